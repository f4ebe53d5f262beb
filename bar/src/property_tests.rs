//! Property tests: the schedule driven to the end by an event simulation on random specs and random
//! trajectories (budget, stride sizes, monotonic launches, group invariants, Eager vs StrideBoundary), and
//! exact arithmetic against integer-scaled decimals.

use proptest::prelude::*;

use super::*;

/// One drawn trajectory: reward, outcome, length, and duration (its finishing time within its stride).
type Draw = (f64, Outcome, u64, u32);

fn outcome_strategy() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        6 => Just(Outcome::Completed),
        2 => Just(Outcome::Truncated),
        2 => Just(Outcome::Aborted),
    ]
}

fn draw_strategy() -> impl Strategy<Value = Draw> {
    (
        prop_oneof![Just(-1.0), Just(0.0), Just(0.5), Just(1.0)],
        outcome_strategy(),
        0_u64..6,
        0_u32..20,
    )
}

fn params_strategy() -> impl Strategy<Value = Params> {
    (
        1_u32..=8,
        1_u32..=3,
        0_usize..4,
        0_u64..=8,
        0_u64..=8,
        any::<bool>(),
        any::<bool>(),
        0_u32..=8,
    )
        .prop_map(
            |(group_size, multiple, divisor_pick, a, b, eager, filter_on, max_backfill)| {
                let max_trajectories = group_size * multiple;
                let divisors: Vec<u32> = (1..=max_trajectories)
                    .filter(|d| max_trajectories % d == 0)
                    .collect();
                let stride = divisors[divisor_pick % divisors.len()];
                let (low, high) = (a.min(b), a.max(b));
                Params {
                    group_size,
                    max_trajectories,
                    stride,
                    positive_min: Fraction::new(low, 8).unwrap_or(Fraction::ZERO),
                    positive_max: Fraction::new(high, 8).unwrap_or(Fraction::ONE),
                    early_stop: if eager {
                        EarlyStop::Eager
                    } else {
                        EarlyStop::StrideBoundary
                    },
                    filter: GroupFilter {
                        enabled: filter_on,
                        max_backfill,
                    },
                }
            },
        )
}

/// What a driven group did.
#[derive(Debug)]
struct Run {
    launches: Vec<(u32, u32)>,
    launched: u32,
    pool: Vec<Trajectory>,
    decision: GroupDecision,
}

fn trajectory(index: usize, draw: &Draw) -> Trajectory {
    Trajectory {
        name: format!("g-{index:02}"),
        reward: draw.0,
        outcome: draw.1,
        length: draw.2,
    }
}

/// Drives `next_step` like the controller: each stride's trajectories run in parallel and finish in order
/// of duration (ties by index); the engine is asked after every finish and whenever it asks to launch.
fn drive(params: &Params, draws: &[Draw]) -> Run {
    let mut launches = Vec::new();
    let mut launched = 0_u32;
    let mut pool: Vec<Trajectory> = Vec::new();
    let mut running: Vec<usize> = Vec::new();
    for _ in 0..10_000 {
        match next_step(
            params,
            &Progress {
                launched,
                terminal: &pool,
            },
        ) {
            Step::LaunchStride {
                stride_index,
                count,
            } => {
                assert!(running.is_empty(), "launch while trajectories run");
                launches.push((stride_index, count));
                running = (launched as usize..(launched + count) as usize).collect();
                running.sort_by_key(|&index| (draws[index].3, index));
                launched += count;
            }
            Step::Wait => {
                assert!(!running.is_empty(), "wait with nothing running");
                let index = running.remove(0);
                pool.push(trajectory(index, &draws[index]));
            }
            Step::Finish(decision) => {
                return Run {
                    launches,
                    launched,
                    pool,
                    decision,
                };
            }
        }
    }
    panic!("the schedule did not finish");
}

