//! Expiry arithmetic (pure): when a sandbox must be deleted, and which heartbeat counts.
//!
//! Both clocks start when the sandbox becomes Ready: the deadline is
//! `min(readyTime + ttl, lastHeartbeat + heartbeatTimeout)` where `lastHeartbeat` is never earlier
//! than `readyTime`. Times have whole-second precision (the `metav1.Time` wire format), so a heartbeat
//! is rounded *up* to the next second: it never makes a sandbox expire early.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::plumbing::time::ceil_to_second;

use orchard_api::{HEARTBEAT_ANNOTATION, Lifecycle, Sandbox};

/// Heartbeats more than this far in the future are ignored (clock skew or a typo, not a heartbeat).
pub const MAX_HEARTBEAT_SKEW: SignedDuration = SignedDuration::from_secs(60);

/// Which deadline ends a sandbox's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryCause {
    /// `readyTime + ttlSeconds`.
    Ttl,
    /// `lastHeartbeatTime + heartbeatTimeoutSeconds`.
    Heartbeat,
}

impl ExpiryCause {
    /// Label value used in metrics and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ttl => "ttl",
            Self::Heartbeat => "heartbeat",
        }
    }
}

/// The deadline and its cause, or `None` before the sandbox is Ready.
pub fn expiry_deadline(
    ready_time: Option<Timestamp>,
    last_heartbeat: Option<Timestamp>,
    lifecycle: Lifecycle,
) -> Option<(Timestamp, ExpiryCause)> {
    let ready = ready_time?;
    let ttl_deadline = ready
        .saturating_add(SignedDuration::from_secs(lifecycle.ttl_seconds.max(0)))
        .ok()?;
    let mut deadline = (ttl_deadline, ExpiryCause::Ttl);
    if lifecycle.heartbeat_timeout_seconds > 0 {
        let beat = last_heartbeat.map_or(ready, |b| b.max(ready));
        if let Ok(heartbeat_deadline) = beat.saturating_add(SignedDuration::from_secs(
            lifecycle.heartbeat_timeout_seconds,
        )) && heartbeat_deadline < deadline.0
        {
            deadline = (heartbeat_deadline, ExpiryCause::Heartbeat);
        }
    }
    Some(deadline)
}

/// When a Failed sandbox is removed (pure): its TTL counted from Ready, or from its creation when it
/// never became Ready. It is kept that long so its status can say why it failed, not forever.
pub fn failed_deadline(
    created: Timestamp,
    ready_time: Option<Timestamp>,
    lifecycle: Lifecycle,
) -> Timestamp {
    let from = ready_time.unwrap_or(created);
    from.saturating_add(SignedDuration::from_secs(lifecycle.ttl_seconds.max(0)))
        .unwrap_or(from)
}

/// Why a heartbeat annotation was not counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeartbeatError {
    /// Not an RFC 3339 time.
    Unparseable(String),
    /// Too far in the future.
    InTheFuture(String),
}

impl std::fmt::Display for HeartbeatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unparseable(value) => write!(
                f,
                "annotation {HEARTBEAT_ANNOTATION}={value:?} is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z); heartbeat ignored"
            ),
            Self::InTheFuture(value) => write!(
                f,
                "annotation {HEARTBEAT_ANNOTATION}={value:?} lies more than {}s in the future; heartbeat ignored",
                MAX_HEARTBEAT_SKEW.as_secs()
            ),
        }
    }
}

/// The heartbeat recorded in the annotation, rounded up to a whole second; `Ok(None)` without one.
pub fn annotated_heartbeat(
    sandbox: &Sandbox,
    now: Timestamp,
) -> Result<Option<Timestamp>, HeartbeatError> {
    let Some(value) = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HEARTBEAT_ANNOTATION))
    else {
        return Ok(None);
    };
    let parsed: Timestamp = value
        .trim()
        .parse()
        .map_err(|_| HeartbeatError::Unparseable(value.clone()))?;
    if parsed > now.saturating_add(MAX_HEARTBEAT_SKEW).unwrap_or(now) {
        return Err(HeartbeatError::InTheFuture(value.clone()));
    }
    Ok(Some(ceil_to_second(parsed)))
}

