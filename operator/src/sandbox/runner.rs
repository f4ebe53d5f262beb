//! The trajectory runner of sandboxes with `spec.run`: once the sandbox is Ready, a task (never a
//! reconcile worker) starts the command through the agent's background-process API, waits for it with
//! long polls, reads the result file and records `status.result` once.
//!
//! Restart safety: the process has a fixed id ([`RUN_PROCESS_ID`]); a restarted operator's start
//! request gets 409 Conflict and adopts the running (or finished) process. The agent enforces
//! `timeoutSeconds` itself, so a run ends on time even while the operator is down; the operator adds
//! its own deadline (plus [`DEADLINE_GRACE`]) in case the agent stops answering.

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::run_protocol::{DEADLINE_GRACE, RunAgent, agent_answers, run_to_result};
use crate::plumbing::backoff::Retry;
use crate::plumbing::status_patch::status_member_patch;
use crate::pod::agent_client::{AgentCallError, AgentClient, AgentTarget};
use crate::pod::agent_target::NoTarget;
use crate::pod::disruption::disruption_failure;
use crate::pod::lookup::cached_pod;
use crate::pod::naming::TASK_CONTAINER;
use crate::pod::oom::memory_limit;
use crate::sandbox::apply::fetch_own_pod;
use crate::sandbox::context::SandboxCtx;
use bytes::Bytes;
use orchard_api::agent::ProcessStatus;
use orchard_api::{RunSpec, Sandbox, SandboxPhase, TrajectoryResult, TrajectoryStatus};
use tokio::time::Instant;

/// The patch that sets `status.result` of the sandbox with `uid`.
fn result_patch(uid: &str, result: &TrajectoryResult) -> Option<json_patch::Patch> {
    let value = serde_json::to_value(result).ok()?;
    Some(status_member_patch(uid, "result", value))
}

/// Condition of a sandbox whose run's own result lost to one recorded before it.
pub const RESULT_PREEMPTED: &str = "ResultPreempted";

/// A run given up before its result (see [`drive`]): if that is because a result was recorded
/// meanwhile, the run was preempted, and says so.
async fn abandoned(ctx: &SandboxCtx, key: &ObjectRef<Sandbox>, uid: &str) {
    let Some(sandbox) = ctx.kube.caches.sandboxes.get(key) else {
        return;
    };
    if sandbox.uid().as_deref() != Some(uid) || sandbox.meta().deletion_timestamp.is_some() {
        return;
    }
    if let Some(recorded) = sandbox.status.as_ref().and_then(|s| s.result.as_ref()) {
        preempted(ctx, &sandbox, recorded, None).await;
    }
}

/// The run's own result (`None`: the run was given up when the other appeared) lost to `recorded`,
/// written first by someone allowed to patch the sandbox's status (the gateway refuses results of
/// run-driven sandboxes): never silently. It is logged, counted
/// (`orchard_trajectory_runs_total{outcome="Preempted"}`), published as a Warning event and set as
/// the condition [`RESULT_PREEMPTED`], which later status writes keep.
async fn preempted(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    recorded: &TrajectoryResult,
    result: Option<&TrajectoryResult>,
) {
    let show = |r: &TrajectoryResult| serde_json::to_string(r).unwrap_or_default();
    let message = match result {
        Some(result) => format!(
            "a result was recorded before the run's own, which was not recorded (status.result is write-once): recorded {}, the run's {}",
            show(recorded),
            show(result)
        ),
        None => format!(
            "a result was recorded while the run was in progress, so the run was given up and its own result was never recorded (status.result is write-once): recorded {}",
            show(recorded)
        ),
    };
    warn!(sandbox = %sandbox.name_any(), recorded = %show(recorded), run = %result.map(show).unwrap_or_default(), "the run's result was preempted by a result recorded first");
    ctx.kube
        .metrics
        .trajectory_runs
        .with_label_values(&["Preempted"])
        .inc();
    crate::plumbing::events::publish(
        &ctx.kube,
        sandbox,
        kube::runtime::events::EventType::Warning,
        RESULT_PREEMPTED,
        message.clone(),
    )
    .await;
    let uid = sandbox.uid().unwrap_or_default();
    let condition = serde_json::json!({
        "type": RESULT_PREEMPTED,
        "status": "True",
        "reason": RESULT_PREEMPTED,
        "message": message,
        "lastTransitionTime": crate::plumbing::time::floor_to_second(Timestamp::now()).to_string(),
    });
    let patch = crate::plumbing::status_patch::append_condition_patch(&uid, condition);
    let api: Api<Sandbox> = Api::namespaced(
        ctx.kube.client.clone(),
        sandbox.namespace().as_deref().unwrap_or_default(),
    );
    match api
        .patch_status(
            &sandbox.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(_) => ctx.kube.metrics.api_write("sandboxes/status", "patch"),
        Err(err) => {
            warn!(sandbox = %sandbox.name_any(), %err, "cannot set the ResultPreempted condition")
        }
    }
}

