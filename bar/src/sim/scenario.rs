//! What is being simulated: prompt pass-rate distributions, trajectory outcomes (abort rate, duration
//! model) and the draws themselves, with common random numbers.
//!
//! Common random numbers: prompt i's pass rate comes from stream (seed, PROMPT, i) and its j-th trajectory
//! from stream (seed, TRAJECTORY, i, j). Neither stream depends on the method, so the j-th trajectory of
//! prompt i is the same draw (outcome, reward, length, duration) for every method; they do not depend on the
//! abort rate or duration model either, so cells differ only by how the same uniforms are transformed.

use serde::Serialize;

use super::rng::Xoshiro256;
use crate::Outcome;

const PROMPT_STREAM: u64 = 1;
const TRAJECTORY_STREAM: u64 = 2;

/// Responses longer than this many tokens are cut and reported as `truncated` (their reward is still the
/// drawn one: the grader scores what was produced, and correctness stays independent of length cuts).
pub const MAX_LENGTH: u64 = 4096;
/// Wall-clock seconds per generated token: durations are proportional to length.
pub const SECONDS_PER_TOKEN: f64 = 0.02;
/// Log-scale spread of response lengths.
pub const LENGTH_SIGMA: f64 = 0.5;

/// How prompts' pass rates p are distributed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PassRate {
    /// p ~ uniform(0, 1).
    Uniform,
    /// p ~ uniform(0, 0.5] (hard prompts).
    UniformLowHalf,
    /// p ~ Beta(a, b); Beta(0.5, 2) has mean 0.2 and mass near 0.
    Beta {
        /// First shape.
        a: f64,
        /// Second shape.
        b: f64,
    },
    /// With probability `unsolvable` p = 0, with probability `trivial` p = 1, else uniform(0, 1).
    Mixture {
        /// Share of prompts no trajectory solves.
        unsolvable: f64,
        /// Share of prompts every trajectory solves.
        trivial: f64,
    },
    /// Every prompt has this pass rate (for tests against closed forms).
    Fixed {
        /// The pass rate.
        p: f64,
    },
}

impl PassRate {
    /// The four distributions of docs/BAR.md's benchmark grid.
    pub fn standard_grid() -> Vec<PassRate> {
        vec![
            PassRate::Uniform,
            PassRate::UniformLowHalf,
            PassRate::Beta { a: 0.5, b: 2.0 },
            PassRate::Mixture {
                unsolvable: 0.2,
                trivial: 0.1,
            },
        ]
    }

    /// A short label for tables.
    pub fn label(&self) -> String {
        match self {
            PassRate::Uniform => "U(0,1)".to_string(),
            PassRate::UniformLowHalf => "U(0,0.5]".to_string(),
            PassRate::Beta { a, b } => format!("Beta({a},{b})"),
            PassRate::Mixture {
                unsolvable,
                trivial,
            } => format!(
                "mix {:.0}% p=0, {:.0}% p=1",
                unsolvable * 100.0,
                trivial * 100.0
            ),
            PassRate::Fixed { p } => format!("p={p}"),
        }
    }

    /// Prompt `prompt`'s pass rate under `seed`.
    pub fn sample(&self, seed: u64, prompt: u64) -> f64 {
        let mut rng = Xoshiro256::for_stream(seed, &[PROMPT_STREAM, prompt]);
        match *self {
            PassRate::Uniform => rng.uniform(),
            PassRate::UniformLowHalf => 0.5 * (1.0 - rng.uniform()),
            PassRate::Beta { a, b } => rng.beta(a, b),
            PassRate::Mixture {
                unsolvable,
                trivial,
            } => {
                let pick = rng.uniform();
                if pick < unsolvable {
                    0.0
                } else if pick < unsolvable + trivial {
                    1.0
                } else {
                    rng.uniform()
                }
            }
            PassRate::Fixed { p } => p,
        }
    }
}

/// How response length (and so duration) is distributed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DurationModel {
    /// Length ~ lognormal, median 1000 tokens, independent of correctness.
    Independent,
    /// Correct responses are shorter: median 600 tokens when correct, 1400 when not.
    CorrectShorter,
}

impl DurationModel {
    /// Median response length for a correct or incorrect response.
    pub fn median_length(self, correct: bool) -> f64 {
        match (self, correct) {
            (DurationModel::Independent, _) => 1000.0,
            (DurationModel::CorrectShorter, true) => 600.0,
            (DurationModel::CorrectShorter, false) => 1400.0,
        }
    }

    /// A short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            DurationModel::Independent => "independent",
            DurationModel::CorrectShorter => "correct-shorter",
        }
    }
}

