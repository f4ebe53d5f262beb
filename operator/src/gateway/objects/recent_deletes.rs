//! Read-your-deletes without waiting: the objects this replica deleted, hidden from its own answers
//! until its watch cache shows the deletion.
//!
//! A gateway DELETE answers as soon as the API server has. The replica's watch cache can still show
//! the object a moment longer (the watch event is on its way: most of a second with 500 clients in
//! `make bench-scale`), and a client that deletes and then lists, reads or waits through the same
//! replica must not see the object it deleted as live. So the replica remembers each deletion (kind,
//! namespace, name and the UID of the incarnation deleted) and treats that incarnation as absent
//! while its cache shows it unchanged. It is forgotten once the cache shows the deletion (the object
//! gone, being deleted, or another incarnation under the name) or after [`REMEMBERED_FOR`], a bound
//! on a watch that lags or broke. Before, the DELETE itself waited (up to 2 s) for the cache.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Resource;

/// The longest a deletion is remembered, when the cache does not show it sooner.
pub const REMEMBERED_FOR: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    kind: String,
    namespace: String,
    name: String,
}

#[derive(Debug, Clone)]
struct Deleted {
    uid: String,
    until: Instant,
}

/// The deletions this replica made that its cache may not show yet.
#[derive(Debug, Default)]
pub struct RecentDeletes {
    entries: Mutex<HashMap<Key, Deleted>>,
}

/// Whether the cache's `object` is the incarnation `deleted` names, still shown as live (pure).
fn hidden_by<K: Resource>(deleted: &Deleted, object: &K, now: Instant) -> bool {
    let meta = object.meta();
    now < deleted.until
        && meta.deletion_timestamp.is_none()
        && meta.uid.as_deref() == Some(deleted.uid.as_str())
}

impl RecentDeletes {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Deleted>> {
        // Every step under the lock is one insert, lookup or retain: a poisoned map is consistent.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Remembers that incarnation `uid` of `kind` `namespace/name` was deleted (answered by the API
    /// server) at `now`. Forgets every deletion past its time.
    pub fn record(&self, kind: &str, namespace: &str, name: &str, uid: &str, now: Instant) {
        let mut entries = self.entries();
        entries.retain(|_, deleted| now < deleted.until);
        entries.insert(
            Key {
                kind: kind.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            Deleted {
                uid: uid.to_string(),
                until: now + REMEMBERED_FOR,
            },
        );
    }

    /// Whether `object`, as the cache shows it, is one this replica deleted; the deletion is
    /// forgotten once the cache shows something else under the name.
    pub fn hides<K: Resource<DynamicType = ()>>(&self, object: &K, now: Instant) -> bool {
        let mut entries = self.entries();
        if entries.is_empty() {
            return false;
        }
        let meta = object.meta();
        let key = Key {
            kind: K::kind(&()).into_owned(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
        };
        let Some(deleted) = entries.get(&key) else {
            return false;
        };
        let hidden = hidden_by(deleted, object, now);
        if !hidden {
            entries.remove(&key);
        }
        hidden
    }

    /// `object` unless it is one this replica deleted (see [`RecentDeletes::hides`]).
    pub fn visible<K: Resource<DynamicType = ()>>(
        &self,
        object: Option<std::sync::Arc<K>>,
    ) -> Option<std::sync::Arc<K>> {
        object.filter(|object| !self.hides(object.as_ref(), Instant::now()))
    }

    /// Deletions remembered (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries().len()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use orchard_api::{Sandbox, SandboxSpec};

    use super::*;

    fn sandbox(namespace: &str, name: &str, uid: &str) -> Sandbox {
        let mut sandbox = Sandbox::new(name, SandboxSpec::default());
        sandbox.metadata.namespace = Some(namespace.into());
        sandbox.metadata.uid = Some(uid.into());
        sandbox
    }

    #[test]
    fn the_deleted_incarnation_is_hidden_until_the_cache_shows_the_deletion() {
        let deletes = RecentDeletes::default();
        let now = Instant::now();
        deletes.record("Sandbox", "ns", "a", "uid-1", now);
        let live = sandbox("ns", "a", "uid-1");
        assert!(deletes.hides(&live, now));
        assert!(
            deletes.hides(&live, now + Duration::from_secs(1)),
            "asked again"
        );
        // The cache shows it being deleted: shown as it is, and forgotten.
        let mut terminating = live.clone();
        terminating.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(!deletes.hides(&terminating, now));
        assert_eq!(deletes.len(), 0);
        assert!(!deletes.hides(&live, now), "forgotten");
    }

    #[test]
    fn another_incarnation_under_the_name_is_shown_and_ends_the_memory() {
        let deletes = RecentDeletes::default();
        let now = Instant::now();
        deletes.record("Sandbox", "ns", "a", "uid-1", now);
        assert!(!deletes.hides(&sandbox("ns", "a", "uid-2"), now));
        assert_eq!(deletes.len(), 0);
    }

    #[test]
    fn only_the_same_kind_namespace_and_name_are_hidden() {
        let deletes = RecentDeletes::default();
        let now = Instant::now();
        deletes.record("Sandbox", "ns", "a", "uid-1", now);
        assert!(!deletes.hides(&sandbox("other", "a", "uid-1"), now));
        assert!(!deletes.hides(&sandbox("ns", "b", "uid-1"), now));
        let mut pod = k8s_openapi::api::core::v1::Pod::default();
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.name = Some("a".into());
        pod.metadata.uid = Some("uid-1".into());
        assert!(!deletes.hides(&pod, now), "another kind under that name");
        assert!(deletes.hides(&sandbox("ns", "a", "uid-1"), now));
    }

    #[test]
    fn a_deletion_is_forgotten_after_its_time() {
        let deletes = RecentDeletes::default();
        let now = Instant::now();
        deletes.record("Sandbox", "ns", "a", "uid-1", now);
        let later = now + REMEMBERED_FOR;
        assert!(!deletes.hides(&sandbox("ns", "a", "uid-1"), later));
        // Recording another deletion drops the ones past their time.
        deletes.record("Sandbox", "ns", "b", "uid-2", now);
        deletes.record("Sandbox", "ns", "c", "uid-3", later);
        assert_eq!(deletes.len(), 1);
    }
}
