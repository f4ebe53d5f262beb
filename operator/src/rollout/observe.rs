//! What a RolloutGroup has launched and what came of it (pure), derived from its own status and its
//! child Sandboxes — never from memory, so a restarted operator resumes exactly.
//!
//! - A trajectory is launched if the status lists it or a child Sandbox for it exists (a crash can
//!   leave children the status does not list yet).
//! - Its outcome is the one recorded in the status, else the child's `status.result`.
//! - A listed trajectory without an outcome whose child is gone (confirmed by the caller with a live
//!   read, since the cache may lag) is aborted with reason `SandboxDeleted`; it is never launched again.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::build::{trajectory_index, trajectory_name};
use orchard_api::{
    RolloutGroupSpec, RolloutGroupStatus, TrajectoryRecord, TrajectoryResult, TrajectoryStatus,
};

/// Abort reason of the trajectories still unfinished when the group's own deadline passed.
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// When the group's `activeDeadlineSeconds` ends: counted from its first admitted stride (`start`);
/// `None` without a deadline or before the first stride.
pub fn deadline_of(spec: &RolloutGroupSpec, start: Option<Timestamp>) -> Option<Timestamp> {
    let seconds = spec.active_deadline_seconds.filter(|s| *s > 0)?;
    start?.checked_add(SignedDuration::from_secs(seconds)).ok()
}
use orchard_bar::{Outcome, Trajectory};

/// What the controller sees of one child Sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildView {
    /// Sandbox name.
    pub name: String,
    /// Stride label.
    pub stride: u32,
    /// Recorded result, if any.
    pub result: Option<TrajectoryResult>,
    /// Being deleted.
    pub deleting: bool,
}

/// The group's trajectories as observed now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    /// Every launched trajectory, by index.
    pub records: BTreeMap<u32, TrajectoryRecord>,
    /// Listed trajectories without outcome whose child the cache does not show.
    pub unseen: Vec<String>,
}

impl Observation {
    /// Trajectories launched.
    pub fn launched(&self) -> u32 {
        u32::try_from(self.records.len()).unwrap_or(u32::MAX)
    }

    /// Terminal trajectories as the BAR engine sees them.
    pub fn pool(&self) -> Vec<Trajectory> {
        self.records.values().filter_map(bar_trajectory).collect()
    }

    /// Names of launched trajectories that have no outcome yet.
    pub fn running(&self) -> Vec<String> {
        self.records
            .values()
            .filter(|r| r.status.is_none() && r.reason.is_none())
            .map(|r| r.name.clone())
            .collect()
    }

    /// Marks every trajectory without an outcome aborted with `reason` (the group is being decided
    /// without them).
    pub fn abort_unfinished(&mut self, reason: &str) {
        for record in self
            .records
            .values_mut()
            .filter(|r| r.status.is_none() && r.reason.is_none())
        {
            record.status = Some(TrajectoryStatus::Aborted);
            record.reason = Some(reason.to_string());
        }
    }

    /// Records trajectory `index` of stride `stride` of group `group` as launched (and running,
    /// unless it is known already): its child was just created, or found to be ours.
    pub fn record_launch(&mut self, group: &str, index: u32, stride: u32) {
        self.records
            .entry(index)
            .or_insert_with(|| TrajectoryRecord {
                name: trajectory_name(group, index),
                stride: i32::try_from(stride).unwrap_or(i32::MAX),
                status: None,
                reward: None,
                length: None,
                artifact: None,
                reason: None,
            });
    }

    /// Indices of the latest stride that have no trajectory (a crash interrupted its launch).
    pub fn incomplete_latest_stride(&self, stride_size: u32) -> Vec<(u32, u32)> {
        let Some(&last) = self.records.keys().next_back() else {
            return Vec::new();
        };
        let stride = last / stride_size.max(1);
        (stride * stride_size..(stride + 1) * stride_size)
            .filter(|index| !self.records.contains_key(index))
            .map(|index| (index, stride))
            .collect()
    }
}

