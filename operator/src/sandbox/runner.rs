//! The trajectory runner of sandboxes with `spec.run`: once the sandbox is Ready, a task (never a
//! reconcile worker) starts the command through the agent's background-process API, waits for it with
//! long polls, reads the result file and records `status.result` once.
//!
//! Restart safety: the process has a fixed id ([`RUN_PROCESS_ID`]); a restarted operator's start
//! request gets 409 Conflict and adopts the running (or finished) process. The agent enforces
//! `timeoutSeconds` itself, so a run ends on time even while the operator is down; the operator adds
//! its own deadline (plus [`DEADLINE_GRACE`]) in case the agent stops answering.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::build::{TOKEN_KEY, token_secret_name};
use super::run_result::{aborted, result_of_run};
use crate::agent_client::{AgentCallError, AgentTarget};
use crate::api::{RunSpec, Sandbox, SandboxPhase, TrajectoryResult};
use crate::context::Context;
use crate::ownership::controlled_by;
use crate::status_patch::status_member_patch;

/// The patch that sets `status.result` of the sandbox with `uid`.
fn result_patch(uid: &str, result: &TrajectoryResult) -> Option<json_patch::Patch> {
    let value = serde_json::to_value(result).ok()?;
    Some(status_member_patch(uid, "result", value))
}

/// Id of the run's background process inside the agent.
pub const RUN_PROCESS_ID: &str = "orchard-run";
/// Extra time the operator allows beyond `timeoutSeconds` before declaring the run lost.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(60);
/// Seconds each long poll waits for the process to exit.
const LONG_POLL_SECONDS: u64 = 20;

/// The agent endpoint and token of a sandbox, from its status and its own Secret (by owner UID) in
/// the cache.
pub fn agent_target(ctx: &Context, sandbox: &Sandbox) -> Option<AgentTarget> {
    let endpoint = sandbox.status.as_ref()?.agent_endpoint.clone()?;
    let namespace = sandbox.namespace()?;
    let secret = ctx
        .caches
        .secrets
        .get(&ObjectRef::new(&token_secret_name(&sandbox.name_any())).within(&namespace))
        .filter(|s| controlled_by(s.meta(), sandbox.meta().uid.as_deref().unwrap_or_default()))?;
    let token = String::from_utf8(secret.data.as_ref()?.get(TOKEN_KEY)?.0.clone()).ok()?;
    Some(AgentTarget { endpoint, token })
}

/// Starts the runner of `sandbox` unless one runs already or nothing is left to do.
pub fn ensure_runner(ctx: &Arc<Context>, sandbox: &Sandbox) {
    let Some(run) = sandbox.spec.run.clone() else {
        return;
    };
    let status = sandbox.status.clone().unwrap_or_default();
    if status.result.is_some()
        || status.ready_time.is_none()
        || status.phase != Some(SandboxPhase::Ready)
    {
        return;
    }
    let Some(uid) = sandbox.uid() else { return };
    {
        let mut runners = ctx.runners.lock().unwrap_or_else(|p| p.into_inner());
        if !runners.insert(uid.clone()) {
            return;
        }
    }
    let key = ObjectRef::from_obj(sandbox);
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let outcome = drive(&ctx, &key, &uid, &run).await;
        if let Some(result) = outcome {
            record(&ctx, &key, &uid, &result).await;
        }
        ctx.runners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
    });
}

/// The sandbox as the cache has it now, if it is still the same object and still needs a result.
fn still_wanted(ctx: &Context, key: &ObjectRef<Sandbox>, uid: &str) -> Option<Arc<Sandbox>> {
    if !ctx.leadership.is_leader() {
        // The new leader adopts the run (its start request gets 409 and waits on the same process).
        return None;
    }
    let sandbox = ctx.caches.sandboxes.get(key)?;
    if sandbox.uid().as_deref() != Some(uid) || sandbox.meta().deletion_timestamp.is_some() {
        return None;
    }
    let status = sandbox.status.as_ref()?;
    if status.result.is_some()
        || matches!(
            status.phase,
            Some(SandboxPhase::Failed | SandboxPhase::Expired)
        )
    {
        return None;
    }
    Some(sandbox)
}

fn next_delay(delay: Duration) -> Duration {
    (delay * 2).min(Duration::from_secs(10))
}