/// One grid cell: a pass-rate distribution, an abort rate and a duration model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cell {
    /// Prompt pass rates.
    pub pass_rate: PassRate,
    /// Probability that a trajectory aborts (crash or time-out), independent of everything else.
    pub abort_rate: f64,
    /// Lengths and durations.
    pub durations: DurationModel,
}

/// One simulated trajectory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// The grader would accept it (only meaningful when not aborted).
    pub correct: bool,
    /// completed, truncated (length cut at [`MAX_LENGTH`]) or aborted.
    pub outcome: Outcome,
    /// 1 when correct and not aborted, else 0.
    pub reward: f64,
    /// Tokens produced (an aborted run reports what it produced before dying).
    pub length: u64,
    /// The length the response would have had without the abort (used for the length-bias baseline).
    pub full_length: u64,
    /// Seconds from launch to terminal.
    pub duration: f64,
}

impl Draw {
    /// Completed or truncated.
    pub fn usable(&self) -> bool {
        self.outcome.is_usable()
    }

    /// Usable with reward > 0.
    pub fn positive(&self) -> bool {
        self.usable() && self.reward > 0.0
    }

    /// The j-th trajectory of `prompt` with pass rate `pass_rate` in `cell`.
    ///
    /// The stream is consumed in a fixed order (abort, correctness, two normals' uniforms, abort point) so
    /// the same uniforms drive every cell: an aborted trajectory in a cell with a higher abort rate is the
    /// same response cut short.
    pub fn sample(seed: u64, prompt: u64, index: u64, pass_rate: f64, cell: &Cell) -> Draw {
        let mut rng = Xoshiro256::for_stream(seed, &[TRAJECTORY_STREAM, prompt, index]);
        let aborted = rng.uniform() < cell.abort_rate;
        let correct = rng.uniform() < pass_rate;
        let z = rng.normal();
        let abort_point = rng.uniform();
        let drawn = (cell.durations.median_length(correct).ln() + LENGTH_SIGMA * z).exp();
        let full_length = (drawn.round() as u64).clamp(1, MAX_LENGTH);
        let truncated = drawn > MAX_LENGTH as f64;
        let (outcome, length) = if aborted {
            let produced = (full_length as f64 * abort_point).floor() as u64;
            (Outcome::Aborted, produced)
        } else if truncated {
            (Outcome::Truncated, full_length)
        } else {
            (Outcome::Completed, full_length)
        };
        let reward = if correct && !aborted { 1.0 } else { 0.0 };
        Draw {
            correct,
            outcome,
            reward,
            length,
            full_length,
            duration: length.max(1) as f64 * SECONDS_PER_TOKEN,
        }
    }

    /// The first `count` draws of `prompt`.
    pub fn sample_prompt(
        seed: u64,
        prompt: u64,
        count: usize,
        pass_rate: f64,
        cell: &Cell,
    ) -> Vec<Draw> {
        (0..count as u64)
            .map(|index| Draw::sample(seed, prompt, index, pass_rate, cell))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(abort_rate: f64, durations: DurationModel) -> Cell {
        Cell {
            pass_rate: PassRate::Uniform,
            abort_rate,
            durations,
        }
    }

    #[test]
    fn draws_share_uniforms_across_cells() {
        for index in 0..200 {
            let clean = Draw::sample(3, 9, index, 0.4, &cell(0.0, DurationModel::Independent));
            let aborting = Draw::sample(3, 9, index, 0.4, &cell(0.2, DurationModel::Independent));
            let skewed = Draw::sample(3, 9, index, 0.4, &cell(0.0, DurationModel::CorrectShorter));
            assert_eq!(clean.correct, aborting.correct);
            assert_eq!(clean.correct, skewed.correct);
            if aborting.outcome == Outcome::Aborted {
                assert!(aborting.length <= clean.length && aborting.reward == 0.0);
            } else {
                assert_eq!(clean, aborting);
            }
            assert!(clean.usable());
            assert!((clean.duration - clean.length as f64 * SECONDS_PER_TOKEN).abs() < 1e-9);
        }
    }

    #[test]
    fn pass_rates_stay_in_range() {
        for prompt in 0..2000 {
            for distribution in PassRate::standard_grid() {
                let p = distribution.sample(5, prompt);
                assert!((0.0..=1.0).contains(&p), "{distribution:?}: {p}");
                if distribution == PassRate::UniformLowHalf {
                    assert!(p > 0.0 && p <= 0.5);
                }
            }
        }
        assert_eq!(PassRate::Fixed { p: 0.3 }.sample(1, 1), 0.3);
    }
}
