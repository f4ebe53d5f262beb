//! Trajectory retries in the simulator: what the operator's `retry.onOOM` does to the draws BAR sees.
//!
//! The operator runs a trajectory whose attempt ran out of memory again under the same name (with
//! more memory) and reports one outcome per trajectory, its last attempt's; BAR never sees the failed
//! attempts. [`with_retries`] applies that to a prompt's draws: each attempt of trajectory j is
//! OOM-killed with probability `rate`, drawn from a stream of its own, (seed, OOM, prompt, j), so the
//! draws themselves stay the common random numbers of every method; a killed attempt costs the part of
//! the run it got through and is tried again, up to `max_attempts`. An attempt that survives is the
//! draw itself (more memory changes whether the task had room, not what it answers); a trajectory
//! whose every attempt was killed is aborted, as the operator records it (`OOMKilled`, backfill).
//!
//! The claim the tests check: when retries succeed, a StrideBoundary group is exactly the group BAR
//! selects without any OOM kill (same selection, members, positives, trajectories launched), prompt
//! by prompt; only the time and the sandbox-seconds grow. An Eager group launches the same and is
//! selected the same way, but which members it takes may change, since retries change which
//! trajectories finish first. Without retries (one attempt), the same kills become backfill and the
//! statistics shift.

use super::rng::Xoshiro256;
use super::scenario::Draw;
use crate::Outcome;

const OOM_STREAM: u64 = 3;

/// How attempts run out of memory and how often they are tried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OomModel {
    /// Probability that one attempt is OOM-killed, independently of everything else.
    pub rate: f64,
    /// Attempts per trajectory, the first one included (`retry.maxAttempts`; 1: no retries).
    pub max_attempts: u32,
}

/// `draws` of `prompt` under `seed` as a retrying operator reports them, and how many trajectories
/// used up their attempts.
pub fn with_retries(draws: &[Draw], model: &OomModel, seed: u64, prompt: u64) -> (Vec<Draw>, u32) {
    let mut exhausted = 0;
    let reported = draws
        .iter()
        .enumerate()
        .map(|(index, draw)| {
            let mut rng = Xoshiro256::for_stream(seed, &[OOM_STREAM, prompt, index as u64]);
            let mut lost = 0.0;
            for _ in 0..model.max_attempts.max(1) {
                let killed = rng.uniform() < model.rate;
                let point = rng.uniform();
                if !killed {
                    return Draw {
                        duration: lost + draw.duration,
                        ..*draw
                    };
                }
                lost += draw.duration * point;
            }
            exhausted += 1;
            Draw {
                outcome: Outcome::Aborted,
                reward: 0.0,
                length: 0,
                duration: lost,
                ..*draw
            }
        })
        .collect();
    (reported, exhausted)
}

#[cfg(test)]
mod tests {
    use super::super::methods::{Method, PromptRun, run_prompt};
    use super::super::scenario::{Cell, DurationModel, PassRate};
    use super::*;
    use crate::{EarlyStop, Params, Selection};

    const SEED: u64 = 20_240_601;
    const PROMPTS: u64 = 3_000;

    fn cell() -> Cell {
        Cell {
            pass_rate: PassRate::Uniform,
            abort_rate: 0.05,
            durations: DurationModel::CorrectShorter,
        }
    }

    fn positives(run: &PromptRun, draws: &[Draw]) -> usize {
        run.selected
            .iter()
            .filter(|&&i| draws[i].positive())
            .count()
    }

    /// Per prompt: the run without OOM kills, the run with them under `model`, the draws each saw,
    /// and whether a trajectory of the prompt used up its attempts.
    fn runs(method: Method, model: &OomModel) -> Vec<(PromptRun, PromptRun, Vec<Draw>, bool)> {
        let params = Params::paper_defaults();
        let needed = method.draws_needed(&params);
        (0..PROMPTS)
            .map(|prompt| {
                let cell = cell();
                let p = cell.pass_rate.sample(SEED, prompt);
                let draws = Draw::sample_prompt(SEED, prompt, needed, p, &cell);
                let (reported, exhausted) = with_retries(&draws, model, SEED, prompt);
                (
                    run_prompt(method, &params, &draws),
                    run_prompt(method, &params, &reported),
                    reported,
                    exhausted > 0,
                )
            })
            .collect()
    }

    /// How many admitted groups have k positives, k = 0..=N.
    fn histogram(runs: &[(PromptRun, PromptRun, Vec<Draw>, bool)], retried: bool) -> Vec<usize> {
        let mut counts = vec![0; 9];
        for (clean, with_kills, reported, _) in runs {
            let run = if retried { with_kills } else { clean };
            if run.admitted {
                counts[positives(run, reported)] += 1;
            }
        }
        counts
    }

