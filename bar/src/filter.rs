//! The group filter (docs/BAR.md, schedule step 6): which assembled groups carry no learning signal and are
//! dropped. It applies to every selection, `Balanced` included (with `n_min = 0` a balanced group can be
//! all negative).

use super::params::GroupFilter;
use super::rank::Member;

/// Why a group was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// All usable members have exactly the same reward (or there are fewer than two usable members):
    /// per-group advantages would all be zero.
    ZeroVariance,
    /// More backfill (aborted) members than `filter.max_backfill`.
    TooMuchBackfill,
    /// The pool had no trajectories at all.
    Empty,
    /// The pool had some trajectories but fewer than N, so no group of exactly N exists. Only reachable
    /// when the controller reports fewer terminal trajectories than it launched with nothing running.
    TooFewTrajectories,
}

impl DropReason {
    /// A CamelCase reason for status and events.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::ZeroVariance => "ZeroVariance",
            DropReason::TooMuchBackfill => "TooMuchBackfill",
            DropReason::Empty => "Empty",
            DropReason::TooFewTrajectories => "TooFewTrajectories",
        }
    }
}

/// Whether the usable members' rewards are not all exactly equal (`0.0 == -0.0`; NaN counts as equal to
/// NaN so that a NaN never manufactures variance). Backfill members are ignored.
pub fn has_reward_variance(group: &[Member]) -> bool {
    let mut usable = group.iter().filter(|member| member.outcome.is_usable());
    let Some(first) = usable.next() else {
        return false;
    };
    usable.any(|member| !same_reward(member.reward, first.reward))
}

fn same_reward(a: f64, b: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan())
}

/// The reason `filter` drops `group`, checked in docs/BAR.md's order (zero variance first, then backfill);
/// `None` keeps it. A disabled filter keeps every group.
pub fn drop_reason(filter: &GroupFilter, group: &[Member]) -> Option<DropReason> {
    if !filter.enabled {
        return None;
    }
    if !has_reward_variance(group) {
        return Some(DropReason::ZeroVariance);
    }
    let backfill = group
        .iter()
        .filter(|member| !member.outcome.is_usable())
        .count();
    if backfill > filter.max_backfill as usize {
        return Some(DropReason::TooMuchBackfill);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::Outcome;

    fn member(reward: f64, outcome: Outcome) -> Member {
        Member {
            name: "m".to_string(),
            reward,
            outcome,
            length: 1,
            positive: outcome.is_usable() && reward > 0.0,
        }
    }

    #[test]
    fn variance_ignores_backfill() {
        use Outcome::{Aborted, Completed, Truncated};
        assert!(!has_reward_variance(&[]));
        assert!(!has_reward_variance(&[member(1.0, Completed)]));
        assert!(!has_reward_variance(&[
            member(0.0, Completed),
            member(-0.0, Truncated)
        ]));
        assert!(!has_reward_variance(&[
            member(0.0, Completed),
            member(1.0, Aborted)
        ]));
        assert!(has_reward_variance(&[
            member(0.0, Completed),
            member(0.5, Truncated)
        ]));
        assert!(has_reward_variance(&[
            member(0.0, Completed),
            member(-1.0, Completed)
        ]));
        assert!(!has_reward_variance(&[
            member(f64::NAN, Completed),
            member(f64::NAN, Completed)
        ]));
        assert!(has_reward_variance(&[
            member(f64::NAN, Completed),
            member(0.0, Completed)
        ]));
    }

    #[test]
    fn drops_in_order_and_only_when_enabled() {
        use Outcome::{Aborted, Completed};
        let filter = GroupFilter {
            enabled: true,
            max_backfill: 1,
        };
        let flat = [
            member(0.0, Completed),
            member(0.0, Completed),
            member(1.0, Aborted),
        ];
        assert_eq!(drop_reason(&filter, &flat), Some(DropReason::ZeroVariance));
        let mixed = [
            member(0.0, Completed),
            member(1.0, Completed),
            member(1.0, Aborted),
        ];
        assert_eq!(drop_reason(&filter, &mixed), None);
        let aborted = [
            member(0.0, Completed),
            member(1.0, Completed),
            member(1.0, Aborted),
            member(1.0, Aborted),
        ];
        assert_eq!(
            drop_reason(&filter, &aborted),
            Some(DropReason::TooMuchBackfill)
        );
        let disabled = GroupFilter {
            enabled: false,
            max_backfill: 0,
        };
        assert_eq!(drop_reason(&disabled, &flat), None);
        assert_eq!(drop_reason(&disabled, &aborted), None);
    }
}
