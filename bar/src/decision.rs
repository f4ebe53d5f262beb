//! The outcome of a group: which selection path produced it, its N members, and the group filter applied
//! on top (docs/BAR.md, schedule steps 2, 4, 5 and 6).

use super::assemble::{top_ranked, try_assemble_ranked};
use super::filter::{DropReason, drop_reason};
use super::params::{Params, bounds};
use super::rank::{Member, RankedPool, Trajectory};

/// How a group was selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selection {
    /// `TryAssemble(n_min, n_max)` succeeded.
    Balanced,
    /// The budget was spent; `TryAssemble(1, N - 1)` succeeded.
    Relaxed,
    /// The budget was spent and nothing else fitted: the N best of the pool.
    TopRanked,
    /// The group filter (or a pool smaller than N) rejected the group; the trainer replaces it.
    Dropped,
}

impl Selection {
    /// The spelling used in `status.selection`.
    pub fn as_str(self) -> &'static str {
        match self {
            Selection::Balanced => "Balanced",
            Selection::Relaxed => "Relaxed",
            Selection::TopRanked => "TopRanked",
            Selection::Dropped => "Dropped",
        }
    }
}

/// The final answer for a group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupDecision {
    /// The path that produced the group, or `Dropped`.
    pub selection: Selection,
    /// Exactly N members in rank order, unless `Dropped` (then empty).
    pub group: Vec<Member>,
    /// n+: positive members of `group` (0 when dropped).
    pub positives: u32,
    /// Set exactly when `selection` is `Dropped`.
    pub drop_reason: Option<DropReason>,
}

impl GroupDecision {
    /// A dropped group.
    pub fn dropped(reason: DropReason) -> GroupDecision {
        GroupDecision {
            selection: Selection::Dropped,
            group: Vec::new(),
            positives: 0,
            drop_reason: Some(reason),
        }
    }

    /// `group` under `selection` after the group filter of `params`.
    fn filtered(params: &Params, selection: Selection, group: Vec<Member>) -> GroupDecision {
        if let Some(reason) = drop_reason(&params.filter, &group) {
            return GroupDecision::dropped(reason);
        }
        let positives = group.iter().filter(|member| member.positive).count();
        GroupDecision {
            selection,
            positives: u32::try_from(positives).unwrap_or(u32::MAX),
            group,
            drop_reason: None,
        }
    }

    /// Whether the trainer receives a group (anything but `Dropped`).
    pub fn is_admitted(&self) -> bool {
        self.selection != Selection::Dropped
    }
}

/// Step 2: `TryAssemble(n_min, n_max)` and, when feasible, the filtered `Balanced` decision.
pub fn decide_balanced(params: &Params, pool: &[Trajectory]) -> Option<GroupDecision> {
    balanced(params, &RankedPool::new(pool))
}

fn balanced(params: &Params, ranked: &RankedPool<'_>) -> Option<GroupDecision> {
    let bounds = bounds(params);
    try_assemble_ranked(params, ranked, bounds.n_min, bounds.n_max)
        .map(|(group, _)| GroupDecision::filtered(params, Selection::Balanced, group))
}