/// Id of the run's background process inside the agent.
pub const RUN_PROCESS_ID: &str = "orchard-run";

/// The agent endpoint and token of a sandbox, from its own pod in the cache.
pub fn agent_target(ctx: &SandboxCtx, sandbox: &Sandbox) -> Option<AgentTarget> {
    let pod = cached_pod(&ctx.kube.caches.pods, sandbox, &ctx.kube.key)?;
    agent_target_of(ctx, sandbox, &pod)
}

/// The agent endpoint and token of `sandbox` running in `pod` (see [`pod::agent_target`]); a pod
/// whose token cannot be derived is logged.
///
/// [`pod::agent_target`]: crate::pod::agent_target::agent_target
pub fn agent_target_of(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    pod: &CachedPod,
) -> Option<AgentTarget> {
    let port = ctx.pods.settings.pod.agent_port;
    match crate::pod::agent_target::agent_target(sandbox, pod, port, &ctx.kube.key) {
        Ok(target) => Some(target),
        Err(NoTarget::NotReady) => None,
        Err(NoTarget::Token(err)) => {
            warn!(sandbox = %sandbox.name_any(), %err, "no agent token");
            None
        }
    }
}

/// When the current attempt of a sandbox with `status` became Ready (pure): `readyTime` for the
/// first; for a later one (`spec.retry`), when its Ready condition last turned True.
fn attempt_ready_time(status: &orchard_api::SandboxStatus) -> Option<Timestamp> {
    if status.attempts <= 1 {
        return status.ready_time.as_ref().map(|t| t.0);
    }
    status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::sandbox::status::condition::READY && c.status == "True")
        .map(|c| c.last_transition_time.0)
}

/// Starts the runner of `sandbox` unless one runs already or nothing is left to do. Each attempt of
/// a retried sandbox (`spec.retry`) runs the command again in its new pod.
pub fn ensure_runner(ctx: &Arc<SandboxCtx>, sandbox: &Sandbox) {
    let Some(run) = sandbox.spec.run.clone() else {
        return;
    };
    let status = sandbox.status.clone().unwrap_or_default();
    if status.result.is_some() || status.phase != Some(SandboxPhase::Ready) {
        return;
    }
    let (Some(uid), Some(ready)) = (sandbox.uid(), attempt_ready_time(&status)) else {
        return;
    };
    let attempt = status.attempts;
    let key = ObjectRef::from_obj(sandbox);
    let task_ctx = ctx.clone();
    let task_uid = uid.clone();
    let task_key = if attempt > 1 {
        format!("{uid}/{attempt}")
    } else {
        uid
    };
    ctx.runners.start(task_key, async move {
        let (ctx, uid) = (task_ctx, task_uid);
        let current = Current {
            key: &key,
            uid: &uid,
            attempt,
        };
        // Only during this replica's term: a step-down stops the waits and aborts the result write;
        // the new leader adopts the run (its start request gets 409 and waits on the same process).
        let term = ctx.kube.leadership.while_leader(async {
            match drive(&ctx, &current, ready, &run).await {
                Some(result) => record(&ctx, &current, &result).await,
                None => abandoned(&ctx, &key, &uid).await,
            }
        });
        if term.await.is_none() {
            info!(sandbox = %key, "trajectory runner stopped: not the leader");
        }
    });
}

