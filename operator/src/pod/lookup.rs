//! Finding a sandbox's Pod in the watch cache (pure over the cache's contents): under the name its
//! status gives, else its own name, else, for a sandbox of a pool, the member it claimed.

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::sealed_for;
use crate::pod::naming::own_pod_name_of;
use orchard_api::SANDBOX_LABEL;
use orchard_api::Sandbox;

/// Name of the sandbox's Pod: the one its status names (a claimed pool member keeps the member's
/// name), else the name of its current attempt's Pod (the sandbox's own name for the first).
pub fn own_pod_name(sandbox: &Sandbox) -> String {
    sandbox
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| own_pod_name_of(sandbox))
}

/// The sandbox's pod as the watch cache shows it, whoever owns it (callers check it is the sandbox's
/// own): under [`own_pod_name`], or, for a sandbox of a pool whose status does not name its pod yet,
/// the member it claimed (by its label and seal, verified with `key`).
pub fn cached_pod(
    pods: &Store<CachedPod>,
    sandbox: &Sandbox,
    key: &OperatorKey,
) -> Option<Arc<CachedPod>> {
    let namespace = sandbox.namespace()?;
    pods.get(&ObjectRef::new(&own_pod_name(sandbox)).within(&namespace))
        .or_else(|| {
            let unnamed = sandbox.status.as_ref().is_none_or(|s| s.pod_name.is_none());
            (sandbox.spec.pool.is_some() && unnamed)
                .then(|| claimed_in_cache(pods, sandbox, key))
                .flatten()
        })
}

/// The Pod `sandbox` claimed, as the cache shows it (found by its label and its seal for the sandbox,
/// verified with `key`: the status may not name it yet, after a crash between the claim and the status
/// write). Pure over the store's contents.
pub fn claimed_in_cache(
    pods: &Store<CachedPod>,
    sandbox: &Sandbox,
    key: &OperatorKey,
) -> Option<Arc<CachedPod>> {
    let namespace = sandbox.namespace()?;
    let name = sandbox.name_any();
    let uid = sandbox.uid()?;
    pods.state().into_iter().find(|p| {
        p.metadata.namespace.as_deref() == Some(namespace.as_str())
            && p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(orchard_api::SANDBOX_LABEL))
                .is_some_and(|v| *v == name)
            && sealed_for(p.as_ref(), &uid, key)
    })
}

/// The Pods of `sandbox`'s earlier attempts, as the cache shows them (pure over the store's
/// contents): labelled with its name and sealed for it (verified with `key`), under a name other than
/// its current attempt's.
pub fn previous_attempt_pods(
    pods: &Store<CachedPod>,
    sandbox: &Sandbox,
    key: &OperatorKey,
) -> Vec<Arc<CachedPod>> {
    let (Some(namespace), Some(uid)) = (sandbox.namespace(), sandbox.uid()) else {
        return Vec::new();
    };
    let name = sandbox.name_any();
    let current = own_pod_name(sandbox);
    pods.state()
        .into_iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace.as_str())
                && p.metadata.name.as_deref() != Some(current.as_str())
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SANDBOX_LABEL))
                    .is_some_and(|v| *v == name)
                && sealed_for(p.as_ref(), &uid, key)
        })
        .collect()
}