    #[test]
    fn retries_that_succeed_leave_stride_boundary_groups_unchanged() {
        let model = OomModel {
            rate: 0.25,
            max_attempts: 10,
        };
        for stride in [16, 8, 4] {
            let method = Method::Bar {
                stride,
                early_stop: EarlyStop::StrideBoundary,
            };
            let runs = runs(method, &model);
            let exhausted = runs.iter().filter(|r| r.3).count();
            assert_eq!(
                exhausted, 0,
                "no trajectory used up 10 attempts (seed {SEED})"
            );
            let mut slower = 0;
            for (prompt, (clean, retried, _, _)) in runs.iter().enumerate() {
                assert_eq!(
                    retried.selection, clean.selection,
                    "s={stride} prompt {prompt}"
                );
                assert_eq!(
                    retried.selected, clean.selected,
                    "s={stride} prompt {prompt}"
                );
                assert_eq!(
                    retried.launched, clean.launched,
                    "s={stride} prompt {prompt}"
                );
                assert!(retried.makespan >= clean.makespan);
                assert!(retried.sandbox_seconds >= clean.sandbox_seconds);
                slower += usize::from(retried.makespan > clean.makespan);
            }
            assert_eq!(
                histogram(&runs, true),
                histogram(&runs, false),
                "s={stride}"
            );
            assert!(
                slower > runs.len() / 2,
                "retries cost time ({slower} of {} prompts slower)",
                runs.len()
            );
        }
    }

    #[test]
    fn retries_that_succeed_leave_eager_launches_and_selections_unchanged() {
        let model = OomModel {
            rate: 0.25,
            max_attempts: 10,
        };
        let method = Method::Bar {
            stride: 16,
            early_stop: EarlyStop::Eager,
        };
        let bounds = Params::paper_defaults().bounds();
        let mut other_members = 0;
        for (clean, retried, reported, exhausted) in runs(method, &model) {
            assert!(!exhausted);
            assert_eq!(retried.launched, clean.launched);
            assert_eq!(retried.selection, clean.selection);
            assert_eq!(retried.admitted, clean.admitted);
            if retried.selection == Some(Selection::Balanced) {
                let k = positives(&retried, &reported) as u32;
                assert!((bounds.n_min..=bounds.n_max).contains(&k));
            }
            other_members += usize::from(retried.selected != clean.selected);
        }
        // Eager takes the first to finish, and retries change who that is.
        assert!(other_members > 0, "Eager's members depend on timing");
    }

    #[test]
    fn without_retries_the_same_kills_become_backfill_and_shift_the_groups() {
        let once = OomModel {
            rate: 0.25,
            max_attempts: 1,
        };
        let method = Method::Bar {
            stride: 16,
            early_stop: EarlyStop::StrideBoundary,
        };
        let runs = runs(method, &once);
        let lost = runs.iter().filter(|r| r.3).count();
        assert!(
            lost > runs.len() / 2,
            "most prompts lose a trajectory ({lost})"
        );
        let changed = runs
            .iter()
            .filter(|(clean, killed, _, _)| killed.selected != clean.selected)
            .count();
        assert!(changed > 0, "lost trajectories change groups");
        let admitted = |retried: bool| {
            runs.iter()
                .filter(|(clean, killed, _, _)| {
                    if retried {
                        killed.admitted
                    } else {
                        clean.admitted
                    }
                })
                .count()
        };
        assert!(
            admitted(true) < admitted(false),
            "fewer groups reach the trainer: {} of {} against {}",
            admitted(true),
            runs.len(),
            admitted(false)
        );
        assert_ne!(histogram(&runs, true), histogram(&runs, false));
    }

    #[test]
    fn a_retried_trajectory_is_its_draw_with_the_lost_time_added() {
        let draw = Draw {
            correct: true,
            outcome: Outcome::Completed,
            reward: 1.0,
            length: 100,
            full_length: 100,
            duration: 2.0,
        };
        let never = OomModel {
            rate: 0.0,
            max_attempts: 3,
        };
        assert_eq!(with_retries(&[draw], &never, 1, 1), (vec![draw], 0));
        let always = OomModel {
            rate: 1.0,
            max_attempts: 3,
        };
        let (reported, exhausted) = with_retries(&[draw], &always, 1, 1);
        assert_eq!(exhausted, 1);
        assert_eq!(reported[0].outcome, Outcome::Aborted);
        assert_eq!(reported[0].reward, 0.0);
        assert!(reported[0].duration > 0.0 && reported[0].duration < 3.0 * 2.0);
        let half = OomModel {
            rate: 0.5,
            max_attempts: 50,
        };
        let draws = vec![draw; 200];
        let (reported, exhausted) = with_retries(&draws, &half, 7, 3);
        assert_eq!(exhausted, 0);
        assert!(
            reported
                .iter()
                .all(|r| r.outcome == draw.outcome && r.reward == 1.0)
        );
        assert!(reported.iter().all(|r| r.duration >= draw.duration));
        assert!(reported.iter().any(|r| r.duration > draw.duration));
    }
}