/// The latest of the heartbeats known (previous status and annotation), never earlier than Ready.
pub fn latest_heartbeat(
    ready_time: Option<Timestamp>,
    previous: Option<Timestamp>,
    annotated: Option<Timestamp>,
) -> Option<Timestamp> {
    let ready = ready_time?;
    Some(
        [previous, annotated]
            .into_iter()
            .flatten()
            .fold(ready, Timestamp::max),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_sandbox_lives_its_ttl_from_ready_or_from_creation() {
        let lifecycle = Lifecycle {
            ttl_seconds: 60,
            heartbeat_timeout_seconds: 10,
        };
        let created: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let ready: Timestamp = "2026-01-01T00:00:30Z".parse().unwrap();
        assert_eq!(
            failed_deadline(created, Some(ready), lifecycle),
            "2026-01-01T00:01:30Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(
            failed_deadline(created, None, lifecycle),
            "2026-01-01T00:01:00Z".parse::<Timestamp>().unwrap(),
            "never Ready: counted from creation; heartbeats do not apply"
        );
    }
    use orchard_api::SandboxSpec;
    use std::collections::BTreeMap;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn no_deadline_before_ready() {
        let lifecycle = Lifecycle {
            ttl_seconds: 60,
            heartbeat_timeout_seconds: 10,
        };
        assert_eq!(expiry_deadline(None, None, lifecycle), None);
    }

    #[test]
    fn ttl_alone_counts_from_ready() {
        let lifecycle = Lifecycle {
            ttl_seconds: 60,
            heartbeat_timeout_seconds: 0,
        };
        let deadline = expiry_deadline(
            Some(t("2026-01-01T00:00:00Z")),
            Some(t("2026-01-01T00:10:00Z")),
            lifecycle,
        );
        assert_eq!(
            deadline,
            Some((t("2026-01-01T00:01:00Z"), ExpiryCause::Ttl))
        );
    }

    #[test]
    fn heartbeat_deadline_wins_when_earlier() {
        let lifecycle = Lifecycle {
            ttl_seconds: 3600,
            heartbeat_timeout_seconds: 3,
        };
        let ready = t("2026-01-01T00:00:00Z");
        assert_eq!(
            expiry_deadline(Some(ready), None, lifecycle),
            Some((t("2026-01-01T00:00:03Z"), ExpiryCause::Heartbeat))
        );
        assert_eq!(
            expiry_deadline(Some(ready), Some(t("2026-01-01T00:00:10Z")), lifecycle),
            Some((t("2026-01-01T00:00:13Z"), ExpiryCause::Heartbeat))
        );
    }

    #[test]
    fn ttl_caps_heartbeats() {
        let lifecycle = Lifecycle {
            ttl_seconds: 20,
            heartbeat_timeout_seconds: 15,
        };
        let ready = t("2026-01-01T00:00:00Z");
        assert_eq!(
            expiry_deadline(Some(ready), Some(t("2026-01-01T00:00:10Z")), lifecycle),
            Some((t("2026-01-01T00:00:20Z"), ExpiryCause::Ttl))
        );
    }

    #[test]
    fn heartbeats_before_ready_do_not_shorten_the_life() {
        let lifecycle = Lifecycle {
            ttl_seconds: 3600,
            heartbeat_timeout_seconds: 5,
        };
        let ready = t("2026-01-01T00:01:00Z");
        assert_eq!(
            expiry_deadline(Some(ready), Some(t("2026-01-01T00:00:00Z")), lifecycle),
            Some((t("2026-01-01T00:01:05Z"), ExpiryCause::Heartbeat))
        );
        assert_eq!(
            latest_heartbeat(Some(ready), None, Some(t("2026-01-01T00:00:30Z"))),
            Some(ready)
        );
    }

    #[test]
    fn latest_heartbeat_takes_the_maximum() {
        let ready = t("2026-01-01T00:00:00Z");
        assert_eq!(
            latest_heartbeat(
                Some(ready),
                Some(t("2026-01-01T00:00:09Z")),
                Some(t("2026-01-01T00:00:05Z"))
            ),
            Some(t("2026-01-01T00:00:09Z"))
        );
        assert_eq!(latest_heartbeat(None, Some(ready), None), None);
    }

    fn annotated(value: &str) -> Sandbox {
        let mut s = Sandbox::new("s", SandboxSpec::default());
        s.metadata.annotations = Some(BTreeMap::from([(
            HEARTBEAT_ANNOTATION.to_string(),
            value.to_string(),
        )]));
        s
    }

    #[test]
    fn annotation_is_parsed_and_rounded_up() {
        let now = t("2026-01-01T00:00:10Z");
        assert_eq!(
            annotated_heartbeat(&annotated("2026-01-01T00:00:05.250Z"), now),
            Ok(Some(t("2026-01-01T00:00:06Z")))
        );
        assert_eq!(
            annotated_heartbeat(&annotated("2026-01-01T01:00:05+01:00"), now),
            Ok(Some(t("2026-01-01T00:00:05Z")))
        );
        assert_eq!(
            annotated_heartbeat(&Sandbox::new("s", SandboxSpec::default()), now),
            Ok(None)
        );
    }

    #[test]
    fn bad_annotations_are_rejected_with_a_reason() {
        let now = t("2026-01-01T00:00:10Z");
        let err = annotated_heartbeat(&annotated("yesterday"), now).unwrap_err();
        assert!(err.to_string().contains("not an RFC 3339 time"), "{err}");
        let err = annotated_heartbeat(&annotated("2026-01-01T00:05:00Z"), now).unwrap_err();
        assert!(err.to_string().contains("in the future"), "{err}");
    }

    #[test]
    fn defaults_fill_unset_lifecycle_fields() {
        let s = Sandbox::new("s", SandboxSpec::default());
        assert_eq!(
            Lifecycle::of(&s.spec, 7200, 0),
            Lifecycle {
                ttl_seconds: 7200,
                heartbeat_timeout_seconds: 0
            }
        );
    }
}
