//! The operator's one retry policy: exponential backoff with jitter, doubling from a base up to a cap
//! ([`delay_for`]). Per object for failed reconciles ([`ReconcileBackoff`]; kube-runtime has none built
//! in), resetting on the object's next success; and per operation for the trajectory runner's calls
//! ([`Retry`]), resetting when a call succeeds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Tracks consecutive failures per object key (`namespace/name`).
#[derive(Debug)]
pub struct ReconcileBackoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ReconcileBackoff {
    /// Backoff starting at `base`, doubling per failure, capped at `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn next_delay(&self, key: &str) -> Duration {
        let attempt = {
            let mut failures = self
                .failures
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let count = failures.entry(key.to_string()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        };
        let jitter = rand::random_range(0.8..1.2);
        delay_for(self.base, self.max, attempt)
            .mul_f64(jitter)
            .min(self.max)
    }

    /// Forgets the failures of `key` (call after a successful reconcile).
    pub fn reset(&self, key: &str) {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        failures.remove(key);
    }

    /// Consecutive failures recorded for `key`.
    pub fn failures(&self, key: &str) -> u32 {
        let failures = self
            .failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        failures.get(key).copied().unwrap_or(0)
    }
}

/// The delay before the next retry of one operation: the policy of [`ReconcileBackoff`] for a single
/// caller that owns its attempts.
#[derive(Debug, Clone)]
pub struct Retry {
    base: Duration,
    max: Duration,
    attempt: u32,
}

impl Retry {
    /// Retries starting at `base`, doubling, capped at `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            attempt: 0,
        }
    }

    /// The next delay (with jitter), counting one more failure.
    pub fn next_delay(&mut self) -> Duration {
        self.attempt = self.attempt.saturating_add(1);
        let jitter = rand::random_range(0.8..1.2);
        delay_for(self.base, self.max, self.attempt)
            .mul_f64(jitter)
            .min(self.max)
    }

    /// Sleeps for the next delay.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// Starts over at `base` (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// `base * 2^(attempt-1)`, capped at `max` (pure; `attempt` starts at 1).
pub fn delay_for(base: Duration, max: Duration, attempt: u32) -> Duration {
    let exponent = attempt.saturating_sub(1).min(30);
    base.saturating_mul(1u32 << exponent).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_doubles_within_jitter_and_starts_over_after_a_reset() {
        let mut retry = Retry::new(Duration::from_millis(100), Duration::from_secs(1));
        let first = retry.next_delay();
        let second = retry.next_delay();
        assert!(first >= Duration::from_millis(80) && first <= Duration::from_millis(120));
        assert!(second >= Duration::from_millis(160) && second <= Duration::from_millis(240));
        for _ in 0..10 {
            assert!(retry.next_delay() <= Duration::from_secs(1));
        }
        retry.reset();
        assert!(retry.next_delay() <= Duration::from_millis(120));
    }

    #[test]
    fn delays_double_and_cap() {
        let base = Duration::from_millis(500);
        let max = Duration::from_secs(10);
        assert_eq!(delay_for(base, max, 1), Duration::from_millis(500));
        assert_eq!(delay_for(base, max, 2), Duration::from_secs(1));
        assert_eq!(delay_for(base, max, 4), Duration::from_secs(4));
        assert_eq!(delay_for(base, max, 6), max);
        assert_eq!(delay_for(base, max, 1000), max);
    }

    #[test]
    fn failures_are_per_object_and_reset_on_success() {
        let backoff = ReconcileBackoff::new(Duration::from_millis(100), Duration::from_secs(60));
        let first = backoff.next_delay("ns/a");
        let second = backoff.next_delay("ns/a");
        assert!(first <= Duration::from_millis(120) && second >= Duration::from_millis(160));
        assert_eq!(backoff.failures("ns/a"), 2);
        assert_eq!(backoff.failures("ns/b"), 0);
        backoff.reset("ns/a");
        assert_eq!(backoff.failures("ns/a"), 0);
    }
}
