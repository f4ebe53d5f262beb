//! Retries of standalone Sandboxes: which lost pods are retried, with what, and the status a retried
//! sandbox goes through (a new attempt Pending with Ready False `Retrying`, Ready again in its new
//! pod, Failed with the last reason once the attempts are spent).

use crate::plumbing::cached_pod::CachedPod;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::plumbing::conditions;
use crate::pod::fixtures::{pod, with_task_state};
use crate::sandbox::decide::{ChildOutcome, Note, StatusInput, StatusPlan, Then, plan_status};
use crate::sandbox::enforcement::Verdict;
use crate::sandbox::fixtures::{key, sandbox, t, trajectory};
use crate::sandbox::status::{Observed, desired_status};
use orchard_api::{
    Lifecycle, OomEscalation, RetryPolicy, SandboxPhase, SandboxResources, TrajectoryResult,
    TrajectoryStatus,
};

const EVICTED_FOR_MEMORY: &str =
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 10Mi.";

fn defaults() -> ResourceDefaults {
    ResourceDefaults {
        cpu: "1".into(),
        memory: "2Gi".into(),
    }
}

/// `sandbox()` asking for 64Mi with `retry`: 3 attempts, memory doubled up to 256Mi, and
/// evictions retried when `on_eviction`.
fn retrying(on_eviction: bool) -> Sandbox {
    let mut s = sandbox();
    s.metadata.namespace = Some("ns".into());
    s.metadata.uid = Some("uid-s1".into());
    s.spec.resources = Some(SandboxResources {
        memory: Some(Quantity("64Mi".into())),
        ..SandboxResources::default()
    });
    s.spec.retry = Some(RetryPolicy {
        max_attempts: 3,
        on_oom: Some(OomEscalation {
            memory_factor: 2.0,
            cpu_factor: None,
            max_memory: Quantity("256Mi".into()),
            max_cpu: None,
        }),
        on_eviction,
    });
    s
}

fn params(s: &Sandbox) -> RetryParams {
    policy_of(s, key(), &defaults())
        .expect("a valid policy")
        .expect("a policy")
}

fn oom_killed() -> Failure {
    Failure::new("OOMKilled", "the task container `sandbox` was killed")
}

fn record(reason: &str, memory: &str) -> AttemptRecord {
    AttemptRecord {
        reason: reason.into(),
        message: Some("lost".into()),
        memory: Some(Quantity(memory.into())),
        cpu: Some(Quantity("1".into())),
    }
}

fn on_attempt(mut s: Sandbox, previous: Vec<AttemptRecord>) -> Sandbox {
    let mut status = s.status.clone().unwrap_or_default();
    status.attempts = i32::try_from(previous.len()).expect("few") + 1;
    status.previous_attempts = previous;
    s.status = Some(status);
    s
}

#[test]
fn the_policy_is_the_sandboxs_own_and_never_a_trajectorys() {
    assert_eq!(policy_of(&sandbox(), key(), &defaults()), Ok(None));
    let p = params(&retrying(true));
    assert_eq!(p.max_attempts, 3);
    assert_eq!(p.start.memory, 64 << 20);
    assert_eq!(p.start.cpu, 1000, "the operator's default CPU");

    let mut in_group = trajectory();
    in_group.spec.retry = retrying(true).spec.retry;
    assert_eq!(
        policy_of(&in_group, key(), &defaults()),
        Ok(None),
        "its group retries a trajectory"
    );

    let mut below_default = retrying(false);
    below_default.spec.resources = None;
    let error = policy_of(&below_default, key(), &defaults()).expect_err("256Mi < 2Gi");
    assert!(
        error.contains(
            "retry.onOOM.maxMemory 256Mi is below the 2Gi a first attempt runs with (the operator's default memory (--default-memory), since spec.resources.memory is unset)"
        ),
        "{error}"
    );
}

