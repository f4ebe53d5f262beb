//! The status of a Sandbox for each state its CachedPod can be in.

use super::*;
use crate::plumbing::cached_pod::CachedPod;
use crate::pod::fixtures::{pod, with_pod_condition, with_task_state};
use crate::pod::health::permanent_pull_error;
use crate::sandbox::fixtures::{forged_trajectory, key, sandbox, t, trajectory};
use crate::sandbox::refusals::quota_refusal;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, EnvVar, PodCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use orchard_api::{HEARTBEAT_ANNOTATION, TrajectoryResult, TrajectoryStatus};
use std::collections::BTreeMap;

fn observed<'a>(pod: Option<&'a CachedPod>, now: &str) -> Observed<'a> {
    Observed {
        pod,
        pod_gone: None,
        now: t(now),
        lifecycle: Lifecycle {
            ttl_seconds: 3600,
            heartbeat_timeout_seconds: 0,
        },
        startup_timeout_seconds: 600,
        agent_port: 9090,
        blocked: None,
        key: key(),
        enforcement: &Verdict::Unknown,
        egress_proxy: false,
        retry: None,
    }
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
fn an_unscheduled_gpu_sandbox_says_which_gpus_it_waits_for() {
    let mut p = pod(None, None, false);
    p.status.as_mut().unwrap().conditions = Some(vec![PodCondition {
        type_: "PodScheduled".into(),
        status: "False".into(),
        reason: Some("Unschedulable".into()),
        message: Some("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. ".into()),
        ..Default::default()
    }]);
    let mut gpu = sandbox();
    gpu.spec.resources = serde_json::from_value(serde_json::json!({
        "gpu": {"count": 3, "types": ["H100"]}
    }))
    .expect("resources JSON");
    let status = desired_status(&gpu, &observed(Some(&p), "2026-01-01T00:00:01Z"));
    assert_eq!(status.phase, Some(SandboxPhase::Pending));
    let expected = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. (the sandbox asks for 3 GPUs on one node of GPU type h100)";
    assert_eq!(cond(&status, "Scheduled").reason, "Unschedulable");
    assert_eq!(cond(&status, "Scheduled").message, expected);
    assert_eq!(cond(&status, "Ready").reason, "Unschedulable");
    assert_eq!(cond(&status, "Ready").message, expected);
    // Waiting for the scheduler (no verdict yet) adds nothing.
    let waiting = pod(None, None, false);
    let status = desired_status(&gpu, &observed(Some(&waiting), "2026-01-01T00:00:01Z"));
    assert_eq!(cond(&status, "Scheduled").reason, "PodPending");
    assert_eq!(
        cond(&status, "Scheduled").message,
        "waiting for the scheduler"
    );
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
            pod_gone: Some(crate::pod::disruption::gone_failure(None, None)),
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
fn an_oom_killed_task_container_fails_the_sandbox_with_oom_killed() {
    let p = with_task_state(
        pod(Some("node-1"), Some("10.0.0.7"), false),
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some("OOMKilled".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let status = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:05Z"));
    assert_eq!(status.phase, Some(SandboxPhase::Failed));
    assert_eq!(status.reason.as_deref(), Some("OOMKilled"));
    let ready = cond(&status, condition::READY);
    assert_eq!(ready.reason, "OOMKilled");
    assert!(
        ready.message.contains("`sandbox`") && ready.message.contains("spec.resources.memory"),
        "{}",
        ready.message
    );
    assert_eq!(cond(&status, conditions::STALLED).reason, "OOMKilled");
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
    obs.pod_gone = Some(crate::pod::disruption::gone_failure(Some("node-1"), None));
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
        "CachedPod s1 of a deleted Sandbox with this name is still being removed".into(),
    ));
    let status = desired_status(&sandbox(), &obs);
    assert_eq!(status.phase, Some(SandboxPhase::Pending));
    let scheduled = cond(&status, condition::SCHEDULED);
    assert_eq!(scheduled.reason, "PreviousIncarnation");
    assert!(scheduled.message.contains("still being removed"));
}

#[test]
fn a_name_held_by_somebody_else_fails_the_sandbox() {
    let mut obs = observed(None, "2026-01-01T00:00:05Z");
    obs.blocked = Some(Blocked::NameConflict(
        "CachedPod s1 already exists and is not created by the operator".into(),
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
fn awaiting_enforcement(mut pod: CachedPod) -> CachedPod {
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

/// A gated pod whose task container runs since 00:00:05.
fn gated_running() -> CachedPod {
    awaiting_enforcement(with_task_state(
        pod(Some("node-1"), Some("10.0.0.9"), false),
        ContainerState {
            running: Some(k8s_openapi::api::core::v1::ContainerStateRunning {
                started_at: Some(Time(t("2026-01-01T00:00:05Z"))),
            }),
            ..Default::default()
        },
    ))
}

#[test]
fn while_the_cluster_wide_verdict_is_missing_a_waiting_sandbox_says_so_at_once_without_stalling() {
    let missing = Verdict::Missing {
        since: t("2025-12-31T23:00:00Z"),
        sandbox: "other/first".into(),
    };
    let with = |verdict: &Verdict, p: &CachedPod, now: &str| {
        let obs = Observed {
            enforcement: verdict,
            ..observed(Some(p), now)
        };
        desired_status(&sandbox(), &obs)
    };
    let gated = gated_running();
    let early = with(&missing, &gated, "2026-01-01T00:00:06Z");
    let ready = cond(&early, condition::READY);
    assert_eq!(ready.reason, POLICY_ENFORCEMENT_MISSING);
    for part in [
        "cluster-wide verdict",
        "other/first",
        "2025-12-31T23:00:00Z",
        "sandboxEgress.awaitEnforcement=false",
    ] {
        assert!(ready.message.contains(part), "{part}: {}", ready.message);
    }
    assert_eq!(cond(&early, conditions::STALLED).status, "False");
    assert_eq!(cond(&early, conditions::RECONCILING).status, "True");
    assert_eq!(early.phase, Some(SandboxPhase::Starting));

    // Its own wait past 30 s: its own message, stalled.
    let own = with(&missing, &gated, "2026-01-01T00:00:35Z");
    assert!(
        !cond(&own, condition::READY)
            .message
            .contains("cluster-wide")
    );
    assert_eq!(cond(&own, conditions::STALLED).status, "True");

    // Not yet running, or a verdict that is not Missing, or an agent that does not wait: nothing early.
    let created = awaiting_enforcement(pod(Some("node-1"), None, false));
    let plain = pod(Some("node-1"), Some("10.0.0.9"), false);
    let enforced = Verdict::Enforced {
        since: t("2025-12-31T23:00:00Z"),
    };
    for (case, verdict, p) in [
        ("container not running", &missing, &created),
        ("enforced", &enforced, &gated),
        ("unknown", &Verdict::Unknown, &gated),
        ("not gated", &missing, &plain),
    ] {
        let status = with(verdict, p, "2026-01-01T00:00:06Z");
        assert_eq!(
            cond(&status, condition::READY).reason,
            "AgentStarting",
            "{case}"
        );
    }
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

fn naming_hosts() -> Sandbox {
    let mut s = sandbox();
    s.spec.network = Some(orchard_api::NetworkSpec {
        egress: orchard_api::EgressPolicy::AllowList,
        allow: vec![orchard_api::EgressRule {
            cidr: None,
            host: Some("pypi.org".into()),
            ports: vec![],
        }],
        deny: vec![],
    });
    s
}

#[test]
fn a_sandbox_naming_hosts_is_ready_only_once_the_proxy_enforces_them() {
    let p = pod(Some("node-1"), Some("10.0.0.7"), true);
    let with_proxy = |now| Observed {
        egress_proxy: true,
        ..observed(Some(&p), now)
    };
    let mut s = naming_hosts();
    let waiting = desired_status(&s, &with_proxy("2026-01-01T00:00:02Z"));
    assert_eq!(waiting.phase, Some(SandboxPhase::Starting));
    assert!(conditions::is_true(&waiting.conditions, "AgentReady"));
    assert_eq!(cond(&waiting, "Ready").reason, "EgressPending");
    assert_eq!(cond(&waiting, "HostEgress").status, "False");
    assert!(waiting.ready_time.is_none());

    // The proxy reports the generation for the pod's IP: Ready, and the report is kept.
    s.status = Some(SandboxStatus {
        egress: Some(orchard_api::EgressStatus {
            observed_generation: 1,
            pod_ip: "10.0.0.7".into(),
            message: None,
        }),
        ..waiting
    });
    let ready = desired_status(&s, &with_proxy("2026-01-01T00:00:03Z"));
    assert_eq!(ready.phase, Some(SandboxPhase::Ready));
    assert_eq!(cond(&ready, "HostEgress").reason, "InForce");
    assert_eq!(ready.egress, s.status.as_ref().unwrap().egress);

    // A later change the proxy has not applied yet leaves it Ready, and says so.
    s.metadata.generation = Some(2);
    s.status = Some(ready);
    let changed = desired_status(&s, &with_proxy("2026-01-01T00:00:04Z"));
    assert_eq!(changed.phase, Some(SandboxPhase::Ready));
    assert_eq!(cond(&changed, "HostEgress").reason, "EgressPending");
}

#[test]
fn a_sandbox_naming_hosts_fails_without_an_egress_proxy() {
    let p = pod(Some("node-1"), Some("10.0.0.7"), true);
    let status = desired_status(&naming_hosts(), &observed(Some(&p), "2026-01-01T00:00:02Z"));
    assert_eq!(status.phase, Some(SandboxPhase::Failed));
    assert_eq!(status.reason.as_deref(), Some("EgressProxyMissing"));
    // One without hosts has no HostEgress condition at all.
    let plain = desired_status(&sandbox(), &observed(Some(&p), "2026-01-01T00:00:02Z"));
    assert!(plain.conditions.iter().all(|c| c.type_ != "HostEgress"));
}
