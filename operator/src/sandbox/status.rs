//! Pure status computation: a Sandbox, its observed Pod and the current time in, the desired
//! `SandboxStatus` out. Recomputing from the same observations gives the same status, so the
//! controller writes only on real changes.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::pod::build::{INSTALL_CONTAINER, TASK_CONTAINER};
use super::expiry::{
    Lifecycle, annotated_heartbeat, expiry_deadline, floor_to_second, latest_heartbeat,
};
use crate::pod::policy_canary::awaits_enforcement;
use crate::plumbing::conditions::{self, Desired, Progress};
use crate::plumbing::ownership::sealed_for;
use crate::pod::token::TokenKey;
use orchard_api::{Sandbox, SandboxPhase, SandboxStatus};

/// Condition types of a Sandbox.
pub mod condition {
    /// The Pod is bound to a node.
    pub const SCHEDULED: &str = "Scheduled";
    /// The agent answers its health probe.
    pub const AGENT_READY: &str = "AgentReady";
    /// The sandbox accepts exec and file calls.
    pub const READY: &str = "Ready";
    /// A deadline passed.
    pub const EXPIRED: &str = "Expired";
}

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

/// Container waiting reasons that mean the container will not start without outside help.
const START_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Everything the status depends on.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The sandbox's Pod, if one exists.
    pub pod: Option<&'a Pod>,
    /// The Pod existed (status names it) and a live read confirmed it is gone.
    pub pod_gone: bool,
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
    pub key: &'a TokenKey,
}

/// What a pod's status says about why it is not Ready (pure): not scheduled (the scheduler's
/// message), or the task container waiting (reason and message, e.g. `ErrImagePull`), or its last
/// termination; empty when it says nothing.
pub fn pod_state_summary(pod: &Pod) -> String {
    let Some(status) = pod.status.as_ref() else {
        return String::new();
    };
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(condition) = unscheduled {
        return format!(
            "not scheduled: {}",
            condition.message.as_deref().unwrap_or("no reason given")
        );
    }
    let task = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find(|c| {
            c.state.as_ref().is_some_and(|s| s.waiting.is_some())
                || c.name == crate::pod::build::TASK_CONTAINER
        });
    let Some(container) = task else {
        return String::new();
    };
    let state = container.state.as_ref();
    if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = waiting.reason.as_deref().unwrap_or("waiting");
        return match waiting.message.as_deref().filter(|m| !m.is_empty()) {
            Some(message) => format!("container {} {reason}: {message}", container.name),
            None => format!("container {} {reason}", container.name),
        };
    }
    let terminated = state.and_then(|s| s.terminated.as_ref()).or_else(|| {
        container
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
    });
    if let Some(terminated) = terminated {
        return format!(
            "container {} exited with code {} ({})",
            container.name,
            terminated.exit_code,
            terminated.reason.as_deref().unwrap_or("no reason given")
        );
    }
    if state.is_some_and(|s| s.running.is_some()) {
        return format!("container {} running, not Ready", container.name);
    }
    String::new()
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

/// Reason of a sandbox whose agent has waited too long for its NetworkPolicies to be enforced.
pub const POLICY_ENFORCEMENT_MISSING: &str = "PolicyEnforcementMissing";

/// How long an agent may wait for its NetworkPolicies, after its container started, before the
/// sandbox says that no enforcer may be programming them.
pub const POLICY_WAIT_WARNING: SignedDuration = SignedDuration::from_secs(30);

/// Since when the task container of `pod` runs (pure).
fn task_running_since(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == crate::pod::build::TASK_CONTAINER)?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()
        .map(|t| t.0)
}

/// When a sandbox whose agent waits for its NetworkPolicies says that no enforcer may be programming
/// them, if `pod` is such a pod and its task container runs (pure).
pub fn policy_warning_at(pod: &Pod) -> Option<Timestamp> {
    if !awaits_enforcement(pod) {
        return None;
    }
    task_running_since(pod)?
        .checked_add(POLICY_WAIT_WARNING)
        .ok()
}

/// The `PolicyEnforcementMissing` message (pure; the same at every reconcile, so it costs one write).
fn policy_enforcement_missing_message() -> String {
    format!(
        "the agent has waited more than {}s for the sandbox's NetworkPolicies to be enforced: nothing seems to enforce NetworkPolicies in this cluster (EKS without the VPC CNI's network policy agent, GKE without network policy enforcement); install an enforcer, or set Helm value sandboxEgress.awaitEnforcement=false (--await-policy-enforcement=false) to run sandboxes without network isolation",
        POLICY_WAIT_WARNING.as_secs()
    )
}

/// Why the sandbox cannot have one of its children under the name it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// A deleted sandbox of the same name still has children the garbage collector is removing; the
    /// Pod is created once they are gone.
    PreviousIncarnation(String),
    /// Somebody else's object holds the name: the sandbox fails, nothing is touched.
    NameConflict(String),
    /// The API server refused the Pod for good (Pod Security admission, an invalid field): the
    /// sandbox fails with the server's words.
    PodRejected(String),
    /// The operator's placement policy refuses the spec (`placement`): the sandbox fails before any
    /// child is created.
    PlacementRefused(String),
    /// A ResourceQuota refused the Pod: the sandbox stays Pending and the creation is retried (a
    /// trajectory of a RolloutGroup waits for as long as its group allows; see [`startup_clock`]).
    QuotaExceeded(String),
    /// A sandbox of a pool has no member to claim and does not start cold: it waits (`stalled`: until
    /// someone changes something, e.g. creates the pool or aligns its spec with the template).
    Pool {
        /// Machine-readable reason: `WaitingForPoolMember`, `PoolNotFound`, `PoolTemplateMismatch`.
        reason: &'static str,
        /// Detail.
        message: String,
        /// Nothing the operator does will end the wait.
        stalled: bool,
    },
}

/// Why the API server's refusal of a Pod creation is a ResourceQuota that is full, or `None` (pure).
pub fn quota_refusal(code: u16, message: &str) -> Option<String> {
    (code == 403 && message.contains("exceeded quota")).then(|| {
        format!("{message}; the pod is created once the quota has room (raise the ResourceQuota or wait for other pods to end)")
    })
}

