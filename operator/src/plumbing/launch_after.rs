//! The start time a RolloutGroup gives a trajectory Sandbox of a jittered stride (pure): the
//! `orchard.dev/launch-after` annotation as the group writes it ([`annotation_text`]) and as the
//! Sandbox controller reads it ([`launch_after`]); `rollout::jitter` decides the times.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The most a trajectory Sandbox waits for its start after its creation, whatever its annotation
/// says (the schema's maximum jitter, and a second of clock skew).
pub const MAX_WAIT: Duration = Duration::from_secs(61);

/// When the Pod of a trajectory Sandbox created at `created` with annotation `annotation` (its
/// `orchard.dev/launch-after`) may be created (pure): `None` at once (no annotation, not a time, or
/// due), else the time, never later than [`MAX_WAIT`] after `created`.
pub fn launch_after(
    annotation: Option<&str>,
    created: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    let at: Timestamp = annotation?.parse().ok()?;
    let latest = created?
        .checked_add(SignedDuration::try_from(MAX_WAIT).ok()?)
        .ok()?;
    let at = at.min(latest);
    (at > now).then_some(at)
}

/// `at` as the annotation's text: RFC 3339 in UTC with milliseconds.
pub fn annotation_text(at: Timestamp) -> String {
    format!("{at:.3}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + millis).expect("time")
    }

    #[test]
    fn a_pod_waits_for_its_time_but_never_more_than_a_minute_after_creation() {
        let text = annotation_text(at(2_500));
        assert!(text.ends_with(".500Z"), "{text}");
        assert_eq!(
            launch_after(Some(&text), Some(at(0)), at(1_000)),
            Some(at(2_500))
        );
        assert_eq!(
            launch_after(Some(&text), Some(at(0)), at(2_500)),
            None,
            "due"
        );
        assert_eq!(launch_after(None, Some(at(0)), at(0)), None);
        assert_eq!(
            launch_after(Some("soon"), Some(at(0)), at(0)),
            None,
            "not a time"
        );
        let far = annotation_text(at(3_600_000));
        assert_eq!(
            launch_after(Some(&far), Some(at(0)), at(0)),
            Some(at(61_000)),
            "capped"
        );
    }
}
