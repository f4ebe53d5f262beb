//! The rollout methods compared, each run on one prompt's draws.
//!
//! - **GRPO**: launch N in parallel, keep all N.
//! - **DAPO-style dynamic sampling**: launch N in parallel; drop the prompt when the usable rewards have
//!   zero variance (the trainer refills its batch with fresh prompts, so the cost of a dropped prompt is
//!   charged to the admitted ones).
//! - **PODS-style down-sampling**: launch 2N in parallel, keep the N with maximal reward variance — for
//!   binary rewards, n+ as close to N/2 as the usable draws allow (ties to the smaller n+), the first draws
//!   of each class in launch order; aborted draws fill in only when fewer than N are usable. Never drops.
//! - **BAR**: the real engine ([`crate::next_step`]) driven by an event simulation: each stride's s
//!   trajectories start together and finish at their durations; the engine is asked after every finish
//!   (StrideBoundary simply waits until the stride is done), and under Eager the still-running trajectories
//!   are cancelled when it finishes.

use serde::Serialize;

use super::scenario::Draw;
use crate::{DropReason, EarlyStop, Params, Progress, Selection, Step, Trajectory, next_step};

/// A rollout method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Method {
    /// Fixed N.
    Grpo,
    /// Sample N, drop zero-variance prompts.
    Dapo,
    /// Sample 2N, keep the max-variance N.
    Pods,
    /// Balanced Adaptive Rollout.
    Bar {
        /// s.
        stride: u32,
        /// When a balanced group may be taken.
        #[serde(serialize_with = "serialize_early_stop")]
        early_stop: EarlyStop,
    },
}

fn serialize_early_stop<S: serde::Serializer>(
    early_stop: &EarlyStop,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(early_stop.as_str())
}

impl Method {
    /// GRPO, DAPO, PODS, then BAR with s in {Nmax, Nmax/2, Nmax/4} (those that are whole and divide Nmax),
    /// each with StrideBoundary and Eager.
    pub fn standard_set(max_trajectories: u32) -> Vec<Method> {
        let mut methods = vec![Method::Grpo, Method::Dapo, Method::Pods];
        let mut strides: Vec<u32> = [1, 2, 4]
            .iter()
            .filter(|&&divisor| {
                max_trajectories.is_multiple_of(divisor) && max_trajectories / divisor > 0
            })
            .map(|divisor| max_trajectories / divisor)
            .collect();
        strides.dedup();
        for stride in strides {
            for early_stop in [EarlyStop::StrideBoundary, EarlyStop::Eager] {
                methods.push(Method::Bar { stride, early_stop });
            }
        }
        methods
    }

    /// A short label for tables, e.g. `BAR s=8 Eager`.
    pub fn label(&self, params: &Params) -> String {
        match self {
            Method::Grpo => format!("GRPO N={}", params.group_size),
            Method::Dapo => format!("DAPO filter N={}", params.group_size),
            Method::Pods => format!("PODS {}->{}", 2 * params.group_size, params.group_size),
            Method::Bar { stride, early_stop } => format!("BAR s={stride} {}", early_stop.as_str()),
        }
    }

    /// How many draws per prompt this method may use.
    pub fn draws_needed(&self, params: &Params) -> usize {
        match self {
            Method::Grpo | Method::Dapo => params.group_size as usize,
            Method::Pods => 2 * params.group_size as usize,
            Method::Bar { .. } => params.max_trajectories as usize,
        }
    }
}

/// What one method did with one prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRun {
    /// Draws launched: always the first `launched` draws, in order.
    pub launched: usize,
    /// Indices of the selected draws; empty when the prompt is not admitted.
    pub selected: Vec<usize>,
    /// The trainer receives a group.
    pub admitted: bool,
    /// BAR's selection (Dropped included); `None` for the other methods.
    pub selection: Option<Selection>,
    /// Why BAR dropped the group, if it did.
    pub drop_reason: Option<DropReason>,
    /// Wall-clock seconds from the first launch to the decision.
    pub makespan: f64,
    /// Seconds summed over every launched sandbox (cancelled ones until cancellation).
    pub sandbox_seconds: f64,
}

