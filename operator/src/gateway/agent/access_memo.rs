//! The agent endpoint and token of a sandbox, remembered per version of the sandbox and of its pod.
//!
//! Finding them checks the pod's seal (an HMAC) and derives the token (another), on every proxied
//! call: about a seventh of the gateway's instructions per exec (callgrind, docs/BENCHMARKS.md). What
//! they conclude depends only on the two objects, and an object at one `resourceVersion` never
//! changes, so the answer for a pair of versions is remembered and the next call with the same pair
//! skips both. Any change to either object (a status write, a deletion starting, a new pod) is a new
//! version and is checked again; only answers that let a call through are remembered. Each sandbox
//! keeps its latest answer, found by its UID without allocating, with the `Authorization` header of
//! calls to its agent made once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::gateway::http::errors::ApiError;
use crate::gateway::objects::lookup::AgentAccess;
use crate::plumbing::cached_pod::CachedPod;
use orchard_api::Sandbox;

/// How many answers are remembered at most; when full, all are forgotten (the next calls check again).
const CAPACITY: usize = 4096;

/// Remembered answers by sandbox UID, each with the versions it was found for: the latest answer
/// of each sandbox (an object at an older version is not asked for again once a newer one is seen).
#[derive(Default)]
pub struct AccessMemo {
    entries: Mutex<HashMap<String, Remembered>>,
}

/// An answer and the versions of the sandbox and of its pod it was found for.
struct Remembered {
    versions: Versions,
    access: Arc<AgentAccess>,
}

/// The sandbox's resource version, and its pod's UID and resource version.
struct Versions {
    sandbox: String,
    pod_uid: String,
    pod: String,
}

impl AccessMemo {
    /// The answer for `sandbox` and `pod` as `find` gives it, remembered when it is one: `find` runs
    /// only when these versions of the two were not seen before (or the memo was full).
    pub fn get_or_find(
        &self,
        sandbox: &Sandbox,
        pod: Option<&CachedPod>,
        find: impl FnOnce() -> Result<AgentAccess, ApiError>,
    ) -> Result<Arc<AgentAccess>, ApiError> {
        let Some((uid, versions)) = versions(sandbox, pod) else {
            return find().map(Arc::new);
        };
        // A hit costs a lookup by the UID and three comparisons: nothing is allocated.
        if let Some(known) = self.lock().get(uid)
            && versions.matches(&known.versions)
        {
            return Ok(Arc::clone(&known.access));
        }
        let access = Arc::new(find()?);
        let mut entries = self.lock();
        if entries.len() >= CAPACITY && !entries.contains_key(uid) {
            entries.clear();
        }
        entries.insert(
            uid.to_string(),
            Remembered {
                versions: versions.owned(),
                access: Arc::clone(&access),
            },
        );
        Ok(access)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Remembered>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// [`Versions`], borrowed from the objects.
struct SeenVersions<'a> {
    sandbox: &'a str,
    pod_uid: &'a str,
    pod: &'a str,
}

impl SeenVersions<'_> {
    fn matches(&self, known: &Versions) -> bool {
        self.sandbox == known.sandbox && self.pod_uid == known.pod_uid && self.pod == known.pod
    }

    fn owned(&self) -> Versions {
        Versions {
            sandbox: self.sandbox.to_string(),
            pod_uid: self.pod_uid.to_string(),
            pod: self.pod.to_string(),
        }
    }
}

