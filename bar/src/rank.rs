//! Trajectories, their classes (positive, negative, backfill) and the one total ranking every selection
//! uses (docs/BAR.md, "Classes and ranking").
//!
//! The rank key is (status: completed < truncated < aborted, length ascending, name ascending). Names are
//! unique in practice (the controller derives them from the group); a final tie-break on the reward's
//! total order (`f64::total_cmp`) makes the order total even for duplicates, so shuffled input always gives
//! identical output.

use std::cmp::Ordering;

/// How a trajectory ended. The declaration order is the rank order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Ran to the end and was scored.
    Completed,
    /// Hit a length limit but was scored.
    Truncated,
    /// Crashed, produced no valid result, or timed out: backfill only.
    Aborted,
}

impl Outcome {
    /// The spelling used in trajectory results (`completed`, `truncated`, `aborted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Truncated => "truncated",
            Outcome::Aborted => "aborted",
        }
    }

    /// Completed and truncated trajectories are usable (they count as positive or negative).
    pub fn is_usable(self) -> bool {
        self != Outcome::Aborted
    }
}

/// One terminal trajectory as the controller reports it.
///
/// `reward` is never NaN in practice (the controller rejects such results); the engine still accepts any
/// `f64` without panicking and treats NaN as non-positive.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    /// Stable, unique name (the Sandbox name); the last ranking key.
    pub name: String,
    /// The reward; positive means `> 0`.
    pub reward: f64,
    /// How it ended.
    pub outcome: Outcome,
    /// Response tokens or steps; shorter ranks first.
    pub length: u64,
}

/// The class of a terminal trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Usable with reward > 0 (T+).
    Positive,
    /// Usable with reward <= 0, or NaN (T-).
    Negative,
    /// Aborted: never counts as positive or negative.
    Backfill,
}

/// The class of `trajectory`.
pub fn classify(trajectory: &Trajectory) -> Class {
    if !trajectory.outcome.is_usable() {
        Class::Backfill
    } else if trajectory.reward > 0.0 {
        Class::Positive
    } else {
        Class::Negative
    }
}

/// The total rank order: status, then length ascending, then name ascending, then reward (`total_cmp`).
pub fn rank_order(a: &Trajectory, b: &Trajectory) -> Ordering {
    a.outcome
        .cmp(&b.outcome)
        .then(a.length.cmp(&b.length))
        .then_with(|| a.name.cmp(&b.name))
        .then_with(|| a.reward.total_cmp(&b.reward))
}

/// The whole pool in rank order (usable first, backfill last, because the status leads the key).
pub fn rank(pool: &[Trajectory]) -> Vec<&Trajectory> {
    let mut ranked: Vec<&Trajectory> = pool.iter().collect();
    ranked.sort_by(|a, b| rank_order(a, b));
    ranked
}

/// A pool split into its classes, each in rank order.
#[derive(Debug, Clone, Default)]
pub struct RankedPool<'a> {
    /// T+, best first.
    pub positives: Vec<&'a Trajectory>,
    /// T-, best first.
    pub negatives: Vec<&'a Trajectory>,
    /// Aborted trajectories, best first.
    pub backfill: Vec<&'a Trajectory>,
}

impl<'a> RankedPool<'a> {
    /// Classifies and ranks `pool`.
    pub fn new(pool: &'a [Trajectory]) -> RankedPool<'a> {
        let mut ranked = RankedPool::default();
        for trajectory in rank(pool) {
            match classify(trajectory) {
                Class::Positive => ranked.positives.push(trajectory),
                Class::Negative => ranked.negatives.push(trajectory),
                Class::Backfill => ranked.backfill.push(trajectory),
            }
        }
        ranked
    }

    /// |T+| + |T-|.
    pub fn usable(&self) -> usize {
        self.positives.len() + self.negatives.len()
    }
}

/// One member of a selected group, as recorded in `status.group`.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The trajectory's name.
    pub name: String,
    /// Its reward.
    pub reward: f64,
    /// How it ended.
    pub outcome: Outcome,
    /// Its length.
    pub length: u64,
    /// Whether it counts as a positive (usable with reward > 0).
    pub positive: bool,
}