#[test]
fn a_lost_pod_is_retried_while_the_policy_covers_it_and_attempts_are_left() {
    let both = retrying(true);
    let oom_only = retrying(false);
    type Row<'a> = (&'a str, Sandbox, Failure, Option<(&'a str, &'a str)>);
    let cases: Vec<Row> = vec![
        (
            "OOM-killed, attempt 1: recorded with what it ran with",
            both.clone(),
            oom_killed(),
            Some(("OOMKilled", "64Mi")),
        ),
        (
            "OOM-killed, attempt 2 runs with 128Mi",
            on_attempt(both.clone(), vec![record("OOMKilled", "64Mi")]),
            oom_killed(),
            Some(("OOMKilled", "128Mi")),
        ),
        (
            "OOM-killed at maxMemory: no retry",
            on_attempt(
                both.clone(),
                vec![record("OOMKilled", "64Mi"), record("PodDeleted", "128Mi")],
            ),
            oom_killed(),
            None,
        ),
        (
            "attempts spent",
            on_attempt(
                both.clone(),
                vec![record("PodDeleted", "64Mi"), record("PodDeleted", "64Mi")],
            ),
            Failure::new("PodDeleted", "gone"),
            None,
        ),
        (
            "evicted for memory: onOOM covers it",
            oom_only.clone(),
            Failure::new("Evicted", EVICTED_FOR_MEMORY),
            Some(("Evicted", "64Mi")),
        ),
        (
            "evicted for disk without onEviction",
            oom_only.clone(),
            Failure::new(
                "Evicted",
                "The node was low on resource: ephemeral-storage.",
            ),
            None,
        ),
        (
            "the node lost, with onEviction",
            both.clone(),
            Failure::new("NodeLost", "node n1 is gone"),
            Some(("NodeLost", "64Mi")),
        ),
        (
            "a deleted pod without onEviction",
            oom_only.clone(),
            Failure::new("PodDeleted", "gone"),
            None,
        ),
        (
            "an image that cannot be pulled is no loss a new pod fixes",
            both.clone(),
            Failure::new("ImagePullBackOff", "not found"),
            None,
        ),
        (
            "preempted: not retried (as in a RolloutGroup)",
            both.clone(),
            Failure::new("Preempted", "higher priority"),
            None,
        ),
    ];
    for (case, s, failure, expected) in cases {
        let got = retry_of(&s, &params(&s), &failure);
        assert_eq!(
            got.as_ref().map(|r| (
                r.reason.as_str(),
                r.memory.as_ref().map_or("", |q| q.0.as_str())
            )),
            expected,
            "{case}"
        );
    }
    let mut finished = both.clone();
    finished.status = Some(SandboxStatus {
        result: Some(TrajectoryResult {
            reward: Some(1.0),
            status: TrajectoryStatus::Completed,
            length: None,
            exit_code: Some(0),
            artifact: None,
            reason: None,
            message: None,
        }),
        ..SandboxStatus::default()
    });
    assert_eq!(
        retry_of(&finished, &params(&finished), &oom_killed()),
        None,
        "a recorded result stands"
    );
}

#[test]
fn each_attempts_pod_asks_for_what_its_retry_gave_it() {
    let s = retrying(true);
    let p = params(&s);
    assert_eq!(as_attempt(&s, Some(&p)), s, "the first attempt: as it is");
    let second = on_attempt(s.clone(), vec![record("OOMKilled", "64Mi")]);
    let built = as_attempt(&second, Some(&p));
    assert_eq!(
        built.spec.resources.as_ref().and_then(|r| r.memory.clone()),
        Some(Quantity("128Mi".into()))
    );
    assert_eq!(
        built.spec.resources.as_ref().and_then(|r| r.cpu.clone()),
        None,
        "the CPU left to the operator's default stays so"
    );
    let evicted = on_attempt(s.clone(), vec![record("PodDeleted", "64Mi")]);
    assert_eq!(
        as_attempt(&evicted, Some(&p)).spec,
        s.spec,
        "an eviction keeps the resources"
    );
    assert_eq!(as_attempt(&second, None), second, "without a policy");
}

#[test]
fn a_pod_per_attempt_named_and_labelled_for_it() {
    use crate::pod::naming::{attempt_pod_name, own_pod_name_of, pod_labels};
    assert_eq!(attempt_pod_name("s1", 1), "s1");
    assert_eq!(attempt_pod_name("s1", 3), "s1-attempt-3");
    let first = retrying(true);
    assert_eq!(own_pod_name_of(&first), "s1");
    assert!(!pod_labels(&first, key()).contains_key(orchard_api::ATTEMPT_LABEL));
    let second = on_attempt(first, vec![record("OOMKilled", "64Mi")]);
    assert_eq!(own_pod_name_of(&second), "s1-attempt-2");
    assert_eq!(
        pod_labels(&second, key())
            .get(orchard_api::ATTEMPT_LABEL)
            .map(String::as_str),
        Some("2")
    );
}

fn observed<'a>(
    pod: Option<&'a CachedPod>,
    now: &str,
    retry: Option<&'a RetryParams>,
) -> Observed<'a> {
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
        retry,
    }
}

