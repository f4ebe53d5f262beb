//! The simulator against closed-form expectations derived here, within 5 standard errors.
//!
//! Notation: N = 8, Nmax = 16, [0.375, 0.625] so n_min = 3, n_max = 5, n* = 4. With no aborts every
//! trajectory is positive with probability p independently, so the positives among the first m draws are
//! K_m ~ Bin(m, p).
//!
//! TryAssemble(lo, hi) on a pool of m usable trajectories with K positives succeeds iff some n+ in [lo, hi]
//! has n+ <= K (enough positives) and N - n+ <= m - K (enough negatives), i.e. iff
//! max(lo, N - m + K) <= min(hi, K). It picks the n+ of that interval closest to n*.
//! - One stride of 16 (m = 16, [3, 5]): max(3, K - 8) <= min(5, K) iff 3 <= K <= 13, so
//!   P(Balanced) = P(3 <= K16 <= 13); n+ = 3 for K = 3, 5 for K = 13, else 4.
//! - Budget spent, relaxed [1, 7]: max(1, K - 8) <= min(7, K) iff 1 <= K <= 15, so
//!   P(Relaxed) = P(K16 in {1, 2, 14, 15}) with n+ = K for K <= 2 and K - 8 for K >= 14. K = 0 or 16 leaves
//!   TopRanked with eight equal rewards: dropped. P(Dropped) = p^16 + (1 - p)^16.
//! - Strides of 8: the boundary at 8 succeeds iff n+ = K8 is in [3, 5]; at 16 as above. Since K8 in [3, 5]
//!   implies K16 in [3, 13], P(Balanced) is unchanged and E[launched] = 8 + 8 (1 - P(3 <= K8 <= 5)).
//! - Strides of 4: nothing at 4 (4 < N usable); at 12, max(3, K - 4) <= min(5, K) iff 3 <= K12 <= 9, which
//!   K8 in [3, 5] implies, so E[launched] = 8 + 4 (1 - P(3 <= K8 <= 5)) + 4 (1 - P(3 <= K12 <= 9)).
//! - GRPO (first 8 draws): non-zero variance iff 1 <= K8 <= 7: 1 - p^8 - (1 - p)^8. DAPO admits exactly
//!   those. Mean imbalance E|K8/8 - 1/2|.
//! - PODS (16 draws, n+ closest to 4 in [max(0, K - 8), min(8, K)]): n+ = K for K <= 4, K - 8 for K >= 12,
//!   else 4; non-zero variance iff 1 <= K16 <= 15.
//! - With abort rate a: each draw is positive (1-a)p, negative (1-a)(1-p), aborted a, jointly multinomial
//!   (K+, K-, A). Balanced iff K+ >= 3, K- >= 3 and K+ + K- >= 8; else Relaxed iff K+, K- >= 1 and
//!   K+ + K- >= 8; else TopRanked (the U = K+ + K- usable first, then 8 - U backfill) survives the filter
//!   iff both classes are present and 8 - U <= 4 backfill, i.e. K+, K- >= 1 and 4 <= U <= 7.
//! - Pass rates averaged over the distributions: E[p^k] for Beta(a, b) is prod_{r<k} (a+r)/(a+b+r) (and
//!   E[(1-p)^k] the same with a, b swapped); for U(0,1) it is 1/(k+1); for U(0, 1/2] it is 2^-k/(k+1) and
//!   E[(1-p)^k] = 2 (1 - 2^-(k+1))/(k+1).

use super::methods::{Method, run_prompt};
use super::scenario::{Cell, Draw, DurationModel, PassRate};
use super::{SimConfig, run, run_cell};
use crate::{EarlyStop, Params, Selection};

const SEED: u64 = 0x00C0_FFEE;

fn choose(n: u64, k: u64) -> f64 {
    (0..k).fold(1.0, |value, i| value * (n - i) as f64 / (i + 1) as f64)
}

fn pmf(n: u64, k: u64, p: f64) -> f64 {
    choose(n, k) * p.powi(k as i32) * (1.0 - p).powi((n - k) as i32)
}

fn between(n: u64, lo: u64, hi: u64, p: f64) -> f64 {
    (lo..=hi.min(n)).map(|k| pmf(n, k, p)).sum()
}

