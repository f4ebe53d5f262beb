//! Building a group of exactly N from a pool: `TryAssemble(lo, hi)` (used for the balanced and the relaxed
//! selection) and the top-ranked fallback (docs/BAR.md, "TryAssemble" and schedule step 5).

use super::params::{Params, bounds};
use super::rank::{Member, RankedPool, Trajectory, members_in_rank_order, rank};

/// The candidate counts of positives `lo..=hi`, closest to `n_star` first, ties to the smaller count.
pub fn candidate_order(lo: u32, hi: u32, n_star: u32) -> Vec<u32> {
    let mut candidates: Vec<u32> = (lo..=hi).collect();
    candidates.sort_by_key(|&n_plus| (n_plus.abs_diff(n_star), n_plus));
    candidates
}

/// `TryAssemble(lo, hi)` on `pool`: the group of N made of the top n+ positives and the top N - n+
/// negatives for the first n+ of [`candidate_order`] that the pool can fill, with that n+.
///
/// `None` when the pool has fewer than N usable trajectories or no candidate fits. The members come in
/// rank order (status, length, name). Backfill is never used here.
pub fn try_assemble(
    params: &Params,
    pool: &[Trajectory],
    lo: u32,
    hi: u32,
) -> Option<(Vec<Member>, u32)> {
    try_assemble_ranked(params, &RankedPool::new(pool), lo, hi)
}

/// [`try_assemble`] on an already classified pool.
pub fn try_assemble_ranked(
    params: &Params,
    ranked: &RankedPool<'_>,
    lo: u32,
    hi: u32,
) -> Option<(Vec<Member>, u32)> {
    let group_size = params.group_size as usize;
    if ranked.usable() < group_size {
        return None;
    }
    let n_plus = candidate_order(lo, hi, bounds(params).n_star)
        .into_iter()
        .find(|&n_plus| {
            let n_plus = n_plus as usize;
            n_plus <= group_size
                && n_plus <= ranked.positives.len()
                && group_size - n_plus <= ranked.negatives.len()
        })?;
    let positives = n_plus as usize;
    let chosen: Vec<&Trajectory> = ranked.positives[..positives]
        .iter()
        .chain(&ranked.negatives[..group_size - positives])
        .copied()
        .collect();
    Some((members_in_rank_order(chosen), n_plus))
}

/// The N best of the whole pool: usable in rank order regardless of sign, then backfill (the status leads
/// the rank key, so this is simply the first N of [`rank`]). `None` when the pool has fewer than N.
pub fn top_ranked(params: &Params, pool: &[Trajectory]) -> Option<Vec<Member>> {
    let ranked = rank(pool);
    let group_size = params.group_size as usize;
    if ranked.len() < group_size {
        return None;
    }
    Some(members_in_rank_order(ranked[..group_size].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rank::Outcome;

    fn pool(spec: &[(&str, f64, Outcome, u64)]) -> Vec<Trajectory> {
        spec.iter()
            .map(|&(name, reward, outcome, length)| Trajectory {
                name: name.to_string(),
                reward,
                outcome,
                length,
            })
            .collect()
    }

    fn names(members: &[Member]) -> Vec<&str> {
        members.iter().map(|member| member.name.as_str()).collect()
    }

    #[test]
    fn candidates_are_centred_with_ties_to_the_smaller() {
        assert_eq!(candidate_order(3, 5, 4), [4, 3, 5]);
        assert_eq!(candidate_order(1, 7, 4), [4, 3, 5, 2, 6, 1, 7]);
        assert_eq!(candidate_order(1, 7, 0), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(candidate_order(2, 6, 9), [6, 5, 4, 3, 2]);
        assert!(candidate_order(4, 3, 4).is_empty());
    }

    #[test]
    fn takes_the_top_of_each_class() {
        let mut params = Params::paper_defaults();
        params.group_size = 4;
        params.filter.max_backfill = 2;
        // N = 4, [0.375, 0.625] -> n_min = 2, n_max = 2, n* = 2.
        let pool = pool(&[
            ("p-long", 1.0, Outcome::Completed, 90),
            ("p-short", 1.0, Outcome::Completed, 10),
            ("p-trunc", 1.0, Outcome::Truncated, 1),
            ("n-b", 0.0, Outcome::Completed, 20),
            ("n-a", 0.0, Outcome::Completed, 20),
            ("n-c", 0.0, Outcome::Completed, 5),
            ("x", 1.0, Outcome::Aborted, 1),
        ]);
        let (group, n_plus) = try_assemble(&params, &pool, 2, 2).expect("feasible");
        assert_eq!(n_plus, 2);
        assert_eq!(names(&group), ["n-c", "p-short", "n-a", "p-long"]);
        assert_eq!(group.iter().filter(|member| member.positive).count(), 2);
    }

    #[test]
    fn infeasible_without_enough_usable_or_fitting_counts() {
        let params = Params::paper_defaults();
        let seven_usable: Vec<(&str, f64, Outcome, u64)> = vec![
            ("a", 1.0, Outcome::Completed, 1),
            ("b", 1.0, Outcome::Completed, 1),
            ("c", 1.0, Outcome::Completed, 1),
            ("d", 0.0, Outcome::Completed, 1),
            ("e", 0.0, Outcome::Completed, 1),
            ("f", 0.0, Outcome::Completed, 1),
            ("g", 0.0, Outcome::Truncated, 1),
            ("h", 1.0, Outcome::Aborted, 1),
        ];
        assert_eq!(try_assemble(&params, &pool(&seven_usable), 1, 7), None);
        let mut eight = seven_usable.clone();
        eight[7].2 = Outcome::Completed;
        // 4 positives + 4 negatives -> n* = 4 fits.
        assert_eq!(
            try_assemble(&params, &pool(&eight), 3, 5).map(|found| found.1),
            Some(4)
        );
        // 2 positives + 8 negatives: only n+ = 2 is possible, outside [3, 5] but inside [1, 7].
        let mut skewed = pool(&eight);
        for trajectory in skewed.iter_mut().take(2) {
            trajectory.reward = 0.0;
        }
        skewed.extend(pool(&[
            ("i", 0.0, Outcome::Completed, 2),
            ("j", 0.0, Outcome::Completed, 2),
        ]));
        assert_eq!(try_assemble(&params, &skewed, 3, 5), None);
        assert_eq!(
            try_assemble(&params, &skewed, 1, 7).map(|found| found.1),
            Some(2)
        );
    }

    #[test]
    fn top_ranked_puts_backfill_last() {
        let mut params = Params::paper_defaults();
        params.group_size = 3;
        let pool = pool(&[
            ("x", 1.0, Outcome::Aborted, 1),
            ("t", 0.0, Outcome::Truncated, 1),
            ("c", 0.0, Outcome::Completed, 9),
            ("y", 0.0, Outcome::Aborted, 0),
        ]);
        assert_eq!(
            names(&top_ranked(&params, &pool).expect("enough")),
            ["c", "t", "y"]
        );
        params.group_size = 5;
        assert_eq!(top_ranked(&params, &pool), None);
    }
}