fn oom_killed_pod() -> CachedPod {
    let mut p = with_task_state(
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
    if let Some(status) = p.status.as_mut() {
        status.phase = Some("Failed".into());
    }
    p
}

fn ready_pod(name: &str, created: &str) -> CachedPod {
    let mut p = pod(Some("node-1"), Some("10.0.0.8"), true);
    p.metadata.name = Some(name.into());
    p.metadata.creation_timestamp = Some(Time(t(created)));
    p
}

fn ready_condition(status: &SandboxStatus) -> (String, String, String) {
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// `s` Ready since 00:01:00 in its first pod.
fn ready_sandbox(s: Sandbox) -> Sandbox {
    let mut s = s;
    let first = ready_pod("s1", "2026-01-01T00:00:01Z");
    s.status = Some(desired_status(
        &s,
        &observed(Some(&first), "2026-01-01T00:01:00Z", None),
    ));
    assert_eq!(
        s.status.as_ref().and_then(|x| x.phase),
        Some(SandboxPhase::Ready)
    );
    s
}

#[test]
fn an_oom_killed_sandbox_starts_its_next_attempt_and_is_ready_again_in_its_new_pod() {
    let s = ready_sandbox(retrying(true));
    let p = params(&s);
    let killed = oom_killed_pod();
    let retried = desired_status(
        &s,
        &observed(Some(&killed), "2026-01-01T00:10:00Z", Some(&p)),
    );
    assert_eq!(retried.phase, Some(SandboxPhase::Pending), "{retried:?}");
    assert_eq!(retried.attempts, 2);
    assert_eq!(retried.previous_attempts.len(), 1);
    assert_eq!(retried.previous_attempts[0].reason, "OOMKilled");
    assert_eq!(
        retried.previous_attempts[0].memory,
        Some(Quantity("64Mi".into()))
    );
    assert_eq!(
        retried.pod_name, None,
        "the lost pod is not the sandbox's any more"
    );
    assert_eq!(retried.pod_ip, None);
    assert_eq!(retried.agent_endpoint, None);
    assert_eq!(retried.reason, None, "not failed");
    assert_eq!(
        retried.ready_time,
        s.status.as_ref().and_then(|x| x.ready_time.clone()),
        "the expiry clocks go on"
    );
    assert!(retried.expires_at.is_some());
    let (ready, reason, message) = ready_condition(&retried);
    assert_eq!((ready.as_str(), reason.as_str()), ("False", RETRYING));
    for part in [
        "attempt 2 of 3 after OOMKilled",
        "files are gone",
        "PodNotCreated",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert!(conditions::is_true(&retried.conditions, "Reconciling"));

    // Its new pod starting, then Ready: the same sandbox, Ready again.
    let mut s = s;
    s.status = Some(retried);
    let mut starting = ready_pod("s1-attempt-2", "2026-01-01T00:10:01Z");
    if let Some(c) = starting
        .status
        .as_mut()
        .and_then(|st| st.conditions.as_mut())
    {
        c[0].status = "False".into();
    }
    let waiting = desired_status(
        &s,
        &observed(Some(&starting), "2026-01-01T00:10:02Z", Some(&p)),
    );
    assert_eq!(waiting.phase, Some(SandboxPhase::Starting));
    let (_, reason, message) = ready_condition(&waiting);
    assert_eq!(reason, RETRYING);
    assert!(message.contains("AgentStarting"), "{message}");
    assert_eq!(waiting.pod_name.as_deref(), Some("s1-attempt-2"));

    let new = ready_pod("s1-attempt-2", "2026-01-01T00:10:01Z");
    let again = desired_status(&s, &observed(Some(&new), "2026-01-01T00:10:05Z", Some(&p)));
    assert_eq!(again.phase, Some(SandboxPhase::Ready));
    assert_eq!(ready_condition(&again).1, "SandboxReady");
    assert_eq!(again.attempts, 2, "kept once Ready");
    assert_eq!(again.previous_attempts.len(), 1);
    assert_eq!(again.pod_name.as_deref(), Some("s1-attempt-2"));
    assert_eq!(
        again.agent_endpoint.as_deref(),
        Some("http://10.0.0.8:9090")
    );

    // Once Ready, an agent that stops answering is not a retry starting.
    s.status = Some(again);
    let mut silent = new.clone();
    if let Some(c) = silent.status.as_mut().and_then(|st| st.conditions.as_mut()) {
        c[0].status = "False".into();
    }
    let later = desired_status(
        &s,
        &observed(Some(&silent), "2026-01-01T00:50:00Z", Some(&p)),
    );
    assert_eq!(ready_condition(&later).1, "AgentNotResponding");
}

#[test]
fn a_sandbox_that_loses_its_last_attempt_fails_with_that_attempts_reason() {
    let s = on_attempt(
        ready_sandbox(retrying(true)),
        vec![record("PodDeleted", "64Mi"), record("PodDeleted", "64Mi")],
    );
    let p = params(&s);
    let gone = desired_status(
        &s,
        &Observed {
            pod_gone: Some(Failure::new("PodDeleted", "the sandbox's pod was deleted")),
            ..observed(None, "2026-01-01T00:20:00Z", Some(&p))
        },
    );
    assert_eq!(gone.phase, Some(SandboxPhase::Failed));
    assert_eq!(gone.reason.as_deref(), Some("PodDeleted"));
    assert_eq!(gone.attempts, 3, "what it went through stays");
    assert_eq!(gone.previous_attempts.len(), 2);

    let without = ready_sandbox(sandbox());
    let failed = desired_status(
        &without,
        &observed(Some(&oom_killed_pod()), "2026-01-01T00:20:00Z", None),
    );
    assert_eq!(
        failed.phase,
        Some(SandboxPhase::Failed),
        "no policy: as before"
    );
    assert_eq!(failed.reason.as_deref(), Some("OOMKilled"));
    assert_eq!(failed.attempts, 1);
}

#[test]
fn a_retried_attempt_has_its_own_startup_timeout_from_its_pods_creation() {
    let s = ready_sandbox(retrying(true));
    let p = params(&s);
    let mut s = s;
    s.status = Some(desired_status(
        &s,
        &observed(Some(&oom_killed_pod()), "2026-01-01T00:30:00Z", Some(&p)),
    ));
    // No pod yet (a quota, say): no clock.
    let no_pod = desired_status(&s, &observed(None, "2026-01-01T02:00:00Z", Some(&p)));
    assert_eq!(no_pod.phase, Some(SandboxPhase::Pending));
    let mut stuck = ready_pod("s1-attempt-2", "2026-01-01T00:30:01Z");
    if let Some(st) = stuck.status.as_mut() {
        st.phase = Some("Pending".into());
        if let Some(c) = st.conditions.as_mut() {
            c[0].status = "False".into();
        }
    }
    let young = desired_status(
        &s,
        &observed(Some(&stuck), "2026-01-01T00:39:00Z", Some(&p)),
    );
    assert_eq!(young.phase, Some(SandboxPhase::Starting));
    let old = desired_status(
        &s,
        &observed(Some(&stuck), "2026-01-01T00:40:02Z", Some(&p)),
    );
    assert_eq!(old.phase, Some(SandboxPhase::Failed));
    assert_eq!(old.reason.as_deref(), Some("StartupTimeout"));
}

#[test]
fn a_retry_is_written_at_once_told_and_followed_by_the_new_pod() {
    let settings = crate::sandbox::context::SandboxSettings {
        default_ttl_seconds: 3600,
        max_ttl_seconds: 86400,
        default_heartbeat_timeout_seconds: 0,
        startup_timeout_seconds: 600,
        status_coalesce: Duration::from_secs(3600),
        concurrency: 1,
        simulated_agent: false,
    };
    let s = ready_sandbox(retrying(true));
    let p = params(&s);
    let input = StatusInput {
        settings: &settings,
        agent_port: 9090,
        resync: Duration::from_secs(300),
        key: key(),
        now: t("2026-01-01T00:00:30Z"),
        enforcement: &Verdict::Unknown,
        egress_proxy: false,
        retry: Some(&p),
    };
    let outcome = ChildOutcome {
        pod: Some(oom_killed_pod()),
        ..ChildOutcome::default()
    };
    let StatusPlan::Settle(plan) = plan_status(&s, &outcome, &input) else {
        panic!("a retry is never held back, however young the sandbox");
    };
    assert!(plan.write);
    assert_eq!(plan.then, Then::Requeue(Duration::ZERO));
    let [Note::Retried { reason, message }] = plan.notes.as_slice() else {
        panic!("one retry told: {:?}", plan.notes);
    };
    assert_eq!(reason, "OOMKilled");
    assert_eq!(
        message,
        "attempt 1 ended OOMKilled (memory 64Mi, cpu 1); attempt 2 gets memory 128Mi, cpu 1; the sandbox's files are lost with its pod"
    );
}

#[test]
fn a_policy_that_cannot_run_refuses_the_first_pod_only() {
    use crate::pod::placement::Placement;
    use crate::sandbox::blocked::Blocked;
    use crate::sandbox::decide::{ChildPlan, PodStep, plan_children};
    let allow = Placement::default();
    let s = retrying(true);
    assert_eq!(
        plan_children(&s, None, &allow, Some("bad"), None),
        ChildPlan::Refused(Blocked::InvalidSpec("bad".into()))
    );
    let later = on_attempt(s, vec![record("PodDeleted", "64Mi")]);
    assert_eq!(
        plan_children(&later, None, &allow, Some("bad"), None),
        ChildPlan::Ensure {
            pod: PodStep::Start
        },
        "a retry is not refused by a policy the operator's defaults broke since"
    );
}