/// Which run a runner drives: the sandbox's, of its UID, in its attempt's pod.
struct Current<'a> {
    /// The Sandbox.
    key: &'a ObjectRef<Sandbox>,
    /// Its UID (a new sandbox under the same name is not this one).
    uid: &'a str,
    /// Its attempt (`spec.retry`: a later attempt's pod runs the command again).
    attempt: i32,
}

/// The sandbox as the cache has it now, if it is still the same object on the same attempt and still
/// needs a result.
fn still_wanted(ctx: &SandboxCtx, current: &Current) -> Option<Arc<Sandbox>> {
    if !ctx.kube.leadership.is_leader() {
        // The new leader adopts the run (its start request gets 409 and waits on the same process).
        return None;
    }
    let sandbox = ctx.kube.caches.sandboxes.get(current.key)?;
    needs_result(&sandbox, current.uid, current.attempt).then_some(sandbox)
}

/// Whether the cache's `sandbox` still needs the run of attempt `attempt` of the sandbox with `uid`
/// (pure): the same object, not deleting, not on a later attempt (`spec.retry`), no result recorded,
/// not Failed or Expired. Only what the cache shows ends the run: a cache that does not show the status
/// the reconcile just wrote yet (no status at all, when the first write of a fast sandbox was its Ready;
/// an earlier attempt's) does not. Giving up on it left a Ready trajectory unstarted: the reconcile the
/// write's watch event brings found the giving-up task still running and left it be (seen in
/// `rollout_queue`, whose first-started trajectory of a jittered stride was Ready before its first
/// status write).
fn needs_result(sandbox: &Sandbox, uid: &str, attempt: i32) -> bool {
    if sandbox.uid().as_deref() != Some(uid) || sandbox.meta().deletion_timestamp.is_some() {
        return false;
    }
    !sandbox.status.as_ref().is_some_and(|status| {
        status.attempts > attempt
            || status.result.is_some()
            || matches!(
                status.phase,
                Some(SandboxPhase::Failed | SandboxPhase::Expired)
            )
    })
}

/// The runner's retry policy for agent and API calls.
fn retry() -> Retry {
    Retry::new(Duration::from_millis(200), Duration::from_secs(10))
}

/// A sandbox's agent as [`run_to_result`] talks to it: the run process [`RUN_PROCESS_ID`].
struct SandboxAgent<'a> {
    client: &'a AgentClient,
    target: AgentTarget,
}

impl RunAgent for SandboxAgent<'_> {
    async fn start(&self, run: &RunSpec) -> Result<ProcessStatus, AgentCallError> {
        self.client
            .start_process(
                &self.target,
                RUN_PROCESS_ID,
                &run.command,
                run.timeout_seconds,
            )
            .await
    }
    async fn poll(&self, wait_seconds: u64) -> Result<ProcessStatus, AgentCallError> {
        self.client
            .process(&self.target, RUN_PROCESS_ID, wait_seconds)
            .await
    }
    async fn kill(&self) -> Result<(), AgentCallError> {
        self.client.kill_process(&self.target, RUN_PROCESS_ID).await
    }
    async fn read(&self, path: &str) -> Result<Option<Bytes>, AgentCallError> {
        self.client.read_file(&self.target, path).await
    }
}

/// The run's deadline on the monotonic clock: `timeoutSeconds` after `ready` plus [`DEADLINE_GRACE`].
fn run_deadline(ready: Timestamp, run: &RunSpec) -> Instant {
    let end = ready
        .saturating_add(SignedDuration::from_secs(run.timeout_seconds.max(1)))
        .and_then(|t| t.saturating_add(DEADLINE_GRACE))
        .unwrap_or(ready);
    let left = Timestamp::now().duration_until(end);
    Instant::now() + Duration::try_from(left).unwrap_or(Duration::ZERO)
}