/// From when a sandbox's startup timeout counts, or `None` while it does not count (pure).
///
/// A standalone Sandbox: from its creation, whatever holds it up. A trajectory of a RolloutGroup: from
/// the moment its Pod was scheduled. While a quota refuses its Pod or no node has room for it, it
/// waits instead of failing (a trajectory that failed for lack of capacity would become an aborted
/// trajectory and change the group's selection); its group's `activeDeadlineSeconds` bounds the wait.
pub fn startup_clock(sandbox: &Sandbox, pod: Option<&Pod>, key: &TokenKey) -> Option<Timestamp> {
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

/// Why the API server's refusal of a Pod creation will not go away by retrying, or `None` when it
/// may (pure): Pod Security admission (403 "violates PodSecurity") and validation (422). Other 403s
/// (the operator's own RBAC, a quota) are retried: an administrator can fix them.
pub fn admission_rejection(code: u16, message: &str) -> Option<String> {
    let permanent = (code == 403 && message.contains("violates PodSecurity")) || code == 422;
    permanent.then(|| {
        if message.contains("violates PodSecurity") {
            format!(
                "{message}; set spec.security.profile: Restricted (or label the namespace with a laxer pod-security.kubernetes.io/enforce level)"
            )
        } else {
            message.to_string()
        }
    })
}

/// Why a sandbox failed: a machine-readable reason and a message a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// CamelCase reason, e.g. `ImagePullBackOff`.
    pub reason: String,
    /// What happened and what to do.
    pub message: String,
}

impl Failure {
    fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
        }
    }
}

fn container_status<'a>(
    statuses: Option<&'a Vec<ContainerStatus>>,
    name: &str,
) -> Option<&'a ContainerStatus> {
    statuses?.iter().find(|s| s.name == name)
}

fn pod_image(pod: &Pod, container: &str) -> String {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .find(|c| c.name == container)
            .and_then(|c| c.image.clone())
    })
    .unwrap_or_default()
}

/// What an image pull error says when the image cannot be had by waiting: it does not exist, the
/// registry refuses us, or it has no build for this platform.
const PERMANENT_PULL_ERRORS: &[&str] = &[
    "not found",
    "manifest unknown",
    "name unknown",
    "unauthorized",
    "denied",
    "forbidden",
    "no match for platform",
    "invalid reference",
];

/// Whether an image pull error will stay (pure). Others (the kubelet's pull rate limit, a registry
/// that is briefly unreachable or overloaded) are retried by the kubelet: the sandbox waits, and the
/// startup timeout ends the wait if they never clear.
pub fn permanent_pull_error(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    PERMANENT_PULL_ERRORS.iter().any(|m| message.contains(m))
}

fn start_failure(pod: &Pod, status: &ContainerStatus, what: &str) -> Option<Failure> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    if !START_FAILURES.contains(&reason) {
        return None;
    }
    let detail = waiting.message.clone().unwrap_or_default();
    if matches!(reason, "ErrImagePull" | "ImagePullBackOff") && !permanent_pull_error(&detail) {
        return None;
    }
    let message = if reason.contains("Image") {
        format!(
            "image pull failed for `{}` ({what}): {detail}",
            pod_image(pod, &status.name)
        )
    } else {
        format!("{what} cannot start: {detail}")
    };
    Some(Failure::new(
        reason,
        message.trim_end_matches([':', ' ']).to_string(),
    ))
}

fn exit_description(status: &ContainerStatus) -> Option<String> {
    let terminated = status.state.as_ref()?.terminated.as_ref()?;
    let mut text = format!("exit code {}", terminated.exit_code);
    if let Some(signal) = terminated.signal {
        text.push_str(&format!(", signal {signal}"));
    }
    if let Some(reason) = &terminated.reason {
        text.push_str(&format!(", {reason}"));
    }
    if let Some(message) = terminated.message.as_deref().filter(|m| !m.is_empty()) {
        text.push_str(&format!(": {message}"));
    }
    Some(text)
}

