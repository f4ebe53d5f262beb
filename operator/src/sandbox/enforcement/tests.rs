//! The verdict's transitions and the evidence a sandbox's status gives, as tables.

use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::shared::SharedVerdict;
use super::*;
use crate::pod::fixtures::pod;
use crate::sandbox::fixtures::t;

fn missing(at: &str, sandbox: &str) -> Evidence {
    Evidence::Missing {
        at: t(at),
        sandbox: sandbox.into(),
    }
}

fn enforced(at: &str) -> Evidence {
    Evidence::Enforced { at: t(at) }
}

fn verdict_of(e: &Evidence) -> Verdict {
    next(&Verdict::Unknown, e)
}

const T1: &str = "2026-01-01T00:01:00Z";
const T2: &str = "2026-01-01T00:02:00Z";
const T3: &str = "2026-01-01T00:03:00Z";

#[test]
fn the_latest_evidence_wins_and_a_second_missing_keeps_the_first() {
    let missing_at_2 = verdict_of(&missing(T2, "ns/a"));
    let enforced_at_2 = verdict_of(&enforced(T2));
    let cases: Vec<(&str, Verdict, Evidence, Verdict)> = vec![
        (
            "unknown, then missing",
            Verdict::Unknown,
            missing(T1, "ns/a"),
            Verdict::Missing {
                since: t(T1),
                sandbox: "ns/a".into(),
            },
        ),
        (
            "unknown, then enforced",
            Verdict::Unknown,
            enforced(T1),
            Verdict::Enforced { since: t(T1) },
        ),
        (
            "missing, then another missing: the first stays",
            missing_at_2.clone(),
            missing(T3, "ns/b"),
            missing_at_2.clone(),
        ),
        (
            "missing, then a later pass: an enforcer appeared",
            missing_at_2.clone(),
            enforced(T3),
            Verdict::Enforced { since: t(T3) },
        ),
        (
            "missing, then an older pass (a Ready sandbox reconciled again): missing stays",
            missing_at_2.clone(),
            enforced(T1),
            missing_at_2.clone(),
        ),
        (
            "enforced, then a later pass moves the time",
            enforced_at_2.clone(),
            enforced(T3),
            Verdict::Enforced { since: t(T3) },
        ),
        (
            "enforced, then an older pass keeps it",
            enforced_at_2.clone(),
            enforced(T1),
            enforced_at_2.clone(),
        ),
        (
            "enforced, then a later wait too long: the enforcer went",
            enforced_at_2.clone(),
            missing(T3, "ns/c"),
            Verdict::Missing {
                since: t(T3),
                sandbox: "ns/c".into(),
            },
        ),
        (
            "enforced, then an older wait too long keeps it",
            enforced_at_2.clone(),
            missing(T1, "ns/c"),
            enforced_at_2.clone(),
        ),
        (
            "enforced, then a wait too long at the same second keeps it",
            enforced_at_2.clone(),
            missing(T2, "ns/c"),
            enforced_at_2,
        ),
    ];
    for (case, current, evidence, want) in cases {
        assert_eq!(next(&current, &evidence), want, "{case}");
    }
}

#[test]
fn a_fold_takes_the_evidence_in_time_order_whatever_order_it_comes_in() {
    let evidence = vec![
        missing(T3, "ns/late"),
        enforced(T2),
        missing(T1, "ns/early"),
        missing(T3, "ns/also-late"),
    ];
    let want = Verdict::Missing {
        since: t(T3),
        sandbox: "ns/also-late".into(),
    };
    assert_eq!(after_all(&Verdict::Unknown, evidence.clone()), want);
    let mut reversed = evidence;
    reversed.reverse();
    assert_eq!(after_all(&Verdict::Unknown, reversed), want);
    assert_eq!(after_all(&want, Vec::new()), want, "no evidence, no change");
}

fn stalled(reason: &str, at: &str) -> SandboxStatus {
    SandboxStatus {
        conditions: vec![Condition {
            type_: STALLED.into(),
            status: "True".into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(t(at)),
            observed_generation: None,
        }],
        ..SandboxStatus::default()
    }
}

fn gated(mut p: CachedPod) -> CachedPod {
    if let Some(spec) = p.spec.as_mut() {
        spec.containers[0].env = Some(vec![EnvVar {
            name: crate::pod::policy_canary::CANARY_VARIABLE.into(),
            value: Some("10.0.0.1:6443".into()),
            ..Default::default()
        }]);
    }
    p
}

#[test]
fn a_sandbox_tells_missing_by_its_own_stall_and_enforced_by_its_gated_pods_ready() {
    let ready = SandboxStatus {
        ready_time: Some(Time(t(T2))),
        ..SandboxStatus::default()
    };
    let ready_pod = pod(Some("n"), Some("10.0.0.7"), true);
    let cases: Vec<(&str, SandboxStatus, Option<CachedPod>, Option<Evidence>)> = vec![
        (
            "its own agent waited too long",
            stalled(POLICY_ENFORCEMENT_MISSING, T1),
            None,
            Some(missing(T1, "ns/s")),
        ),
        (
            "stalled for another reason",
            stalled("QuotaExceeded", T1),
            None,
            None,
        ),
        (
            "Ready, its agent waited for its policies",
            ready.clone(),
            Some(gated(ready_pod.clone())),
            Some(enforced(T2)),
        ),
        (
            "Ready, its agent did not wait",
            ready.clone(),
            Some(ready_pod),
            None,
        ),
        ("Ready, no pod to tell", ready, None, None),
        (
            "told early by the verdict (not stalled): no evidence",
            SandboxStatus {
                conditions: vec![Condition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    reason: POLICY_ENFORCEMENT_MISSING.into(),
                    message: String::new(),
                    last_transition_time: Time(t(T1)),
                    observed_generation: None,
                }],
                ..SandboxStatus::default()
            },
            Some(gated(pod(Some("n"), Some("10.0.0.7"), false))),
            None,
        ),
    ];
    for (case, status, pod, want) in cases {
        assert_eq!(evidence_of("ns/s", &status, pod.as_ref()), want, "{case}");
    }
}

#[test]
fn the_gauge_says_the_current_state_only() {
    let metrics = crate::plumbing::metrics::Metrics::new().expect("metrics");
    let shared = SharedVerdict::new(metrics.network_policy_enforcement.clone());
    let value = |state: &str| {
        metrics
            .network_policy_enforcement
            .with_label_values(&[state])
            .get()
    };
    assert_eq!(
        (value("unknown"), value("missing"), value("enforced")),
        (1, 0, 0)
    );
    shared.observe(vec![missing(T1, "ns/a")]);
    assert_eq!(
        (value("unknown"), value("missing"), value("enforced")),
        (0, 1, 0)
    );
    shared.observe(vec![enforced(T2)]);
    assert_eq!(shared.current(), Verdict::Enforced { since: t(T2) });
    assert_eq!(
        (value("unknown"), value("missing"), value("enforced")),
        (0, 0, 1)
    );
}
