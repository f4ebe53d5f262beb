//! Retries of a RolloutGroup's trajectories (pure): which endings of a trajectory's attempt a retry
//! may fix ([`attempt_end`]: its run's result, or its Sandbox's failure) and the group's `retry`
//! policy resolved against its template ([`retry_params`]). The arithmetic is the shared
//! `crate::retry`.

use orchard_api::{RolloutGroupSpec, TrajectoryResult, TrajectoryStatus};

use crate::retry::cause::OOM_KILLED;
use crate::retry::{AttemptEnd, ResourceDefaults, RetryParams};

/// The result reason of a trajectory whose Sandbox failed (`sandbox/status`): the failure's own
/// reason is in the Sandbox's `status.reason`.
pub const SANDBOX_FAILED: &str = "SandboxFailed";

/// The ending of an attempt whose Sandbox recorded `result` and, if it failed, `failure` (its
/// `status.reason` and `status.message`), when a retry may fix it (pure). Only an aborted result
/// counts: a run's command killed by the OOM killer (`OOMKilled`), or a Sandbox whose failure
/// (`SandboxFailed`) was an OOM kill, an eviction or a lost pod. A result the run recorded before
/// its Sandbox failed stands.
pub fn attempt_end(result: &TrajectoryResult, failure: Option<(&str, &str)>) -> Option<AttemptEnd> {
    if result.status != TrajectoryStatus::Aborted {
        return None;
    }
    let (reason, message) = match result.reason.as_deref() {
        Some(OOM_KILLED) => (OOM_KILLED, result.message.as_deref().unwrap_or_default()),
        Some(SANDBOX_FAILED) => failure?,
        _ => return None,
    };
    AttemptEnd::of(reason, message)
}

/// The retry policy of `spec` under the operator's `defaults` (pure): `None` without `retry`, or
/// why it cannot run. A template that leaves memory (or CPU, with a `cpuFactor`) unset starts with
/// the operator's default, which `maxMemory` (`maxCpu`) must not be below; one that names a
/// SandboxPool must set them itself (its members have the pool template's).
pub fn retry_params(
    spec: &RolloutGroupSpec,
    defaults: &ResourceDefaults,
) -> Result<Option<RetryParams>, String> {
    let Some(policy) = &spec.retry else {
        return Ok(None);
    };
    let resources = spec.template.spec.resources.as_ref();
    let pool = spec.template.spec.pool.as_deref().filter(|p| !p.is_empty());
    if let (Some(pool), Some(oom)) = (pool, &policy.on_oom) {
        if resources.and_then(|r| r.memory.as_ref()).is_none() {
            return Err(format!(
                "retry.onOOM needs template.spec.resources.memory when the template names SandboxPool {pool}: its members run with the pool template's memory, which the group does not know; set the memory the first attempt runs with"
            ));
        }
        if oom.cpu_factor.is_some() && resources.and_then(|r| r.cpu.as_ref()).is_none() {
            return Err(format!(
                "retry.onOOM.cpuFactor needs template.spec.resources.cpu when the template names SandboxPool {pool}: its members run with the pool template's CPU, which the group does not know"
            ));
        }
    }
    crate::retry::resolve(policy, resources, "template.spec.resources", defaults).map(Some)
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