/// Runs `method` on one prompt's `draws` (at least [`Method::draws_needed`] of them).
pub fn run_prompt(method: Method, params: &Params, draws: &[Draw]) -> PromptRun {
    match method {
        Method::Grpo => fixed(draws, params.group_size as usize, false),
        Method::Dapo => fixed(draws, params.group_size as usize, true),
        Method::Pods => pods(draws, params.group_size as usize),
        Method::Bar { stride, early_stop } => bar(
            &Params {
                stride,
                early_stop,
                ..params.clone()
            },
            draws,
        ),
    }
}

/// Whether the usable draws among `indices` have different rewards.
pub fn has_signal(draws: &[Draw], indices: &[usize]) -> bool {
    let mut rewards = indices
        .iter()
        .map(|&index| &draws[index])
        .filter(|draw| draw.usable());
    match rewards.next() {
        Some(first) => rewards.any(|draw| draw.reward != first.reward),
        None => false,
    }
}

fn parallel_cost(draws: &[Draw]) -> (f64, f64) {
    let makespan = draws.iter().map(|draw| draw.duration).fold(0.0, f64::max);
    (makespan, draws.iter().map(|draw| draw.duration).sum())
}

fn fixed(draws: &[Draw], group_size: usize, drop_flat: bool) -> PromptRun {
    let launched = group_size.min(draws.len());
    let indices: Vec<usize> = (0..launched).collect();
    let admitted = !drop_flat || has_signal(draws, &indices);
    let (makespan, sandbox_seconds) = parallel_cost(&draws[..launched]);
    PromptRun {
        launched,
        selected: if admitted { indices } else { Vec::new() },
        admitted,
        selection: None,
        drop_reason: None,
        makespan,
        sandbox_seconds,
    }
}

fn pods(draws: &[Draw], group_size: usize) -> PromptRun {
    let launched = (2 * group_size).min(draws.len());
    let (makespan, sandbox_seconds) = parallel_cost(&draws[..launched]);
    let class = |keep: fn(&Draw) -> bool| -> Vec<usize> {
        (0..launched).filter(|&i| keep(&draws[i])).collect()
    };
    let positives = class(|draw| draw.positive());
    let negatives = class(|draw| draw.usable() && !draw.positive());
    let aborted = class(|draw| !draw.usable());
    let selected = if positives.len() + negatives.len() >= group_size {
        let low = group_size.saturating_sub(negatives.len());
        let high = group_size.min(positives.len());
        let half = group_size / 2;
        let n_plus = half.clamp(low, high.max(low));
        positives[..n_plus]
            .iter()
            .chain(&negatives[..group_size - n_plus])
            .copied()
            .collect()
    } else {
        let mut selected: Vec<usize> = positives.iter().chain(&negatives).copied().collect();
        let missing = group_size.saturating_sub(selected.len());
        selected.extend(aborted.iter().take(missing));
        selected
    };
    PromptRun {
        launched,
        selected,
        admitted: true,
        selection: None,
        drop_reason: None,
        makespan,
        sandbox_seconds,
    }
}

/// The trajectory name for draw `index`; names sort like indices.
fn trajectory_name(index: usize) -> String {
    format!("t{index:03}")
}

