//! Which endings of a trajectory's attempt are retried, and the group's policy against its
//! template, as tables (the arithmetic's own tables are `crate::retry`'s).

use super::*;
use crate::retry::{Amounts, Cause};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use orchard_api::{OomEscalation, RetryPolicy, SandboxResources, SandboxSpec, SandboxTemplate};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

fn amounts(memory: u64, cpu: u64) -> Amounts {
    Amounts { memory, cpu }
}

fn result(reason: &str, message: &str) -> TrajectoryResult {
    TrajectoryResult {
        reward: None,
        status: TrajectoryStatus::Aborted,
        length: None,
        exit_code: None,
        artifact: None,
        reason: Some(reason.into()),
        message: Some(message.into()),
    }
}

#[test]
fn endings_are_classified_into_retry_causes() {
    use Cause::{Eviction, MemoryEviction, OutOfMemory};
    let evicted_for_memory =
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 10Mi.";
    type Row<'a> = (
        &'a str,
        TrajectoryResult,
        Option<(&'a str, &'a str)>,
        Option<(Cause, &'a str)>,
    );
    let cases: Vec<Row> = vec![
        (
            "the run's command OOM-killed",
            result("OOMKilled", "killed at 64Mi"),
            None,
            Some((OutOfMemory, "OOMKilled")),
        ),
        (
            "the task container OOM-killed",
            result("SandboxFailed", "OOMKilled: ..."),
            Some(("OOMKilled", "the task container `sandbox` was killed")),
            Some((OutOfMemory, "OOMKilled")),
        ),
        (
            "evicted for memory",
            result("SandboxFailed", "Evicted: ..."),
            Some(("Evicted", evicted_for_memory)),
            Some((MemoryEviction, "Evicted")),
        ),
        (
            "evicted for disk",
            result("SandboxFailed", "Evicted: ..."),
            Some((
                "Evicted",
                "The node was low on resource: ephemeral-storage.",
            )),
            Some((Eviction, "Evicted")),
        ),
        (
            "the pod deleted",
            result("SandboxFailed", "PodDeleted: ..."),
            Some(("PodDeleted", "the sandbox's pod was deleted")),
            Some((Eviction, "PodDeleted")),
        ),
        (
            "the node lost",
            result("SandboxFailed", "NodeLost: ..."),
            Some(("NodeLost", "node n1 is gone")),
            Some((Eviction, "NodeLost")),
        ),
        (
            "placement refused: not retried",
            result("SandboxFailed", "PlacementRefused: ..."),
            Some(("PlacementRefused", "priorityClassName x is not allowed")),
            None,
        ),
        (
            "a time-out: not retried",
            result("TimeExceeded", "killed after 60s"),
            None,
            None,
        ),
        (
            "no result file: not retried",
            result("NoResult", "exit code 1"),
            None,
            None,
        ),
        (
            "a result recorded before the sandbox failed stands",
            result("TimeExceeded", "killed after 60s"),
            Some(("OOMKilled", "the task container was killed")),
            None,
        ),
        (
            "a failed sandbox without its failure: not retried",
            result("SandboxFailed", "OOMKilled: ..."),
            None,
            None,
        ),
        (
            "a completed run is never retried",
            TrajectoryResult {
                reward: Some(1.0),
                status: TrajectoryStatus::Completed,
                ..result("OOMKilled", "")
            },
            None,
            None,
        ),
    ];
    for (case, result, failure, expected) in cases {
        let end = attempt_end(&result, failure);
        assert_eq!(
            end.as_ref().map(|e| (e.cause, e.reason.as_str())),
            expected,
            "{case}"
        );
    }
    let end = attempt_end(
        &result("SandboxFailed", "Evicted: x"),
        Some(("Evicted", evicted_for_memory)),
    )
    .expect("an ending");
    assert_eq!(end.message, evicted_for_memory, "the sandbox's own message");
}

fn spec(retry: Option<RetryPolicy>, resources: Option<SandboxResources>) -> RolloutGroupSpec {
    RolloutGroupSpec {
        launch_jitter_seconds: None,
        group_size: 2,
        max_trajectories: 4,
        stride: Some(2),
        positive_fraction: Default::default(),
        early_stop: Default::default(),
        filter: None,
        template: SandboxTemplate {
            metadata: Default::default(),
            spec: SandboxSpec {
                image: "i".into(),
                resources,
                ..SandboxSpec::default()
            },
        },
        trajectory_timeout_seconds: None,
        cleanup: Default::default(),
        queue: None,
        retry,
        active_deadline_seconds: None,
    }
}

fn policy(max_attempts: i32, on_oom: Option<OomEscalation>, on_eviction: bool) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        on_oom,
        on_eviction,
    }
}

fn oom(
    factor: f64,
    cpu_factor: Option<f64>,
    max_memory: &str,
    max_cpu: Option<&str>,
) -> OomEscalation {
    OomEscalation {
        memory_factor: factor,
        cpu_factor,
        max_memory: Quantity(max_memory.into()),
        max_cpu: max_cpu.map(|q| Quantity(q.into())),
    }
}

