//! What a Sandbox is to the operator (pure): a trajectory (it runs `spec.run` or a RolloutGroup
//! sealed it as one) or a plain sandbox.

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::sealed_for;
use orchard_api::Sandbox;

/// Whether a sandbox is a trajectory: it runs `spec.run`, or belongs to a RolloutGroup (see
/// [`rollout_group_of`]).
pub fn is_trajectory(sandbox: &Sandbox, key: &OperatorKey) -> bool {
    sandbox.spec.run.is_some() || rollout_group_of(sandbox, key).is_some()
}

/// Name of the RolloutGroup this sandbox is a trajectory of: the group its controller reference
/// names, when the operator sealed it for that group (`key` verifies it). A Sandbox somebody made with
/// a controller reference to a group is no trajectory: it keeps the lifecycle of any Sandbox.
pub fn rollout_group_of(sandbox: &Sandbox, key: &OperatorKey) -> Option<String> {
    let group = sandbox
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "RolloutGroup")?;
    sealed_for(sandbox, &group.uid, key).then(|| group.name.clone())
}
