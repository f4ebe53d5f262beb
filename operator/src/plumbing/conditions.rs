//! Status conditions in the `metav1.Condition` shape, shared by both controllers (pure).
//!
//! `lastTransitionTime` moves only when a condition's status really changes, so recomputing a status
//! from the same observations yields the same object and costs no API write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::plumbing::time::floor_to_second;

/// A condition as computed now; [`merge`] decides its `lastTransitionTime`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    /// Condition type, e.g. `Ready`.
    pub type_: &'static str,
    /// Whether it holds.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
}

impl Desired {
    /// A condition of `type_` with the given truth, reason and message.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

fn status_word(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Builds the new condition list: each desired condition keeps the previous `lastTransitionTime` when
/// its status did not change, and gets `now` (whole seconds) when it did.
pub fn merge(
    previous: &[Condition],
    desired: Vec<Desired>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    desired
        .into_iter()
        .map(|d| {
            let word = status_word(d.status);
            let last_transition_time = previous
                .iter()
                .find(|c| c.type_ == d.type_ && c.status == word)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| Time(floor_to_second(now)));
            Condition {
                type_: d.type_.to_string(),
                status: word.to_string(),
                reason: d.reason,
                message: d.message,
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// The kstatus condition saying work is in flight (`sigs.k8s.io/cli-utils` kstatus: InProgress).
pub const RECONCILING: &str = "Reconciling";
/// The kstatus condition saying the object cannot progress without outside help (kstatus: Failed).
pub const STALLED: &str = "Stalled";

/// Where an object stands in the kstatus convention, which Flux, `kstatus` and Argo CD's health
/// checks read: at most one of `Reconciling` and `Stalled` is `True`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Work is in flight; `reason` is usually the phase.
    Reconciling(String, String),
    /// It cannot progress: `reason` and a message a user can act on.
    Stalled(String, String),
    /// Nothing left to do (ready, complete, or terminal without fault).
    Settled,
}

/// The `Reconciling` and `Stalled` conditions for `progress` (pure).
pub fn kstatus(progress: &Progress) -> [Desired; 2] {
    match progress {
        Progress::Reconciling(reason, message) => [
            Desired::new(RECONCILING, true, reason.clone(), message.clone()),
            Desired::new(STALLED, false, "Progressing", ""),
        ],
        Progress::Stalled(reason, message) => [
            Desired::new(RECONCILING, false, "Stalled", ""),
            Desired::new(STALLED, true, reason.clone(), message.clone()),
        ],
        Progress::Settled => [
            Desired::new(RECONCILING, false, "Reconciled", ""),
            Desired::new(STALLED, false, "Reconciled", ""),
        ],
    }
}

/// Whether the condition of `type_` is present and `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// What the conditions say about an object that is not where it was asked to be (pure): the
/// `Stalled` condition's reason and message when it is `True`, else those of condition `waiting_on`
/// (e.g. `Ready`) when it is not `True` and gives a reason.
pub fn why_unsettled<'a>(
    conditions: &'a [Condition],
    waiting_on: &str,
) -> Option<(&'a str, &'a str)> {
    let stalled = conditions
        .iter()
        .find(|c| c.type_ == STALLED && c.status == "True");
    let waiting = || {
        conditions
            .iter()
            .find(|c| c.type_ == waiting_on && c.status != "True" && !c.reason.is_empty())
    };
    stalled
        .or_else(waiting)
        .map(|c| (c.reason.as_str(), c.message.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn transition_time_moves_only_on_real_transitions() {
        let first = merge(
            &[],
            vec![Desired::new("Ready", false, "Starting", "")],
            Some(1),
            t("2026-01-01T00:00:00.5Z"),
        );
        assert_eq!(
            first[0].last_transition_time,
            Time(t("2026-01-01T00:00:00Z"))
        );
        let same = merge(
            &first,
            vec![Desired::new("Ready", false, "Starting", "still")],
            Some(2),
            t("2026-01-01T00:00:09Z"),
        );
        assert_eq!(same[0].last_transition_time, first[0].last_transition_time);
        assert_eq!(same[0].observed_generation, Some(2));
        let flipped = merge(
            &same,
            vec![Desired::new("Ready", true, "AgentReady", "")],
            Some(2),
            t("2026-01-01T00:00:10Z"),
        );
        assert_eq!(
            flipped[0].last_transition_time,
            Time(t("2026-01-01T00:00:10Z"))
        );
        assert!(is_true(&flipped, "Ready"));
        assert!(!is_true(&flipped, "Expired"));
    }
}