/// Runs the trajectory of the sandbox that became Ready at `ready` to its result. `ready` comes from
/// the status the reconcile just wrote, not from the cache, which may not show that write yet. A run
/// that gave up on the stale cache could stay unstarted: the reconcile that the write's watch event
/// brings can find the giving-up task still running and leave it be (seen once in `rollout_restart`:
/// a Ready trajectory never started, its group never completed).
async fn drive(
    ctx: &SandboxCtx,
    current: &Current<'_>,
    ready: Timestamp,
    run: &RunSpec,
) -> Option<TrajectoryResult> {
    let key = current.key;
    let deadline = run_deadline(ready, run);
    let mut retry = retry();
    let target = loop {
        let sandbox = still_wanted(ctx, current)?;
        if let Some(target) = agent_target(ctx, &sandbox) {
            break target;
        }
        retry.wait().await;
    };
    let agent = SandboxAgent {
        client: &ctx.agent,
        target,
    };
    // What an OOM-killed run's message names: the limit the Pod has, not what the spec asked for.
    let memory_limit = still_wanted(ctx, current)
        .and_then(|sandbox| cached_pod(&ctx.kube.caches.pods, &sandbox, &ctx.kube.key))
        .and_then(|pod| memory_limit(&pod, TASK_CONTAINER));
    info!(sandbox = %key, "trajectory run starting");
    let result = run_to_result(
        &agent,
        run,
        memory_limit.as_deref(),
        deadline,
        || still_wanted(ctx, current).is_some(),
        retry,
    )
    .await?;
    if result.status == TrajectoryStatus::Aborted {
        // A run killed with its pod ends without a result; that is the pod's disruption, which the
        // reconcile reports (and a RolloutGroup retries), not the run's. The kubelet kills a
        // container only after the API server recorded the pod's deletion, so a read now sees it
        // even when the watch has not delivered it yet. A node that dies at once (a spot reclaim)
        // records nothing first: while the run's agent is gone with it and its pod not yet marked
        // lost, wait (until the run's deadline) for one or the other.
        let mut again = self::retry();
        let mut waiting = false;
        loop {
            let sandbox = still_wanted(ctx, current)?;
            match fetch_own_pod(ctx, &sandbox).await {
                Ok(pod) if lost_with_its_pod(pod.as_ref().map(CachedPod::from).as_ref()) => {
                    info!(sandbox = %key, reason = ?result.reason, "run ended with its pod taken away: left to the pod's disruption");
                    return None;
                }
                Ok(_) => {}
                Err(err) => {
                    warn!(sandbox = %key, %err, "cannot read the run's pod; recording its result");
                    break;
                }
            }
            if Instant::now() >= deadline || agent_answers(&agent).await {
                break;
            }
            if !waiting {
                waiting = true;
                info!(sandbox = %key, reason = ?result.reason, "run ended without a result and its agent does not answer: waiting to see whether its pod is lost");
            }
            again.wait().await;
        }
    }
    Some(result)
}

/// Whether a run that ended without a result of its own ended with its pod (pure): `pod`, read after
/// the run ended, is being deleted or disrupted, or is gone (`None`).
fn lost_with_its_pod(pod: Option<&CachedPod>) -> bool {
    pod.is_none_or(|pod| disruption_failure(pod).is_some())
}

/// Records `result` in the sandbox's status (write-once: a result already there wins), only on the
/// sandbox with `uid` (a UID-guarded JSON Patch: never on a new sandbox under the same name), while
/// it is on the run's attempt.
async fn record(ctx: &SandboxCtx, current: &Current<'_>, result: &TrajectoryResult) {
    let (key, uid) = (current.key, current.uid);
    let Some(namespace) = key.namespace.as_deref() else {
        return;
    };
    let api: Api<Sandbox> = Api::namespaced(ctx.kube.client.clone(), namespace);
    let Some(patch) = result_patch(uid, result) else {
        return;
    };
    let mut retry = retry();
    // Until it is recorded or nobody needs it: a result is never dropped because the API server was
    // briefly unavailable.
    while still_wanted(ctx, current).is_some() {
        match api
            .patch_status(
                &key.name,
                &PatchParams::default(),
                &Patch::Json::<()>(patch.clone()),
            )
            .await
        {
            Ok(_) => {
                ctx.kube.metrics.api_write("sandboxes/status", "patch");
                ctx.kube
                    .metrics
                    .trajectory_runs
                    .with_label_values(&[result.reason.as_deref().unwrap_or(status_label(result))])
                    .inc();
                info!(sandbox = %key, status = status_label(result), reason = result.reason.as_deref().unwrap_or(""), "trajectory result recorded");
                return;
            }
            Err(kube::Error::Api(status)) if status.is_not_found() => return,
            Err(kube::Error::Api(status)) if status.code == 422 || status.is_conflict() => {
                // Replaced by a new sandbox of the same name (the UID test failed), or a result was
                // recorded first (the CRD makes status.result write-once): see which.
                match api.get_opt(&key.name).await {
                    Ok(Some(current)) if current.uid().as_deref() == Some(uid) => {
                        let recorded = current.status.as_ref().and_then(|s| s.result.as_ref());
                        if let Some(recorded) = recorded.filter(|r| *r != result) {
                            preempted(ctx, &current, recorded, Some(result)).await;
                        }
                        return;
                    }
                    Ok(_) => return,
                    Err(err) => {
                        warn!(sandbox = %key, %err, "cannot read the sandbox after its result was refused; retrying");
                        retry.wait().await;
                    }
                }
            }
            Err(err) => {
                warn!(sandbox = %key, %err, "cannot record the trajectory result; retrying");
                retry.wait().await;
            }
        }
    }
}

