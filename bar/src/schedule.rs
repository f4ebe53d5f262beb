//! The schedule (docs/BAR.md, "The schedule"): given what has been launched and what is terminal, the one next
//! thing the controller should do — launch a stride, wait, or finish with a decision.
//!
//! The function is stateless: everything is derived from [`Progress`], so a restarted controller that
//! rebuilds `launched` and the terminal pool from status and child Sandboxes gets the same answer and never
//! launches a stride twice.

use super::decision::{GroupDecision, decide, decide_balanced};
use super::params::{EarlyStop, Params};
use super::rank::Trajectory;

/// What the controller knows about a group.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// Trajectories launched so far over all strides (terminal or not).
    pub launched: u32,
    /// The pool T: every terminal trajectory (completed, truncated or aborted, time-outs included).
    pub terminal: &'a [Trajectory],
}

/// The next action for a group.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Create `count` trajectories for stride `stride_index` (0-based); `count` is the stride size s.
    LaunchStride {
        /// Index of the stride to create; its trajectories are `stride_index * s ..` in launch order.
        stride_index: u32,
        /// How many trajectories to create.
        count: u32,
    },
    /// Trajectories are still running and nothing can be decided yet.
    Wait,
    /// The group is decided. Under `Eager` a `Balanced` decision may come while trajectories still run:
    /// the controller deletes them.
    Finish(GroupDecision),
}

