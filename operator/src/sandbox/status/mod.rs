//! Pure status computation: a Sandbox, its observed Pod and the current time in, the desired
//! `SandboxStatus` out. Recomputing from the same observations gives the same status, so the
//! controller writes only on real changes.

use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::expiry::{annotated_heartbeat, expiry_deadline, latest_heartbeat};
use crate::plumbing::conditions::{self, Desired, Progress};
use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::time::floor_to_second;
use crate::pod::agent_target::agent_endpoint;
use crate::pod::health::{
    Failure, pod_condition, pod_failure, pod_ready, pod_state_summary, scheduling,
};
use crate::pod::policy_canary::awaits_enforcement;
use crate::retry::RetryParams;
use crate::sandbox::blocked::Blocked;
use crate::sandbox::enforcement::Verdict;
use crate::sandbox::identity::{is_trajectory, rollout_group_of};
use crate::sandbox::retry::{
    INVALID_SPEC, RETRYING, awaiting_ready, next_attempt, retry_of, retrying_message,
};
use orchard_api::Lifecycle;
use orchard_api::{Sandbox, SandboxPhase, SandboxStatus};

mod egress;
mod policy_wait;
pub use egress::{EGRESS_PROXY_MISSING, HOST_EGRESS, HostEgress, host_egress};
pub use policy_wait::{
    POLICY_ENFORCEMENT_MISSING, POLICY_WAIT_WARNING, PolicyWait, policy_wait, policy_warning_at,
};

pub mod condition;

/// Conditions the status computation does not derive but keeps once set: the trajectory runner sets
/// `ResultPreempted` when its result lost to one recorded first, an event nothing observed later
/// can undo.
const KEPT_CONDITIONS: &[&str] = &[crate::sandbox::runner::RESULT_PREEMPTED];

/// [`conditions::merge`], keeping the previous [`KEPT_CONDITIONS`] as they were.
fn merge_conditions(
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    desired: Vec<Desired>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let mut merged = conditions::merge(previous, desired, generation, now);
    merged.extend(
        previous
            .iter()
            .filter(|c| KEPT_CONDITIONS.contains(&c.type_.as_str()))
            .cloned(),
    );
    merged
}

/// Everything the status depends on.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The sandbox's Pod, if one exists.
    pub pod: Option<&'a CachedPod>,
    /// The Pod existed (status names it) and a live read confirmed it is gone: the failure to report
    /// (`PodDeleted`, or `NodeLost` when its node is gone too: `pod::disruption::gone_failure`).
    pub pod_gone: Option<Failure>,
    /// Current time.
    pub now: Timestamp,
    /// Effective TTL and heartbeat timeout.
    pub lifecycle: Lifecycle,
    /// Seconds after creation a sandbox may take to become Ready.
    pub startup_timeout_seconds: i64,
    /// Port the agent listens on.
    pub agent_port: u16,
    /// A child the sandbox needs whose name is held by an object that is not its own.
    pub blocked: Option<Blocked>,
    /// The operator's key (a trajectory of a RolloutGroup is a Sandbox sealed for its group).
    pub key: &'a OperatorKey,
    /// The cluster-wide verdict on NetworkPolicy enforcement.
    pub enforcement: &'a Verdict,
    /// The operator knows an egress proxy (`--egress-proxy-service`).
    pub egress_proxy: bool,
    /// The sandbox's retry policy (`spec.retry`) under the operator's defaults; `None` without one
    /// (and for a RolloutGroup's trajectory, which its group retries).
    pub retry: Option<&'a RetryParams>,
}

