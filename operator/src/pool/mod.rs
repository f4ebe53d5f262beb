//! SandboxPools: warm sandbox Pods that Sandboxes claim instead of starting their own.
//!
//! [`template`] (what a pool's template means for a Sandbox naming it) and [`members`] (building
//! members, planning a pool reconcile) are pure; [`claim`] is the one write that hands a member to a
//! Sandbox; [`book`] is the in-memory state (reservations, claim counts, waiting Sandboxes);
//! [`controller`] keeps each pool at its size and writes its status. docs/POOLS.md explains the
//! behaviour.

pub mod book;
pub mod claim;
pub mod controller;
pub mod members;
pub mod template;

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use orchard_api::{Sandbox, SandboxPool};

/// `sandbox` as it runs (its own fields, the pool template's where it leaves them unset) and its
/// pool, if it names one that exists (pure over the cache). A sandbox without a pool, or whose pool
/// is not there, is returned as it is.
pub fn resolve(
    pools: &Store<SandboxPool>,
    sandbox: &Sandbox,
) -> (Sandbox, Option<Arc<SandboxPool>>) {
    let Some(name) = sandbox.spec.pool.as_deref() else {
        return (sandbox.clone(), None);
    };
    let namespace = sandbox.namespace().unwrap_or_default();
    match pools.get(&ObjectRef::new(name).within(&namespace)) {
        Some(pool) if pool.metadata.deletion_timestamp.is_none() => {
            let mut resolved = sandbox.clone();
            resolved.spec = template::effective_spec(&sandbox.spec, &pool.spec.template);
            (resolved, Some(pool))
        }
        _ => (sandbox.clone(), None),
    }
}