/// The decision once no more trajectories will be launched: `Balanced`, else `Relaxed`
/// (`TryAssemble(1, N - 1)`), else `TopRanked`, then the group filter. A pool with fewer than N
/// trajectories is dropped (`Empty` or `TooFewTrajectories`), filter or not.
pub fn decide(params: &Params, pool: &[Trajectory]) -> GroupDecision {
    let ranked = RankedPool::new(pool);
    if let Some(decision) = balanced(params, &ranked) {
        return decision;
    }
    let relaxed_max = params.group_size.saturating_sub(1);
    if let Some((group, _)) = try_assemble_ranked(params, &ranked, 1, relaxed_max) {
        return GroupDecision::filtered(params, Selection::Relaxed, group);
    }
    match top_ranked(params, pool) {
        Some(group) => GroupDecision::filtered(params, Selection::TopRanked, group),
        None if pool.is_empty() => GroupDecision::dropped(DropReason::Empty),
        None => GroupDecision::dropped(DropReason::TooFewTrajectories),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fraction::Fraction;
    use crate::rank::Outcome;

    fn pool(spec: &[(f64, Outcome)]) -> Vec<Trajectory> {
        spec.iter()
            .enumerate()
            .map(|(index, &(reward, outcome))| Trajectory {
                name: format!("t{index:02}"),
                reward,
                outcome,
                length: 100 - index as u64,
            })
            .collect()
    }

    fn repeat(count: usize, reward: f64, outcome: Outcome) -> Vec<(f64, Outcome)> {
        vec![(reward, outcome); count]
    }

    #[test]
    fn balanced_relaxed_top_ranked_and_dropped() {
        use Outcome::{Aborted, Completed};
        let params = Params::paper_defaults();
        let balanced = pool(&[repeat(4, 1.0, Completed), repeat(12, 0.0, Completed)].concat());
        let decision = decide(&params, &balanced);
        assert_eq!(
            (decision.selection, decision.positives, decision.group.len()),
            (Selection::Balanced, 4, 8)
        );

        let relaxed = pool(&[repeat(1, 1.0, Completed), repeat(15, 0.0, Completed)].concat());
        let decision = decide(&params, &relaxed);
        assert_eq!(
            (decision.selection, decision.positives, decision.group.len()),
            (Selection::Relaxed, 1, 8)
        );

        // 3 positives, 2 negatives, 11 aborted: no usable group of 8; top ranked = 5 usable + 3 backfill.
        let top = pool(
            &[
                repeat(3, 1.0, Completed),
                repeat(2, 0.0, Completed),
                repeat(11, 0.0, Aborted),
            ]
            .concat(),
        );
        let decision = decide(&params, &top);
        assert_eq!(
            (decision.selection, decision.positives, decision.group.len()),
            (Selection::TopRanked, 3, 8)
        );

        // Same with 4 usable -> 4 backfill = max_backfill (kept); with 3 usable -> 5 backfill (dropped).
        let four = pool(
            &[
                repeat(2, 1.0, Completed),
                repeat(2, 0.0, Completed),
                repeat(12, 0.0, Aborted),
            ]
            .concat(),
        );
        assert_eq!(decide(&params, &four).selection, Selection::TopRanked);
        let three = pool(
            &[
                repeat(2, 1.0, Completed),
                repeat(1, 0.0, Completed),
                repeat(13, 0.0, Aborted),
            ]
            .concat(),
        );
        assert_eq!(
            decide(&params, &three).drop_reason,
            Some(DropReason::TooMuchBackfill)
        );

        let all_wrong = pool(&repeat(16, 0.0, Completed));
        let decision = decide(&params, &all_wrong);
        assert_eq!(decision, GroupDecision::dropped(DropReason::ZeroVariance));
        assert!(decision.group.is_empty() && !decision.is_admitted());

        let mut unfiltered = params.clone();
        unfiltered.filter.enabled = false;
        let decision = decide(&unfiltered, &all_wrong);
        assert_eq!(
            (decision.selection, decision.group.len()),
            (Selection::TopRanked, 8)
        );
    }

    #[test]
    fn balanced_groups_are_filtered_too() {
        let mut params = Params::paper_defaults();
        params.positive_min = Fraction::ZERO;
        params.positive_max = Fraction::new(1, 4).expect("non-zero");
        // n_min = 0, n_max = 2, n* = 1; an all-negative pool assembles n+ = 0, which has zero variance.
        let all_wrong = pool(&repeat(8, 0.0, Outcome::Completed));
        assert_eq!(
            decide_balanced(&params, &all_wrong),
            Some(GroupDecision::dropped(DropReason::ZeroVariance))
        );
        // Distinct negative rewards carry variance: kept as Balanced with n+ = 0.
        let mut graded = all_wrong.clone();
        graded[0].reward = -1.0;
        let decision = decide_balanced(&params, &graded).expect("feasible");
        assert_eq!(
            (decision.selection, decision.positives),
            (Selection::Balanced, 0)
        );
    }

    #[test]
    fn small_pools_are_dropped_whatever_the_filter() {
        let mut params = Params::paper_defaults();
        params.filter.enabled = false;
        assert_eq!(
            decide(&params, &[]),
            GroupDecision::dropped(DropReason::Empty)
        );
        let few = pool(&repeat(3, 1.0, Outcome::Completed));
        assert_eq!(
            decide(&params, &few),
            GroupDecision::dropped(DropReason::TooFewTrajectories)
        );
    }
}
