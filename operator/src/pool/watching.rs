//! What the watches tell the pools: a changed or deleted member Pod (label `orchard.dev/pool`) or a
//! claimed one (`orchard.dev/claimed-from`) makes its pool reconcile (it refills after a claim), and
//! a member that is Ready wakes the Sandboxes waiting for one; a pool that appears or changes wakes
//! them too; a deleted Sandbox no longer waits.

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;

use kube::Resource;
use kube::runtime::watcher;

use crate::plumbing::triggers::{Forward, forwarded};
use crate::plumbing::watch::Subscriber;
use crate::pod::health::pod_ready;
use crate::pool::book::{PoolBook, PoolKey};
use orchard_api::{CLAIMED_FROM_LABEL, POOL_LABEL, Sandbox, SandboxPool};

impl Subscriber<CachedPod> for Arc<PoolBook> {
    fn notify(&mut self, event: &watcher::Event<CachedPod>) {
        let Some(pod) = forwarded(event, Forward::AppliedAndDeleted) else {
            return;
        };
        let labels = pod.metadata.labels.as_ref();
        let key = |name: &String| PoolKey {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: name.clone(),
        };
        if let Some(pool) = labels.and_then(|l| l.get(POOL_LABEL)) {
            self.wake_pool(&key(pool));
            if pod_ready(pod) && pod.metadata.deletion_timestamp.is_none() {
                self.wake_waiting(&key(pool));
            }
        } else if let Some(pool) = labels.and_then(|l| l.get(CLAIMED_FROM_LABEL)) {
            self.wake_pool(&key(pool));
        }
    }
}

impl Subscriber<SandboxPool> for Arc<PoolBook> {
    fn notify(&mut self, event: &watcher::Event<SandboxPool>) {
        if let Some(pool) = forwarded(event, Forward::AppliedAndDeleted) {
            self.wake_waiting(&PoolKey {
                namespace: pool.meta().namespace.clone().unwrap_or_default(),
                name: pool.meta().name.clone().unwrap_or_default(),
            });
        }
    }
}

impl Subscriber<Sandbox> for Arc<PoolBook> {
    fn notify(&mut self, event: &watcher::Event<Sandbox>) {
        // A deleted Sandbox no longer waits for a pool member.
        if let watcher::Event::Delete(sandbox) = event
            && let Some(pool) = sandbox.spec.pool.as_ref()
        {
            let key = PoolKey {
                namespace: sandbox.meta().namespace.clone().unwrap_or_default(),
                name: pool.clone(),
            };
            self.stop_waiting(&key, sandbox.meta().name.as_deref().unwrap_or_default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::fixtures::pod;
    use orchard_api::SandboxSpec;
    use std::collections::BTreeMap;

    fn member(ready: bool, label: &str) -> CachedPod {
        let mut p = pod(Some("node"), Some("10.0.0.9"), ready);
        p.metadata.namespace = Some("ns".into());
        p.metadata.labels = Some(BTreeMap::from([(label.into(), "py".into())]));
        p
    }

    fn waiter() -> Sandbox {
        let mut s = Sandbox::new(
            "s",
            SandboxSpec {
                pool: Some("py".into()),
                ..SandboxSpec::default()
            },
        );
        s.metadata.namespace = Some("ns".into());
        s
    }

    /// What the book's signals carried: (sandboxes woken, pools woken).
    fn signals(book: &PoolBook) -> (Vec<String>, Vec<String>) {
        let mut signals = book.take_receivers().expect("receivers");
        let mut sandboxes = Vec::new();
        while let Ok(s) = signals.sandboxes.try_recv() {
            sandboxes.push(s.name);
        }
        let mut pools = Vec::new();
        while let Ok(p) = signals.pools.try_recv() {
            pools.push(p.name);
        }
        (sandboxes, pools)
    }

    #[test]
    fn a_ready_member_wakes_the_waiting_sandboxes_and_a_starting_one_only_its_pool() {
        let mut book = Arc::new(PoolBook::default());
        let key = PoolKey {
            namespace: "ns".into(),
            name: "py".into(),
        };
        book.wait_for(&key, "s");
        book.notify(&watcher::Event::Apply(member(false, POOL_LABEL)));
        assert_eq!(signals(&book), (vec![], vec!["py".to_string()]));

        let mut book = Arc::new(PoolBook::default());
        book.wait_for(&key, "s");
        book.notify(&watcher::Event::Apply(member(true, POOL_LABEL)));
        book.notify(&watcher::Event::Delete(member(true, CLAIMED_FROM_LABEL)));
        assert_eq!(
            signals(&book),
            (
                vec!["s".to_string()],
                vec!["py".to_string(), "py".to_string()]
            )
        );
    }

    #[test]
    fn a_deleted_sandbox_stops_waiting_and_a_changed_pool_wakes_the_rest() {
        let mut book = Arc::new(PoolBook::default());
        let key = PoolKey {
            namespace: "ns".into(),
            name: "py".into(),
        };
        book.wait_for(&key, "s");
        book.wait_for(&key, "other");
        book.notify(&watcher::Event::Delete(waiter()));
        let mut pool = SandboxPool::new(
            "py",
            serde_json::from_value(serde_json::json!({"replicas": 1, "template": {"image": "x"}}))
                .unwrap(),
        );
        pool.metadata.namespace = Some("ns".into());
        book.notify(&watcher::Event::Apply(pool));
        assert_eq!(signals(&book), (vec!["other".to_string()], vec![]));
    }
}