impl Member {
    /// The member for `trajectory`.
    pub fn from_trajectory(trajectory: &Trajectory) -> Member {
        Member {
            name: trajectory.name.clone(),
            reward: trajectory.reward,
            outcome: trajectory.outcome,
            length: trajectory.length,
            positive: classify(trajectory) == Class::Positive,
        }
    }
}

/// The members for `chosen`, in rank order.
pub(crate) fn members_in_rank_order(mut chosen: Vec<&Trajectory>) -> Vec<Member> {
    chosen.sort_by(|a, b| rank_order(a, b));
    chosen.into_iter().map(Member::from_trajectory).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trajectory(name: &str, reward: f64, outcome: Outcome, length: u64) -> Trajectory {
        Trajectory {
            name: name.to_string(),
            reward,
            outcome,
            length,
        }
    }

    #[test]
    fn classes_follow_outcome_and_sign() {
        let cases = [
            (1.0, Outcome::Completed, Class::Positive),
            (1e-300, Outcome::Truncated, Class::Positive),
            (0.0, Outcome::Completed, Class::Negative),
            (-0.0, Outcome::Completed, Class::Negative),
            (-1.0, Outcome::Truncated, Class::Negative),
            (f64::NAN, Outcome::Completed, Class::Negative),
            (f64::INFINITY, Outcome::Completed, Class::Positive),
            (f64::NEG_INFINITY, Outcome::Completed, Class::Negative),
            (1.0, Outcome::Aborted, Class::Backfill),
            (0.0, Outcome::Aborted, Class::Backfill),
        ];
        for (reward, outcome, class) in cases {
            assert_eq!(
                classify(&trajectory("t", reward, outcome, 1)),
                class,
                "{reward} {outcome:?}"
            );
        }
    }

    #[test]
    fn rank_is_status_then_length_then_name() {
        let pool = vec![
            trajectory("b", 1.0, Outcome::Aborted, 1),
            trajectory("c", 1.0, Outcome::Truncated, 5),
            trajectory("b", 0.0, Outcome::Completed, 7),
            trajectory("a", 0.0, Outcome::Completed, 7),
            trajectory("z", 0.0, Outcome::Completed, 2),
            trajectory("a", 0.0, Outcome::Truncated, 1),
        ];
        let names: Vec<(&str, u64)> = rank(&pool)
            .iter()
            .map(|t| (t.name.as_str(), t.length))
            .collect();
        assert_eq!(
            names,
            [("z", 2), ("a", 7), ("b", 7), ("a", 1), ("c", 5), ("b", 1)]
        );
    }

    #[test]
    fn duplicates_and_nan_still_order_totally() {
        let a = trajectory("same", f64::NAN, Outcome::Completed, 3);
        let b = trajectory("same", 1.0, Outcome::Completed, 3);
        assert_eq!(rank_order(&a, &a), Ordering::Equal);
        assert_eq!(rank_order(&a, &b), rank_order(&b, &a).reverse());
        assert_ne!(rank_order(&a, &b), Ordering::Equal);
    }

    #[test]
    fn ranked_pool_splits_classes() {
        let pool = vec![
            trajectory("n1", 0.0, Outcome::Completed, 3),
            trajectory("p1", 1.0, Outcome::Truncated, 1),
            trajectory("x1", 1.0, Outcome::Aborted, 1),
            trajectory("p2", 0.5, Outcome::Completed, 9),
        ];
        let ranked = RankedPool::new(&pool);
        let names = |list: &[&Trajectory]| list.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&ranked.positives), ["p2", "p1"]);
        assert_eq!(names(&ranked.negatives), ["n1"]);
        assert_eq!(names(&ranked.backfill), ["x1"]);
        assert_eq!(ranked.usable(), 3);
    }
}