/// The `StartupTimeout` message (pure): what the pod's status said last (`state`, from
/// [`pod_state_summary`]), where its events are (they outlive the pod by an hour), and the settings
/// that change the outcome, by Helm value and flag. `gated`: the pod's agent waits for its
/// NetworkPolicies to be enforced.
fn startup_timeout_message(
    seconds: i64,
    namespace: &str,
    pod: &str,
    state: &str,
    gated: bool,
) -> String {
    let mut message =
        format!("not Ready {seconds}s after creation (a trajectory: after its pod was scheduled)");
    if !state.is_empty() {
        message.push_str(&format!("; last seen: {state}"));
    }
    message.push_str(&format!(
        "; the pod's events: `kubectl get events -n {namespace} --field-selector involvedObject.name={pod}`; the limit is Helm value sandboxDefaults.startupTimeoutSeconds (--startup-timeout-seconds)"
    ));
    if gated {
        message.push_str(
            "; the agent serves only once the sandbox's NetworkPolicies are enforced, which never happens in a cluster without a NetworkPolicy enforcer: install one, or set Helm value sandboxEgress.awaitEnforcement=false (--await-policy-enforcement=false)",
        );
    }
    message
}

/// From when a sandbox's startup timeout counts, or `None` while it does not count (pure).
///
/// A standalone Sandbox: from its creation, whatever holds it up; a later attempt after a retry
/// (`spec.retry`): from its Pod's creation. A trajectory of a RolloutGroup: from the moment its Pod was
/// scheduled. While a quota refuses its Pod or no node has room for it, it
/// waits instead of failing (a trajectory that failed for lack of capacity would become an aborted
/// trajectory and change the group's selection); its group's `activeDeadlineSeconds` bounds the wait.
pub fn startup_clock(
    sandbox: &Sandbox,
    pod: Option<&CachedPod>,
    key: &OperatorKey,
) -> Option<Timestamp> {
    if sandbox.status.as_ref().is_some_and(|s| s.attempts > 1) {
        return pod?.metadata.creation_timestamp.as_ref().map(|t| t.0);
    }
    if rollout_group_of(sandbox, key).is_none() {
        return sandbox.metadata.creation_timestamp.as_ref().map(|t| t.0);
    }
    let pod = pod?;
    pod.spec.as_ref().and_then(|s| s.node_name.as_ref())?;
    pod_condition(pod, "PodScheduled")
        .filter(|c| c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
        .or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The status of a sandbox whose pod failed with `failure`: its next attempt when its retry policy
/// retries the failure (computed as for a sandbox without a pod yet), else failed.
fn fail_or_retry(
    sandbox: &Sandbox,
    status: SandboxStatus,
    failure: Failure,
    observed: &Observed,
) -> SandboxStatus {
    let retried = observed.retry.and_then(|policy| {
        let record = retry_of(sandbox, policy, &failure)?;
        Some(next_attempt(sandbox, record, observed.now))
    });
    match retried {
        Some(next) => desired_status(
            &next,
            &Observed {
                pod: None,
                pod_gone: None,
                blocked: None,
                ..observed.clone()
            },
        ),
        None => failed_status(sandbox, status, failure, observed.now, observed.key),
    }
}

/// The failed status: terminal, so the conditions say why and nothing is Ready.
fn failed_status(
    sandbox: &Sandbox,
    mut status: SandboxStatus,
    failure: Failure,
    now: Timestamp,
    key: &OperatorKey,
) -> SandboxStatus {
    let previous = sandbox.status.clone().unwrap_or_default();
    let scheduled = conditions::is_true(&previous.conditions, condition::SCHEDULED);
    status.phase = Some(SandboxPhase::Failed);
    status.conditions = merge_conditions(
        &previous.conditions,
        vec![
            Desired::new(
                condition::SCHEDULED,
                scheduled,
                if scheduled {
                    "Scheduled"
                } else {
                    "NotScheduled"
                },
                "",
            ),
            Desired::new(
                condition::AGENT_READY,
                false,
                failure.reason.clone(),
                failure.message.clone(),
            ),
            Desired::new(
                condition::READY,
                false,
                failure.reason.clone(),
                failure.message.clone(),
            ),
            Desired::new(condition::EXPIRED, false, "Failed", ""),
        ]
        .into_iter()
        .chain(conditions::kstatus(&Progress::Stalled(
            failure.reason.clone(),
            failure.message.clone(),
        )))
        .collect(),
        sandbox.metadata.generation,
        now,
    );
    status.expires_at = None;
    if is_trajectory(sandbox, key) && status.result.is_none() {
        // A trajectory that cannot finish is aborted, so its RolloutGroup (or trainer) can move on.
        status.result = Some(crate::sandbox::run_result::aborted(
            "SandboxFailed",
            format!("{}: {}", failure.reason, failure.message),
            None,
        ));
    }
    status.reason = Some(failure.reason);
    status.message = Some(failure.message);
    status
}

/// `scheduling` (bound, reason, message) of a Pod, its message followed by what a GPU sandbox waits
/// for when the scheduler found no node (pure): the scheduler's own words ("Insufficient
/// nvidia.com/gpu", "didn't match Pod's node affinity/selector") do not say which GPUs were asked for.
fn with_gpu_hint(
    (scheduled, reason, message): (bool, String, String),
    spec: &orchard_api::SandboxSpec,
) -> (bool, String, String) {
    match crate::pod::gpu::unschedulable_hint(spec) {
        Some(hint) if !scheduled && reason == "Unschedulable" => {
            let message = if message.is_empty() {
                hint
            } else {
                format!("{} ({hint})", message.trim_end())
            };
            (scheduled, reason, message)
        }
        _ => (scheduled, reason, message),
    }
}

/// The status the sandbox should have given what is observed now.
pub fn desired_status(sandbox: &Sandbox, observed: &Observed) -> SandboxStatus {
    let previous = sandbox.status.clone().unwrap_or_default();
    let now = observed.now;
    // Failed and Expired are terminal: nothing observed later changes them.
    if matches!(
        previous.phase,
        Some(SandboxPhase::Failed | SandboxPhase::Expired)
    ) {
        return previous;
    }
    let mut status = SandboxStatus {
        observed_generation: sandbox.metadata.generation,
        result: previous.result.clone(),
        pod_name: previous.pod_name.clone(),
        ready_time: previous.ready_time.clone(),
        // The egress proxy's member: carried over, never computed here.
        egress: previous.egress.clone(),
        attempts: previous.attempts,
        previous_attempts: previous.previous_attempts.clone(),
        ..SandboxStatus::default()
    };
    // A retried attempt waits for its new pod's first Ready as a new sandbox does (the expiry
    // clocks, counted from the first Ready, go on).
    let retrying = awaiting_ready(&previous);

    if let Some(failure) = &observed.pod_gone {
        return fail_or_retry(sandbox, status, failure.clone(), observed);
    }
    let refused = match &observed.blocked {
        Some(Blocked::NameConflict(message)) => Some(("NameConflict", message)),
        Some(Blocked::PodRejected(message)) => Some(("PodRejected", message)),
        Some(Blocked::PlacementRefused(message)) => Some((crate::pod::placement::REASON, message)),
        Some(Blocked::InvalidSpec(message)) => Some((INVALID_SPEC, message)),
        Some(Blocked::Snapshot {
            failed: true,
            message,
        }) => Some((crate::snapshot::source::SNAPSHOT_FAILED, message)),
        _ => None,
    };
    if let Some((reason, message)) = refused {
        let failure = Failure::new(reason, message.clone());
        return failed_status(sandbox, status, failure, now, observed.key);
    }
    if let Some(pod) = observed.pod {
        status.pod_name = pod.metadata.name.clone();
        status.node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        status.pod_ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty());
        if let Some(failure) = pod_failure(pod) {
            return fail_or_retry(sandbox, status, failure, observed);
        }
    }

    let host_egress = host_egress(
        sandbox,
        status.egress.as_ref(),
        status.pod_ip.as_deref(),
        observed.egress_proxy,
    );
    if host_egress == HostEgress::ProxyMissing && status.ready_time.is_none() {
        let failure = Failure::new(EGRESS_PROXY_MISSING, egress::proxy_missing_message());
        return failed_status(sandbox, status, failure, now, observed.key);
    }
    let agent_up = observed.pod.is_some_and(pod_ready) && status.pod_ip.is_some();
    // A new sandbox is Ready only once its host rules are in force (a running one keeps serving
    // while a change is applied: the previous rules stay in force until then).
    let egress_waits = (status.ready_time.is_none() || retrying)
        && matches!(
            host_egress,
            HostEgress::Pending(_) | HostEgress::NotEnforced(_)
        );
    let ready_now = agent_up && !egress_waits;
    if ready_now && status.ready_time.is_none() {
        status.ready_time = Some(Time(floor_to_second(now)));
    }
    let ready_time = status.ready_time.as_ref().map(|t| t.0);
    if ready_time.is_none() || retrying {
        let limit = SignedDuration::from_secs(observed.startup_timeout_seconds);
        if let Some(started) = startup_clock(sandbox, observed.pod, observed.key)
            && now.duration_since(started) >= limit
        {
            let pod = status.pod_name.clone().unwrap_or_default();
            let gated = observed.pod.is_some_and(awaits_enforcement);
            let state = observed.pod.map(pod_state_summary).unwrap_or_default();
            let namespace = sandbox.metadata.namespace.as_deref().unwrap_or_default();
            return failed_status(
                sandbox,
                status,
                Failure::new(
                    "StartupTimeout",
                    startup_timeout_message(
                        observed.startup_timeout_seconds,
                        namespace,
                        &pod,
                        &state,
                        gated,
                    ),
                ),
                now,
                observed.key,
            );
        }
    }

    status.agent_endpoint = status
        .pod_ip
        .as_deref()
        .map(|ip| agent_endpoint(ip, observed.agent_port));
    // A malformed heartbeat annotation is reported by the controller (event) and otherwise ignored.
    let annotated = annotated_heartbeat(sandbox, now).ok().flatten();
    let heartbeat = latest_heartbeat(
        ready_time,
        previous.last_heartbeat_time.as_ref().map(|t| t.0),
        annotated,
    );
    status.last_heartbeat_time = heartbeat
        .filter(|_| observed.lifecycle.heartbeat_timeout_seconds > 0)
        .map(Time);
    status.expires_at =
        expiry_deadline(ready_time, heartbeat, observed.lifecycle).map(|(at, _)| Time(at));

    let (scheduled, scheduled_reason, scheduled_message) = match observed.pod {
        Some(pod) => with_gpu_hint(scheduling(pod), &sandbox.spec),
        None => match &observed.blocked {
            Some(Blocked::PreviousIncarnation(message)) => {
                (false, "PreviousIncarnation".into(), message.clone())
            }
            Some(Blocked::QuotaExceeded(message)) => {
                (false, "QuotaExceeded".into(), message.clone())
            }
            Some(Blocked::LaunchJitter(at)) => (
                false,
                "LaunchJitter".into(),
                format!(
                    "its RolloutGroup spreads the starts of a stride (launchJitterSeconds): its pod is created at {at:.3}"
                ),
            ),
            Some(Blocked::Snapshot { message, .. }) => (
                false,
                crate::snapshot::source::SNAPSHOT_NOT_READY.into(),
                message.clone(),
            ),
            Some(Blocked::Pool {
                reason, message, ..
            }) => (false, (*reason).to_string(), message.clone()),
            _ => (
                false,
                "PodNotCreated".into(),
                "creating the sandbox's pod".into(),
            ),
        },
    };
    // Its agent waited too long for its policies: it needs outside help (Stalled).
    let mut policy_stalled = false;
    let (agent_reason, agent_message) = if agent_up {
        ("AgentHealthy", String::new())
    } else if ready_time.is_some() && !retrying {
        (
            "AgentNotResponding",
            "the agent stopped answering its health probe".to_string(),
        )
    } else if let Some(pod) = observed.pod.filter(|pod| awaits_enforcement(pod)) {
        match policy_wait(pod, now, observed.enforcement) {
            PolicyWait::Missing { message, stalled } => {
                policy_stalled = stalled;
                (POLICY_ENFORCEMENT_MISSING, message)
            }
            PolicyWait::Starting => (
                "AgentStarting",
                "waiting for the agent to answer /healthz (it answers once the sandbox's NetworkPolicies are enforced)"
                    .to_string(),
            ),
        }
    } else {
        (
            "AgentStarting",
            "waiting for the agent to answer /healthz".to_string(),
        )
    };
    status.phase = Some(if sandbox.metadata.deletion_timestamp.is_some() {
        SandboxPhase::Terminating
    } else if status.result.is_some() {
        SandboxPhase::Succeeded
    } else if ready_now {
        SandboxPhase::Ready
    } else if scheduled {
        SandboxPhase::Starting
    } else {
        SandboxPhase::Pending
    });
    let progress = match (status.phase, &observed.blocked) {
        (_, Some(Blocked::QuotaExceeded(message))) => {
            Progress::Stalled("QuotaExceeded".into(), message.clone())
        }
        (
            _,
            Some(Blocked::Pool {
                reason,
                message,
                stalled: true,
            }),
        ) => Progress::Stalled((*reason).to_string(), message.clone()),
        (Some(SandboxPhase::Pending), _) => {
            Progress::Reconciling("Pending".into(), scheduled_message.clone())
        }
        // Without an enforcer it would wait until its startup timeout: it needs outside help now.
        (Some(SandboxPhase::Starting), _) if policy_stalled => {
            Progress::Stalled(agent_reason.to_string(), agent_message.clone())
        }
        (Some(SandboxPhase::Starting), _) => {
            Progress::Reconciling("Starting".into(), agent_message.clone())
        }
        _ => Progress::Settled,
    };
    let egress_condition = host_egress.condition();
    let (ready_reason, ready_message) = if ready_now {
        ("SandboxReady".to_string(), String::new())
    } else if agent_up && let Some((_, reason, message)) = &egress_condition {
        (reason.to_string(), message.clone())
    } else if !scheduled {
        // The Scheduled condition's own reason (`WaitingForPoolMember`, `QuotaExceeded`, the
        // scheduler's `Unschedulable`, ...) says more than "not scheduled".
        (scheduled_reason.clone(), scheduled_message.clone())
    } else {
        (agent_reason.to_string(), agent_message.clone())
    };
    // A retried attempt says so until its pod is Ready, with what it waits for now.
    let (ready_reason, ready_message) = if retrying && !ready_now {
        let detail = if ready_message.is_empty() {
            ready_reason
        } else {
            format!("{ready_reason}: {ready_message}")
        };
        (
            RETRYING.to_string(),
            retrying_message(&previous, observed.retry, &detail),
        )
    } else {
        (ready_reason, ready_message)
    };
    status.conditions = merge_conditions(
        &previous.conditions,
        vec![
            Desired::new(
                condition::SCHEDULED,
                scheduled,
                scheduled_reason,
                scheduled_message,
            ),
            Desired::new(
                condition::AGENT_READY,
                agent_up,
                agent_reason,
                agent_message,
            ),
            Desired::new(condition::READY, ready_now, ready_reason, ready_message),
            Desired::new(condition::EXPIRED, false, "NotExpired", ""),
        ]
        .into_iter()
        .chain(
            egress_condition
                .map(|(ok, reason, message)| Desired::new(HOST_EGRESS, ok, reason, message)),
        )
        .chain(conditions::kstatus(&progress))
        .collect(),
        sandbox.metadata.generation,
        now,
    );
    status
}

/// The status written just before an expired sandbox is deleted (only when a trajectory result must
/// be recorded first, so a RolloutGroup learns why the trajectory ended).
pub fn expired_status(sandbox: &Sandbox, cause: &str, now: Timestamp) -> SandboxStatus {
    let mut status = sandbox.status.clone().unwrap_or_default();
    status.phase = Some(SandboxPhase::Expired);
    let message = format!("the {cause} deadline passed; the sandbox is being deleted");
    status.conditions = merge_conditions(
        &status.conditions,
        vec![
            Desired::new(condition::SCHEDULED, true, "Scheduled", ""),
            Desired::new(condition::AGENT_READY, false, "Expired", message.clone()),
            Desired::new(condition::READY, false, "Expired", message.clone()),
            Desired::new(condition::EXPIRED, true, "Expired", message.clone()),
        ]
        .into_iter()
        .chain(conditions::kstatus(&Progress::Settled))
        .collect(),
        sandbox.metadata.generation,
        now,
    );
    status.reason = Some("Expired".into());
    status.message = Some(message);
    status
}

#[cfg(test)]
mod tests;
