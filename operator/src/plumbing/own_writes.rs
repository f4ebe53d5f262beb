//! The operator's short memory of its own writes, for the moments when the watch caches do not show
//! them yet. One store for both controllers, replacing ad-hoc memories keyed by name.
//!
//! Rules (each one closes a way the same-name recreation bug happened):
//! - Every entry lives in a *scope*: the UID of the object the write was for (a Sandbox, a
//!   RolloutGroup), so a new object under an old name starts with an empty memory. The one exception is
//!   the per-namespace baseline policy, scoped by namespace.
//! - An entry ends as soon as the watch shows what it stood in for: a child's watch event (applied or
//!   deleted) drops the owner's entry for that child; the owner's watch event carrying the
//!   resourceVersion our status write returned drops the remembered status; the owner's deletion drops
//!   the whole scope. No resourceVersion is ever compared as a number.
//! - Whatever the watch does, an entry expires after [`OwnWrites::TTL`], and a reconcile that relied on
//!   one requeues at its expiry at the latest ([`OwnWrites::next_expiry`]): no wait on a memory can
//!   end without a reconcile being scheduled.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A write we sent for one child object (`Kind/name` within the scope).
struct ChildWrite {
    at: Instant,
    /// What was written: `create`, `apply@<generation>`, `delete`.
    tag: String,
    /// The object the API server returned, when a caller needs it before the cache has it.
    object: Option<Arc<dyn Any + Send + Sync>>,
}

/// A status we wrote, until the watch delivers the version our write returned.
struct StatusWrite {
    at: Instant,
    resource_version: String,
    status: Arc<dyn Any + Send + Sync>,
}

#[derive(Default)]
struct Scope {
    children: HashMap<String, ChildWrite>,
    status: Option<StatusWrite>,
}

impl Scope {
    fn prune(&mut self, now: Instant) {
        self.children
            .retain(|_, w| now.duration_since(w.at) < OwnWrites::TTL);
        if self
            .status
            .as_ref()
            .is_some_and(|s| now.duration_since(s.at) >= OwnWrites::TTL)
        {
            self.status = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.status.is_none()
    }

    fn oldest(&self) -> Option<Instant> {
        let children = self.children.values().map(|w| w.at);
        children.chain(self.status.as_ref().map(|s| s.at)).min()
    }
}

/// The scope of the per-namespace objects the operator writes for no single owner.
pub fn namespace_scope(namespace: &str) -> String {
    format!("namespace/{namespace}")
}

/// `Kind/name`: the key of a child within its scope.
pub fn child_key(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

/// The store; shared by both controllers through the context.
#[derive(Default)]
pub struct OwnWrites {
    scopes: Mutex<HashMap<String, Scope>>,
    last_prune: Mutex<Option<Instant>>,
}

impl OwnWrites {
    /// How long any entry is trusted when the watch never confirms it.
    pub const TTL: Duration = Duration::from_secs(30);

    fn with_scopes<T>(&self, f: impl FnOnce(&mut HashMap<String, Scope>) -> T) -> T {
        let mut scopes = self.scopes.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut scopes)
    }

    /// Drops expired entries and empty scopes, at most once a second.
    fn maybe_prune(&self, scopes: &mut HashMap<String, Scope>, now: Instant) {
        let mut last = self.last_prune.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
            return;
        }
        *last = Some(now);
        scopes.retain(|_, scope| {
            scope.prune(now);
            !scope.is_empty()
        });
    }

    /// Remembers that we wrote child `key` (see [`child_key`]) in `scope`, tagged `tag`, unless
    /// `cache_shows_it` says the watch cache shows the write already. It is called under this store's
    /// lock, and the watch calls [`OwnWrites::child_observed`] (which takes the lock) only after
    /// updating its cache, so an event that lands concurrently is either seen here or drops the entry
    /// just inserted: no entry outlives the event it stood in for.
    pub fn record(&self, scope: &str, key: &str, tag: &str, cache_shows_it: impl FnOnce() -> bool) {
        self.insert(scope, key, tag, None, cache_shows_it);
    }

    /// [`OwnWrites::record`] for a child we created, together with the object the API server returned.
    pub fn record_object<T: Any + Send + Sync>(
        &self,
        scope: &str,
        key: &str,
        tag: &str,
        object: T,
        cache_shows_it: impl FnOnce() -> bool,
    ) {
        self.insert(scope, key, tag, Some(Arc::new(object)), cache_shows_it);
    }

