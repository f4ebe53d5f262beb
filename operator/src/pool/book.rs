//! The pools' in-memory state under one lock: members a reconcile of this replica is claiming now
//! (so two concurrent reconciles do not try the same Pod; the API server's precondition is what makes
//! a claim exclusive), the claims per pool for the status, when a pool's members last failed (to
//! space out replacements), when each pool was last reconciled in full (at most one full reconcile
//! per [`MIN_RECONCILE_INTERVAL`]), and the Sandboxes waiting for a member (woken when one is Ready).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use kube::runtime::reflector::ObjectRef;

use orchard_api::{Sandbox, SandboxPool};

/// A pool by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// How long a member stays reserved by the reconcile that tries to claim it (the claim is one API
/// call; after it the member is either claimed or taken by someone else).
const RESERVATION: Duration = Duration::from_secs(10);

/// The window of `claimedLastMinute`.
const CLAIM_WINDOW: Duration = Duration::from_secs(60);

/// The shortest time between two full reconciles of one pool. A full reconcile looks at every member
/// (its seal, readiness, failures), and every claim brings several member events (the claimed Pod
/// relabelled, its replacement created, scheduled, Ready): without a floor a pool of 1,000 members
/// claimed at 25 a second cost the operator 16 CPU ms per claim. A refill waits at most this long; a
/// pass that has more members to start than it starts at once is followed at once
/// ([`PoolBook::continue_now`]).
pub const MIN_RECONCILE_INTERVAL: Duration = Duration::from_millis(250);

/// How long a reconcile of a pool last reconciled in full at `last` waits before its next full one
/// (pure): `None` when it may run now.
pub fn hold_off(last: Option<Instant>, now: Instant, interval: Duration) -> Option<Duration> {
    let since = now.saturating_duration_since(last?);
    (since < interval).then(|| interval - since)
}

#[derive(Default)]
struct State {
    reserved: HashMap<String, Instant>,
    claims: HashMap<PoolKey, VecDeque<Instant>>,
    totals: HashMap<PoolKey, i64>,
    failures: HashMap<PoolKey, (Instant, String)>,
    last_full: HashMap<PoolKey, Instant>,
    waiting: HashMap<PoolKey, BTreeSet<(String, String)>>,
}

/// The pools' book; see the module docs.
pub struct PoolBook {
    state: Mutex<State>,
    wake_sandbox: mpsc::UnboundedSender<ObjectRef<Sandbox>>,
    wake_pool: mpsc::UnboundedSender<ObjectRef<SandboxPool>>,
    receivers: Mutex<Option<PoolSignals>>,
}

/// The receiving ends: Sandboxes to reconcile (a member became Ready for them, or their pool
/// appeared) and pools to reconcile (a member changed or was claimed).
pub struct PoolSignals {
    /// Sandboxes waiting for a member.
    pub sandboxes: mpsc::UnboundedReceiver<ObjectRef<Sandbox>>,
    /// Pools whose members changed.
    pub pools: mpsc::UnboundedReceiver<ObjectRef<SandboxPool>>,
}

impl Default for PoolBook {
    fn default() -> Self {
        let (wake_sandbox, sandboxes) = mpsc::unbounded();
        let (wake_pool, pools) = mpsc::unbounded();
        Self {
            state: Mutex::default(),
            wake_sandbox,
            wake_pool,
            receivers: Mutex::new(Some(PoolSignals { sandboxes, pools })),
        }
    }
}