/// The sandbox's UID and the versions of `sandbox` and `pod` (pure); `None` when any UID or
/// version is missing (such objects are never remembered).
fn versions<'a>(
    sandbox: &'a Sandbox,
    pod: Option<&'a CachedPod>,
) -> Option<(&'a str, SeenVersions<'a>)> {
    let (sandbox, pod) = (&sandbox.metadata, &pod?.metadata);
    Some((
        sandbox.uid.as_deref()?,
        SeenVersions {
            sandbox: sandbox.resource_version.as_deref()?,
            pod_uid: pod.uid.as_deref()?,
            pod: pod.resource_version.as_deref()?,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::SandboxSpec;
    use std::cell::Cell;

    fn sandbox(uid: &str, version: &str) -> Sandbox {
        let mut s = Sandbox::new("s", SandboxSpec::default());
        s.metadata.uid = Some(uid.into());
        s.metadata.resource_version = Some(version.into());
        s
    }

    fn pod(uid: &str, version: &str) -> CachedPod {
        let mut p = CachedPod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.resource_version = Some(version.into());
        p
    }

    fn access(n: u32) -> AgentAccess {
        AgentAccess::new(format!("http://10.0.0.{n}:9090"), format!("token-{n}")).expect("access")
    }

    #[test]
    fn the_same_versions_are_found_once() {
        let memo = AccessMemo::default();
        let calls = Cell::new(0);
        let find = || {
            calls.set(calls.get() + 1);
            Ok(access(1))
        };
        let (s, p) = (sandbox("su", "1"), pod("pu", "1"));
        assert_eq!(
            memo.get_or_find(&s, Some(&p), find).unwrap().as_ref(),
            &access(1)
        );
        assert_eq!(
            memo.get_or_find(&s, Some(&p), find).unwrap().as_ref(),
            &access(1)
        );
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn a_new_version_of_either_is_found_again() {
        let memo = AccessMemo::default();
        let (s, p) = (sandbox("su", "1"), pod("pu", "1"));
        memo.get_or_find(&s, Some(&p), || Ok(access(1))).unwrap();
        for (s, p) in [
            (sandbox("su", "2"), pod("pu", "1")),
            (sandbox("su", "1"), pod("pu", "2")),
            (sandbox("other", "1"), pod("pu", "1")),
            (sandbox("su", "1"), pod("other", "1")),
        ] {
            let refused = memo.get_or_find(&s, Some(&p), || {
                Err(ApiError::not_ready("ns", "s", Some("Terminating")))
            });
            assert_eq!(refused.unwrap_err().status, 409, "{s:?} {p:?}");
        }
    }

    #[test]
    fn refusals_and_unversioned_objects_are_not_remembered() {
        let memo = AccessMemo::default();
        let (s, p) = (sandbox("su", "1"), pod("pu", "1"));
        let refused = memo.get_or_find(&s, Some(&p), || {
            Err(ApiError::not_ready("ns", "s", Some("Pending")))
        });
        assert!(refused.is_err());
        assert_eq!(
            memo.get_or_find(&s, Some(&p), || Ok(access(2)))
                .unwrap()
                .as_ref(),
            &access(2),
            "the refusal was not kept"
        );
        let unversioned = CachedPod::default();
        memo.get_or_find(&s, Some(&unversioned), || Ok(access(3)))
            .unwrap();
        let calls = Cell::new(0);
        memo.get_or_find(&s, Some(&unversioned), || {
            calls.set(1);
            Ok(access(3))
        })
        .unwrap();
        assert_eq!(
            calls.get(),
            1,
            "an object without a version is always checked"
        );
        let without_pod = memo.get_or_find(&s, None, || {
            Err(ApiError::not_ready("ns", "s", Some("Pending")))
        });
        assert!(without_pod.is_err());
    }

    #[test]
    fn a_full_memo_starts_over() {
        let memo = AccessMemo::default();
        let p = pod("pu", "1");
        for n in 0..CAPACITY {
            memo.get_or_find(&sandbox(&format!("s{n}"), "1"), Some(&p), || Ok(access(1)))
                .unwrap();
        }
        assert_eq!(memo.lock().len(), CAPACITY);
        // A sandbox already remembered replaces its own answer: nothing is cleared.
        memo.get_or_find(&sandbox("s0", "2"), Some(&p), || Ok(access(2)))
            .unwrap();
        assert_eq!(memo.lock().len(), CAPACITY);
        memo.get_or_find(&sandbox("new", "1"), Some(&p), || Ok(access(1)))
            .unwrap();
        assert_eq!(
            memo.lock().len(),
            1,
            "cleared when full, then the newest kept"
        );
    }

    #[test]
    fn each_sandbox_keeps_only_its_latest_answer() {
        let memo = AccessMemo::default();
        memo.get_or_find(&sandbox("su", "1"), Some(&pod("pu", "1")), || Ok(access(1)))
            .unwrap();
        memo.get_or_find(&sandbox("su", "2"), Some(&pod("pu", "1")), || Ok(access(2)))
            .unwrap();
        assert_eq!(memo.lock().len(), 1);
        let calls = Cell::new(0);
        let again = memo
            .get_or_find(&sandbox("su", "2"), Some(&pod("pu", "1")), || {
                calls.set(1);
                Ok(access(3))
            })
            .unwrap();
        assert_eq!((again.as_ref(), calls.get()), (&access(2), 0));
    }
}