async fn drive(
    ctx: &Context,
    key: &ObjectRef<Sandbox>,
    uid: &str,
    run: &RunSpec,
) -> Option<TrajectoryResult> {
    let sandbox = still_wanted(ctx, key, uid)?;
    let ready = sandbox.status.as_ref()?.ready_time.as_ref()?.0;
    let deadline = ready
        .saturating_add(SignedDuration::from_secs(run.timeout_seconds.max(1)))
        .and_then(|t| t.saturating_add(DEADLINE_GRACE))
        .unwrap_or(ready);
    let mut delay = Duration::from_millis(200);
    let target = loop {
        let sandbox = still_wanted(ctx, key, uid)?;
        if let Some(target) = agent_target(ctx, &sandbox) {
            break target;
        }
        tokio::time::sleep(delay).await;
        delay = next_delay(delay);
    };
    let mut process = loop {
        still_wanted(ctx, key, uid)?;
        match ctx
            .agent
            .start_process(&target, RUN_PROCESS_ID, &run.command, run.timeout_seconds)
            .await
        {
            Ok(process) => break process,
            Err(AgentCallError::Status { status, body }) if (400..500).contains(&status) => {
                return Some(aborted(
                    "RunnerStartFailed",
                    format!("the agent refused to start the run ({status}): {body}"),
                    None,
                ));
            }
            Err(err) if Timestamp::now() < deadline => {
                warn!(sandbox = %key, %err, "cannot start the run yet; retrying");
                tokio::time::sleep(delay).await;
                delay = next_delay(delay);
            }
            Err(err) => {
                return Some(aborted(
                    "TimeExceeded",
                    format!("the run could not be started before its deadline: {err}"),
                    None,
                ));
            }
        }
    };
    info!(sandbox = %key, "trajectory run started");
    delay = Duration::from_millis(200);
    while !process.exited() {
        still_wanted(ctx, key, uid)?;
        if Timestamp::now() >= deadline {
            let _ = ctx.agent.kill_process(&target, RUN_PROCESS_ID).await;
            return Some(aborted(
                "TimeExceeded",
                format!(
                    "the run did not report its end within timeoutSeconds={} (+{}s grace) and was killed",
                    run.timeout_seconds,
                    DEADLINE_GRACE.as_secs()
                ),
                None,
            ));
        }
        match ctx
            .agent
            .process(&target, RUN_PROCESS_ID, LONG_POLL_SECONDS)
            .await
        {
            Ok(status) => {
                process = status;
                delay = Duration::from_millis(200);
            }
            Err(AgentCallError::Status { status: 404, .. }) => {
                return Some(aborted(
                    "RunLost",
                    "the agent no longer knows the run's process",
                    None,
                ));
            }
            Err(err) => {
                warn!(sandbox = %key, %err, "cannot reach the run's agent; retrying");
                tokio::time::sleep(delay).await;
                delay = next_delay(delay);
            }
        }
    }
    let file = ctx
        .agent
        .read_file(&target, &run.result_path)
        .await
        .map(|bytes| bytes.map(|b| b.to_vec()))
        .map_err(|e| e.to_string());
    let file_ref = file.as_ref().map(|f| f.as_deref()).map_err(Clone::clone);
    Some(result_of_run(
        &process,
        file_ref,
        &run.result_path,
        run.timeout_seconds,
    ))
}

/// Records `result` in the sandbox's status (write-once: a result already there wins), only on the
/// sandbox with `uid` (a UID-guarded JSON Patch: never on a new sandbox under the same name).
async fn record(ctx: &Context, key: &ObjectRef<Sandbox>, uid: &str, result: &TrajectoryResult) {
    let Some(namespace) = key.namespace.as_deref() else {
        return;
    };
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(patch) = result_patch(uid, result) else {
        return;
    };
    let mut delay = Duration::from_millis(200);
    for _ in 0..8 {
        match api
            .patch_status(
                &key.name,
                &PatchParams::default(),
                &Patch::Json::<()>(patch.clone()),
            )
            .await
        {
            Ok(_) => {
                ctx.metrics.api_write("sandboxes/status", "patch");
                ctx.metrics
                    .trajectory_runs
                    .with_label_values(&[result.reason.as_deref().unwrap_or(status_label(result))])
                    .inc();
                info!(sandbox = %key, status = status_label(result), reason = result.reason.as_deref().unwrap_or(""), "trajectory result recorded");
                return;
            }
            Err(kube::Error::Api(status))
                if status.is_not_found() || status.code == 422 || status.is_conflict() =>
            {
                // Gone, replaced by a new sandbox of the same name (the UID test failed), or a result
                // was recorded first (the CRD makes status.result write-once).
                return;
            }
            Err(err) => {
                warn!(sandbox = %key, %err, "cannot record the trajectory result; retrying");
                tokio::time::sleep(delay).await;
                delay = next_delay(delay);
            }
        }
    }
}

fn status_label(result: &TrajectoryResult) -> &'static str {
    match result.status {
        crate::api::TrajectoryStatus::Completed => "completed",
        crate::api::TrajectoryStatus::Truncated => "truncated",
        crate::api::TrajectoryStatus::Aborted => "aborted",
    }
}
