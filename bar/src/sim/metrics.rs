//! Per-method metrics over the prompts of one cell, "per admitted group" as docs/BAR.md asks: costs are summed
//! over every prompt (dropped ones included) and divided by the number of admitted groups.

use serde::Serialize;

use super::methods::{PromptRun, has_signal};
use super::scenario::Draw;
use crate::{DropReason, Selection};

/// Running sums for one method in one cell.
#[derive(Debug, Clone, Default)]
pub struct Accumulator {
    prompts: u64,
    admitted: u64,
    launched: u64,
    with_signal: u64,
    imbalance_sum: f64,
    makespan_sum: f64,
    sandbox_seconds_sum: f64,
    selections: [u64; 4],
    dropped_for_backfill: u64,
    selected_length_sum: f64,
    selected_count: u64,
    launched_length_sum: [f64; 2],
    launched_count: [u64; 2],
    // Per-prompt selected lengths by class, resolved against the cell's class means in `summary`.
    selected_class_length_sum: [f64; 2],
    selected_class_count: [u64; 2],
}

/// The metrics of one method in one cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    /// Prompts simulated.
    pub prompts: u64,
    /// Prompts whose group reached the trainer.
    pub admitted: u64,
    /// `admitted / prompts`.
    pub admitted_share: f64,
    /// Trajectories launched over all prompts / admitted groups.
    pub launched_per_admitted: Option<f64>,
    /// Admitted groups whose usable rewards are not all equal / admitted groups.
    pub nonzero_variance_share: Option<f64>,
    /// Mean over admitted groups of |k/N - 1/2|, k = positive members.
    pub mean_imbalance: Option<f64>,
    /// Mean wall-clock seconds per prompt (admitted or not), s parallel sandboxes per stride.
    pub makespan_mean_seconds: f64,
    /// Wall-clock seconds over all prompts / admitted groups (prompts run one after another).
    pub makespan_per_admitted_seconds: Option<f64>,
    /// Sandbox-seconds over all prompts (cancelled sandboxes until cancellation) / admitted groups.
    pub sandbox_seconds_per_admitted: Option<f64>,
    /// Shares of prompts per BAR selection (Balanced, Relaxed, TopRanked, Dropped); `None` for methods
    /// without selections (DAPO's drops show in `admitted_share`).
    pub path_mix: Option<PathMix>,
    /// Mean length of selected usable members / mean length of every launched usable trajectory
    /// (cancelled ones at the length they would have had). Below 1: selection favours short responses.
    pub length_ratio: Option<f64>,
    /// The same, class by class: selected members' lengths / the mean launched length of their class
    /// (positive or negative), so a different class mix does not count as bias.
    pub length_ratio_within_class: Option<f64>,
}

/// Shares of prompts by BAR selection.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PathMix {
    /// `Balanced`.
    pub balanced: f64,
    /// `Relaxed`.
    pub relaxed: f64,
    /// `TopRanked`.
    pub top_ranked: f64,
    /// `Dropped`.
    pub dropped: f64,
    /// `Dropped` for too much backfill (part of `dropped`; the rest is zero variance).
    pub dropped_for_backfill: f64,
}

fn class_of(draw: &Draw) -> usize {
    usize::from(draw.positive())
}

fn ratio(numerator: f64, denominator: f64) -> Option<f64> {
    (denominator > 0.0).then(|| numerator / denominator)
}

impl Accumulator {
    /// Adds one prompt's run; `draws` are that prompt's draws, `group_size` is N.
    pub fn add(&mut self, run: &PromptRun, draws: &[Draw], group_size: u32) {
        self.prompts += 1;
        self.launched += run.launched as u64;
        self.makespan_sum += run.makespan;
        self.sandbox_seconds_sum += run.sandbox_seconds;
        if let Some(selection) = run.selection {
            let slot = match selection {
                Selection::Balanced => 0,
                Selection::Relaxed => 1,
                Selection::TopRanked => 2,
                Selection::Dropped => 3,
            };
            self.selections[slot] += 1;
        }
        if run.drop_reason == Some(DropReason::TooMuchBackfill) {
            self.dropped_for_backfill += 1;
        }
        for draw in draws[..run.launched].iter().filter(|draw| draw.usable()) {
            // Usable draws never abort, so `length` is the full length even for cancelled ones.
            self.launched_length_sum[class_of(draw)] += draw.full_length as f64;
            self.launched_count[class_of(draw)] += 1;
        }
        if !run.admitted {
            return;
        }
        self.admitted += 1;
        if has_signal(draws, &run.selected) {
            self.with_signal += 1;
        }
        let positives = run
            .selected
            .iter()
            .filter(|&&index| draws[index].positive())
            .count();
        self.imbalance_sum += (positives as f64 / f64::from(group_size.max(1)) - 0.5).abs();
        for draw in run
            .selected
            .iter()
            .map(|&index| &draws[index])
            .filter(|draw| draw.usable())
        {
            self.selected_length_sum += draw.length as f64;
            self.selected_count += 1;
            self.selected_class_length_sum[class_of(draw)] += draw.length as f64;
            self.selected_class_count[class_of(draw)] += 1;
        }
    }

    /// The metrics so far.
    pub fn summary(&self) -> Summary {
        let admitted = self.admitted as f64;
        let prompts = self.prompts.max(1) as f64;
        let launched_mean = |class: usize| {
            ratio(
                self.launched_length_sum[class],
                self.launched_count[class] as f64,
            )
        };
        let all_launched = ratio(
            self.launched_length_sum.iter().sum(),
            self.launched_count.iter().sum::<u64>() as f64,
        );
        let selected_mean = ratio(self.selected_length_sum, self.selected_count as f64);
        let expected_within: f64 = (0..2)
            .map(|class| {
                self.selected_class_count[class] as f64 * launched_mean(class).unwrap_or(0.0)
            })
            .sum();
        let path_mix = (self.selections.iter().sum::<u64>() > 0).then(|| PathMix {
            balanced: self.selections[0] as f64 / prompts,
            relaxed: self.selections[1] as f64 / prompts,
            top_ranked: self.selections[2] as f64 / prompts,
            dropped: self.selections[3] as f64 / prompts,
            dropped_for_backfill: self.dropped_for_backfill as f64 / prompts,
        });
        Summary {
            prompts: self.prompts,
            admitted: self.admitted,
            admitted_share: admitted / prompts,
            launched_per_admitted: ratio(self.launched as f64, admitted),
            nonzero_variance_share: ratio(self.with_signal as f64, admitted),
            mean_imbalance: ratio(self.imbalance_sum, admitted),
            makespan_mean_seconds: self.makespan_sum / prompts,
            makespan_per_admitted_seconds: ratio(self.makespan_sum, admitted),
            sandbox_seconds_per_admitted: ratio(self.sandbox_seconds_sum, admitted),
            path_mix,
            length_ratio: selected_mean
                .zip(all_launched)
                .and_then(|(selected, all)| ratio(selected, all)),
            length_ratio_within_class: ratio(
                self.selected_class_length_sum.iter().sum(),
                expected_within,
            ),
        }
    }
}
