//! The operator's in-memory side of admission: which groups wait on each queue and which admitted
//! trajectories the caches do not show yet (reservations). One lock serialises every admission, so
//! two reconciles never give away the same slot.
//!
//! Nothing here must survive a restart: capacity in use is recounted from the caches (`accounting`),
//! waiting groups register again when they reconcile (a gained leadership reconciles them all), and
//! the Fair order's key is the group's `status.lastAdmissionTime`. A stride whose launch a crash
//! interrupted is finished without asking again ([`QueueBook::reserve`]): it was admitted before.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;

use super::order::{Request, admissible, ordered, position};
use orchard_api::{AdmissionOrder, RolloutGroup};

/// A reservation the caches never confirmed is dropped after this long (its create failed, or the
/// group was deleted before it launched).
pub const RESERVATION_TTL: Duration = Duration::from_secs(30);

/// A queue: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    /// Namespace of the queue (and of its groups).
    pub namespace: String,
    /// Name of the RolloutQueue.
    pub name: String,
}

impl std::fmt::Display for QueueKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a queue's spec says, if the queue exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `spec.maxRunningTrajectories`.
    pub max_running: u32,
    /// `spec.admission`.
    pub order: AdmissionOrder,
}

/// Why a stride waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    /// Behind other strides, or not enough free slots.
    Queued,
    /// The queue the group names does not exist (yet).
    QueueNotFound,
    /// The stride is larger than the queue's whole capacity.
    StrideExceedsQueue,
}

impl WaitReason {
    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Queued => "Queued",
            WaitReason::QueueNotFound => "QueueNotFound",
            WaitReason::StrideExceedsQueue => "StrideExceedsQueue",
        }
    }
}

/// The answer to a stride's request.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Launch it now; `since` is when it began to wait.
    Admitted {
        /// When the stride began to wait.
        since: Timestamp,
    },
    /// Not yet.
    Waiting {
        /// Why.
        reason: WaitReason,
        /// 1-based position in the admission order (for `Queued`).
        position: Option<u32>,
        /// When the stride began to wait.
        since: Timestamp,
        /// Slots in use and the queue's capacity, for the message.
        used: u32,
    },
}

/// What the caches show of a queue's trajectories now.
pub struct InUse<'a> {
    /// Trajectories holding a slot (`accounting::holders`).
    pub holders: &'a BTreeSet<String>,
    /// Whether the Sandbox cache shows a trajectory of that name at all (a reservation ends then).
    pub seen: &'a dyn Fn(&str) -> bool,
}

#[derive(Default)]
struct QueueState {
    waiting: BTreeMap<String, Request>,
    reserved: BTreeMap<String, Instant>,
}

impl QueueState {
    fn prune(&mut self, in_use: &InUse<'_>, now: Instant) {
        self.reserved
            .retain(|name, at| !(in_use.seen)(name) && now.duration_since(*at) < RESERVATION_TTL);
    }

    fn used(&self, in_use: &InUse<'_>) -> u32 {
        let extra = self
            .reserved
            .keys()
            .filter(|name| !in_use.holders.contains(*name))
            .count();
        u32::try_from(in_use.holders.len() + extra).unwrap_or(u32::MAX)
    }
}

/// A snapshot of one queue for its status and metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueView {
    /// Slots in use (holders and reservations).
    pub used: u32,
    /// Waiting strides in admission order (too-large ones last).
    pub waiting: Vec<Request>,
}

/// Admission state of every queue, and the signals that keep the queue loop informed.
pub struct QueueBook {
    queues: Mutex<HashMap<QueueKey, QueueState>>,
    dirty: mpsc::UnboundedSender<QueueKey>,
    wake: mpsc::UnboundedSender<ObjectRef<RolloutGroup>>,
    receivers: Mutex<Option<Receivers>>,
}

/// The receiving ends, taken once by the process wiring (`app::start`).
pub struct Receivers {
    /// Queues whose accounting may have changed.
    pub dirty: mpsc::UnboundedReceiver<QueueKey>,
    /// Groups to reconcile because their stride may be admissible now.
    pub wake: mpsc::UnboundedReceiver<ObjectRef<RolloutGroup>>,
}

impl Default for QueueBook {
    fn default() -> Self {
        let (dirty, dirty_rx) = mpsc::unbounded();
        let (wake, wake_rx) = mpsc::unbounded();
        Self {
            queues: Mutex::default(),
            dirty,
            wake,
            receivers: Mutex::new(Some(Receivers {
                dirty: dirty_rx,
                wake: wake_rx,
            })),
        }
    }
}

impl QueueBook {
    fn with<T>(&self, key: &QueueKey, work: impl FnOnce(&mut QueueState) -> T) -> T {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        work(queues.entry(key.clone()).or_default())
    }

