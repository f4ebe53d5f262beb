//! The status we wrote last, per object, until the watch cache catches up. A reconcile that runs on a
//! cached object older than our own status write (the watch event is still in flight) must not compute
//! from the stale status: it would write again, and could re-stamp times such as `readyTime`.
//!
//! resourceVersions are compared as integers: kube-apiserver backs them with etcd revisions. Where one
//! does not parse, an entry counts as fresh for [`StatusMemory::TTL`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Entry<S> {
    resource_version: String,
    status: S,
    written: Instant,
}

/// Last written status per object uid.
pub struct StatusMemory<S> {
    entries: Mutex<HashMap<String, Entry<S>>>,
}

impl<S> Default for StatusMemory<S> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

/// Whether a cached object with `cached` resourceVersion already includes a write that returned
/// `written` (pure).
pub fn cache_includes(cached: Option<&str>, written: &str) -> Option<bool> {
    let cached: u64 = cached?.parse().ok()?;
    let written: u64 = written.parse().ok()?;
    Some(cached >= written)
}

impl<S: Clone> StatusMemory<S> {
    /// How long an entry is trusted when resourceVersions cannot be compared.
    pub const TTL: Duration = Duration::from_secs(30);

    /// Records that our write of `status` to object `uid` returned `resource_version`.
    pub fn remember(&self, uid: &str, resource_version: Option<String>, status: S) {
        let Some(resource_version) = resource_version else {
            return;
        };
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        entries.retain(|_, e| now.duration_since(e.written) < Self::TTL);
        entries.insert(
            uid.to_string(),
            Entry {
                resource_version,
                status,
                written: now,
            },
        );
    }

    /// The status we wrote if the cached object (at `cached_resource_version`) does not include it yet;
    /// `None` when the cache is current (the entry is then dropped).
    pub fn newer_than_cache(&self, uid: &str, cached_resource_version: Option<&str>) -> Option<S> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let entry = entries.get(uid)?;
        let fresh = match cache_includes(cached_resource_version, &entry.resource_version) {
            Some(includes) => !includes,
            None => {
                entry.written.elapsed() < Self::TTL
                    && cached_resource_version != Some(entry.resource_version.as_str())
            }
        };
        if fresh {
            Some(entry.status.clone())
        } else {
            entries.remove(uid);
            None
        }
    }

    /// Forgets an object.
    pub fn forget(&self, uid: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_versions_compare_as_integers() {
        assert_eq!(cache_includes(Some("100"), "99"), Some(true));
        assert_eq!(cache_includes(Some("100"), "100"), Some(true));
        assert_eq!(cache_includes(Some("99"), "100"), Some(false));
        assert_eq!(cache_includes(Some("abc"), "100"), None);
        assert_eq!(cache_includes(None, "100"), None);
    }

    #[test]
    fn a_stale_cache_sees_our_write_until_it_catches_up() {
        let memory = StatusMemory::<&'static str>::default();
        memory.remember("uid-1", Some("105".into()), "Ready");
        assert_eq!(memory.newer_than_cache("uid-1", Some("100")), Some("Ready"));
        assert_eq!(memory.newer_than_cache("uid-1", Some("105")), None);
        assert_eq!(
            memory.newer_than_cache("uid-1", Some("100")),
            None,
            "entry dropped once caught up"
        );
        assert_eq!(memory.newer_than_cache("uid-2", Some("1")), None);
    }
}