/// Cases per property: 512 in `make test`; `PROPTEST_CASES` asks for more (`make fuzz` runs 20,000).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(512)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn schedule_respects_budget_strides_and_group_invariants(
        params in params_strategy(),
        draws in proptest::collection::vec(draw_strategy(), 24),
    ) {
        prop_assert_eq!(params.validate(), Ok(()));
        let run = drive(&params, &draws);
        prop_assert!(run.launched <= params.max_trajectories);
        for (index, &(stride_index, count)) in run.launches.iter().enumerate() {
            prop_assert_eq!(stride_index as usize, index);
            prop_assert_eq!(count, params.stride);
        }
        let decision = &run.decision;
        let b = bounds(&params);
        match decision.selection {
            Selection::Dropped => {
                prop_assert!(decision.group.is_empty());
                prop_assert!(decision.drop_reason.is_some());
            }
            selection => {
                prop_assert_eq!(decision.group.len(), params.group_size as usize);
                prop_assert!(decision.drop_reason.is_none());
                let positives = decision.group.iter().filter(|m| m.positive).count() as u32;
                prop_assert_eq!(positives, decision.positives);
                if selection == Selection::Balanced {
                    prop_assert!(b.n_min <= positives && positives <= b.n_max);
                }
                if selection == Selection::Relaxed {
                    prop_assert!(1 <= positives && positives < params.group_size);
                }
                if selection != Selection::TopRanked {
                    prop_assert!(decision.group.iter().all(|m| m.outcome.is_usable()));
                }
                // Distinct members from the pool, in rank order.
                let as_trajectory = |m: &Member| Trajectory {
                    name: m.name.clone(), reward: m.reward, outcome: m.outcome, length: m.length,
                };
                for pair in decision.group.windows(2) {
                    let order = rank_order(&as_trajectory(&pair[0]), &as_trajectory(&pair[1]));
                    prop_assert_eq!(order, std::cmp::Ordering::Less);
                }
                for member in &decision.group {
                    prop_assert!(run.pool.iter().any(|t| t.name == member.name));
                }
            }
        }
        // Until the last stride the pool is complete at every launch; the budget-spent decision is `decide`.
        if run.launched == params.max_trajectories && run.pool.len() == run.launched as usize
            && decide_balanced(&params, &run.pool).is_none()
        {
            prop_assert_eq!(decision, &decide(&params, &run.pool));
        }
    }

    #[test]
    fn eager_launches_exactly_what_the_boundary_launches(
        params in params_strategy(),
        draws in proptest::collection::vec(draw_strategy(), 24),
    ) {
        let boundary = drive(&Params { early_stop: EarlyStop::StrideBoundary, ..params.clone() }, &draws);
        let eager = drive(&Params { early_stop: EarlyStop::Eager, ..params.clone() }, &draws);
        prop_assert_eq!(&eager.launches, &boundary.launches);
        prop_assert!(eager.pool.len() <= boundary.pool.len());
        // Without a feasible balanced group both end on the same pool with the same fallback.
        if decide_balanced(&params, &boundary.pool).is_none() {
            prop_assert_eq!(&eager.decision, &boundary.decision);
        }
    }

    #[test]
    fn balanced_feasibility_only_grows_with_the_pool(
        params in params_strategy(),
        draws in proptest::collection::vec(draw_strategy(), 24),
        cut in 0_usize..24,
    ) {
        let pool: Vec<Trajectory> = draws.iter().enumerate().map(|(i, d)| trajectory(i, d)).collect();
        let b = bounds(&params);
        if try_assemble(&params, &pool[..cut], b.n_min, b.n_max).is_some() {
            prop_assert!(try_assemble(&params, &pool, b.n_min, b.n_max).is_some());
        }
    }

    #[test]
    fn shuffled_pools_decide_identically(
        params in params_strategy(),
        draws in proptest::collection::vec(draw_strategy(), 0..24),
        seed in any::<u64>(),
    ) {
        let pool: Vec<Trajectory> = draws.iter().enumerate().map(|(i, d)| trajectory(i, d)).collect();
        let mut shuffled = pool.clone();
        let mut state = seed;
        for index in (1..shuffled.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(index, ((state >> 33) % (index as u64 + 1)) as usize);
        }
        prop_assert_eq!(decide(&params, &shuffled), decide(&params, &pool));
    }

    #[test]
    fn any_reward_is_accepted_without_panic(
        rewards in proptest::collection::vec(any::<f64>(), 0..20),
        params in params_strategy(),
    ) {
        let pool: Vec<Trajectory> = rewards.iter().enumerate().map(|(i, &reward)| Trajectory {
            name: format!("t{i}"), reward, outcome: Outcome::Completed, length: 1,
        }).collect();
        let decision = decide(&params, &pool);
        if decision.selection != Selection::Dropped {
            prop_assert_eq!(decision.group.len(), params.group_size as usize);
        }
    }

    #[test]
    fn bounds_match_integer_scaled_decimals(
        min_micros in 0_u64..=1_000_000,
        max_micros in 0_u64..=1_000_000,
        group_size in 1_u32..=100_000,
    ) {
        let (low, high) = (min_micros.min(max_micros), min_micros.max(max_micros));
        let decimal = |micros: u64| format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000);
        let params = Params {
            group_size,
            max_trajectories: group_size,
            stride: 1,
            positive_min: Fraction::from_decimal_str(&decimal(low)).expect("decimal"),
            positive_max: Fraction::from_f64(high as f64 / 1e6).expect("finite"),
            early_stop: EarlyStop::StrideBoundary,
            filter: GroupFilter::default_for(group_size),
        };
        let n = u64::from(group_size);
        let b = bounds(&params);
        prop_assert_eq!(u64::from(b.n_min), (low * n).div_ceil(1_000_000));
        prop_assert_eq!(u64::from(b.n_max), high * n / 1_000_000);
        prop_assert_eq!(u64::from(b.n_star), ((low + high) * n + 1_000_000) / 2_000_000);
    }

    /// A float whose shortest decimal has at most 18 places is exact (10^18 fits a `u64`
    /// denominator); one with more (`0.00039061191088407186`: 20 places) round-trips when its reduced
    /// denominator still fits, and is otherwise refused as `TooPrecise`, as the error documents.
    #[test]
    fn floats_round_trip_through_fractions(value in 0.0_f64..=1.0) {
        let places = decimal_places(value);
        match Fraction::from_f64(value) {
            Ok(fraction) => prop_assert_eq!(fraction.to_f64(), value),
            Err(error) => {
                prop_assert!(
                    matches!(error, FractionError::TooPrecise(_)) && places > 18,
                    "{} ({} decimal places) has no fraction: {:?}", value, places, error
                );
            }
        }
    }
}

/// Decimal places of `value`'s shortest round-trip representation (`0.375` -> 3, `3.9e-4` -> 5).
fn decimal_places(value: f64) -> i64 {
    let text = format!("{value:e}");
    let (mantissa, exponent) = text.split_once('e').unwrap_or((&text, "0"));
    let fraction_digits = mantissa
        .split_once('.')
        .map_or(0, |(_, digits)| digits.len()) as i64;
    let exponent: i64 = exponent.parse().unwrap_or(0);
    (fraction_digits - exponent).max(0)
}

#[test]
fn decimal_places_counts_the_shortest_decimal() {
    assert_eq!(decimal_places(0.375), 3);
    assert_eq!(decimal_places(0.0), 0);
    assert_eq!(decimal_places(1.0), 0);
    assert_eq!(decimal_places(0.00039061191088407186), 20);
}