/// The next step for a group with `params` (which should have passed [`Params::validate`]).
///
/// - Nothing launched: launch stride 0.
/// - `StrideBoundary`: while any launched trajectory is running, wait. `Eager`: while some run, finish as
///   soon as `TryAssemble(n_min, n_max)` succeeds on the terminal pool, else wait.
/// - All terminal: `Balanced` if feasible; else the next stride while fewer than Nmax were launched; else
///   the fallbacks (`Relaxed`, `TopRanked`) and the group filter.
///
/// Inconsistent input never panics: a pool larger than `launched` counts as that many launched, and a
/// launch count at or above Nmax never launches more.
pub fn next_step(params: &Params, progress: &Progress<'_>) -> Step {
    let terminal = u32::try_from(progress.terminal.len()).unwrap_or(u32::MAX);
    let launched = progress.launched.max(terminal);
    let stride = params.stride.max(1);
    if launched == 0 && params.max_trajectories > 0 {
        return Step::LaunchStride {
            stride_index: 0,
            count: stride.min(params.max_trajectories),
        };
    }
    if launched > terminal {
        return match params.early_stop {
            EarlyStop::StrideBoundary => Step::Wait,
            EarlyStop::Eager => match decide_balanced(params, progress.terminal) {
                Some(decision) => Step::Finish(decision),
                None => Step::Wait,
            },
        };
    }
    if let Some(decision) = decide_balanced(params, progress.terminal) {
        return Step::Finish(decision);
    }
    if launched < params.max_trajectories {
        return Step::LaunchStride {
            stride_index: launched.div_ceil(stride),
            count: stride.min(params.max_trajectories - launched),
        };
    }
    Step::Finish(decide(params, progress.terminal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Selection;
    use crate::filter::DropReason;
    use crate::rank::Outcome;

    fn trajectory(index: usize, reward: f64, outcome: Outcome) -> Trajectory {
        Trajectory {
            name: format!("g-{index:02}"),
            reward,
            outcome,
            length: 10 + index as u64,
        }
    }

    fn params(stride: u32, early_stop: EarlyStop) -> Params {
        Params {
            stride,
            early_stop,
            ..Params::paper_defaults()
        }
    }

    fn step(params: &Params, launched: u32, terminal: &[Trajectory]) -> Step {
        next_step(params, &Progress { launched, terminal })
    }

    fn selection(step: &Step) -> Option<(Selection, u32)> {
        match step {
            Step::Finish(decision) => Some((decision.selection, decision.positives)),
            _ => None,
        }
    }

    #[test]
    fn stride_boundary_walks_every_stride() {
        let params = params(4, EarlyStop::StrideBoundary);
        let mut pool = Vec::new();
        assert_eq!(
            step(&params, 0, &pool),
            Step::LaunchStride {
                stride_index: 0,
                count: 4
            }
        );
        // Rewards: only the 13th trajectory is positive.
        for stride in 0..4_u32 {
            for offset in 0..4 {
                let index = (stride * 4 + offset) as usize;
                assert_eq!(
                    step(&params, (stride + 1) * 4, &pool),
                    Step::Wait,
                    "running {index}"
                );
                let reward = if index == 12 { 1.0 } else { 0.0 };
                pool.push(trajectory(index, reward, Outcome::Completed));
            }
            let next = step(&params, (stride + 1) * 4, &pool);
            if stride < 3 {
                assert_eq!(
                    next,
                    Step::LaunchStride {
                        stride_index: stride + 1,
                        count: 4
                    }
                );
            } else {
                assert_eq!(selection(&next), Some((Selection::Relaxed, 1)));
            }
        }
    }

    #[test]
    fn stride_boundary_finishes_at_the_first_feasible_boundary() {
        let params = params(8, EarlyStop::StrideBoundary);
        let pool: Vec<Trajectory> = (0..8)
            .map(|index| {
                trajectory(
                    index,
                    if index % 2 == 0 { 1.0 } else { 0.0 },
                    Outcome::Completed,
                )
            })
            .collect();
        // 7 terminal: even though 4 positives + 3 negatives are in, the boundary rule waits.
        assert_eq!(step(&params, 8, &pool[..7]), Step::Wait);
        assert_eq!(
            selection(&step(&params, 8, &pool)),
            Some((Selection::Balanced, 4))
        );
    }

    #[test]
    fn eager_finishes_while_trajectories_run() {
        let params = params(16, EarlyStop::Eager);
        let mut pool = Vec::new();
        assert_eq!(
            step(&params, 0, &pool),
            Step::LaunchStride {
                stride_index: 0,
                count: 16
            }
        );
        // Finishing order: 5 negatives, then positives; 8 usable with n+ = 3 is the first feasible pool.
        let rewards = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        for (index, reward) in rewards.into_iter().enumerate() {
            pool.push(trajectory(index, reward, Outcome::Completed));
            let next = step(&params, 16, &pool);
            if pool.len() < 8 {
                assert_eq!(next, Step::Wait, "after {}", pool.len());
            } else {
                assert_eq!(selection(&next), Some((Selection::Balanced, 3)));
                break;
            }
        }
        assert_eq!(pool.len(), 8);
    }

    #[test]
    fn eager_ignores_aborts_and_falls_back_like_the_boundary() {
        let params = params(8, EarlyStop::Eager);
        let mut pool: Vec<Trajectory> = (0..8)
            .map(|index| trajectory(index, 0.0, Outcome::Aborted))
            .collect();
        assert_eq!(step(&params, 8, &pool[..4]), Step::Wait);
        assert_eq!(
            step(&params, 8, &pool),
            Step::LaunchStride {
                stride_index: 1,
                count: 8
            }
        );
        pool.extend((8..16).map(|index| trajectory(index, 0.0, Outcome::Aborted)));
        assert_eq!(step(&params, 16, &pool[..12]), Step::Wait);
        let last = step(&params, 16, &pool);
        assert_eq!(
            last,
            Step::Finish(GroupDecision::dropped(DropReason::ZeroVariance))
        );
    }

    #[test]
    fn never_launches_past_the_budget_and_tolerates_inconsistent_input() {
        let params = params(16, EarlyStop::StrideBoundary);
        let pool: Vec<Trajectory> = (0..16)
            .map(|index| trajectory(index, 1.0, Outcome::Completed))
            .collect();
        // More terminal than launched: counted as 16 launched, budget spent, all positive -> dropped.
        let last = step(&params, 3, &pool);
        assert_eq!(
            last,
            Step::Finish(GroupDecision::dropped(DropReason::ZeroVariance))
        );
        // Launched beyond the budget with a short pool: no launch, no panic.
        assert_eq!(step(&params, 40, &pool), Step::Wait);
        let mut broken = params.clone();
        broken.stride = 0;
        broken.max_trajectories = 0;
        assert!(matches!(step(&broken, 0, &[]), Step::Finish(_)));
    }
}
