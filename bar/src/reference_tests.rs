//! Exhaustive check of the engine against a brute-force reference written independently in this file.
//!
//! Every pool composition up to Nmax = 16 (counts of completed/truncated positives and negatives and of
//! aborted trajectories, 20,349 compositions, with colliding lengths so names break ties) is built once.
//! The reference enumerates every N-subset (N = 8) of the usable trajectories, keeps for each n+ the subset
//! whose rank-sorted members are lexicographically best, picks n+ by the rules (inside the range, closest to
//! n*, ties to the smaller), and falls back to the top N of the pool and the group filter. The engine must
//! agree exactly — selection, members in order, n+, drop reason — for several positive-fraction ranges,
//! filter settings and both early-stop modes, also on shuffled input.

use std::cmp::Ordering;

use super::*;

const GROUP_SIZE: usize = 8;
const BUDGET: usize = 16;

/// The five kinds a pool is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    CompletedPositive,
    CompletedNegative,
    TruncatedPositive,
    TruncatedNegative,
    Aborted,
}

fn splitmix(mut state: u64) -> u64 {
    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    state = (state ^ (state >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    state = (state ^ (state >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    state ^ (state >> 31)
}

/// A pool for `counts` (one per kind, in `Kind` order). `style` 0 uses rewards 1/0; style 1 varies the
/// magnitude within each sign and gives aborted trajectories a positive reward (which must be ignored).
fn build_pool(counts: [usize; 5], composition: u64, style: u64) -> Vec<Trajectory> {
    let kinds = [
        Kind::CompletedPositive,
        Kind::CompletedNegative,
        Kind::TruncatedPositive,
        Kind::TruncatedNegative,
        Kind::Aborted,
    ];
    let mut pool = Vec::new();
    for (kind, &count) in kinds.iter().zip(&counts) {
        for _ in 0..count {
            let index = pool.len() as u64;
            let noise = splitmix(composition << 8 | index);
            let (outcome, sign) = match kind {
                Kind::CompletedPositive => (Outcome::Completed, 1.0),
                Kind::CompletedNegative => (Outcome::Completed, -1.0),
                Kind::TruncatedPositive => (Outcome::Truncated, 1.0),
                Kind::TruncatedNegative => (Outcome::Truncated, -1.0),
                Kind::Aborted => (Outcome::Aborted, 0.0),
            };
            let reward = match (style, sign) {
                (0, s) if s > 0.0 => 1.0,
                (0, _) => 0.0,
                (_, s) if s > 0.0 => [1.0, 0.25][(noise >> 20) as usize % 2],
                (_, s) if s < 0.0 => [0.0, -0.5][(noise >> 21) as usize % 2],
                _ => 1.0,
            };
            pool.push(Trajectory {
                // A random prefix so name order differs from creation order; the suffix keeps names unique.
                name: format!("r{:02}-{index:02}", (noise >> 8) % 40),
                reward,
                outcome,
                // Lengths 1..=4 collide often, so the name tie-break is exercised.
                length: 1 + noise % 4,
            });
        }
    }
    pool
}

fn reference_rank(a: &Trajectory, b: &Trajectory) -> Ordering {
    let status = |t: &Trajectory| match t.outcome {
        Outcome::Completed => 0,
        Outcome::Truncated => 1,
        Outcome::Aborted => 2,
    };
    (status(a), a.length, &a.name).cmp(&(status(b), b.length, &b.name))
}

fn usable(t: &Trajectory) -> bool {
    t.outcome != Outcome::Aborted
}

fn positive(t: &Trajectory) -> bool {
    usable(t) && t.reward > 0.0
}

/// Bounds by scanning every n (no ceil/floor formulas): n_min is the least n with n/N >= min, n_max the
/// greatest with n/N <= max, n* the greatest with n <= rho* N + 1/2.
fn reference_bounds(min: Fraction, max: Fraction, group_size: u32) -> (u32, u32, u32) {
    let (a, b) = (u128::from(min.numerator()), u128::from(min.denominator()));
    let (c, d) = (u128::from(max.numerator()), u128::from(max.denominator()));
    let n = u128::from(group_size);
    let all = 0..=group_size;
    let n_min = all
        .clone()
        .find(|&k| u128::from(k) * b >= a * n)
        .unwrap_or(group_size + 1);
    let n_max = all
        .clone()
        .filter(|&k| u128::from(k) * d <= c * n)
        .max()
        .unwrap_or(0);
    // k <= (a/b + c/d)/2 * N + 1/2  <=>  2 k b d <= (a d + c b) N + b d
    let n_star = all
        .filter(|&k| 2 * u128::from(k) * b * d <= (a * d + c * b) * n + b * d)
        .max()
        .unwrap_or(0);
    (n_min, n_max, n_star)
}

/// For each n+ in 0..=N, the best N-subset (bit i = i-th usable trajectory in rank order) with that n+,
/// by enumerating every N-subset of the usable trajectories.
fn best_subsets(usable_is_positive: &[bool]) -> [Option<u32>; GROUP_SIZE + 1] {
    let mut best = [None; GROUP_SIZE + 1];
    let count = usable_is_positive.len();
    if count < GROUP_SIZE {
        return best;
    }
    let positive_mask: u32 = usable_is_positive
        .iter()
        .enumerate()
        .filter(|&(_, &is_positive)| is_positive)
        .map(|(index, _)| 1 << index)
        .sum();
    let mut mask: u32 = (1 << GROUP_SIZE) - 1;
    while mask < (1 << count) {
        let n_plus = (mask & positive_mask).count_ones() as usize;
        let better = match best[n_plus] {
            None => true,
            // Lexicographically smaller sorted index list <=> owns the lowest differing index.
            Some(current) => {
                let differing: u32 = mask ^ current;
                mask & differing & differing.wrapping_neg() != 0
            }
        };
        if better {
            best[n_plus] = Some(mask);
        }
        // Gosper's hack: the next larger integer with the same number of set bits.
        let lowest = mask & mask.wrapping_neg();
        let ripple = mask + lowest;
        mask = (((ripple ^ mask) >> 2) / lowest) | ripple;
    }
    best
}

/// The reference decision as (selection, member names in rank order, n+, drop reason).
type Expected = (Selection, Vec<String>, u32, Option<DropReason>);

fn filtered(filter: GroupFilter, selection: Selection, members: Vec<&Trajectory>) -> Expected {
    if filter.enabled {
        let rewards: Vec<f64> = members
            .iter()
            .filter(|t| usable(t))
            .map(|t| t.reward)
            .collect();
        if rewards
            .iter()
            .all(|&reward| reward == rewards.first().copied().unwrap_or(reward))
        {
            return (
                Selection::Dropped,
                Vec::new(),
                0,
                Some(DropReason::ZeroVariance),
            );
        }
        if members.iter().filter(|t| !usable(t)).count() > filter.max_backfill as usize {
            return (
                Selection::Dropped,
                Vec::new(),
                0,
                Some(DropReason::TooMuchBackfill),
            );
        }
    }
    let n_plus = members.iter().filter(|t| positive(t)).count() as u32;
    (
        selection,
        members.iter().map(|t| t.name.clone()).collect(),
        n_plus,
        None,
    )
}

struct Reference<'a> {
    ranked: Vec<&'a Trajectory>,
    usable: Vec<&'a Trajectory>,
    best: [Option<u32>; GROUP_SIZE + 1],
}

impl<'a> Reference<'a> {
    fn new(pool: &'a [Trajectory]) -> Reference<'a> {
        let mut ranked: Vec<&Trajectory> = pool.iter().collect();
        ranked.sort_by(|a, b| reference_rank(a, b));
        let usable: Vec<&Trajectory> = ranked.iter().copied().filter(|t| usable(t)).collect();
        let flags: Vec<bool> = usable.iter().map(|t| positive(t)).collect();
        let best = best_subsets(&flags);
        Reference {
            ranked,
            usable,
            best,
        }
    }

    fn assemble(&self, lo: u32, hi: u32, n_star: u32) -> Option<Vec<&'a Trajectory>> {
        let n_plus = (lo..=hi)
            .filter(|&n| (n as usize) <= GROUP_SIZE && self.best[n as usize].is_some())
            .min_by_key(|&n| (n.abs_diff(n_star), n))?;
        let mask = self.best[n_plus as usize]?;
        Some(
            (0..self.usable.len())
                .filter(|&index| mask & (1 << index) != 0)
                .map(|index| self.usable[index])
                .collect(),
        )
    }

    fn balanced(&self, bounds: (u32, u32, u32), filter: GroupFilter) -> Option<Expected> {
        let (n_min, n_max, n_star) = bounds;
        self.assemble(n_min, n_max, n_star)
            .map(|members| filtered(filter, Selection::Balanced, members))
    }

    fn decide(&self, bounds: (u32, u32, u32), filter: GroupFilter) -> Expected {
        if let Some(expected) = self.balanced(bounds, filter) {
            return expected;
        }
        if let Some(members) = self.assemble(1, GROUP_SIZE as u32 - 1, bounds.2) {
            return filtered(filter, Selection::Relaxed, members);
        }
        if self.ranked.len() >= GROUP_SIZE {
            return filtered(
                filter,
                Selection::TopRanked,
                self.ranked[..GROUP_SIZE].to_vec(),
            );
        }
        let reason = if self.ranked.is_empty() {
            DropReason::Empty
        } else {
            DropReason::TooFewTrajectories
        };
        (Selection::Dropped, Vec::new(), 0, Some(reason))
    }
}

fn actual(decision: &GroupDecision) -> Expected {
    (
        decision.selection,
        decision
            .group
            .iter()
            .map(|member| member.name.clone())
            .collect(),
        decision.positives,
        decision.drop_reason,
    )
}

fn params(min: &str, max: &str, filter: GroupFilter) -> Params {
    Params {
        group_size: GROUP_SIZE as u32,
        max_trajectories: BUDGET as u32,
        stride: 1,
        positive_min: Fraction::from_decimal_str(min).expect("decimal"),
        positive_max: Fraction::from_decimal_str(max).expect("decimal"),
        early_stop: EarlyStop::StrideBoundary,
        filter,
    }
}

/// Every (completed+, completed-, truncated+, truncated-, aborted) count vector with total <= 16.
fn compositions() -> Vec<[usize; 5]> {
    let mut all = Vec::new();
    for a in 0..=BUDGET {
        for b in 0..=BUDGET - a {
            for c in 0..=BUDGET - a - b {
                for d in 0..=BUDGET - a - b - c {
                    for e in 0..=BUDGET - a - b - c - d {
                        all.push([a, b, c, d, e]);
                    }
                }
            }
        }
    }
    all
}

#[test]
fn reference_bounds_agree_with_the_engine() {
    for min_num in 0..=20_u64 {
        for max_num in min_num..=20 {
            let min = Fraction::new(min_num, 20).expect("non-zero");
            let max = Fraction::new(max_num, 20).expect("non-zero");
            for group_size in 1..=40 {
                let mut p = params("0", "1", GroupFilter::default_for(group_size));
                p.group_size = group_size;
                p.positive_min = min;
                p.positive_max = max;
                let engine = bounds(&p);
                assert_eq!(
                    (engine.n_min, engine.n_max, engine.n_star),
                    reference_bounds(min, max, group_size),
                    "{min} {max} N={group_size}"
                );
            }
        }
    }
}

#[test]
fn engine_matches_brute_force_on_every_composition() {
    let default_filter = GroupFilter::default_for(GROUP_SIZE as u32);
    let ranges = [
        ("0.375", "0.625"),
        ("0.25", "0.75"),
        ("0", "1"),
        ("0.3", "0.45"),
        ("0.5", "0.5"),
        ("0.1", "0.3"),
        ("0", "0.25"),
        ("0.4", "0.45"),
    ];
    let filters = [
        default_filter,
        GroupFilter {
            enabled: false,
            max_backfill: 0,
        },
        GroupFilter {
            enabled: true,
            max_backfill: 0,
        },
    ];
    let all = compositions();
    assert_eq!(all.len(), 20_349);
    let mut selections = std::collections::HashMap::new();
    for (composition, &counts) in all.iter().enumerate() {
        let size = counts.iter().sum::<usize>();
        for style in 0..2 {
            let pool = build_pool(counts, composition as u64, style);
            let reference = Reference::new(&pool);
            for (range, &(min, max)) in ranges.iter().enumerate() {
                let range_filters: &[GroupFilter] =
                    if range == 0 { &filters } else { &filters[..1] };
                for &filter in range_filters {
                    let p = params(min, max, filter);
                    let reference_bounds =
                        reference_bounds(p.positive_min, p.positive_max, GROUP_SIZE as u32);
                    let expected = reference.decide(reference_bounds, filter);
                    let decision = decide(&p, &pool);
                    assert_eq!(
                        actual(&decision),
                        expected,
                        "{counts:?} style {style} [{min}, {max}] {filter:?}"
                    );
                    match decision.selection {
                        Selection::Dropped => assert!(decision.group.is_empty()),
                        _ => assert_eq!(decision.group.len(), GROUP_SIZE),
                    }
                    *selections.entry(decision.selection).or_insert(0_u32) += 1;
                }
            }

            // The schedule, s = 1 so every pool size is a stride boundary, paper range.
            let p = params("0.375", "0.625", default_filter);
            let b = reference_bounds(p.positive_min, p.positive_max, GROUP_SIZE as u32);
            let balanced = reference.balanced(b, default_filter);
            let at_boundary = next_step(
                &p,
                &Progress {
                    launched: size as u32,
                    terminal: &pool,
                },
            );
            let expected_step = match (&balanced, size) {
                (_, 0) => None,
                (Some(expected), _) => Some(expected.clone()),
                (None, size) if size < BUDGET => None,
                (None, _) => Some(reference.decide(b, default_filter)),
            };
            match (at_boundary, expected_step) {
                (Step::Finish(decision), Some(expected)) => assert_eq!(actual(&decision), expected),
                (
                    Step::LaunchStride {
                        stride_index,
                        count,
                    },
                    None,
                ) => {
                    assert_eq!((stride_index, count), (size as u32, 1), "{counts:?}")
                }
                (step, expected) => panic!("{counts:?}: {step:?} but expected {expected:?}"),
            }
            if size < BUDGET {
                let running = Progress {
                    launched: BUDGET as u32,
                    terminal: &pool,
                };
                assert_eq!(next_step(&p, &running), Step::Wait);
                let eager = Params {
                    early_stop: EarlyStop::Eager,
                    ..p.clone()
                };
                match (next_step(&eager, &running), &balanced) {
                    (Step::Finish(decision), Some(expected)) => {
                        assert_eq!(&actual(&decision), expected)
                    }
                    (Step::Wait, None) => {}
                    (step, expected) => {
                        panic!("{counts:?} eager: {step:?} but expected {expected:?}")
                    }
                }
            }

            // Shuffled input gives the identical decision.
            if composition % 7 == 0 {
                let mut shuffled = pool.clone();
                let mut state = composition as u64;
                for index in (1..shuffled.len()).rev() {
                    state = splitmix(state);
                    shuffled.swap(index, (state % (index as u64 + 1)) as usize);
                }
                assert_eq!(decide(&p, &shuffled), decide(&p, &pool));
            }
        }
    }
    // Every path is exercised by the enumeration.
    for selection in [
        Selection::Balanced,
        Selection::Relaxed,
        Selection::TopRanked,
        Selection::Dropped,
    ] {
        assert!(
            selections.get(&selection).copied().unwrap_or(0) > 1000,
            "{selection:?}: {selections:?}"
        );
    }
}
