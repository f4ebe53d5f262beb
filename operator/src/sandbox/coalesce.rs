//! When a status write can wait (pure): a young sandbox usually becomes Ready within a second, so
//! its transient phases are not written one by one.

use k8s_openapi::jiff::Timestamp;

use crate::plumbing::operator_key::OperatorKey;
use crate::sandbox::identity::rollout_group_of;
use orchard_api::{Sandbox, SandboxPhase, SandboxStatus};

/// Whether writing `desired` can wait: a transient phase (Pending, Starting) of a sandbox younger than
/// `window`, replacing another transient phase (never the first status). Returns how long to wait, or `None` to
/// write now. Ready, Failed and everything after them are written at once.
pub fn hold_back_transient(
    previous: Option<&SandboxStatus>,
    desired: &SandboxStatus,
    created: Option<Timestamp>,
    now: Timestamp,
    window: std::time::Duration,
    first_can_wait: bool,
) -> Option<std::time::Duration> {
    let transient = |phase: Option<SandboxPhase>| {
        matches!(
            phase,
            None | Some(SandboxPhase::Pending | SandboxPhase::Starting)
        )
    };
    // The first status is written at once unless `first_can_wait`: until then kstatus (Flux, Argo
    // CD, cli-utils) would call the new object Current.
    if previous.is_none() && !first_can_wait {
        return None;
    }
    if !transient(desired.phase) || !transient(previous.and_then(|p| p.phase)) {
        return None;
    }
    let age = std::time::Duration::try_from(now.duration_since(created?)).unwrap_or_default();
    window.checked_sub(age).filter(|left| !left.is_zero())
}

/// Whether a new sandbox's first status may wait like later transient ones (pure): true for sandboxes
/// nobody reads with kstatus, those created through the gateway (whose callers wait with its `/wait`
/// or read its answers) and a RolloutGroup's trajectories (the group's status is what GitOps tools
/// read). A sandbox applied by `kubectl`, Flux or Argo CD gets its first status at once.
pub fn first_status_can_wait(sandbox: &Sandbox, key: &OperatorKey) -> bool {
    rollout_group_of(sandbox, key).is_some()
        || sandbox
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(orchard_api::CREATED_BY_ANNOTATION))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::fixtures::{CREATED, forged_trajectory, key, t, trajectory};
    use orchard_api::SandboxSpec;
    use std::collections::BTreeMap;

    #[test]
    fn transient_phases_of_young_sandboxes_are_held_back() {
        let window = std::time::Duration::from_secs(1);
        let created = Some(t(CREATED));
        let pending = SandboxStatus {
            phase: Some(SandboxPhase::Pending),
            ..Default::default()
        };
        let starting = SandboxStatus {
            phase: Some(SandboxPhase::Starting),
            ..Default::default()
        };
        let ready = SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            ..Default::default()
        };
        let failed = SandboxStatus {
            phase: Some(SandboxPhase::Failed),
            ..Default::default()
        };
        let young = t("2026-01-01T00:00:00.300Z");
        let old = t("2026-01-01T00:00:01.500Z");
        assert_eq!(
            hold_back_transient(None, &pending, created, young, window, false),
            None,
            "the first status is written at once (kstatus needs it)"
        );
        assert_eq!(
            hold_back_transient(Some(&pending), &starting, created, young, window, false),
            Some(std::time::Duration::from_millis(700))
        );
        assert_eq!(
            hold_back_transient(Some(&pending), &starting, created, old, window, false),
            None,
            "old enough: write"
        );
        assert_eq!(
            hold_back_transient(None, &ready, created, young, window, false),
            None,
            "Ready is never held back"
        );
        assert_eq!(
            hold_back_transient(None, &failed, created, young, window, false),
            None,
            "Failed is never held back"
        );
        assert_eq!(
            hold_back_transient(Some(&ready), &starting, created, young, window, false),
            None
        );
        assert_eq!(
            hold_back_transient(
                Some(&pending),
                &starting,
                created,
                young,
                std::time::Duration::ZERO,
                false
            ),
            None
        );
        // Sandboxes nobody reads with kstatus wait for their first status too.
        assert_eq!(
            hold_back_transient(None, &pending, created, young, window, true),
            Some(std::time::Duration::from_millis(700))
        );
        assert_eq!(
            hold_back_transient(None, &ready, created, young, window, true),
            None,
            "Ready is never held back"
        );
        assert_eq!(
            hold_back_transient(None, &pending, created, old, window, true),
            None
        );
    }

    #[test]
    fn only_gateway_and_group_sandboxes_wait_for_their_first_status() {
        let mut s = Sandbox::new("s", SandboxSpec::default());
        assert!(!first_status_can_wait(&s, key()), "kubectl, Flux, Argo CD");
        s.metadata.annotations = Some(BTreeMap::from([(
            orchard_api::CREATED_BY_ANNOTATION.to_string(),
            "alice".to_string(),
        )]));
        assert!(
            first_status_can_wait(&s, key()),
            "created through the gateway"
        );
        s.metadata.annotations = None;
        assert!(
            !first_status_can_wait(&forged_trajectory(), key()),
            "a Sandbox with a forged controller reference"
        );
        assert!(first_status_can_wait(&trajectory(), key()), "a trajectory");
    }
}
