//! The caches of the gateway's verdicts (pure: every call takes `now`): TokenReview results, and
//! SubjectAccessReview decisions. Accepted and refused verdicts live in two separate bounded maps, so
//! a flood of bogus tokens, or of requests for names a caller may not touch, fills only the refused
//! map and never evicts a valid caller's entry. An accepted token stays *known* after its entry
//! expired (for [`KNOWN_FOR`]): it is reviewed again, but outside the budget for unknown tokens, so a
//! flood cannot starve callers the gateway has already seen.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Cache key: a SHA-256 of the token (never the token itself), with the decision's attributes for
/// access decisions.
pub type Key = [u8; 32];

/// How long an accepted token stays known after its review.
pub const KNOWN_FOR: Duration = Duration::from_secs(3600);

/// What the cache says about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<V> {
    /// Accepted within the TTL.
    Valid(V),
    /// Refused within the TTL, with the reason.
    Invalid(String),
    /// Accepted before, expired: review it again (outside the unknown-token budget).
    Known,
    /// Never seen, or forgotten: review it within the unknown-token budget.
    Unknown,
}

/// Accepted (`V`) and refused tokens, each map bounded.
#[derive(Debug)]
pub struct VerdictCache<V> {
    ttl: Duration,
    max_valid: usize,
    max_invalid: usize,
    valid: HashMap<Key, (Instant, V)>,
    invalid: HashMap<Key, (Instant, String)>,
}

impl<V: Clone> VerdictCache<V> {
    /// An empty cache whose entries are fresh for `ttl`, holding at most `max_valid` accepted and
    /// `max_invalid` refused tokens.
    pub fn new(ttl: Duration, max_valid: usize, max_invalid: usize) -> Self {
        Self {
            ttl,
            max_valid: max_valid.max(1),
            max_invalid: max_invalid.max(1),
            valid: HashMap::new(),
            invalid: HashMap::new(),
        }
    }

    /// What is known about `key` at `now`.
    pub fn lookup(&self, key: &Key, now: Instant) -> Lookup<V> {
        if let Some((at, value)) = self.valid.get(key) {
            let age = now.saturating_duration_since(*at);
            if age < self.ttl {
                return Lookup::Valid(value.clone());
            }
            if age < KNOWN_FOR {
                return Lookup::Known;
            }
        }
        match self.invalid.get(key) {
            Some((at, reason)) if now.saturating_duration_since(*at) < self.ttl => {
                Lookup::Invalid(reason.clone())
            }
            _ => Lookup::Unknown,
        }
    }

    /// Records an accepted token.
    pub fn accept(&mut self, key: Key, value: V, now: Instant) {
        self.invalid.remove(&key);
        if self.valid.len() >= self.max_valid && !self.valid.contains_key(&key) {
            // Forgotten first: entries past KNOWN_FOR, then expired ones, then (a cache full of
            // fresh valid tokens) all of them.
            self.valid
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < KNOWN_FOR);
            if self.valid.len() >= self.max_valid {
                let ttl = self.ttl;
                self.valid
                    .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            }
            if self.valid.len() >= self.max_valid {
                self.valid.clear();
            }
        }
        self.valid.insert(key, (now, value));
    }

    /// Records a refused token (an accepted token that is now refused stops being known).
    pub fn refuse(&mut self, key: Key, reason: String, now: Instant) {
        self.valid.remove(&key);
        if self.invalid.len() >= self.max_invalid && !self.invalid.contains_key(&key) {
            let ttl = self.ttl;
            self.invalid
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            if self.invalid.len() >= self.max_invalid {
                self.invalid.clear();
            }
        }
        self.invalid.insert(key, (now, reason));
    }

    /// Number of accepted and refused entries held (for tests and metrics).
    pub fn sizes(&self) -> (usize, usize) {
        (self.valid.len(), self.invalid.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn key(n: u32) -> Key {
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(&n.to_le_bytes());
        key
    }

    #[test]
    fn entries_are_fresh_for_the_ttl_then_known_or_unknown() {
        let now = Instant::now();
        let mut cache = VerdictCache::new(TTL, 10, 10);
        cache.accept(key(1), "alice", now);
        cache.refuse(key(2), "bogus".into(), now);
        assert_eq!(cache.lookup(&key(1), now), Lookup::Valid("alice"));
        assert_eq!(cache.lookup(&key(2), now), Lookup::Invalid("bogus".into()));
        assert_eq!(cache.lookup(&key(3), now), Lookup::Unknown);
        let expired = now + TTL;
        assert_eq!(cache.lookup(&key(1), expired), Lookup::Known);
        assert_eq!(cache.lookup(&key(2), expired), Lookup::Unknown);
        assert_eq!(cache.lookup(&key(1), now + KNOWN_FOR), Lookup::Unknown);
    }

    #[test]
    fn a_flood_of_refused_tokens_never_evicts_accepted_ones() {
        let now = Instant::now();
        let mut cache = VerdictCache::new(TTL, 4, 8);
        cache.accept(key(0), "alice", now);
        for n in 1..10_000 {
            cache.refuse(key(n), "bogus".into(), now);
        }
        assert_eq!(cache.lookup(&key(0), now), Lookup::Valid("alice"));
        let (valid, invalid) = cache.sizes();
        assert_eq!(valid, 1);
        assert!(invalid <= 8, "{invalid} refused entries");
    }

    #[test]
    fn a_revoked_token_stops_being_known() {
        let now = Instant::now();
        let mut cache = VerdictCache::new(TTL, 4, 4);
        cache.accept(key(1), "alice", now);
        let later = now + TTL;
        assert_eq!(cache.lookup(&key(1), later), Lookup::Known);
        cache.refuse(key(1), "expired".into(), later);
        assert_eq!(
            cache.lookup(&key(1), later),
            Lookup::Invalid("expired".into())
        );
        assert_eq!(cache.lookup(&key(1), later + TTL), Lookup::Unknown);
    }

    #[test]
    fn a_full_valid_map_drops_expired_entries_before_fresh_ones() {
        let now = Instant::now();
        let mut cache = VerdictCache::new(TTL, 3, 3);
        cache.accept(key(1), "old", now);
        let later = now + TTL + Duration::from_secs(1);
        cache.accept(key(2), "b", later);
        cache.accept(key(3), "c", later);
        cache.accept(key(4), "d", later);
        assert_eq!(cache.lookup(&key(1), later), Lookup::Unknown);
        for n in 2..=4 {
            assert!(matches!(cache.lookup(&key(n), later), Lookup::Valid(_)));
        }
    }
}