fn bar(params: &Params, draws: &[Draw]) -> PromptRun {
    let mut now = 0.0_f64;
    let mut launched = 0_usize;
    let mut pool: Vec<Trajectory> = Vec::new();
    let mut pool_index: Vec<usize> = Vec::new();
    // (finish time, start time, draw index), earliest first.
    let mut running: Vec<(f64, f64, usize)> = Vec::new();
    let mut sandbox_seconds = 0.0;
    loop {
        let progress = Progress {
            launched: launched as u32,
            terminal: &pool,
        };
        match next_step(params, &progress) {
            Step::LaunchStride { count, .. } => {
                let end = (launched + count as usize).min(draws.len());
                if end <= launched {
                    // Out of draws (never happens with `draws_needed` draws): give up on the prompt.
                    break;
                }
                running
                    .extend((launched..end).map(|index| (now + draws[index].duration, now, index)));
                running.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.cmp(&b.2)));
                launched = end;
            }
            Step::Wait => {
                if running.is_empty() {
                    break;
                }
                let (finish, start, index) = running.remove(0);
                now = finish;
                sandbox_seconds += finish - start;
                let draw = &draws[index];
                pool.push(Trajectory {
                    name: trajectory_name(index),
                    reward: draw.reward,
                    outcome: draw.outcome,
                    length: draw.length,
                });
                pool_index.push(index);
            }
            Step::Finish(decision) => {
                sandbox_seconds += running
                    .iter()
                    .map(|&(_, start, _)| now - start)
                    .sum::<f64>();
                let selected = decision
                    .group
                    .iter()
                    .filter_map(|member| {
                        pool.iter()
                            .position(|trajectory| trajectory.name == member.name)
                            .map(|position| pool_index[position])
                    })
                    .collect();
                return PromptRun {
                    launched,
                    selected,
                    admitted: decision.is_admitted(),
                    selection: Some(decision.selection),
                    drop_reason: decision.drop_reason,
                    makespan: now,
                    sandbox_seconds,
                };
            }
        }
    }
    PromptRun {
        launched,
        selected: Vec::new(),
        admitted: false,
        selection: Some(Selection::Dropped),
        drop_reason: Some(DropReason::TooFewTrajectories),
        makespan: now,
        sandbox_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outcome;

    fn draw(reward: f64, outcome: Outcome, length: u64) -> Draw {
        Draw {
            correct: reward > 0.0,
            outcome,
            reward,
            length,
            full_length: length,
            duration: length as f64,
        }
    }

    #[test]
    fn pods_keeps_the_most_balanced_subset() {
        use Outcome::{Aborted, Completed};
        // 3 positives, 13 negatives -> n+ = 3 (as close to 4 as possible).
        let mut draws: Vec<Draw> = (0..16)
            .map(|i| draw(if i < 3 { 1.0 } else { 0.0 }, Completed, 1))
            .collect();
        let run = pods(&draws, 8);
        assert_eq!(run.selected, [0, 1, 2, 3, 4, 5, 6, 7]);
        // 10 positives, 6 negatives -> n+ = 4.
        for (index, item) in draws.iter_mut().enumerate() {
            *item = draw(if index < 10 { 1.0 } else { 0.0 }, Completed, 1);
        }
        let run = pods(&draws, 8);
        assert_eq!(run.selected, [0, 1, 2, 3, 10, 11, 12, 13]);
        // 14 positives, 2 negatives -> n+ = 6.
        for (index, item) in draws.iter_mut().enumerate() {
            *item = draw(if index < 14 { 1.0 } else { 0.0 }, Completed, 1);
        }
        assert_eq!(
            pods(&draws, 8).selected.iter().filter(|&&i| i < 14).count(),
            6
        );
        // Only 5 usable: all of them plus 3 aborted.
        for (index, item) in draws.iter_mut().enumerate() {
            *item = draw(1.0, if index < 5 { Completed } else { Aborted }, 1);
        }
        assert_eq!(pods(&draws, 8).selected, [0, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn eager_bar_cancels_running_trajectories() {
        let params = Params {
            early_stop: EarlyStop::Eager,
            ..Params::paper_defaults()
        };
        // Alternating rewards, durations 1..=16: after 8 finishes (t = 8) n+ = 4 is feasible.
        let draws: Vec<Draw> = (0..16)
            .map(|i| {
                draw(
                    if i % 2 == 0 { 1.0 } else { 0.0 },
                    Outcome::Completed,
                    i as u64 + 1,
                )
            })
            .collect();
        let run = bar(&params, &draws);
        assert_eq!(run.selection, Some(Selection::Balanced));
        assert_eq!(run.selected.len(), 8);
        assert_eq!(run.makespan, 8.0);
        // Finished: 1 + ... + 8 = 36; eight cancelled at t = 8 after starting at 0: 64.
        assert_eq!(run.sandbox_seconds, 100.0);
        let boundary = bar(&Params::paper_defaults(), &draws);
        assert_eq!((boundary.makespan, boundary.sandbox_seconds), (16.0, 136.0));
        // The boundary ranks by length: the 4 shortest of each class.
        let mut selected = boundary.selected.clone();
        selected.sort_unstable();
        assert_eq!(selected, [0, 1, 2, 3, 4, 5, 6, 7]);
    }
}