fn status_label(result: &TrajectoryResult) -> &'static str {
    match result.status {
        orchard_api::TrajectoryStatus::Completed => "completed",
        orchard_api::TrajectoryStatus::Truncated => "truncated",
        orchard_api::TrajectoryStatus::Aborted => "aborted",
    }
}

#[cfg(test)]
mod tests {
    use super::{lost_with_its_pod, needs_result};
    use k8s_openapi::jiff::Timestamp;
    use orchard_api::{Sandbox, SandboxPhase, SandboxStatus, TrajectoryResult};
    use serde_json::json;

    fn sandbox(status: Option<SandboxStatus>) -> Sandbox {
        let mut sandbox: Sandbox = serde_json::from_value(json!({
            "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "t-0", "namespace": "ns", "uid": "u1"},
            "spec": {"image": "busybox"},
        }))
        .expect("a Sandbox");
        sandbox.status = status;
        sandbox
    }

    #[test]
    fn a_cache_behind_the_ready_write_does_not_end_the_run() {
        assert!(
            needs_result(&sandbox(None), "u1", 1),
            "no status cached yet"
        );
        let pending = SandboxStatus {
            phase: Some(SandboxPhase::Pending),
            ..SandboxStatus::default()
        };
        assert!(needs_result(&sandbox(Some(pending)), "u1", 1));
    }

    #[test]
    fn a_result_an_ending_another_object_or_a_deletion_ends_it() {
        let recorded = SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            result: Some(
                serde_json::from_value::<TrajectoryResult>(json!({"status": "aborted"}))
                    .expect("a result"),
            ),
            ..SandboxStatus::default()
        };
        assert!(!needs_result(&sandbox(Some(recorded)), "u1", 1));
        for phase in [SandboxPhase::Failed, SandboxPhase::Expired] {
            let ended = SandboxStatus {
                phase: Some(phase),
                ..SandboxStatus::default()
            };
            assert!(!needs_result(&sandbox(Some(ended)), "u1", 1));
        }
        assert!(
            !needs_result(&sandbox(None), "u2", 1),
            "a new object under the name"
        );
        let mut deleting = sandbox(None);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!needs_result(&deleting, "u1", 1));
    }

    #[test]
    fn a_later_attempt_ends_an_earlier_ones_run_and_a_cache_behind_it_does_not() {
        let on = |attempts| SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            attempts,
            ..SandboxStatus::default()
        };
        assert!(
            !needs_result(&sandbox(Some(on(2))), "u1", 1),
            "attempt 2 began"
        );
        assert!(
            needs_result(&sandbox(Some(on(1))), "u1", 2),
            "the cache shows attempt 1 yet"
        );
        assert!(needs_result(&sandbox(Some(on(2))), "u1", 2));
    }

    #[test]
    fn a_run_ended_with_its_pod_deleted_or_gone_is_left_to_the_disruption() {
        use crate::pod::fixtures::pod;
        let running = pod(Some("node-1"), Some("10.0.0.9"), true);
        assert!(
            !lost_with_its_pod(Some(&running)),
            "a live pod: the run's own end"
        );
        let mut deleting = running.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        assert!(lost_with_its_pod(Some(&deleting)));
        assert!(lost_with_its_pod(None), "gone");
    }
}