    /// The receiving ends of the signals (once; `None` afterwards).
    pub fn take_receivers(&self) -> Option<Receivers> {
        self.receivers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// Tells the queue loop that `key`'s accounting may have changed.
    pub fn mark_dirty(&self, key: QueueKey) {
        let _ = self.dirty.unbounded_send(key);
    }

    /// Asks the RolloutGroup controller to reconcile `group`.
    pub fn wake(&self, group: ObjectRef<RolloutGroup>) {
        let _ = self.wake.unbounded_send(group);
    }

    /// Asks for admission of `request`'s stride (trajectory names `names`) on queue `key`, whose spec
    /// is `limits` (`None`: the queue does not exist). Registers the request as waiting unless it is
    /// admitted; an admitted stride's names are reserved until the caches show them.
    pub fn request(
        &self,
        key: &QueueKey,
        limits: Option<Limits>,
        mut request: Request,
        names: &[String],
        in_use: &InUse<'_>,
    ) -> Verdict {
        let now = Instant::now();
        let verdict = self.with(key, |state| {
            state.prune(in_use, now);
            if let Some(known) = state.waiting.get(&request.uid)
                && known.count == request.count
            {
                request.since = known.since;
            }
            let since = request.since;
            let uid = request.uid.clone();
            let count = request.count;
            state.waiting.insert(uid.clone(), request);
            let used = state.used(in_use);
            let Some(limits) = limits else {
                return Verdict::Waiting {
                    reason: WaitReason::QueueNotFound,
                    position: None,
                    since,
                    used,
                };
            };
            if count > limits.max_running {
                return Verdict::Waiting {
                    reason: WaitReason::StrideExceedsQueue,
                    position: None,
                    since,
                    used,
                };
            }
            let waiting: Vec<Request> = state.waiting.values().cloned().collect();
            let order = ordered(&waiting, limits.order, limits.max_running);
            let free = limits.max_running.saturating_sub(used);
            if admissible(&order, free).contains(&uid.as_str()) {
                state.waiting.remove(&uid);
                for name in names {
                    state.reserved.insert(name.clone(), now);
                }
                Verdict::Admitted { since }
            } else {
                Verdict::Waiting {
                    reason: WaitReason::Queued,
                    position: position(&order, &uid),
                    since,
                    used,
                }
            }
        });
        if matches!(verdict, Verdict::Admitted { .. }) {
            // Its status shows the others' positions change; and the queue's status changes.
            self.mark_dirty(key.clone());
        }
        verdict
    }

    /// Reserves `names` without asking: the rest of a stride admitted before a crash.
    pub fn reserve(&self, key: &QueueKey, names: &[String]) {
        let now = Instant::now();
        self.with(key, |state| {
            for name in names {
                state.reserved.insert(name.clone(), now);
            }
        });
    }

    /// The group `uid` no longer waits on `key` (it finished, failed, or its stride was launched).
    pub fn withdraw(&self, key: &QueueKey, uid: &str) {
        let removed = self.with(key, |state| state.waiting.remove(uid).is_some());
        if removed {
            self.mark_dirty(key.clone());
        }
    }

    /// Forgets waiting groups for which `alive` is false (deleted groups).
    pub fn retain_groups(&self, key: &QueueKey, alive: impl Fn(&Request) -> bool) {
        self.with(key, |state| state.waiting.retain(|_, r| alive(r)));
    }

    /// The groups whose stride is admissible now, and the queue as it stands.
    pub fn view(
        &self,
        key: &QueueKey,
        limits: Option<Limits>,
        in_use: &InUse<'_>,
    ) -> (Vec<Request>, QueueView) {
        let now = Instant::now();
        self.with(key, |state| {
            state.prune(in_use, now);
            let used = state.used(in_use);
            let waiting: Vec<Request> = state.waiting.values().cloned().collect();
            let Some(limits) = limits else {
                return (Vec::new(), QueueView { used, waiting });
            };
            let order = ordered(&waiting, limits.order, limits.max_running);
            let free = limits.max_running.saturating_sub(used);
            let admissible_now: BTreeSet<&str> = admissible(&order, free).into_iter().collect();
            let wake: Vec<Request> = order
                .iter()
                .filter(|r| admissible_now.contains(r.uid.as_str()))
                .map(|r| (*r).clone())
                .collect();
            let mut in_order: Vec<Request> = order.into_iter().cloned().collect();
            in_order.extend(
                waiting
                    .iter()
                    .filter(|r| r.count > limits.max_running)
                    .cloned(),
            );
            (
                wake,
                QueueView {
                    used,
                    waiting: in_order,
                },
            )
        })
    }

    /// Every queue the book knows.
    pub fn keys(&self) -> Vec<QueueKey> {
        let queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        queues.keys().cloned().collect()
    }

    /// Forgets a queue with nothing waiting and nothing reserved.
    pub fn forget_if_idle(&self, key: &QueueKey) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if queues
            .get(key)
            .is_some_and(|s| s.waiting.is_empty() && s.reserved.is_empty())
        {
            queues.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> QueueKey {
        QueueKey {
            namespace: "rl".into(),
            name: "q".into(),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn request(uid: &str, created: i64, count: u32) -> Request {
        Request {
            uid: uid.into(),
            group: uid.into(),
            created: at(created),
            last_admitted: None,
            since: at(100 + created),
            count,
        }
    }

    fn names(group: &str, count: u32) -> Vec<String> {
        (0..count).map(|i| format!("{group}-{i}")).collect()
    }

    const LIMITS: Limits = Limits {
        max_running: 8,
        order: AdmissionOrder::Fifo,
    };

    #[test]
    fn reservations_count_until_the_cache_shows_the_trajectories() {
        let book = QueueBook::default();
        let holders = BTreeSet::new();
        let nothing_seen = |_: &str| false;
        let in_use = InUse {
            holders: &holders,
            seen: &nothing_seen,
        };
        let first = book.request(
            &key(),
            Some(LIMITS),
            request("a", 1, 6),
            &names("a", 6),
            &in_use,
        );
        assert!(matches!(first, Verdict::Admitted { .. }));
        // The cache shows nothing yet: a's six reservations still count, so b's 4 do not fit.
        let second = book.request(
            &key(),
            Some(LIMITS),
            request("b", 2, 4),
            &names("b", 4),
            &in_use,
        );
        assert!(
            matches!(
                second,
                Verdict::Waiting {
                    reason: WaitReason::Queued,
                    position: Some(1),
                    used: 6,
                    ..
                }
            ),
            "{second:?}"
        );
        // The cache shows a's trajectories, two of them finished: four slots are in use.
        let holders: BTreeSet<String> = names("a", 4).into_iter().collect();
        let seen = |name: &str| name.starts_with("a-");
        let in_use = InUse {
            holders: &holders,
            seen: &seen,
        };
        let third = book.request(
            &key(),
            Some(LIMITS),
            request("b", 2, 4),
            &names("b", 4),
            &in_use,
        );
        assert_eq!(
            third,
            Verdict::Admitted { since: at(102) },
            "the wait began at the first request"
        );
    }

    #[test]
    fn a_waiting_head_is_served_before_later_arrivals() {
        let book = QueueBook::default();
        let holders: BTreeSet<String> = names("x", 6).into_iter().collect();
        let seen = |_: &str| true;
        let in_use = InUse {
            holders: &holders,
            seen: &seen,
        };
        let head = book.request(
            &key(),
            Some(LIMITS),
            request("a", 1, 4),
            &names("a", 4),
            &in_use,
        );
        assert!(matches!(
            head,
            Verdict::Waiting {
                position: Some(1),
                ..
            }
        ));
        // Two slots are free and b asks for two, but a (older, FIFO) waits ahead of it.
        let later = book.request(
            &key(),
            Some(LIMITS),
            request("b", 2, 2),
            &names("b", 2),
            &in_use,
        );
        assert!(
            matches!(
                later,
                Verdict::Waiting {
                    position: Some(2),
                    ..
                }
            ),
            "{later:?}"
        );
        let free: BTreeSet<String> = names("x", 2).into_iter().collect();
        let in_use = InUse {
            holders: &free,
            seen: &seen,
        };
        let (wake, view) = book.view(&key(), Some(LIMITS), &in_use);
        assert_eq!(
            wake.iter().map(|r| r.uid.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(view.used, 2);
        book.withdraw(&key(), "b");
        let (_, view) = book.view(&key(), Some(LIMITS), &in_use);
        assert_eq!(view.waiting.len(), 1);
    }

    #[test]
    fn missing_queues_and_oversized_strides_wait_without_blocking() {
        let book = QueueBook::default();
        let holders = BTreeSet::new();
        let seen = |_: &str| false;
        let in_use = InUse {
            holders: &holders,
            seen: &seen,
        };
        let missing = book.request(&key(), None, request("a", 1, 4), &names("a", 4), &in_use);
        assert!(matches!(
            missing,
            Verdict::Waiting {
                reason: WaitReason::QueueNotFound,
                ..
            }
        ));
        book.withdraw(&key(), "a");
        let big = book.request(
            &key(),
            Some(LIMITS),
            request("big", 1, 16),
            &names("big", 16),
            &in_use,
        );
        assert!(matches!(
            big,
            Verdict::Waiting {
                reason: WaitReason::StrideExceedsQueue,
                ..
            }
        ));
        let small = book.request(
            &key(),
            Some(LIMITS),
            request("s", 2, 8),
            &names("s", 8),
            &in_use,
        );
        assert!(matches!(small, Verdict::Admitted { .. }));
    }
}