    fn insert(
        &self,
        scope: &str,
        key: &str,
        tag: &str,
        object: Option<Arc<dyn Any + Send + Sync>>,
        cache_shows_it: impl FnOnce() -> bool,
    ) {
        let now = Instant::now();
        self.with_scopes(|scopes| {
            self.maybe_prune(scopes, now);
            if cache_shows_it() {
                return;
            }
            scopes
                .entry(scope.to_string())
                .or_default()
                .children
                .insert(
                    key.to_string(),
                    ChildWrite {
                        at: now,
                        tag: tag.to_string(),
                        object,
                    },
                );
        });
    }

    /// Whether we wrote child `key` in `scope` with `tag` within the TTL.
    pub fn recorded(&self, scope: &str, key: &str, tag: &str) -> bool {
        self.with_scopes(|scopes| {
            scopes
                .get(scope)
                .and_then(|s| s.children.get(key))
                .is_some_and(|w| w.tag == tag && w.at.elapsed() < Self::TTL)
        })
    }

    /// The object recorded for child `key` in `scope` (within the TTL), if it has type `T`.
    pub fn object<T: Any + Clone>(&self, scope: &str, key: &str) -> Option<T> {
        self.with_scopes(|scopes| {
            let write = scopes.get(scope)?.children.get(key)?;
            if write.at.elapsed() >= Self::TTL {
                return None;
            }
            write.object.as_ref()?.downcast_ref::<T>().cloned()
        })
    }

