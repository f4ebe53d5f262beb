//! Time arithmetic the controllers share (pure): Kubernetes times are whole seconds, requeues are
//! durations.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// Rounds a time up to the next whole second (a time already on a second stays).
pub fn ceil_to_second(t: Timestamp) -> Timestamp {
    if t.subsec_nanosecond() == 0 {
        return t;
    }
    Timestamp::from_second(t.as_second() + 1).unwrap_or(t)
}

/// Rounds a time down to a whole second.
pub fn floor_to_second(t: Timestamp) -> Timestamp {
    Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// Time from `now` until `deadline` (zero if it passed), with a millisecond of slack so a requeue
/// lands at or just after the deadline rather than just before it.
pub fn until(now: Timestamp, deadline: Timestamp) -> Duration {
    let remaining = deadline.duration_since(now);
    Duration::try_from(remaining).unwrap_or(Duration::ZERO) + Duration::from_millis(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn rounding() {
        assert_eq!(
            ceil_to_second(t("2026-01-01T00:00:05Z")),
            t("2026-01-01T00:00:05Z")
        );
        assert_eq!(
            ceil_to_second(t("2026-01-01T00:00:05.001Z")),
            t("2026-01-01T00:00:06Z")
        );
        assert_eq!(
            floor_to_second(t("2026-01-01T00:00:05.999Z")),
            t("2026-01-01T00:00:05Z")
        );
    }

    #[test]
    fn until_a_deadline_lands_just_after_it() {
        let now = t("2026-01-01T00:00:05Z");
        assert_eq!(
            until(now, t("2026-01-01T00:00:07Z")),
            Duration::from_millis(2001)
        );
        assert_eq!(
            until(now, t("2026-01-01T00:00:01Z")),
            Duration::from_millis(1)
        );
    }
}
