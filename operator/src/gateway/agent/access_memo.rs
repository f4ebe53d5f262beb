//! The agent endpoint and token of a sandbox, remembered per version of the sandbox and of its pod.
//!
//! Finding them checks the pod's seal (an HMAC) and derives the token (another), on every proxied
//! call: about a seventh of the gateway's instructions per exec (callgrind, docs/BENCHMARKS.md). What
//! they conclude depends only on the two objects, and an object at one `resourceVersion` never
//! changes, so the answer for a pair of versions is remembered and the next call with the same pair
//! skips both. Any change to either object (a status write, a deletion starting, a new pod) is a new
//! version and is checked again; only answers that let a call through are remembered.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::gateway::http::errors::ApiError;
use crate::plumbing::cached_pod::CachedPod;
use orchard_api::Sandbox;

/// How many answers are remembered at most; when full, all are forgotten (the next calls check again).
const CAPACITY: usize = 4096;

/// An agent's endpoint and token.
pub type AgentAccess = (String, String);

/// Remembered answers, by the versions they were found for.
#[derive(Default)]
pub struct AccessMemo {
    entries: Mutex<HashMap<String, AgentAccess>>,
}

impl AccessMemo {
    /// The answer for `sandbox` and `pod` as `find` gives it, remembered when it is one: `find` runs
    /// only when these versions of the two were not seen before (or the memo was full).
    pub fn get_or_find(
        &self,
        sandbox: &Sandbox,
        pod: Option<&CachedPod>,
        find: impl FnOnce() -> Result<AgentAccess, ApiError>,
    ) -> Result<AgentAccess, ApiError> {
        let Some(key) = versions(sandbox, pod) else {
            return find();
        };
        if let Some(known) = self.lock().get(&key) {
            return Ok(known.clone());
        }
        let found = find()?;
        let mut entries = self.lock();
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(key, found.clone());
        Ok(found)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, AgentAccess>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What names the versions of `sandbox` and `pod`: both UIDs and both resource versions (pure);
/// `None` when any is missing (such objects are never remembered).
fn versions(sandbox: &Sandbox, pod: Option<&CachedPod>) -> Option<String> {
    let (sandbox, pod) = (&sandbox.metadata, &pod?.metadata);
    Some(format!(
        "{}/{}/{}/{}",
        sandbox.uid.as_deref()?,
        sandbox.resource_version.as_deref()?,
        pod.uid.as_deref()?,
        pod.resource_version.as_deref()?
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
        (format!("http://10.0.0.{n}:9090"), format!("token-{n}"))
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
        assert_eq!(memo.get_or_find(&s, Some(&p), find).unwrap(), access(1));
        assert_eq!(memo.get_or_find(&s, Some(&p), find).unwrap(), access(1));
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
            memo.get_or_find(&s, Some(&p), || Ok(access(2))).unwrap(),
            access(2),
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
        let s = sandbox("su", "1");
        for n in 0..=CAPACITY {
            memo.get_or_find(&s, Some(&pod(&format!("p{n}"), "1")), || Ok(access(1)))
                .unwrap();
        }
        assert_eq!(
            memo.lock().len(),
            1,
            "cleared when full, then the newest kept"
        );
    }
}
