//! The budget of TokenReviews for tokens the gateway does not know (pure: every call takes `now`):
//! token buckets, one global and one per client IP, so a flood of bogus tokens costs the API server
//! at most `burst + rate × seconds` reviews and one noisy client cannot spend everyone's budget.
//! Tokens the gateway has seen valid are re-reviewed outside this budget (see `verdict_cache`). The
//! same keyed buckets ([`KeyedBuckets`]) budget each caller's SubjectAccessReviews (`auth`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Most per-key buckets kept; beyond it full (idle) buckets are dropped, then all of them.
const MAX_CLIENTS: usize = 16_384;

/// A token bucket: holds up to `burst` tokens, refilled at `rate` per second.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `rate` per second.
    pub fn new(rate: f64, burst: f64, now: Instant) -> Self {
        let burst = burst.max(1.0);
        Self {
            rate: rate.max(0.0),
            burst,
            tokens: burst,
            updated: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.updated = now;
    }

    /// Takes one token, or says how long until one is there.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        if self.rate <= 0.0 {
            return Err(Duration::from_secs(3600));
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
    }

    /// Puts back a token taken by [`TokenBucket::try_take`] (another bucket refused the review).
    pub fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.burst);
    }

    /// Whether the bucket is full at `now` (its client has been quiet long enough to be forgotten).
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }
}

/// One token bucket per key (a client IP, a caller), created full on first use; when more than
/// [`MAX_CLIENTS`] keys are held, full (idle) buckets are forgotten, then all of them.
#[derive(Debug)]
pub struct KeyedBuckets<K> {
    rate: f64,
    burst: f64,
    buckets: HashMap<K, TokenBucket>,
}

impl<K: std::hash::Hash + Eq + Clone> KeyedBuckets<K> {
    /// Buckets of `burst` tokens refilled at `rate` per second; a rate of 0 turns them off.
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            buckets: HashMap::new(),
        }
    }

    /// Whether the buckets limit anything.
    pub fn is_on(&self) -> bool {
        self.rate > 0.0
    }

    /// Takes one token of `key`'s bucket, or says how long until one is there.
    pub fn try_take(&mut self, key: &K, now: Instant) -> Result<(), Duration> {
        if !self.is_on() {
            return Ok(());
        }
        if !self.buckets.contains_key(key) && self.buckets.len() >= MAX_CLIENTS {
            self.buckets.retain(|_, bucket| !bucket.is_full(now));
            if self.buckets.len() >= MAX_CLIENTS {
                self.buckets.clear();
            }
        }
        let (rate, burst) = (self.rate, self.burst);
        self.buckets
            .entry(key.clone())
            .or_insert_with(|| TokenBucket::new(rate, burst, now))
            .try_take(now)
    }

    /// Puts back a token of `key` taken by [`KeyedBuckets::try_take`].
    pub fn give_back(&mut self, key: &K) {
        if let Some(bucket) = self.buckets.get_mut(key) {
            bucket.give_back();
        }
    }
}

/// Rates and bursts of a [`ReviewBudget`]; a rate of 0 turns that bucket off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetLimits {
    /// TokenReviews per second for unknown tokens, all clients together.
    pub rate: f64,
    /// Burst of the global bucket.
    pub burst: f64,
    /// TokenReviews per second for unknown tokens from one client IP.
    pub per_client_rate: f64,
    /// Burst of each client's bucket.
    pub per_client_burst: f64,
}

/// The global bucket and one bucket per client IP.
#[derive(Debug)]
pub struct ReviewBudget {
    limits: BudgetLimits,
    global: TokenBucket,
    clients: KeyedBuckets<IpAddr>,
}

impl ReviewBudget {
    /// A full budget.
    pub fn new(limits: BudgetLimits, now: Instant) -> Self {
        Self {
            limits,
            global: TokenBucket::new(limits.rate, limits.burst, now),
            clients: KeyedBuckets::new(limits.per_client_rate, limits.per_client_burst),
        }
    }

    /// Spends one review for `client` (unknown when the peer address is not known), or says how long
    /// until one may be spent. A review refused by either bucket spends nothing.
    pub fn try_spend(&mut self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        if let Some(ip) = &client {
            self.clients.try_take(ip, now)?;
        }
        if self.limits.rate <= 0.0 {
            return Ok(());
        }
        self.global.try_take(now).inspect_err(|_| {
            if let Some(ip) = &client {
                self.clients.give_back(ip);
            }
        })
    }
}

/// `Retry-After` seconds for a wait (at least 1).
pub fn retry_after_seconds(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BudgetLimits = BudgetLimits {
        rate: 4.0,
        burst: 6.0,
        per_client_rate: 2.0,
        per_client_burst: 3.0,
    };

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 3.0, start);
        for _ in 0..3 {
            assert!(bucket.try_take(start).is_ok());
        }
        let wait = bucket.try_take(start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert!(bucket.try_take(start + Duration::from_millis(499)).is_err());
        assert!(bucket.try_take(start + Duration::from_millis(1000)).is_ok());
        // Refills never exceed the burst.
        let later = start + Duration::from_secs(100);
        assert!(bucket.is_full(later));
        let taken = (0..10).filter(|_| bucket.try_take(later).is_ok()).count();
        assert_eq!(taken, 3);
    }

    #[test]
    fn one_client_cannot_spend_the_global_budget() {
        let now = Instant::now();
        let mut budget = ReviewBudget::new(LIMITS, now);
        let flooder = (0..100)
            .filter(|_| budget.try_spend(ip(1), now).is_ok())
            .count();
        assert_eq!(flooder, 3, "the flooder gets its own burst only");
        // Others still have the rest of the global burst.
        assert!(budget.try_spend(ip(2), now).is_ok());
        assert!(budget.try_spend(ip(3), now).is_ok());
        assert!(budget.try_spend(ip(4), now).is_ok());
        // Global burst (6) spent: everyone waits, and refusals spend nothing of a client's bucket.
        assert!(budget.try_spend(ip(5), now).is_err());
        let later = now + Duration::from_millis(250);
        assert!(
            budget.try_spend(ip(5), later).is_ok(),
            "one global token refilled"
        );
    }

    #[test]
    fn many_clients_together_are_bounded_by_the_global_rate() {
        let start = Instant::now();
        let mut budget = ReviewBudget::new(LIMITS, start);
        let mut spent = 0;
        for step in 0..1000u32 {
            let now = start + Duration::from_millis(u64::from(step) * 10);
            for client in 0..50u8 {
                if budget.try_spend(ip(client), now).is_ok() {
                    spent += 1;
                }
            }
        }
        // 10 s at 4/s plus a burst of 6.
        assert!(spent <= 46, "{spent} reviews in 10 s");
        assert!(spent >= 40, "{spent} reviews in 10 s");
    }

    #[test]
    fn zero_rates_turn_buckets_off() {
        let now = Instant::now();
        let mut budget = ReviewBudget::new(
            BudgetLimits {
                rate: 0.0,
                burst: 0.0,
                per_client_rate: 0.0,
                per_client_burst: 0.0,
            },
            now,
        );
        assert!((0..1000).all(|_| budget.try_spend(ip(1), now).is_ok()));
        assert!(budget.try_spend(None, now).is_ok());
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_seconds(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
    }
}