/// Whether the Pod can no longer serve the sandbox, and why. `None` while it is healthy or starting.
pub fn pod_failure(pod: &Pod) -> Option<Failure> {
    let status = pod.status.as_ref()?;
    let init = container_status(status.init_container_statuses.as_ref(), INSTALL_CONTAINER);
    let task = container_status(status.container_statuses.as_ref(), TASK_CONTAINER);
    if status.phase.as_deref() == Some("Failed")
        && let Some(reason) = status.reason.as_deref().filter(|r| !r.is_empty())
    {
        let message = status
            .message
            .clone()
            .unwrap_or_else(|| format!("pod failed: {reason}"));
        return Some(Failure::new(reason, message));
    }
    if let Some(init) = init {
        if let Some(failure) = start_failure(pod, init, "agent injector init container") {
            return Some(failure);
        }
        if let Some(terminated) = init.state.as_ref().and_then(|s| s.terminated.as_ref())
            && terminated.exit_code != 0
        {
            return Some(Failure::new(
                "AgentInstallFailed",
                format!(
                    "installing the agent into the pod failed ({})",
                    exit_description(init).unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(task) = task {
        if let Some(failure) = start_failure(pod, task, "task container") {
            return Some(failure);
        }
        if let Some(exit) = exit_description(task) {
            return Some(Failure::new(
                "AgentExited",
                format!(
                    "the agent in the task container stopped ({exit}); the sandbox's state is lost"
                ),
            ));
        }
    }
    match status.phase.as_deref() {
        Some("Failed") => Some(Failure::new(
            "PodFailed",
            status
                .message
                .clone()
                .unwrap_or_else(|| "the pod failed".to_string()),
        )),
        Some("Succeeded") => Some(Failure::new(
            "AgentExited",
            "the agent exited; the sandbox's state is lost",
        )),
        _ => None,
    }
}

fn pod_condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// Whether the pod is bound to a node, with the scheduler's reason when it is not.
fn scheduling(pod: &Pod) -> (bool, String, String) {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
    {
        return (true, "Scheduled".into(), String::new());
    }
    match pod_condition(pod, "PodScheduled") {
        Some(c) if c.status == "False" => (
            false,
            c.reason.clone().unwrap_or_else(|| "Unschedulable".into()),
            c.message.clone().unwrap_or_default(),
        ),
        _ => (
            false,
            "PodPending".into(),
            "waiting for the scheduler".into(),
        ),
    }
}

/// Whether `pod`'s `Ready` condition is `True` (pure).
pub fn pod_ready(pod: &Pod) -> bool {
    pod_condition(pod, "Ready").is_some_and(|c| c.status == "True")
}

/// Where the agent of `sandbox` answers, derived from `pod` (pure): only the sandbox's own pod (sealed
/// for its UID under `key`: a pod anyone planted with a controller reference to the sandbox is not),
/// not being deleted, Ready, with an IP. Never read from `status.agentEndpoint`: anyone allowed to
/// patch a Sandbox's status could point it anywhere, and the caller would send the sandbox's token
/// there.
pub fn endpoint_of_own_pod(
    sandbox: &Sandbox,
    pod: &Pod,
    agent_port: u16,
    key: &TokenKey,
) -> Option<String> {
    let uid = sandbox.metadata.uid.as_deref()?;
    if !sealed_for(pod, uid, key) || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    if !pod_ready(pod) {
        return None;
    }
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    (!ip.is_empty()).then(|| agent_endpoint(ip, agent_port))
}

/// The agent's base URL for a pod IP (IPv6 in brackets).
pub fn agent_endpoint(pod_ip: &str, port: u16) -> String {
    if pod_ip.contains(':') {
        format!("http://[{pod_ip}]:{port}")
    } else {
        format!("http://{pod_ip}:{port}")
    }
}

/// The failed status: terminal, so the conditions say why and nothing is Ready.
fn failed_status(
    sandbox: &Sandbox,
    mut status: SandboxStatus,
    failure: Failure,
    now: Timestamp,
    key: &TokenKey,
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

/// Whether a sandbox is a trajectory: it runs `spec.run`, or belongs to a RolloutGroup (see
/// [`rollout_group_of`]).
pub fn is_trajectory(sandbox: &Sandbox, key: &TokenKey) -> bool {
    sandbox.spec.run.is_some() || rollout_group_of(sandbox, key).is_some()
}

/// Name of the RolloutGroup this sandbox is a trajectory of: the group its controller reference
/// names, when the operator sealed it for that group (`key` verifies it). A Sandbox somebody made with
/// a controller reference to a group is no trajectory: it keeps the lifecycle of any Sandbox.
pub fn rollout_group_of(sandbox: &Sandbox, key: &TokenKey) -> Option<String> {
    let group = sandbox
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "RolloutGroup")?;
    sealed_for(sandbox, &group.uid, key).then(|| group.name.clone())
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
        ..SandboxStatus::default()
    };

    if observed.pod_gone {
        return failed_status(
            sandbox,
            status,
            Failure::new(
                "PodDeleted",
                "the sandbox's pod was deleted from outside the operator; its state is lost",
            ),
            now,
            observed.key,
        );
    }
    let refused = match &observed.blocked {
        Some(Blocked::NameConflict(message)) => Some(("NameConflict", message)),
        Some(Blocked::PodRejected(message)) => Some(("PodRejected", message)),
        Some(Blocked::PlacementRefused(message)) => Some((crate::pod::placement::REASON, message)),
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
            return failed_status(sandbox, status, failure, now, observed.key);
        }
    }

    let ready_now = observed.pod.is_some_and(pod_ready) && status.pod_ip.is_some();
    if ready_now && status.ready_time.is_none() {
        status.ready_time = Some(Time(floor_to_second(now)));
    }
    let ready_time = status.ready_time.as_ref().map(|t| t.0);
    if ready_time.is_none() {
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
        Some(pod) => scheduling(pod),
        None => match &observed.blocked {
            Some(Blocked::PreviousIncarnation(message)) => {
                (false, "PreviousIncarnation".into(), message.clone())
            }
            Some(Blocked::QuotaExceeded(message)) => {
                (false, "QuotaExceeded".into(), message.clone())
            }
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
    let (agent_reason, agent_message) = if ready_now {
        ("AgentHealthy", String::new())
    } else if ready_time.is_some() {
        (
            "AgentNotResponding",
            "the agent stopped answering its health probe".to_string(),
        )
    } else if let Some(pod) = observed.pod.filter(|pod| awaits_enforcement(pod)) {
        let waited = task_running_since(pod).map(|since| now.duration_since(since));
        match waited {
            Some(waited) if waited >= POLICY_WAIT_WARNING => (
                POLICY_ENFORCEMENT_MISSING,
                policy_enforcement_missing_message(),
            ),
            _ => (
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
        (Some(SandboxPhase::Starting), _) if agent_reason == POLICY_ENFORCEMENT_MISSING => {
            Progress::Stalled(agent_reason.to_string(), agent_message.clone())
        }
        (Some(SandboxPhase::Starting), _) => {
            Progress::Reconciling("Starting".into(), agent_message.clone())
        }
        _ => Progress::Settled,
    };
    let (ready_reason, ready_message) = if ready_now {
        ("SandboxReady".to_string(), String::new())
    } else if !scheduled {
        // The Scheduled condition's own reason (`WaitingForPoolMember`, `QuotaExceeded`, the
        // scheduler's `Unschedulable`, ...) says more than "not scheduled".
        (scheduled_reason.clone(), scheduled_message.clone())
    } else {
        (agent_reason.to_string(), agent_message.clone())
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
                ready_now,
                agent_reason,
                agent_message,
            ),
            Desired::new(condition::READY, ready_now, ready_reason, ready_message),
            Desired::new(condition::EXPIRED, false, "NotExpired", ""),
        ]
        .into_iter()
        .chain(conditions::kstatus(&progress))
        .collect(),
        sandbox.metadata.generation,
        now,
    );
    status
}

/// Whether writing `desired` can wait: a transient phase (Pending, Starting) of a sandbox younger than
/// `window`, replacing another transient phase (never the first status). Returns how long to wait, or `None` to
/// write now. Ready, Failed and everything after them are written at once.
pub fn hold_back_transient(
    previous: Option<&SandboxStatus>,
    desired: &SandboxStatus,
    created: Option<Timestamp>,
    now: Timestamp,
    window: std::time::Duration,
    first_can_wait: bool,
) -> Option<std::time::Duration> {
    let transient = |phase: Option<SandboxPhase>| {
        matches!(
            phase,
            None | Some(SandboxPhase::Pending | SandboxPhase::Starting)
        )
    };
    // The first status is written at once unless `first_can_wait`: until then kstatus (Flux, Argo
    // CD, cli-utils) would call the new object Current.
    if previous.is_none() && !first_can_wait {
        return None;
    }
    if !transient(desired.phase) || !transient(previous.and_then(|p| p.phase)) {
        return None;
    }
    let age = std::time::Duration::try_from(now.duration_since(created?)).unwrap_or_default();
    window.checked_sub(age).filter(|left| !left.is_zero())
}

/// Whether a new sandbox's first status may wait like later transient ones (pure): true for sandboxes
/// nobody reads with kstatus, those created through the gateway (whose callers wait with its `/wait`
/// or read its answers) and a RolloutGroup's trajectories (the group's status is what GitOps tools
/// read). A sandbox applied by `kubectl`, Flux or Argo CD gets its first status at once.
pub fn first_status_can_wait(sandbox: &Sandbox, key: &TokenKey) -> bool {
    rollout_group_of(sandbox, key).is_some()
        || sandbox
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(orchard_api::CREATED_BY_ANNOTATION))
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
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, EnvVar, PodCondition,
        PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use orchard_api::{HEARTBEAT_ANNOTATION, SandboxSpec, TrajectoryResult, TrajectoryStatus};
    use std::collections::BTreeMap;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const CREATED: &str = "2026-01-01T00:00:00Z";

    fn sandbox() -> Sandbox {
        let mut s = Sandbox::new(
            "s1",
            SandboxSpec {
                image: "python:3.11".into(),
                ..SandboxSpec::default()
            },
        );
        s.metadata.generation = Some(1);
        s.metadata.creation_timestamp = Some(Time(t(CREATED)));
        s
    }

    fn observed<'a>(pod: Option<&'a Pod>, now: &str) -> Observed<'a> {
        Observed {
            pod,
            pod_gone: false,
            now: t(now),
            lifecycle: Lifecycle {
                ttl_seconds: 3600,
                heartbeat_timeout_seconds: 0,
            },
            startup_timeout_seconds: 600,
            agent_port: 9090,
            blocked: None,
            key: key(),
        }
    }

    /// The test key, for the `Observed` of the whole test.
    fn key() -> &'static TokenKey {
        static KEY: std::sync::LazyLock<TokenKey> =
            std::sync::LazyLock::new(crate::plumbing::mock_api::test_token_key);
        &KEY
    }

    fn pod(node: Option<&str>, ip: Option<&str>, ready: bool) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("s1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(String::from),
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: TASK_CONTAINER.into(),
                    image: Some("python:3.11".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(if node.is_some() { "Running" } else { "Pending" }.into()),
                pod_ip: ip.map(String::from),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn with_task_state(mut pod: Pod, state: ContainerState) -> Pod {
        pod.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
            name: TASK_CONTAINER.into(),
            state: Some(state),
            ..Default::default()
        }]);
        pod
    }

    fn cond<'a>(
        status: &'a SandboxStatus,
        type_: &str,
    ) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn no_pod_yet_is_pending() {
        let status = desired_status(&sandbox(), &observed(None, "2026-01-01T00:00:01Z"));
        assert_eq!(status.phase, Some(SandboxPhase::Pending));
        assert_eq!(cond(&status, "Scheduled").reason, "PodNotCreated");
        assert_eq!(cond(&status, "Ready").status, "False");
        assert_eq!(status.observed_generation, Some(1));
        assert!(status.expires_at.is_none());
    }

    #[test]
    fn unscheduled_pod_is_pending_with_the_schedulers_reason() {
        let mut p = pod(None, None, false);
        p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some("0/3 nodes are available".into()),
            ..Default::default()
        }]);
        let status = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:01Z"));
        assert_eq!(status.phase, Some(SandboxPhase::Pending));
        assert_eq!(cond(&status, "Scheduled").reason, "Unschedulable");
        assert_eq!(cond(&status, "Ready").message, "0/3 nodes are available");
    }

    #[test]
    fn running_but_not_ready_is_starting() {
        let p = pod(Some("node-1"), Some("10.0.0.7"), false);
        let status = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:01Z"));
        assert_eq!(status.phase, Some(SandboxPhase::Starting));
        assert_eq!(cond(&status, "Scheduled").status, "True");
        assert_eq!(cond(&status, "AgentReady").reason, "AgentStarting");
        assert_eq!(status.node_name.as_deref(), Some("node-1"));
        assert!(status.ready_time.is_none());
    }

    #[test]
    fn ready_pod_makes_a_ready_sandbox_with_an_endpoint_and_deadline() {
        let p = pod(Some("node-1"), Some("10.0.0.7"), true);
        let status = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:02.7Z"));
        assert_eq!(status.phase, Some(SandboxPhase::Ready));
        assert_eq!(
            status.agent_endpoint.as_deref(),
            Some("http://10.0.0.7:9090")
        );
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.7"));
        assert_eq!(status.ready_time, Some(Time(t("2026-01-01T00:00:02Z"))));
        assert_eq!(status.expires_at, Some(Time(t("2026-01-01T01:00:02Z"))));
        assert!(conditions::is_true(&status.conditions, "Ready"));
        assert!(conditions::is_true(&status.conditions, "AgentReady"));
    }

    #[test]
    fn a_preempted_result_stays_said_through_later_statuses() {
        let p = pod(Some("node-1"), Some("10.0.0.7"), true);
        let mut s = sandbox();
        let mut ready = desired_status(&s, &observed(Some(&p), "2026-01-01T00:00:02Z"));
        let preempted = Condition {
            type_: crate::sandbox::runner::RESULT_PREEMPTED.into(),
            status: "True".into(),
            reason: "ResultPreempted".into(),
            message: "recorded {...}".into(),
            observed_generation: None,
            last_transition_time: Time(t("2026-01-01T00:00:09Z")),
        };
        ready.conditions.push(preempted.clone());
        s.status = Some(ready);
        let again = desired_status(&s, &observed(Some(&p), "2026-01-01T00:05:00Z"));
        assert_eq!(Some(&again), s.status.as_ref(), "kept, and no write");
        let failed = desired_status(
            &s,
            &Observed {
                pod_gone: true,
                ..observed(None, "2026-01-01T00:06:00Z")
            },
        );
        assert_eq!(failed.phase, Some(SandboxPhase::Failed));
        assert!(failed.conditions.contains(&preempted));
        let expired = expired_status(&s, "TTL", t("2026-01-01T00:07:00Z"));
        assert!(expired.conditions.contains(&preempted));
    }

    #[test]
    fn recomputing_gives_the_same_status() {
        let p = pod(Some("node-1"), Some("10.0.0.7"), true);
        let mut s = sandbox();
        s.status = Some(desired_status(
            &s,
            &observed(Some(&p), "2026-01-01T00:00:02Z"),
        ));
        let again = desired_status(&s, &observed(Some(&p), "2026-01-01T00:05:00Z"));
        assert_eq!(
            Some(&again),
            s.status.as_ref(),
            "no change observed means no write"
        );
    }

    #[test]
    fn heartbeat_annotation_extends_the_deadline() {
        let p = pod(Some("node-1"), Some("10.0.0.7"), true);
        let mut s = sandbox();
        let mut obs = observed(Some(&p), "2026-01-01T00:00:02Z");
        obs.lifecycle = Lifecycle {
            ttl_seconds: 3600,
            heartbeat_timeout_seconds: 3,
        };
        s.status = Some(desired_status(&s, &obs));
        assert_eq!(
            s.status.as_ref().unwrap().expires_at,
            Some(Time(t("2026-01-01T00:00:05Z")))
        );
        s.metadata.annotations = Some(BTreeMap::from([(
            HEARTBEAT_ANNOTATION.into(),
            "2026-01-01T00:00:04.2Z".into(),
        )]));
        obs.now = t("2026-01-01T00:00:04.3Z");
        let status = desired_status(&s, &obs);
        assert_eq!(
            status.last_heartbeat_time,
            Some(Time(t("2026-01-01T00:00:05Z")))
        );
        assert_eq!(status.expires_at, Some(Time(t("2026-01-01T00:00:08Z"))));
    }

    #[test]
    fn evicted_pod_fails_the_sandbox() {
        let mut p = pod(Some("node-1"), Some("10.0.0.7"), false);
        let st = p.status.as_mut().unwrap();
        st.phase = Some("Failed".into());
        st.reason = Some("Evicted".into());
        st.message = Some("The node was low on resource: memory.".into());
        let status = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:05Z"));
        assert_eq!(status.phase, Some(SandboxPhase::Failed));
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        assert_eq!(
            status.message.as_deref(),
            Some("The node was low on resource: memory.")
        );
        assert_eq!(cond(&status, "Ready").reason, "Evicted");
    }

    #[test]
    fn image_pull_errors_fail_the_sandbox_naming_the_image() {
        for reason in ["ErrImagePull", "ImagePullBackOff"] {
            let p = with_task_state(
                pod(Some("node-1"), None, false),
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.into()),
                        message: Some("not found".into()),
                    }),
                    ..Default::default()
                },
            );
            let status = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:05Z"));
            assert_eq!(status.phase, Some(SandboxPhase::Failed));
            assert_eq!(status.reason.as_deref(), Some(reason));
            let message = status.message.unwrap();
            assert!(
                message.contains("image pull failed for `python:3.11`"),
                "{message}"
            );
            assert!(message.contains("not found"), "{message}");
        }
    }

    #[test]
    fn transient_image_pull_errors_are_waited_out() {
        let p = with_task_state(
            pod(Some("node-1"), Some("10.0.0.7"), false),
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ErrImagePull".into()),
                    message: Some("pull QPS exceeded".into()),
                }),
                ..Default::default()
            },
        );
        let status = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:05Z"));
        assert_eq!(status.phase, Some(SandboxPhase::Starting), "{status:?}");
        assert!(permanent_pull_error(
            "failed to resolve reference \"localhost:5000/x:1\": localhost:5000/x:1: not found"
        ));
        assert!(permanent_pull_error(
            "pull access denied, repository does not exist"
        ));
        assert!(!permanent_pull_error(
            "dial tcp 127.0.0.1:5000: connect: connection refused"
        ));
    }

    #[test]
    fn a_crashed_agent_fails_the_sandbox() {
        let p = with_task_state(
            pod(Some("node-1"), Some("10.0.0.7"), false),
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    signal: Some(9),
                    reason: Some("Error".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        let status = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:05Z"));
        assert_eq!(status.reason.as_deref(), Some("AgentExited"));
        assert!(status.message.unwrap().contains("exit code 137, signal 9"));
    }

    #[test]
    fn containers_still_creating_are_not_failures() {
        let p = with_task_state(
            pod(Some("node-1"), None, false),
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..Default::default()
            },
        );
        assert_eq!(pod_failure(&p), None);
    }

    #[test]
    fn deleted_pod_fails_the_sandbox_and_failure_is_terminal() {
        let mut s = sandbox();
        let mut obs = observed(None, "2026-01-01T00:00:05Z");
        obs.pod_gone = true;
        let status = desired_status(&s, &obs);
        assert_eq!(status.reason.as_deref(), Some("PodDeleted"));
        s.status = Some(status.clone());
        let healthy = pod(Some("node-1"), Some("10.0.0.7"), true);
        let later = desired_status(&s, &observed(Some(&healthy), "2026-01-01T00:01:00Z"));
        assert_eq!(later, status);
    }

    #[test]
    fn a_previous_incarnations_children_keep_the_sandbox_pending_with_the_reason() {
        let mut obs = observed(None, "2026-01-01T00:00:05Z");
        obs.blocked = Some(Blocked::PreviousIncarnation(
            "Pod s1 of a deleted Sandbox with this name is still being removed".into(),
        ));
        let status = desired_status(&sandbox(), &obs);
        assert_eq!(status.phase, Some(SandboxPhase::Pending));
        let scheduled = cond(&status, condition::SCHEDULED);
        assert_eq!(scheduled.reason, "PreviousIncarnation");
        assert!(scheduled.message.contains("still being removed"));
    }

    #[test]
    fn pod_security_rejections_are_permanent_other_refusals_are_not() {
        let psa = admission_rejection(
            403,
            "pods \"s\" is forbidden: violates PodSecurity \"restricted:latest\": runAsNonRoot != true",
        )
        .expect("permanent");
        assert!(psa.contains("violates PodSecurity"), "{psa}");
        assert!(psa.contains("spec.security.profile: Restricted"), "{psa}");
        assert!(admission_rejection(422, "Pod \"s\" is invalid").is_some());
        assert_eq!(
            admission_rejection(403, "pods is forbidden: User cannot create resource"),
            None
        );
        assert_eq!(admission_rejection(403, "exceeded quota: compute"), None);
        assert_eq!(admission_rejection(500, "violates PodSecurity"), None);
    }

    #[test]
    fn a_name_held_by_somebody_else_fails_the_sandbox() {
        let mut obs = observed(None, "2026-01-01T00:00:05Z");
        obs.blocked = Some(Blocked::NameConflict(
            "Pod s1 already exists and is not created by the operator".into(),
        ));
        let status = desired_status(&sandbox(), &obs);
        assert_eq!(status.phase, Some(SandboxPhase::Failed));
        assert_eq!(status.reason.as_deref(), Some("NameConflict"));
    }

    #[test]
    fn a_pod_the_api_server_rejects_fails_the_sandbox_with_its_words() {
        let mut obs = observed(None, "2026-01-01T00:00:05Z");
        obs.blocked = Some(Blocked::PodRejected("violates PodSecurity".into()));
        let status = desired_status(&sandbox(), &obs);
        assert_eq!(status.phase, Some(SandboxPhase::Failed));
        assert_eq!(status.reason.as_deref(), Some("PodRejected"));
    }

    #[test]
    fn never_ready_sandboxes_time_out() {
        let p = pod(None, None, false);
        let before = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:09:59Z"));
        assert_eq!(before.phase, Some(SandboxPhase::Pending));
        let after = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:10:00Z"));
        assert_eq!(after.reason.as_deref(), Some("StartupTimeout"));
    }

    /// `pod`, its agent told to wait for its NetworkPolicies to be enforced.
    fn awaiting_enforcement(mut pod: Pod) -> Pod {
        pod.spec.as_mut().unwrap().containers[0].env = Some(vec![EnvVar {
            name: crate::pod::policy_canary::CANARY_VARIABLE.into(),
            value: Some("10.0.0.1:6443".into()),
            ..Default::default()
        }]);
        pod
    }

    #[test]
    fn a_sandbox_waiting_for_its_policies_says_so_and_its_timeout_says_where_to_look() {
        let plain = pod(Some("node-1"), Some("10.0.0.9"), false);
        let gated = awaiting_enforcement(plain.clone());
        let now = "2026-01-01T00:00:30Z";
        let waiting = desired_status(&sandbox(), &observed(Some(&gated), now));
        let message = &cond(&waiting, "AgentReady").message;
        assert!(
            message.contains("NetworkPolicies are enforced"),
            "{message}"
        );
        let unaware = desired_status(&sandbox(), &observed(Some(&plain), now));
        assert!(
            !cond(&unaware, "AgentReady")
                .message
                .contains("NetworkPolicies")
        );

        let late = "2026-01-01T00:10:00Z";
        let timed_out = desired_status(&sandbox(), &observed(Some(&gated), late));
        assert_eq!(timed_out.reason.as_deref(), Some("StartupTimeout"));
        let message = timed_out.message.clone().unwrap_or_default();
        for advice in [
            "--await-policy-enforcement=false",
            "sandboxEgress.awaitEnforcement=false",
            "sandboxDefaults.startupTimeoutSeconds",
            "--field-selector involvedObject.name=s1",
        ] {
            assert!(message.contains(advice), "{advice} in {message}");
        }
        assert!(
            !message.contains("kubectl describe pod"),
            "the pod is gone when the message is read: {message}"
        );
        let plain_timeout = desired_status(&sandbox(), &observed(Some(&plain), late));
        let message = plain_timeout.message.unwrap_or_default();
        assert!(!message.contains("NetworkPolicies"), "{message}");
    }

    #[test]
    fn a_sandbox_whose_policies_stay_unenforced_says_what_to_do_after_30_seconds() {
        let running = ContainerState {
            running: Some(k8s_openapi::api::core::v1::ContainerStateRunning {
                started_at: Some(Time(t("2026-01-01T00:00:05Z"))),
            }),
            ..Default::default()
        };
        let gated = awaiting_enforcement(with_task_state(
            pod(Some("node-1"), Some("10.0.0.9"), false),
            running,
        ));
        let reason = |now: &str| {
            let status = desired_status(&sandbox(), &observed(Some(&gated), now));
            cond(&status, "Ready").reason.clone()
        };
        assert_eq!(reason("2026-01-01T00:00:34Z"), "AgentStarting");
        assert_eq!(reason("2026-01-01T00:00:35Z"), POLICY_ENFORCEMENT_MISSING);
        let stalled = desired_status(&sandbox(), &observed(Some(&gated), "2026-01-01T00:00:35Z"));
        assert_eq!(
            cond(&stalled, "Stalled").status,
            "True",
            "a wait settles on it"
        );
        assert_eq!(stalled.phase, Some(SandboxPhase::Starting));
        assert_eq!(
            policy_warning_at(&gated),
            Some(t("2026-01-01T00:00:35Z")),
            "the reconcile comes back then"
        );
        let first = desired_status(&sandbox(), &observed(Some(&gated), "2026-01-01T00:00:40Z"));
        let message = &cond(&first, "Ready").message;
        assert!(
            message.contains("sandboxEgress.awaitEnforcement=false")
                && message.contains("--await-policy-enforcement=false"),
            "{message}"
        );
        let mut again = sandbox();
        again.status = Some(first.clone());
        let later = desired_status(&again, &observed(Some(&gated), "2026-01-01T00:03:00Z"));
        assert_eq!(later, first, "the same status later: one write");
        let ungated = with_task_state(
            pod(Some("node-1"), Some("10.0.0.9"), false),
            ContainerState::default(),
        );
        assert_eq!(policy_warning_at(&ungated), None);
    }

    #[test]
    fn what_a_pod_last_said_is_summarised() {
        let unscheduled = with_pod_condition(
            pod(None, None, false),
            PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                message: Some("0/3 nodes are available: 3 Insufficient memory.".into()),
                ..Default::default()
            },
        );
        assert_eq!(
            pod_state_summary(&unscheduled),
            "not scheduled: 0/3 nodes are available: 3 Insufficient memory."
        );
        let pulling = with_task_state(
            pod(Some("n"), None, false),
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    message: Some("Back-off pulling image \"x\"".into()),
                }),
                ..Default::default()
            },
        );
        assert_eq!(
            pod_state_summary(&pulling),
            "container sandbox ImagePullBackOff: Back-off pulling image \"x\""
        );
        let exited = with_task_state(
            pod(Some("n"), None, false),
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 127,
                    reason: Some("Error".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        assert_eq!(
            pod_state_summary(&exited),
            "container sandbox exited with code 127 (Error)"
        );
        assert_eq!(pod_state_summary(&Pod::default()), "");
    }

    fn with_pod_condition(mut pod: Pod, condition: PodCondition) -> Pod {
        if let Some(conditions) = pod.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            conditions.push(condition);
        }
        pod
    }

    /// A trajectory the operator created for group `g`.
    fn trajectory() -> Sandbox {
        let mut s = forged_trajectory();
        crate::plumbing::ownership::seal(&mut s, key());
        s
    }

    /// A Sandbox somebody made with a controller reference to group `g`.
    fn forged_trajectory() -> Sandbox {
        let mut s = sandbox();
        s.metadata.namespace = Some("ns".into());
        s.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: "RolloutGroup".into(),
                name: "g".into(),
                uid: "uid-g".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        s
    }

    #[test]
    fn trajectories_waiting_for_capacity_never_time_out_and_count_from_scheduling() {
        // Unschedulable for an hour: a standalone sandbox fails, a trajectory waits.
        let unschedulable = with_pod_condition(
            pod(None, None, false),
            PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/1 nodes are available: 1 Insufficient cpu.".into()),
                ..Default::default()
            },
        );
        let late = "2026-01-01T01:00:00Z";
        let standalone = desired_status(&sandbox(), &observed(Some(&unschedulable), late));
        assert_eq!(standalone.reason.as_deref(), Some("StartupTimeout"));
        let waiting = desired_status(&trajectory(), &observed(Some(&unschedulable), late));
        assert_eq!(waiting.phase, Some(SandboxPhase::Pending));
        // A forged controller reference makes no trajectory: the timeout applies.
        let forged = desired_status(&forged_trajectory(), &observed(Some(&unschedulable), late));
        assert_eq!(forged.reason.as_deref(), Some("StartupTimeout"));
        assert_eq!(
            forged.result, None,
            "no trajectory result on somebody's own Sandbox"
        );
        assert_eq!(cond(&waiting, condition::SCHEDULED).reason, "Unschedulable");

        // Over quota: no pod at all; the trajectory waits with the reason.
        let mut obs = observed(None, late);
        obs.blocked = quota_refusal(403, "pods \"g-0\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2").map(Blocked::QuotaExceeded);
        let over = desired_status(&trajectory(), &obs);
        assert_eq!(over.phase, Some(SandboxPhase::Pending));
        let scheduled = cond(&over, condition::SCHEDULED);
        assert_eq!(scheduled.reason, "QuotaExceeded");
        assert!(
            scheduled.message.contains("exceeded quota"),
            "{}",
            scheduled.message
        );

        // Scheduled at 00:50: the startup timeout (600 s) counts from then.
        let scheduled_pod = with_pod_condition(
            pod(Some("node-1"), None, false),
            PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                last_transition_time: Some(Time(t("2026-01-01T00:50:00Z"))),
                ..Default::default()
            },
        );
        let before = desired_status(
            &trajectory(),
            &observed(Some(&scheduled_pod), "2026-01-01T00:59:59Z"),
        );
        assert_eq!(before.phase, Some(SandboxPhase::Starting));
        let after = desired_status(&trajectory(), &observed(Some(&scheduled_pod), late));
        assert_eq!(after.reason.as_deref(), Some("StartupTimeout"));
    }

    #[test]
    fn only_a_full_quota_is_a_quota_refusal() {
        assert!(quota_refusal(403, "exceeded quota: compute").is_some());
        assert!(quota_refusal(403, "pods is forbidden: User cannot create").is_none());
        assert!(quota_refusal(422, "exceeded quota").is_none());
    }

    #[test]
    fn an_agent_that_stops_answering_makes_the_sandbox_not_ready() {
        let mut s = sandbox();
        let ready = pod(Some("node-1"), Some("10.0.0.7"), true);
        s.status = Some(desired_status(
            &s,
            &observed(Some(&ready), "2026-01-01T00:00:02Z"),
        ));
        let unready = pod(Some("node-1"), Some("10.0.0.7"), false);
        let status = desired_status(&s, &observed(Some(&unready), "2026-01-01T00:00:30Z"));
        assert_eq!(status.phase, Some(SandboxPhase::Starting));
        assert_eq!(cond(&status, "Ready").reason, "AgentNotResponding");
        assert_eq!(
            status.ready_time,
            Some(Time(t("2026-01-01T00:00:02Z"))),
            "ready time is kept"
        );
    }

    #[test]
    fn a_recorded_result_means_succeeded() {
        let mut s = sandbox();
        s.status = Some(SandboxStatus {
            result: Some(TrajectoryResult {
                reward: Some(1.0),
                status: TrajectoryStatus::Completed,
                length: Some(10),
                exit_code: Some(0),
                artifact: None,
                reason: None,
                message: None,
            }),
            ..Default::default()
        });
        let p = pod(Some("node-1"), Some("10.0.0.7"), true);
        let status = desired_status(&s, &observed(Some(&p), "2026-01-01T00:00:05Z"));
        assert_eq!(status.phase, Some(SandboxPhase::Succeeded));
        assert!(status.result.is_some());
    }

    #[test]
    fn transient_phases_of_young_sandboxes_are_held_back() {
        let window = std::time::Duration::from_secs(1);
        let created = Some(t(CREATED));
        let pending = SandboxStatus {
            phase: Some(SandboxPhase::Pending),
            ..Default::default()
        };
        let starting = SandboxStatus {
            phase: Some(SandboxPhase::Starting),
            ..Default::default()
        };
        let ready = SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            ..Default::default()
        };
        let failed = SandboxStatus {
            phase: Some(SandboxPhase::Failed),
            ..Default::default()
        };
        let young = t("2026-01-01T00:00:00.300Z");
        let old = t("2026-01-01T00:00:01.500Z");
        assert_eq!(
            hold_back_transient(None, &pending, created, young, window, false),
            None,
            "the first status is written at once (kstatus needs it)"
        );
        assert_eq!(
            hold_back_transient(Some(&pending), &starting, created, young, window, false),
            Some(std::time::Duration::from_millis(700))
        );
        assert_eq!(
            hold_back_transient(Some(&pending), &starting, created, old, window, false),
            None,
            "old enough: write"
        );
        assert_eq!(
            hold_back_transient(None, &ready, created, young, window, false),
            None,
            "Ready is never held back"
        );
        assert_eq!(
            hold_back_transient(None, &failed, created, young, window, false),
            None,
            "Failed is never held back"
        );
        assert_eq!(
            hold_back_transient(Some(&ready), &starting, created, young, window, false),
            None
        );
        assert_eq!(
            hold_back_transient(
                Some(&pending),
                &starting,
                created,
                young,
                std::time::Duration::ZERO,
                false
            ),
            None
        );
        // Sandboxes nobody reads with kstatus wait for their first status too.
        assert_eq!(
            hold_back_transient(None, &pending, created, young, window, true),
            Some(std::time::Duration::from_millis(700))
        );
        assert_eq!(
            hold_back_transient(None, &ready, created, young, window, true),
            None,
            "Ready is never held back"
        );
        assert_eq!(
            hold_back_transient(None, &pending, created, old, window, true),
            None
        );
    }

    #[test]
    fn only_gateway_and_group_sandboxes_wait_for_their_first_status() {
        let mut s = Sandbox::new("s", SandboxSpec::default());
        assert!(!first_status_can_wait(&s, key()), "kubectl, Flux, Argo CD");
        s.metadata.annotations = Some(BTreeMap::from([(
            orchard_api::CREATED_BY_ANNOTATION.to_string(),
            "alice".to_string(),
        )]));
        assert!(
            first_status_can_wait(&s, key()),
            "created through the gateway"
        );
        s.metadata.annotations = None;
        assert!(
            !first_status_can_wait(&forged_trajectory(), key()),
            "a Sandbox with a forged controller reference"
        );
        assert!(first_status_can_wait(&trajectory(), key()), "a trajectory");
    }

    #[test]
    fn kstatus_conditions_follow_the_phase() {
        let is = |status: &SandboxStatus, type_: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == type_)
                .map(|c| (c.status.clone(), c.reason.clone(), c.observed_generation))
        };
        let pending = desired_status(&sandbox(), &observed(None, "2026-01-01T00:00:01Z"));
        assert_eq!(
            is(&pending, conditions::RECONCILING),
            Some(("True".into(), "Pending".into(), Some(1)))
        );
        assert_eq!(
            is(&pending, conditions::STALLED).map(|c| c.0),
            Some("False".into())
        );
        let ready_pod = pod(Some("node-1"), Some("10.0.0.7"), true);
        let ready = desired_status(
            &sandbox(),
            &observed(Some(&ready_pod), "2026-01-01T00:00:02Z"),
        );
        assert_eq!(
            is(&ready, conditions::RECONCILING).map(|c| c.0),
            Some("False".into())
        );
        assert_eq!(
            is(&ready, conditions::STALLED).map(|c| c.0),
            Some("False".into())
        );
        let mut over = observed(None, "2026-01-01T00:00:01Z");
        over.blocked = Some(Blocked::QuotaExceeded("exceeded quota: q".into()));
        let over = desired_status(&sandbox(), &over);
        assert_eq!(
            is(&over, conditions::STALLED).map(|c| (c.0, c.1)),
            Some(("True".into(), "QuotaExceeded".into()))
        );
        assert_eq!(
            is(&over, conditions::RECONCILING).map(|c| c.0),
            Some("False".into())
        );
        let timed_out = desired_status(&sandbox(), &observed(None, "2026-01-01T01:00:00Z"));
        assert_eq!(
            is(&timed_out, conditions::STALLED).map(|c| (c.0, c.1)),
            Some(("True".into(), "StartupTimeout".into()))
        );
    }

    #[test]
    fn ipv6_endpoints_are_bracketed() {
        assert_eq!(agent_endpoint("fd00::7", 9090), "http://[fd00::7]:9090");
    }
}
