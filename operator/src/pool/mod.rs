//! SandboxPools: warm sandbox Pods that Sandboxes claim instead of starting their own.
//!
//! [`template`] (what a pool's template means for a Sandbox naming it), [`members`] (building
//! members, planning which to keep) and [`decide`] (what a pool reconcile does, as a plan) are pure;
//! [`book`] is the in-memory state (reservations, claim counts, waiting Sandboxes); [`execute`]
//! carries out a plan and [`controller`] ties them together, keeping each pool at its size and its
//! status written (the one write that hands a member to a Sandbox is `sandbox/claim.rs`).
//! docs/POOLS.md explains the behaviour.

pub mod book;
pub mod context;
pub mod controller;
pub mod decide;
pub mod execute;
pub mod members;
pub mod template;
pub mod watching;

#[cfg(test)]
mod reconcile_tests;

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use orchard_api::{Sandbox, SandboxPool};

/// `sandbox` as it runs (its own fields, the pool template's where it leaves them unset) and its
/// pool, if it names one that exists (pure over the cache). Once its Pod exists, the network and
/// lifecycle defaults are the ones the Pod recorded (`recorded`): a later edit of the template, or
/// the pool's deletion, never changes a running sandbox's egress or expiry. A sandbox without a pool
/// is returned as it is.
pub fn resolve(
    pools: &Store<SandboxPool>,
    sandbox: &Sandbox,
    recorded: Option<&template::PoolDefaults>,
) -> (Sandbox, Option<Arc<SandboxPool>>) {
    let Some(name) = sandbox.spec.pool.as_deref() else {
        return (sandbox.clone(), None);
    };
    let namespace = sandbox.namespace().unwrap_or_default();
    let pool = pools
        .get(&ObjectRef::new(name).within(&namespace))
        .filter(|p| p.metadata.deletion_timestamp.is_none());
    let mut resolved = sandbox.clone();
    if let Some(pool) = &pool {
        resolved.spec = template::effective_spec(&sandbox.spec, &pool.spec.template);
    }
    if let Some(defaults) = recorded {
        resolved.spec.network = sandbox.spec.network.clone().or(defaults.network.clone());
        resolved.spec.lifecycle = sandbox
            .spec
            .lifecycle
            .clone()
            .or(defaults.lifecycle.clone());
    }
    (resolved, pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher;
    use orchard_api::{EgressPolicy, NetworkSpec, SandboxPoolSpec, SandboxSpec};

    fn network(egress: EgressPolicy) -> Option<NetworkSpec> {
        Some(NetworkSpec {
            egress,
            allow: vec![],
            ..NetworkSpec::default()
        })
    }

    #[test]
    fn a_running_sandbox_keeps_the_defaults_its_pod_recorded() {
        let (store, mut writer) = reflector::store::<SandboxPool>();
        let mut pool = SandboxPool::new(
            "py",
            SandboxPoolSpec {
                replicas: 1,
                template: SandboxSpec {
                    image: "python:3.11".into(),
                    network: network(EgressPolicy::AllowAll),
                    ..SandboxSpec::default()
                },
            },
        );
        pool.metadata.namespace = Some("ns".into());
        let mut sandbox = Sandbox::new(
            "s",
            SandboxSpec {
                pool: Some("py".into()),
                ..SandboxSpec::default()
            },
        );
        sandbox.metadata.namespace = Some("ns".into());

        let (alone, none) = resolve(&store, &sandbox, None);
        assert!(none.is_none() && alone.spec.image.is_empty(), "no pool yet");
        writer.apply_watcher_event(&watcher::Event::Apply(pool.clone()));
        let (live, found) = resolve(&store, &sandbox, None);
        assert!(found.is_some());
        assert_eq!(live.spec.image, "python:3.11");
        assert_eq!(
            live.spec.network,
            network(EgressPolicy::AllowAll),
            "the template's"
        );

        // Claimed under a template that said Deny; the template says AllowAll now.
        let recorded = template::PoolDefaults {
            network: network(EgressPolicy::Deny),
            lifecycle: None,
        };
        let (running, _) = resolve(&store, &sandbox, Some(&recorded));
        assert_eq!(
            running.spec.network,
            network(EgressPolicy::Deny),
            "as recorded"
        );
        writer.apply_watcher_event(&watcher::Event::Delete(pool));
        let (orphan, gone) = resolve(&store, &sandbox, Some(&recorded));
        assert!(gone.is_none());
        assert_eq!(
            orphan.spec.network,
            network(EgressPolicy::Deny),
            "the pool's deletion changes nothing"
        );
        let mut own = sandbox.clone();
        own.spec.network = network(EgressPolicy::AllowAll);
        assert_eq!(
            resolve(&store, &own, Some(&recorded)).0.spec.network,
            network(EgressPolicy::AllowAll),
            "its own field wins"
        );
    }
}