/// The BAR view of a finished trajectory (`None` while it runs or after it was cancelled).
pub fn bar_trajectory(record: &TrajectoryRecord) -> Option<Trajectory> {
    let outcome = match record.status? {
        TrajectoryStatus::Completed => Outcome::Completed,
        TrajectoryStatus::Truncated => Outcome::Truncated,
        TrajectoryStatus::Aborted => Outcome::Aborted,
    };
    Some(Trajectory {
        name: record.name.clone(),
        reward: record.reward.unwrap_or(0.0),
        outcome,
        // Unknown length ranks last among equals.
        length: record
            .length
            .and_then(|l| u64::try_from(l).ok())
            .unwrap_or(u64::MAX),
    })
}

fn record_result(record: &mut TrajectoryRecord, result: &TrajectoryResult) {
    record.status = Some(result.status);
    record.reward = result.reward;
    record.length = result.length;
    record.artifact = result.artifact.clone();
    record.reason = result.reason.clone();
}

/// Observes group `group` (stride size `stride_size`) from its previous status and its children; names
/// in `gone` were confirmed deleted by a live read.
pub fn observe(
    group: &str,
    previous: &RolloutGroupStatus,
    children: &[ChildView],
    gone: &BTreeSet<String>,
) -> Observation {
    let mut records: BTreeMap<u32, TrajectoryRecord> = previous
        .trajectories
        .iter()
        .filter_map(|r| Some((trajectory_index(group, &r.name)?, r.clone())))
        .collect();
    let by_name: BTreeMap<&str, &ChildView> =
        children.iter().map(|c| (c.name.as_str(), c)).collect();
    for child in children {
        if let Some(index) = trajectory_index(group, &child.name) {
            records.entry(index).or_insert_with(|| TrajectoryRecord {
                name: trajectory_name(group, index),
                stride: i32::try_from(child.stride).unwrap_or(i32::MAX),
                status: None,
                reward: None,
                length: None,
                artifact: None,
                reason: None,
            });
        }
    }
    let mut unseen = Vec::new();
    for record in records.values_mut() {
        if record.status.is_some() || record.reason.is_some() {
            continue;
        }
        match by_name.get(record.name.as_str()) {
            Some(child) => {
                if let Some(result) = &child.result {
                    record_result(record, result);
                }
            }
            None if gone.contains(&record.name) => {
                record.status = Some(TrajectoryStatus::Aborted);
                record.reason = Some("SandboxDeleted".into());
            }
            None => unseen.push(record.name.clone()),
        }
    }
    Observation { records, unseen }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(reward: f64, length: i64) -> TrajectoryResult {
        TrajectoryResult {
            reward: Some(reward),
            status: TrajectoryStatus::Completed,
            length: Some(length),
            exit_code: Some(0),
            artifact: Some(format!("a{length}")),
            reason: None,
            message: None,
        }
    }

    fn child(index: u32, stride: u32, result: Option<TrajectoryResult>) -> ChildView {
        ChildView {
            name: trajectory_name("g", index),
            stride,
            result,
            deleting: false,
        }
    }

    fn listed(index: u32, stride: i32) -> TrajectoryRecord {
        TrajectoryRecord {
            name: trajectory_name("g", index),
            stride,
            status: None,
            reward: None,
            length: None,
            artifact: None,
            reason: None,
        }
    }

    #[test]
    fn children_results_become_records_and_the_pool() {
        let previous = RolloutGroupStatus {
            trajectories: vec![listed(0, 0), listed(1, 0)],
            ..Default::default()
        };
        let obs = observe(
            "g",
            &previous,
            &[child(0, 0, Some(result(1.0, 10))), child(1, 0, None)],
            &BTreeSet::new(),
        );
        assert_eq!(obs.launched(), 2);
        assert_eq!(obs.running(), vec!["g-1".to_string()]);
        let pool = obs.pool();
        assert_eq!(pool.len(), 1);
        assert_eq!(pool[0].name, "g-0");
        assert_eq!(pool[0].length, 10);
        assert_eq!(obs.records[&0].artifact.as_deref(), Some("a10"));
    }

    #[test]
    fn recorded_outcomes_survive_deleted_children() {
        let mut done = listed(0, 0);
        done.status = Some(TrajectoryStatus::Completed);
        done.reward = Some(0.0);
        let previous = RolloutGroupStatus {
            trajectories: vec![done],
            ..Default::default()
        };
        let obs = observe("g", &previous, &[], &BTreeSet::new());
        assert_eq!(obs.pool().len(), 1);
        assert!(obs.unseen.is_empty());
    }

    #[test]
    fn children_the_status_does_not_list_yet_count_as_launched() {
        let obs = observe(
            "g",
            &RolloutGroupStatus::default(),
            &[child(0, 0, None), child(1, 0, None)],
            &BTreeSet::new(),
        );
        assert_eq!(obs.launched(), 2);
        assert_eq!(obs.incomplete_latest_stride(4), vec![(2, 0), (3, 0)]);
    }

    #[test]
    fn listed_trajectories_without_children_are_unseen_until_confirmed_gone() {
        let previous = RolloutGroupStatus {
            trajectories: vec![listed(0, 0)],
            ..Default::default()
        };
        let obs = observe("g", &previous, &[], &BTreeSet::new());
        assert_eq!(obs.unseen, vec!["g-0".to_string()]);
        assert_eq!(obs.running(), vec!["g-0".to_string()]);
        let gone = BTreeSet::from(["g-0".to_string()]);
        let obs = observe("g", &previous, &[], &gone);
        assert!(obs.unseen.is_empty());
        assert_eq!(obs.records[&0].reason.as_deref(), Some("SandboxDeleted"));
        assert_eq!(obs.pool()[0].outcome, Outcome::Aborted);
        assert_eq!(
            obs.launched(),
            1,
            "a deleted trajectory is not launched again"
        );
    }

    #[test]
    fn complete_strides_need_nothing() {
        let children: Vec<ChildView> = (0..8).map(|i| child(i, i / 4, None)).collect();
        let obs = observe(
            "g",
            &RolloutGroupStatus::default(),
            &children,
            &BTreeSet::new(),
        );
        assert!(obs.incomplete_latest_stride(4).is_empty());
        assert!(
            Observation::default()
                .incomplete_latest_stride(4)
                .is_empty()
        );
    }

    #[test]
    fn the_deadline_counts_from_the_first_stride_and_aborts_what_is_unfinished() {
        use orchard_api::{SandboxSpec, SandboxTemplate};
        let mut spec = RolloutGroupSpec {
            group_size: 2,
            max_trajectories: 4,
            stride: Some(2),
            positive_fraction: Default::default(),
            early_stop: Default::default(),
            filter: None,
            template: SandboxTemplate {
                metadata: Default::default(),
                spec: SandboxSpec::default(),
            },
            trajectory_timeout_seconds: None,
            cleanup: Default::default(),
            queue: None,
            active_deadline_seconds: None,
        };
        let start = Timestamp::from_second(1_700_000_000).unwrap();
        assert_eq!(deadline_of(&spec, Some(start)), None, "no deadline set");
        spec.active_deadline_seconds = Some(60);
        assert_eq!(deadline_of(&spec, None), None, "not started");
        assert_eq!(
            deadline_of(&spec, Some(start)),
            Some(Timestamp::from_second(1_700_000_060).unwrap())
        );

        let mut done = listed(0, 0);
        done.status = Some(TrajectoryStatus::Completed);
        let previous = RolloutGroupStatus {
            trajectories: vec![done, listed(1, 0)],
            ..Default::default()
        };
        let mut obs = observe("g", &previous, &[child(1, 0, None)], &BTreeSet::new());
        obs.abort_unfinished(DEADLINE_EXCEEDED);
        assert_eq!(
            obs.records[&0].reason, None,
            "finished ones keep their outcome"
        );
        assert_eq!(obs.records[&1].status, Some(TrajectoryStatus::Aborted));
        assert_eq!(obs.records[&1].reason.as_deref(), Some(DEADLINE_EXCEEDED));
        assert!(obs.running().is_empty());
    }

    #[test]
    fn unknown_lengths_rank_last_and_missing_rewards_count_as_zero() {
        let mut record = listed(3, 0);
        record.status = Some(TrajectoryStatus::Aborted);
        let t = bar_trajectory(&record).unwrap();
        assert_eq!(t.length, u64::MAX);
        assert_eq!(t.reward, 0.0);
        assert_eq!(bar_trajectory(&listed(4, 0)), None);
    }
}
