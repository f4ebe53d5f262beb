//! Retries of a standalone Sandbox (`spec.retry`, pure): whether its lost pod is retried and what
//! the next attempt runs with, the sandbox as each attempt's pod is built from it, and the state a
//! retried sandbox is in until its new pod is Ready (its Ready condition says [`RETRYING`]). The
//! arithmetic is `crate::retry`'s, the same a RolloutGroup's trajectories use; a trajectory never
//! gets a sandbox-level retry (its group retries it).

use k8s_openapi::jiff::Timestamp;

use crate::plumbing::conditions::{self, Desired};
use crate::plumbing::operator_key::OperatorKey;
use crate::pod::failure::Failure;
use crate::retry::{AttemptEnd, ResourceDefaults, RetryParams, resolve};
use crate::sandbox::identity::rollout_group_of;
use crate::sandbox::status::condition::READY;
use orchard_api::{AttemptRecord, Sandbox, SandboxStatus};

/// The Ready reason of a retried sandbox while its new pod starts.
pub const RETRYING: &str = "Retrying";

/// The failure reason of a sandbox whose `spec.retry` cannot run under the operator's defaults.
pub const INVALID_SPEC: &str = "InvalidSpec";

/// The retry policy of `sandbox` under the operator's `defaults` (pure): `None` without
/// `spec.retry` and for a RolloutGroup's trajectory (sealed for its group under `key`: the group
/// retries it); an error says why the policy cannot run (a `maxMemory` below the operator's default
/// memory, which CEL cannot see).
pub fn policy_of(
    sandbox: &Sandbox,
    key: &OperatorKey,
    defaults: &ResourceDefaults,
) -> Result<Option<RetryParams>, String> {
    let Some(policy) = &sandbox.spec.retry else {
        return Ok(None);
    };
    if rollout_group_of(sandbox, key).is_some() {
        return Ok(None);
    }
    resolve(
        policy,
        sandbox.spec.resources.as_ref(),
        "spec.resources",
        defaults,
    )
    .map(Some)
}

/// The attempt a sandbox with `status` is on (1-based; 1 without a status).
pub fn attempt_of(status: Option<&SandboxStatus>) -> u32 {
    status
        .map(|s| u32::try_from(s.attempts).unwrap_or(1).max(1))
        .unwrap_or(1)
}

/// The sandbox as the pod of its current attempt is built from it (pure): after the first attempt,
/// its spec asks for what the retry gives it (`policy` decided that when it recorded the attempt
/// before); the first attempt, or a sandbox without a policy, is the sandbox as it is.
pub fn as_attempt(sandbox: &Sandbox, policy: Option<&RetryParams>) -> Sandbox {
    let mut attempt = sandbox.clone();
    let previous = sandbox
        .status
        .as_ref()
        .map(|s| s.previous_attempts.as_slice())
        .unwrap_or_default();
    if let Some(policy) = policy
        && !previous.is_empty()
        && let Some(resources) = policy.resources(policy.amounts_of(previous))
    {
        attempt.spec.resources = Some(resources);
    }
    attempt
}

/// The record of the current attempt of `sandbox`, whose pod failed with `failure`, when `policy`
/// retries it (pure): an out-of-memory kill or an eviction the policy covers, attempts left, and no
/// result recorded yet (a result is write-once: it stands). `None`: the sandbox fails.
pub fn retry_of(
    sandbox: &Sandbox,
    policy: &RetryParams,
    failure: &Failure,
) -> Option<AttemptRecord> {
    let status = sandbox.status.as_ref();
    if status.is_some_and(|s| s.result.is_some()) {
        return None;
    }
    let end = AttemptEnd::of(&failure.reason, &failure.message)?;
    let previous = status
        .map(|s| s.previous_attempts.as_slice())
        .unwrap_or_default();
    let ran = policy.amounts_of(previous);
    policy.next(end.cause, attempt_of(status), ran)?;
    Some(RetryParams::record(&end, ran))
}

/// `sandbox` as its next attempt begins, after its current one ended as `record` (pure): one
/// attempt more, `record` appended, the lost pod's fields cleared, and its Ready condition False
/// with reason [`RETRYING`] until the new pod is Ready. The expiry clocks (`readyTime`, the last
/// heartbeat) go on.
pub fn next_attempt(sandbox: &Sandbox, record: AttemptRecord, now: Timestamp) -> Sandbox {
    let mut next = sandbox.clone();
    let mut status = sandbox.status.clone().unwrap_or_default();
    status.attempts = i32::try_from(attempt_of(Some(&status)) + 1).unwrap_or(i32::MAX);
    status.previous_attempts.push(record);
    status.pod_name = None;
    status.pod_ip = None;
    status.node_name = None;
    status.agent_endpoint = None;
    let ready = conditions::merge(
        &status.conditions,
        vec![Desired::new(READY, false, RETRYING, "")],
        sandbox.metadata.generation,
        now,
    );
    status.conditions.retain(|c| c.type_ != READY);
    status.conditions.extend(ready);
    next.status = Some(status);
    next
}

/// Whether a sandbox with `status` waits for the first Ready of an attempt after a retry (pure):
/// a later attempt whose Ready condition still says [`RETRYING`].
pub fn awaiting_ready(status: &SandboxStatus) -> bool {
    status.attempts > 1
        && status
            .conditions
            .iter()
            .any(|c| c.type_ == READY && c.status == "False" && c.reason == RETRYING)
}

/// The Ready message of a sandbox with `status` whose retried attempt starts (pure): which attempt
/// of how many (`policy`), after what, that the lost pod's files are gone, and what the new pod
/// waits for now (`detail`).
pub fn retrying_message(
    status: &SandboxStatus,
    policy: Option<&RetryParams>,
    detail: &str,
) -> String {
    let of = policy.map_or_else(String::new, |p| format!(" of {}", p.max_attempts));
    let after = status
        .previous_attempts
        .last()
        .map_or_else(String::new, |last| format!(" after {}", last.reason));
    let mut message = format!(
        "attempt {}{of}{after}: a new pod starts and the lost pod's files are gone",
        status.attempts
    );
    if !detail.is_empty() {
        message.push_str("; ");
        message.push_str(detail);
    }
    message
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