    /// Every object of type `T` recorded in `scope` within the TTL (children created moments ago
    /// that the cache may not show yet).
    pub fn objects<T: Any + Clone>(&self, scope: &str) -> Vec<T> {
        self.with_scopes(|scopes| {
            scopes
                .get(scope)
                .map(|s| {
                    s.children
                        .values()
                        .filter(|w| w.at.elapsed() < Self::TTL)
                        .filter_map(|w| w.object.as_ref()?.downcast_ref::<T>().cloned())
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    /// The watch showed child `key` of `scope` (applied or deleted): the cache now speaks for it.
    pub fn child_observed(&self, scope: &str, key: &str) {
        self.with_scopes(|scopes| {
            if let Some(s) = scopes.get_mut(scope) {
                s.children.remove(key);
                if s.is_empty() {
                    scopes.remove(scope);
                }
            }
        });
    }

    /// Remembers that our status write to object `uid` returned `resource_version`. `cached_version`
    /// reads the version the watch cache holds now. It is called under this store's lock, and the
    /// watch calls [`OwnWrites::observed`] (which takes the lock) only after updating its cache, so an
    /// event that lands concurrently is either seen here or drops the entry just inserted.
    pub fn remember_status<S: Any + Send + Sync>(
        &self,
        uid: &str,
        resource_version: Option<String>,
        status: S,
        cached_version: impl FnOnce() -> Option<String>,
    ) {
        let Some(resource_version) = resource_version else {
            return;
        };
        let now = Instant::now();
        self.with_scopes(|scopes| {
            if cached_version().as_deref() == Some(resource_version.as_str()) {
                return;
            }
            self.maybe_prune(scopes, now);
            scopes.entry(uid.to_string()).or_default().status = Some(StatusWrite {
                at: now,
                resource_version,
                status: Arc::new(status),
            });
        });
    }

    /// The status we wrote to `uid` if the watch has not delivered it yet.
    pub fn status_ahead_of_cache<S: Any + Clone>(&self, uid: &str) -> Option<S> {
        self.with_scopes(|scopes| {
            let write = scopes.get(uid)?.status.as_ref()?;
            if write.at.elapsed() >= Self::TTL {
                return None;
            }
            write.status.downcast_ref::<S>().cloned()
        })
    }

    /// The watch delivered object `uid` at `resource_version` (call after the cache was updated).
    pub fn observed(&self, uid: &str, resource_version: Option<&str>) {
        let Some(resource_version) = resource_version else {
            return;
        };
        self.with_scopes(|scopes| {
            if let Some(s) = scopes.get_mut(uid)
                && s.status
                    .as_ref()
                    .is_some_and(|w| w.resource_version == resource_version)
            {
                s.status = None;
                if s.is_empty() {
                    scopes.remove(uid);
                }
            }
        });
    }

    /// Forgets everything about `scope` (its object was deleted).
    pub fn forget(&self, scope: &str) {
        self.with_scopes(|scopes| {
            scopes.remove(scope);
        });
    }

    /// Time until the oldest entry of `scope` expires, if it has any: a reconcile that may have
    /// relied on the memory requeues by then.
    pub fn next_expiry(&self, scope: &str) -> Option<Duration> {
        self.with_scopes(|scopes| {
            let oldest = scopes.get(scope)?.oldest()?;
            Some(Self::TTL.saturating_sub(oldest.elapsed()))
        })
    }

    /// Number of scopes held (for tests and the soak report).
    pub fn scopes(&self) -> usize {
        self.with_scopes(|scopes| scopes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_uid_under_an_old_name_remembers_nothing() {
        let own = OwnWrites::default();
        own.record(
            "uid-old",
            &child_key("Secret", "again-agent-token"),
            "create",
            || false,
        );
        own.record_object(
            "uid-old",
            &child_key("Pod", "again"),
            "create",
            7u32,
            || false,
        );
        assert!(own.recorded("uid-old", "Secret/again-agent-token", "create"));
        assert!(!own.recorded("uid-new", "Secret/again-agent-token", "create"));
        assert_eq!(own.object::<u32>("uid-new", "Pod/again"), None);
        assert_eq!(own.object::<u32>("uid-old", "Pod/again"), Some(7));
    }

    #[test]
    fn deleting_the_owner_forgets_its_scope() {
        let own = OwnWrites::default();
        own.record("uid-1", "Pod/a", "create", || false);
        own.remember_status("uid-1", Some("5".into()), "Ready", || None);
        own.forget("uid-1");
        assert!(!own.recorded("uid-1", "Pod/a", "create"));
        assert_eq!(own.status_ahead_of_cache::<&str>("uid-1"), None);
        assert_eq!(own.scopes(), 0);
    }

    #[test]
    fn a_child_event_ends_the_entry_standing_in_for_it() {
        let own = OwnWrites::default();
        own.record("uid-1", "Pod/a", "create", || false);
        own.record("uid-1", "NetworkPolicy/a-egress", "apply@2", || false);
        own.child_observed("uid-1", "Pod/a");
        assert!(!own.recorded("uid-1", "Pod/a", "create"));
        assert!(own.recorded("uid-1", "NetworkPolicy/a-egress", "apply@2"));
        assert!(
            !own.recorded("uid-1", "NetworkPolicy/a-egress", "apply@3"),
            "another generation is another write"
        );
    }

    #[test]
    fn a_status_stays_ahead_until_the_watch_delivers_its_version() {
        let own = OwnWrites::default();
        own.remember_status("uid-1", Some("rv-b".into()), "Ready", || {
            Some("rv-a".into())
        });
        assert_eq!(own.status_ahead_of_cache::<&str>("uid-1"), Some("Ready"));
        own.observed("uid-1", Some("rv-other"));
        assert_eq!(
            own.status_ahead_of_cache::<&str>("uid-1"),
            Some("Ready"),
            "another version is not ours: versions are opaque, not ordered"
        );
        own.observed("uid-1", Some("rv-b"));
        assert_eq!(own.status_ahead_of_cache::<&str>("uid-1"), None);
        assert_eq!(own.scopes(), 0, "an empty scope is dropped");
    }

    #[test]
    fn a_status_the_cache_already_holds_is_not_remembered() {
        let own = OwnWrites::default();
        own.remember_status("uid-1", Some("rv-b".into()), "Ready", || {
            Some("rv-b".into())
        });
        assert_eq!(own.status_ahead_of_cache::<&str>("uid-1"), None);
    }

    #[test]
    fn a_child_write_the_cache_already_shows_is_not_remembered() {
        // The watch delivered the object before the write's response came back: nothing is left for
        // a later event to end, so an entry now would outlive it (and hide a deletion for the TTL).
        let own = OwnWrites::default();
        own.record("uid-1", "Secret/a-agent-token", "create", || true);
        assert!(!own.recorded("uid-1", "Secret/a-agent-token", "create"));
        assert_eq!(own.scopes(), 0);
    }

    #[test]
    fn the_wrong_type_is_not_returned() {
        let own = OwnWrites::default();
        own.remember_status("uid-1", Some("1".into()), 3u8, || None);
        assert_eq!(own.status_ahead_of_cache::<String>("uid-1"), None);
        assert_eq!(own.status_ahead_of_cache::<u8>("uid-1"), Some(3));
    }

    #[test]
    fn entries_report_when_they_expire() {
        let own = OwnWrites::default();
        assert_eq!(own.next_expiry("uid-1"), None);
        own.record("uid-1", "Pod/a", "create", || false);
        let left = own.next_expiry("uid-1").expect("an entry");
        assert!(left <= OwnWrites::TTL && left > OwnWrites::TTL - Duration::from_secs(5));
    }
}