fn resources(memory: Option<&str>, cpu: Option<&str>) -> Option<SandboxResources> {
    Some(SandboxResources {
        memory: memory.map(|q| Quantity(q.into())),
        cpu: cpu.map(|q| Quantity(q.into())),
        ephemeral_storage: Some(Quantity("1Gi".into())),
        gpu: None,
    })
}

fn defaults() -> ResourceDefaults {
    ResourceDefaults {
        cpu: "1".into(),
        memory: "2Gi".into(),
    }
}

#[test]
fn the_policy_resolves_against_the_template_and_the_defaults() {
    assert_eq!(retry_params(&spec(None, None), &defaults()), Ok(None));
    let params = retry_params(
        &spec(
            Some(policy(3, Some(oom(2.0, None, "8Gi", None)), true)),
            resources(Some("64Mi"), None),
        ),
        &defaults(),
    )
    .expect("valid")
    .expect("a policy");
    assert_eq!(params.max_attempts, 3);
    assert!(params.on_eviction);
    assert_eq!(params.start, amounts(64 * MI, 1000), "the default CPU");
    assert_eq!(params.defaults, amounts(2 * GI, 1000));
    let on_defaults = retry_params(
        &spec(
            Some(policy(2, Some(oom(2.0, None, "2Gi", None)), false)),
            None,
        ),
        &defaults(),
    )
    .expect("maxMemory equal to the default is fine")
    .expect("a policy");
    assert_eq!(on_defaults.start, amounts(2 * GI, 1000));

    let refused: Vec<(&str, RolloutGroupSpec, &str)> = vec![
        (
            "below the operator's default memory",
            spec(
                Some(policy(3, Some(oom(2.0, None, "1Gi", None)), false)),
                None,
            ),
            "retry.onOOM.maxMemory 1Gi is below the 2Gi a first attempt runs with (the operator's default memory (--default-memory)",
        ),
        (
            "below the template's memory",
            spec(
                Some(policy(3, Some(oom(2.0, None, "1Gi", None)), false)),
                resources(Some("4Gi"), None),
            ),
            "(template.spec.resources.memory)",
        ),
        (
            "below the operator's default CPU",
            spec(
                Some(policy(
                    3,
                    Some(oom(2.0, Some(2.0), "8Gi", Some("500m"))),
                    false,
                )),
                None,
            ),
            "retry.onOOM.maxCpu 500m is below the 1 CPU a first attempt runs with (the operator's default cpu (--default-cpu)",
        ),
        (
            "a factor of 1",
            spec(
                Some(policy(3, Some(oom(1.0, None, "8Gi", None)), false)),
                None,
            ),
            "retry.onOOM.memoryFactor must be greater than 1, got 1",
        ),
        (
            "a CPU factor below 1",
            spec(
                Some(policy(3, Some(oom(2.0, Some(0.5), "8Gi", None)), false)),
                None,
            ),
            "retry.onOOM.cpuFactor must be greater than 1, got 0.5",
        ),
        (
            "a NaN factor",
            spec(
                Some(policy(3, Some(oom(f64::NAN, None, "8Gi", None)), false)),
                None,
            ),
            "retry.onOOM.memoryFactor must be greater than 1",
        ),
        (
            "no attempts",
            spec(Some(policy(0, None, true)), None),
            "retry.maxAttempts must be 1 to 10, got 0",
        ),
        (
            "too many attempts",
            spec(Some(policy(11, None, true)), None),
            "retry.maxAttempts must be 1 to 10, got 11",
        ),
        (
            "an unparsable maxMemory",
            spec(
                Some(policy(3, Some(oom(2.0, None, "lots", None)), false)),
                None,
            ),
            "retry.onOOM.maxMemory: `lots` is not a quantity",
        ),
        (
            "a zero maxMemory",
            spec(
                Some(policy(3, Some(oom(2.0, None, "0", None)), false)),
                None,
            ),
            "retry.onOOM.maxMemory must be greater than 0",
        ),
    ];
    for (case, spec, message) in refused {
        let error = retry_params(&spec, &defaults()).expect_err(case);
        assert!(error.contains(message), "{case}: {error}");
    }

    let mut pooled = spec(
        Some(policy(3, Some(oom(2.0, None, "8Gi", None)), false)),
        None,
    );
    pooled.template.spec.pool = Some("warm".into());
    let error = retry_params(&pooled, &defaults()).expect_err("a pool without memory");
    assert!(
        error.contains(
            "needs template.spec.resources.memory when the template names SandboxPool warm"
        ),
        "{error}"
    );
    pooled.template.spec.resources = resources(Some("1Gi"), None);
    assert!(retry_params(&pooled, &defaults()).is_ok());
    pooled.retry = Some(policy(3, Some(oom(2.0, Some(2.0), "8Gi", None)), false));
    let error = retry_params(&pooled, &defaults()).expect_err("a pool without CPU");
    assert!(
        error.contains("retry.onOOM.cpuFactor needs template.spec.resources.cpu"),
        "{error}"
    );
    pooled.retry = Some(policy(3, None, true));
    pooled.template.spec.resources = None;
    assert!(
        retry_params(&pooled, &defaults()).is_ok(),
        "eviction retries keep the resources: a pool needs nothing"
    );
}