/// Expectation of `f(K)` for K ~ Bin(n, p), and its variance.
fn binomial_moments(n: u64, p: f64, f: impl Fn(u64) -> f64) -> (f64, f64) {
    let mean: f64 = (0..=n).map(|k| pmf(n, k, p) * f(k)).sum();
    let second: f64 = (0..=n).map(|k| pmf(n, k, p) * f(k).powi(2)).sum();
    (mean, second - mean * mean)
}

/// Asserts `observed` is within 5 standard errors of `expected` for `samples` draws of variance `variance`.
fn assert_close(what: &str, observed: f64, expected: f64, variance: f64, samples: f64) {
    let tolerance = 5.0 * (variance.max(0.0) / samples).sqrt() + 1e-9;
    assert!(
        (observed - expected).abs() <= tolerance,
        "{what}: observed {observed:.5}, expected {expected:.5} +- {tolerance:.5}"
    );
}

fn assert_share(what: &str, observed: f64, expected: f64, samples: f64) {
    assert_close(
        what,
        observed,
        expected,
        expected * (1.0 - expected),
        samples,
    );
}

fn config(pass_rate: PassRate, abort_rate: f64, methods: Vec<Method>, prompts: u64) -> SimConfig {
    SimConfig {
        seed: SEED,
        prompts,
        params: Params::paper_defaults(),
        cells: vec![Cell {
            pass_rate,
            abort_rate,
            durations: DurationModel::Independent,
        }],
        methods,
    }
}

fn bar(stride: u32, early_stop: EarlyStop) -> Method {
    Method::Bar { stride, early_stop }
}

#[test]
fn one_stride_of_sixteen_and_the_fixed_baselines() {
    const PROMPTS: u64 = 2500;
    let samples = PROMPTS as f64;
    for p in [0.15, 0.5, 0.85] {
        let methods = vec![
            bar(16, EarlyStop::StrideBoundary),
            bar(16, EarlyStop::Eager),
            Method::Grpo,
            Method::Dapo,
            Method::Pods,
        ];
        let cfg = config(PassRate::Fixed { p }, 0.0, methods, PROMPTS);
        let result = run_cell(&cfg, &cfg.cells[0]);
        let summary = |index: usize| &result.methods[index].summary;

        let balanced = between(16, 3, 13, p);
        let relaxed = pmf(16, 1, p) + pmf(16, 2, p) + pmf(16, 14, p) + pmf(16, 15, p);
        let dropped = p.powi(16) + (1.0 - p).powi(16);
        for index in [0, 1] {
            let mix = summary(index).path_mix.expect("BAR has a path mix");
            assert_share(
                &format!("p={p} balanced[{index}]"),
                mix.balanced,
                balanced,
                samples,
            );
            assert_share(
                &format!("p={p} relaxed[{index}]"),
                mix.relaxed,
                relaxed,
                samples,
            );
            assert_share(
                &format!("p={p} dropped[{index}]"),
                mix.dropped,
                dropped,
                samples,
            );
            assert_eq!(
                mix.top_ranked, 0.0,
                "no aborts: TopRanked groups are all zero-variance"
            );
            assert_eq!(summary(index).nonzero_variance_share, Some(1.0));
        }
        // Imbalance over admitted groups (K in 1..=15), |n+/8 - 1/2| with n+ as derived above.
        let imbalance = |k: u64| -> f64 {
            let n_plus = match k {
                3 => 3,
                13 => 5,
                4..=12 => 4,
                14 | 15 => k - 8,
                _ => k, // 1 and 2 (0 and 16 are dropped and never weighed)
            };
            (n_plus as f64 / 8.0 - 0.5).abs()
        };
        let admitted = 1.0 - dropped;
        let (raw_mean, _) = binomial_moments(16, p, |k| {
            if (1..=15).contains(&k) {
                imbalance(k)
            } else {
                0.0
            }
        });
        let (raw_second, _) = binomial_moments(16, p, |k| {
            if (1..=15).contains(&k) {
                imbalance(k).powi(2)
            } else {
                0.0
            }
        });
        let conditional_mean = raw_mean / admitted;
        let conditional_variance = raw_second / admitted - conditional_mean.powi(2);
        let observed = summary(0).mean_imbalance.expect("admitted groups");
        assert_close(
            &format!("p={p} BAR imbalance"),
            observed,
            conditional_mean,
            conditional_variance,
            samples * admitted,
        );

        let signal8 = 1.0 - p.powi(8) - (1.0 - p).powi(8);
        assert_share(
            &format!("p={p} GRPO signal"),
            summary(2).nonzero_variance_share.unwrap_or(-1.0),
            signal8,
            samples,
        );
        assert_eq!(summary(2).admitted_share, 1.0);
        let (grpo_imbalance, grpo_variance) =
            binomial_moments(8, p, |k| (k as f64 / 8.0 - 0.5).abs());
        assert_close(
            &format!("p={p} GRPO imbalance"),
            summary(2).mean_imbalance.unwrap_or(-1.0),
            grpo_imbalance,
            grpo_variance,
            samples,
        );
        assert_share(
            &format!("p={p} DAPO admitted"),
            summary(3).admitted_share,
            signal8,
            samples,
        );
        assert_eq!(summary(3).nonzero_variance_share, Some(1.0));

        let signal16 = 1.0 - p.powi(16) - (1.0 - p).powi(16);
        assert_share(
            &format!("p={p} PODS signal"),
            summary(4).nonzero_variance_share.unwrap_or(-1.0),
            signal16,
            samples,
        );
        let pods_n_plus = |k: u64| match k {
            0..=4 => k,
            12..=16 => k - 8,
            _ => 4,
        };
        let (pods_imbalance, pods_variance) =
            binomial_moments(16, p, |k| (pods_n_plus(k) as f64 / 8.0 - 0.5).abs());
        assert_close(
            &format!("p={p} PODS imbalance"),
            summary(4).mean_imbalance.unwrap_or(-1.0),
            pods_imbalance,
            pods_variance,
            samples,
        );
        assert_eq!(summary(4).launched_per_admitted, Some(16.0));
    }
}

