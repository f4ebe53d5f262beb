//! Names, labels and metadata of a sandbox's children (pure): the Pod, its NetworkPolicies, the
//! containers and volumes inside the Pod, each child sealed for the owner it names.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::sealed;
use orchard_api::{
    ATTEMPT_LABEL, MANAGED_BY, MANAGED_BY_LABEL, ROLLOUT_GROUP_LABEL, ROLLOUT_QUEUE_LABEL,
    SANDBOX_LABEL, SANDBOX_POD_LABEL, STRIDE_LABEL, Sandbox,
};

/// Name of the task container (the one running the agent and every command).
pub const TASK_CONTAINER: &str = "sandbox";

/// Name of the init container that installs the agent.
pub const INSTALL_CONTAINER: &str = "orchard-agent-install";

/// Where the agent binary lives inside the task container.
pub const AGENT_DIR: &str = "/opt/orchard";

/// Name of the per-namespace baseline NetworkPolicy.
pub const BASELINE_POLICY: &str = "orchard-sandbox-baseline";

/// Name of the named container port of the agent.
pub const AGENT_PORT_NAME: &str = "agent";

/// Name of a sandbox's first Pod (the Sandbox's own name; names are unique per kind and namespace).
pub fn pod_name(sandbox_name: &str) -> String {
    sandbox_name.to_string()
}

/// The attempt a Sandbox is on (`status.attempts`, 1-based; a retried sandbox gets a new Pod per
/// attempt).
pub fn attempt(sandbox: &Sandbox) -> u32 {
    sandbox
        .status
        .as_ref()
        .map_or(1, |s| u32::try_from(s.attempts).unwrap_or(1).max(1))
}

/// Name of the Pod of attempt `attempt` of sandbox `sandbox_name` (pure): [`pod_name`] for the first,
/// `<sandbox>-attempt-<n>` after it, so a new attempt's Pod never waits for the lost one to go.
pub fn attempt_pod_name(sandbox_name: &str, attempt: u32) -> String {
    if attempt <= 1 {
        pod_name(sandbox_name)
    } else {
        format!("{sandbox_name}-attempt-{attempt}")
    }
}

/// Name of the Pod the operator creates for `sandbox`'s current attempt (pure).
pub fn own_pod_name_of(sandbox: &Sandbox) -> String {
    attempt_pod_name(
        sandbox.metadata.name.as_deref().unwrap_or_default(),
        attempt(sandbox),
    )
}

/// Name of a sandbox's own egress NetworkPolicy.
pub fn egress_policy_name(sandbox_name: &str) -> String {
    format!("{sandbox_name}-egress")
}

/// Labels that select exactly one sandbox's Pod.
pub fn sandbox_selector(sandbox_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(SANDBOX_LABEL.to_string(), sandbox_name.to_string())])
}

/// Labels of every object built for a sandbox (the selector plus managed-by), plus, for a trajectory
/// the operator created for a RolloutGroup (sealed: `key` verifies it), its group labels, so
/// `kubectl get pods -l orchard.dev/rollout-group=g` works, and the queue label, which a queue's
/// accounting counts on Pods too. Anyone may put those labels on a Sandbox of their own; passed on to
/// its Pod, which the operator seals, they would let it hold a queue's slot without admission.
pub fn child_labels(sandbox: &Sandbox, name: &str, key: &OperatorKey) -> BTreeMap<String, String> {
    let mut labels = sandbox_selector(name);
    labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string());
    if sealed(sandbox, key).is_some() {
        for label in [ROLLOUT_GROUP_LABEL, STRIDE_LABEL, ROLLOUT_QUEUE_LABEL] {
            if let Some(value) = sandbox.metadata.labels.as_ref().and_then(|l| l.get(label)) {
                labels.insert(label.to_string(), value.clone());
            }
        }
    }
    labels
}

/// Labels of a sandbox's Pod: those of every child plus the baseline policy's selector, and, for an
/// attempt after a retry, its number ([`ATTEMPT_LABEL`]). A claimed pool member is relabelled to
/// exactly these (plus the pool it came from).
pub fn pod_labels(sandbox: &Sandbox, key: &OperatorKey) -> BTreeMap<String, String> {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let mut labels = child_labels(sandbox, &name, key);
    labels.insert(SANDBOX_POD_LABEL.to_string(), "true".to_string());
    let attempt = attempt(sandbox);
    if attempt > 1 {
        labels.insert(ATTEMPT_LABEL.to_string(), attempt.to_string());
    }
    labels
}

pub fn child_meta(
    sandbox: &Sandbox,
    name: &str,
    object_name: String,
    owner: &OwnerReference,
    key: &OperatorKey,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(object_name),
        namespace: sandbox.metadata.namespace.clone(),
        labels: Some(child_labels(sandbox, name, key)),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    }
}