impl PoolBook {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut state)
    }

    /// The receivers, once (the process wiring takes them).
    pub fn take_receivers(&self) -> Option<PoolSignals> {
        self.receivers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Reserves member `pod_uid` for one claim attempt; false if another reconcile holds it.
    pub fn reserve(&self, pod_uid: &str) -> bool {
        let now = Instant::now();
        self.with(|s| {
            s.reserved
                .retain(|_, at| now.duration_since(*at) < RESERVATION);
            if s.reserved.contains_key(pod_uid) {
                return false;
            }
            s.reserved.insert(pod_uid.to_string(), now);
            true
        })
    }

    /// Whether member `pod_uid` is reserved (being claimed, or claimed moments ago).
    pub fn is_reserved(&self, pod_uid: &str) -> bool {
        self.with(|s| {
            s.reserved
                .get(pod_uid)
                .is_some_and(|at| at.elapsed() < RESERVATION)
        })
    }

    /// Ends a reservation whose claim failed for a reason that leaves the member claimable.
    pub fn release(&self, pod_uid: &str) {
        self.with(|s| s.reserved.remove(pod_uid));
    }

    /// Records a claim from `pool` and wakes the pool (it refills).
    pub fn claimed(&self, pool: &PoolKey) {
        let now = Instant::now();
        self.with(|s| {
            s.claims.entry(pool.clone()).or_default().push_back(now);
            *s.totals.entry(pool.clone()).or_default() += 1;
        });
        self.wake_pool(pool);
    }

    /// Claims from `pool` in the last minute, and since this replica started.
    pub fn claim_counts(&self, pool: &PoolKey) -> (i64, i64) {
        let now = Instant::now();
        self.with(|s| {
            let recent = s.claims.entry(pool.clone()).or_default();
            while recent
                .front()
                .is_some_and(|at| now.duration_since(*at) >= CLAIM_WINDOW)
            {
                recent.pop_front();
            }
            let last_minute = i64::try_from(recent.len()).unwrap_or(i64::MAX);
            (last_minute, s.totals.get(pool).copied().unwrap_or(0))
        })
    }

    /// Records that a member of `pool` failed now, and why.
    pub fn member_failed(&self, pool: &PoolKey, why: String) {
        self.with(|s| s.failures.insert(pool.clone(), (Instant::now(), why)));
    }

    /// How long ago `pool`'s members last failed, and why.
    pub fn last_failure(&self, pool: &PoolKey) -> Option<(Duration, String)> {
        self.with(|s| {
            s.failures
                .get(pool)
                .map(|(at, why)| (at.elapsed(), why.clone()))
        })
    }

    /// Forgets a deleted pool.
    pub fn forget(&self, pool: &PoolKey) {
        self.with(|s| {
            s.claims.remove(pool);
            s.totals.remove(pool);
            s.failures.remove(pool);
            s.last_full.remove(pool);
        });
    }

    /// The pass of `pool` that just ended left work for right away (more members to start than one
    /// pass starts): the next one is not held off.
    pub fn continue_now(&self, pool: &PoolKey) {
        self.with(|s| s.last_full.remove(pool));
    }

    /// Whether `pool` may be reconciled in full now (then this counts as its last full reconcile),
    /// or how long it waits first ([`hold_off`] with [`MIN_RECONCILE_INTERVAL`]).
    pub fn full_reconcile(&self, pool: &PoolKey) -> Option<Duration> {
        self.with(|s| {
            let now = Instant::now();
            let wait = hold_off(s.last_full.get(pool).copied(), now, MIN_RECONCILE_INTERVAL);
            if wait.is_none() {
                s.last_full.insert(pool.clone(), now);
            }
            wait
        })
    }

    /// Sandbox `namespace/name` waits for a member of `pool` (or for the pool to exist).
    pub fn wait_for(&self, pool: &PoolKey, sandbox: &str) {
        self.with(|s| {
            s.waiting
                .entry(pool.clone())
                .or_default()
                .insert((pool.namespace.clone(), sandbox.to_string()))
        });
    }

    /// Sandbox `namespace/name` no longer waits for `pool`.
    pub fn stop_waiting(&self, pool: &PoolKey, sandbox: &str) {
        self.with(|s| {
            if let Some(waiting) = s.waiting.get_mut(pool) {
                waiting.remove(&(pool.namespace.clone(), sandbox.to_string()));
                if waiting.is_empty() {
                    s.waiting.remove(pool);
                }
            }
        });
    }

    /// Wakes every Sandbox waiting for `pool` (a member became Ready, or the pool changed).
    pub fn wake_waiting(&self, pool: &PoolKey) {
        let waiting: Vec<(String, String)> = self.with(|s| {
            s.waiting
                .get(pool)
                .map(|w| w.iter().cloned().collect())
                .unwrap_or_default()
        });
        for (namespace, name) in waiting {
            let _ = self
                .wake_sandbox
                .unbounded_send(ObjectRef::new(&name).within(&namespace));
        }
    }

    /// Asks for a reconcile of `pool`.
    pub fn wake_pool(&self, pool: &PoolKey) {
        let _ = self
            .wake_pool
            .unbounded_send(ObjectRef::new(&pool.name).within(&pool.namespace));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> PoolKey {
        PoolKey {
            namespace: "ns".into(),
            name: "p".into(),
        }
    }

    #[test]
    fn full_reconciles_of_a_pool_are_spaced_out() {
        let now = Instant::now();
        let interval = Duration::from_millis(250);
        assert_eq!(hold_off(None, now, interval), None, "never reconciled");
        assert_eq!(
            hold_off(Some(now - Duration::from_millis(100)), now, interval),
            Some(Duration::from_millis(150))
        );
        assert_eq!(hold_off(Some(now - interval), now, interval), None);
        let book = PoolBook::default();
        assert_eq!(book.full_reconcile(&key()), None);
        let wait = book.full_reconcile(&key()).expect("held off right after");
        assert!(wait <= MIN_RECONCILE_INTERVAL);
        book.continue_now(&key());
        assert_eq!(book.full_reconcile(&key()), None, "a pass that left work");
        book.forget(&key());
        assert_eq!(
            book.full_reconcile(&key()),
            None,
            "a deleted pool starts over"
        );
    }

    #[test]
    fn a_member_is_reserved_by_one_claim_at_a_time() {
        let book = PoolBook::default();
        assert!(book.reserve("u1"));
        assert!(!book.reserve("u1"));
        assert!(book.is_reserved("u1"));
        assert!(book.reserve("u2"));
        book.release("u1");
        assert!(book.reserve("u1"));
    }

    #[test]
    fn claims_are_counted_and_wake_the_pool() {
        let book = PoolBook::default();
        let mut signals = book.take_receivers().expect("receivers");
        assert!(book.take_receivers().is_none());
        book.claimed(&key());
        book.claimed(&key());
        assert_eq!(book.claim_counts(&key()), (2, 2));
        assert_eq!(signals.pools.try_recv().expect("woken").name, "p");
    }

    #[test]
    fn waiting_sandboxes_are_woken_until_they_stop_waiting() {
        let book = PoolBook::default();
        let mut signals = book.take_receivers().expect("receivers");
        book.wait_for(&key(), "a");
        book.wait_for(&key(), "b");
        book.stop_waiting(&key(), "a");
        book.wake_waiting(&key());
        let woken = signals.sandboxes.try_recv().expect("woken");
        assert_eq!(
            (woken.name.as_str(), woken.namespace.as_deref()),
            ("b", Some("ns"))
        );
        assert!(signals.sandboxes.try_recv().is_err(), "nothing more");
    }
}