#[test]
fn smaller_strides_stop_early_as_derived() {
    const PROMPTS: u64 = 2500;
    let samples = PROMPTS as f64;
    for p in [0.2, 0.5] {
        let methods = vec![
            bar(8, EarlyStop::StrideBoundary),
            bar(4, EarlyStop::StrideBoundary),
        ];
        let cfg = config(PassRate::Fixed { p }, 0.0, methods, PROMPTS);
        let result = run_cell(&cfg, &cfg.cells[0]);
        let mean_launched = |index: usize| {
            let s = &result.methods[index].summary;
            s.launched_per_admitted.unwrap_or(0.0) * s.admitted as f64 / s.prompts as f64
        };
        let stop8 = between(8, 3, 5, p);
        let stop12 = between(12, 3, 9, p);
        // launched = 8 + 8 X with X ~ Bernoulli(1 - stop8).
        let expected8 = 8.0 + 8.0 * (1.0 - stop8);
        assert_close(
            &format!("p={p} s=8 launched"),
            mean_launched(0),
            expected8,
            64.0 * stop8 * (1.0 - stop8),
            samples,
        );
        let expected4 = 8.0 + 4.0 * (1.0 - stop8) + 4.0 * (1.0 - stop12);
        // launched - 8 takes values 0, 4, 8: variance bounded by 16.
        assert_close(
            &format!("p={p} s=4 launched"),
            mean_launched(1),
            expected4,
            16.0,
            samples,
        );
        for index in [0, 1] {
            let mix = result.methods[index].summary.path_mix.expect("BAR");
            assert_share(
                &format!("p={p} balanced[{index}]"),
                mix.balanced,
                between(16, 3, 13, p),
                samples,
            );
        }
    }
}

