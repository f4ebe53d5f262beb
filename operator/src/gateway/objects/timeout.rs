//! `POST .../timeout`: the TTL of a Ready sandbox set so that it ends a given number of seconds from
//! now (E2B's `set_timeout`), to extend or shorten its life, within the operator's maximum TTL. The
//! TTL counts from Ready, so the new TTL is the time since Ready plus the seconds asked for.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Longest timeout one call may ask for (a year): bounds the arithmetic whatever the maximum TTL.
pub const MAX_TIMEOUT_SECONDS: i64 = 366 * 24 * 3600;

/// The TTL a `/timeout` call sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewTtl {
    /// `spec.lifecycle.ttlSeconds` to write.
    pub ttl_seconds: i64,
    /// When that TTL ends the sandbox (Ready time plus the TTL).
    pub ends_at: Timestamp,
}

/// Why a `/timeout` call is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The seconds are not between 1 and [`MAX_TIMEOUT_SECONDS`].
    OutOfRange(i64),
    /// The TTL would pass the operator's maximum; `latest` is the most seconds from now still allowed
    /// (0 or less: none).
    BeyondMaximum {
        /// `--max-ttl-seconds`.
        max_ttl_seconds: i64,
        /// The most seconds from now a call may ask for.
        latest: i64,
    },
}

impl Refusal {
    /// The error message (pure).
    pub fn message(&self) -> String {
        match self {
            Self::OutOfRange(seconds) => format!(
                "`timeoutSeconds` must be between 1 and {MAX_TIMEOUT_SECONDS}, not {seconds}"
            ),
            Self::BeyondMaximum {
                max_ttl_seconds,
                latest,
            } if *latest > 0 => format!(
                "a sandbox lives at most {max_ttl_seconds}s after Ready (the operator's --max-ttl-seconds, Helm value sandboxDefaults.maxTtlSeconds): this one can be given at most {latest}s from now"
            ),
            Self::BeyondMaximum {
                max_ttl_seconds, ..
            } => format!(
                "a sandbox lives at most {max_ttl_seconds}s after Ready (the operator's --max-ttl-seconds, Helm value sandboxDefaults.maxTtlSeconds): this one cannot be extended"
            ),
        }
    }
}

/// The TTL that ends a sandbox Ready since `ready` at `seconds` after `now`, at most
/// `max_ttl_seconds` (pure). The time since Ready is rounded up to whole seconds, so the sandbox
/// never ends before `now + seconds`.
pub fn ttl_for_timeout(
    ready: Timestamp,
    now: Timestamp,
    seconds: i64,
    max_ttl_seconds: i64,
) -> Result<NewTtl, Refusal> {
    if !(1..=MAX_TIMEOUT_SECONDS).contains(&seconds) {
        return Err(Refusal::OutOfRange(seconds));
    }
    let since_ready = now.duration_since(ready).max(SignedDuration::ZERO);
    let elapsed = since_ready.as_secs() + i64::from(since_ready.subsec_nanos() > 0);
    let ttl_seconds = elapsed + seconds;
    if ttl_seconds > max_ttl_seconds {
        return Err(Refusal::BeyondMaximum {
            max_ttl_seconds,
            latest: max_ttl_seconds - elapsed,
        });
    }
    let ends_at = ready
        .checked_add(SignedDuration::from_secs(ttl_seconds))
        .unwrap_or(now);
    Ok(NewTtl {
        ttl_seconds,
        ends_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("time")
    }

    #[test]
    fn the_ttl_is_the_time_since_ready_plus_the_timeout() {
        assert_eq!(
            ttl_for_timeout(at(0), at(100), 30, 3600),
            Ok(NewTtl {
                ttl_seconds: 130,
                ends_at: at(130)
            })
        );
        // Shortening works the same way: 10 s from now.
        assert_eq!(
            ttl_for_timeout(at(0), at(5000), 10, 86400).map(|t| t.ttl_seconds),
            Ok(5010)
        );
    }

    #[test]
    fn a_part_second_since_ready_is_rounded_up_so_the_end_is_never_early() {
        let now = at(100)
            .checked_add(SignedDuration::from_millis(300))
            .expect("time");
        let ttl = ttl_for_timeout(at(0), now, 30, 3600).expect("allowed");
        assert_eq!(ttl.ttl_seconds, 131);
        assert!(
            ttl.ends_at
                >= now
                    .checked_add(SignedDuration::from_secs(30))
                    .expect("time")
        );
    }

    #[test]
    fn beyond_the_maximum_is_refused_with_the_most_still_allowed() {
        let refused = ttl_for_timeout(at(0), at(100), 3600, 3600).expect_err("beyond");
        assert_eq!(
            refused,
            Refusal::BeyondMaximum {
                max_ttl_seconds: 3600,
                latest: 3500
            }
        );
        assert!(refused.message().contains("at most 3500s from now"));
        assert!(refused.message().contains("sandboxDefaults.maxTtlSeconds"));
        // Exactly the maximum is allowed.
        assert_eq!(
            ttl_for_timeout(at(0), at(100), 3500, 3600).map(|t| t.ttl_seconds),
            Ok(3600)
        );
        let spent = ttl_for_timeout(at(0), at(4000), 1, 3600).expect_err("spent");
        assert!(spent.message().contains("cannot be extended"), "{spent:?}");
    }

    #[test]
    fn seconds_outside_the_range_are_refused() {
        for seconds in [0, -5, MAX_TIMEOUT_SECONDS + 1, i64::MAX] {
            assert_eq!(
                ttl_for_timeout(at(0), at(1), seconds, i64::MAX),
                Err(Refusal::OutOfRange(seconds))
            );
        }
    }

    #[test]
    fn a_ready_time_in_the_future_counts_as_now() {
        assert_eq!(
            ttl_for_timeout(at(50), at(0), 30, 3600).map(|t| t.ttl_seconds),
            Ok(30)
        );
    }
}