#[test]
fn aborts_follow_the_multinomial() {
    const PROMPTS: u64 = 3000;
    let samples = PROMPTS as f64;
    let (p, a): (f64, f64) = (0.3, 0.3);
    let (positive, negative) = ((1.0 - a) * p, (1.0 - a) * (1.0 - p));
    let mut expected = [0.0_f64; 4]; // balanced, relaxed, top-ranked kept, dropped
    for k_plus in 0..=16_u64 {
        for k_minus in 0..=16 - k_plus {
            let aborted = 16 - k_plus - k_minus;
            let probability = choose(16, k_plus)
                * choose(16 - k_plus, k_minus)
                * positive.powi(k_plus as i32)
                * negative.powi(k_minus as i32)
                * a.powi(aborted as i32);
            let usable = k_plus + k_minus;
            let slot = if k_plus >= 3 && k_minus >= 3 && usable >= 8 {
                0
            } else if k_plus >= 1 && k_minus >= 1 && usable >= 8 {
                1
            } else if k_plus >= 1 && k_minus >= 1 && (4..8).contains(&usable) {
                2
            } else {
                3
            };
            expected[slot] += probability;
        }
    }
    assert!((expected.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    let cfg = config(
        PassRate::Fixed { p },
        a,
        vec![bar(16, EarlyStop::StrideBoundary)],
        PROMPTS,
    );
    let result = run_cell(&cfg, &cfg.cells[0]);
    let mix = result.methods[0].summary.path_mix.expect("BAR");
    let observed = [mix.balanced, mix.relaxed, mix.top_ranked, mix.dropped];
    for (slot, name) in ["balanced", "relaxed", "top-ranked", "dropped"]
        .iter()
        .enumerate()
    {
        assert_share(name, observed[slot], expected[slot], samples);
    }
}

#[test]
fn pass_rate_distributions_drive_grpo_signal() {
    const PROMPTS: u64 = 6000;
    let samples = PROMPTS as f64;
    let beta_moment = |a: f64, b: f64, k: u32| {
        (0..k)
            .map(|r| (a + r as f64) / (a + b + r as f64))
            .product::<f64>()
    };
    let uniform = 1.0 - 2.0 / 9.0;
    let low_half = 1.0 - 2.0 * 0.5_f64.powi(9) / 9.0 - 2.0 * (1.0 - 0.5_f64.powi(9)) / 9.0;
    let beta = 1.0 - beta_moment(0.5, 2.0, 8) - beta_moment(2.0, 0.5, 8);
    let cases = [
        (PassRate::Uniform, uniform),
        (PassRate::UniformLowHalf, low_half),
        (PassRate::Beta { a: 0.5, b: 2.0 }, beta),
        (
            PassRate::Mixture {
                unsolvable: 0.2,
                trivial: 0.1,
            },
            0.7 * uniform,
        ),
    ];
    for (distribution, expected) in cases {
        let cfg = config(distribution, 0.0, vec![Method::Grpo], PROMPTS);
        let result = run_cell(&cfg, &cfg.cells[0]);
        let observed = result.methods[0]
            .summary
            .nonzero_variance_share
            .unwrap_or(-1.0);
        assert_share(&distribution.label(), observed, expected, samples);
    }
}

#[test]
fn eager_launches_like_the_boundary_and_costs_less() {
    let params = Params::paper_defaults();
    let cell = Cell {
        pass_rate: PassRate::Beta { a: 0.5, b: 2.0 },
        abort_rate: 0.1,
        durations: DurationModel::CorrectShorter,
    };
    for stride in [16, 8, 4] {
        for prompt in 0..300 {
            let p = cell.pass_rate.sample(SEED, prompt);
            let draws = Draw::sample_prompt(SEED, prompt, 16, p, &cell);
            let boundary = run_prompt(bar(stride, EarlyStop::StrideBoundary), &params, &draws);
            let eager = run_prompt(bar(stride, EarlyStop::Eager), &params, &draws);
            assert_eq!(eager.launched, boundary.launched, "prompt {prompt}");
            let is_balanced = |selection| selection == Some(Selection::Balanced);
            assert_eq!(
                is_balanced(eager.selection),
                is_balanced(boundary.selection)
            );
            if !is_balanced(boundary.selection) {
                assert_eq!(eager, boundary);
            }
            assert!(
                eager.makespan <= boundary.makespan
                    && eager.sandbox_seconds <= boundary.sandbox_seconds + 1e-9
            );
        }
    }
}

#[test]
fn runs_are_reproducible() {
    let small = |seed| SimConfig::standard(seed, 40, Params::paper_defaults(), &[0.0, 0.2]);
    let first = run(&small(1));
    assert_eq!(first, run(&small(1)));
    assert_ne!(first, run(&small(2)));
    assert_eq!(first.len(), 16);
    assert_eq!(first[0].methods.len(), 9);
}
