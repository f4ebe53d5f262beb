//! The retry arithmetic and classification as tables.

use super::*;
use orchard_api::{OomEscalation, RetryPolicy, SandboxSpec, SandboxTemplate};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

#[test]
fn quantities_parse_exactly_and_round_up() {
    let cases: Vec<(&str, u128)> = vec![
        ("1", 1_000),
        ("+2", 2_000),
        ("500m", 500),
        ("0.5", 500),
        (".5", 500),
        ("2.", 2_000),
        ("1.5k", 1_500_000),
        ("64Mi", 64 * 1_048_576 * 1_000),
        ("2Gi", 2 * 1_073_741_824 * 1_000),
        ("0.5Gi", 536_870_912 * 1_000),
        ("1G", 1_000_000_000_000),
        ("1e3", 1_000_000),
        ("1E3", 1_000_000),
        ("1E", 1_000_000_000_000_000_000_000),
        ("1e-3", 1),
        ("1u", 1),
        ("1n", 1),
        ("2500u", 3),
    ];
    for (text, expected) in cases {
        assert_eq!(thousandths(text), Ok(expected), "{text}");
    }
    for bad in [
        "", ".", "-1", "1..5", "1.2.3", "lots", "1Xi", "1e", "1e99", "1Mi2",
    ] {
        assert!(thousandths(bad).is_err(), "{bad}");
    }
    assert_eq!(bytes("64Mi"), Ok(64 * MI));
    assert_eq!(bytes("100m"), Ok(1), "a tenth of a byte still asks for one");
    assert_eq!(bytes("1.5Gi"), Ok(3 * GI / 2));
    assert_eq!(millicores("1500m"), Ok(1500));
    assert_eq!(
        millicores("1.2345"),
        Ok(1235),
        "rounded up to whole millicores"
    );
    assert!(bytes("100Ei").is_err(), "beyond u64");
}

#[test]
fn amounts_print_as_the_largest_exact_unit() {
    let cases: Vec<(u64, &str)> = vec![
        (128 * MI, "128Mi"),
        (2 * GI, "2Gi"),
        (1536 * MI, "1536Mi"),
        (4 << 40, "4Ti"),
        (1_000_000_000, "1000000000"),
        (512, "512"),
    ];
    for (value, text) in cases {
        assert_eq!(memory_text(value), text);
        assert_eq!(bytes(text), Ok(value), "{text} parses back");
    }
    for (value, text) in [(1000, "1"), (1500, "1500m"), (4000, "4"), (1, "1m")] {
        assert_eq!(cpu_text(value), text);
        assert_eq!(millicores(text), Ok(value), "{text} parses back");
    }
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

fn escalation(
    factor: f64,
    cpu_factor: Option<f64>,
    max_memory: u64,
    max_cpu: Option<u64>,
) -> Escalation {
    Escalation {
        memory_factor: Fraction::from_f64(factor).expect("a factor"),
        cpu_factor: cpu_factor.map(|f| Fraction::from_f64(f).expect("a factor")),
        max_memory,
        max_cpu,
    }
}

fn amounts(memory: u64, cpu: u64) -> Amounts {
    Amounts { memory, cpu }
}

#[test]
fn escalation_multiplies_rounds_up_to_mib_and_caps() {
    type Row = (&'static str, Escalation, Amounts, Option<Amounts>);
    let cases: Vec<Row> = vec![
        (
            "doubled",
            escalation(2.0, None, 8 * GI, None),
            amounts(64 * MI, 1000),
            Some(amounts(128 * MI, 1000)),
        ),
        (
            "an exact decimal factor: 100Mi x 1.5",
            escalation(1.5, None, 8 * GI, None),
            amounts(100 * MI, 1000),
            Some(amounts(150 * MI, 1000)),
        ),
        (
            "1.1 is 11/10 exactly: 10Mi x 1.1 = 11Mi, not a float a hair above it",
            escalation(1.1, None, 8 * GI, None),
            amounts(10 * MI, 1000),
            Some(amounts(11 * MI, 1000)),
        ),
        (
            "rounded up to whole MiB: 1G x 1.1 = 1049.04Mi",
            escalation(1.1, None, 8 * GI, None),
            amounts(1_000_000_000, 1000),
            Some(amounts(1050 * MI, 1000)),
        ),
        (
            "capped at maxMemory",
            escalation(2.0, None, 100 * MI, None),
            amounts(64 * MI, 1000),
            Some(amounts(100 * MI, 1000)),
        ),
        (
            "capped at a maxMemory that is not whole MiB: exactly the cap",
            escalation(2.0, None, 1_000_000_000, None),
            amounts(900 * MI, 1000),
            Some(amounts(1_000_000_000, 1000)),
        ),
        (
            "at the cap: no escalation",
            escalation(2.0, None, 128 * MI, None),
            amounts(128 * MI, 1000),
            None,
        ),
        (
            "above the cap: no escalation",
            escalation(2.0, None, 128 * MI, None),
            amounts(256 * MI, 1000),
            None,
        ),
        (
            "the CPU grows with cpuFactor, rounded up to millicores",
            escalation(2.0, Some(1.1), 8 * GI, None),
            amounts(64 * MI, 333),
            Some(amounts(128 * MI, 367)),
        ),
        (
            "the CPU is capped at maxCpu",
            escalation(2.0, Some(2.0), 8 * GI, Some(1500)),
            amounts(64 * MI, 1000),
            Some(amounts(128 * MI, 1500)),
        ),
        (
            "maxCpu without cpuFactor changes nothing",
            escalation(2.0, None, 8 * GI, Some(500)),
            amounts(64 * MI, 1000),
            Some(amounts(128 * MI, 1000)),
        ),
    ];
    for (case, escalation, ran, expected) in cases {
        assert_eq!(escalation.escalate(ran), expected, "{case}");
    }
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

fn params(on_oom: Option<Escalation>, on_eviction: bool) -> RetryParams {
    RetryParams {
        max_attempts: 3,
        on_oom,
        on_eviction,
        defaults: amounts(2 * GI, 1000),
        template: resources(Some("64Mi"), None),
        start: amounts(64 * MI, 1000),
    }
}

#[test]
fn the_next_attempt_follows_the_cause_and_the_attempts_left() {
    use Cause::{Eviction, MemoryEviction, OutOfMemory};
    let both = params(Some(escalation(2.0, None, 256 * MI, None)), true);
    let oom_only = params(Some(escalation(2.0, None, 256 * MI, None)), false);
    let eviction_only = params(None, true);
    let ran = amounts(64 * MI, 1000);
    type Row<'a> = (
        &'a str,
        &'a RetryParams,
        Cause,
        u32,
        Amounts,
        Option<Amounts>,
    );
    let cases: Vec<Row> = vec![
        (
            "OOM, attempt 1 of 3",
            &both,
            OutOfMemory,
            1,
            ran,
            Some(amounts(128 * MI, 1000)),
        ),
        (
            "OOM, attempt 2 of 3",
            &both,
            OutOfMemory,
            2,
            amounts(128 * MI, 1000),
            Some(amounts(256 * MI, 1000)),
        ),
        (
            "OOM, attempt 3 of 3: exhausted",
            &both,
            OutOfMemory,
            3,
            amounts(256 * MI, 1000),
            None,
        ),
        (
            "OOM at the cap before the attempts run out",
            &both,
            OutOfMemory,
            2,
            amounts(256 * MI, 1000),
            None,
        ),
        (
            "OOM without onOOM",
            &eviction_only,
            OutOfMemory,
            1,
            ran,
            None,
        ),
        (
            "evicted: the same resources",
            &both,
            Eviction,
            1,
            amounts(128 * MI, 1000),
            Some(amounts(128 * MI, 1000)),
        ),
        (
            "evicted without onEviction",
            &oom_only,
            Eviction,
            1,
            ran,
            None,
        ),
        (
            "evicted, attempts exhausted",
            &eviction_only,
            Eviction,
            3,
            ran,
            None,
        ),
        (
            "evicted for memory: more memory",
            &both,
            MemoryEviction,
            1,
            ran,
            Some(amounts(128 * MI, 1000)),
        ),
        (
            "evicted for memory at the cap: the same with onEviction",
            &both,
            MemoryEviction,
            2,
            amounts(256 * MI, 1000),
            Some(amounts(256 * MI, 1000)),
        ),
        (
            "evicted for memory at the cap without onEviction",
            &oom_only,
            MemoryEviction,
            2,
            amounts(256 * MI, 1000),
            None,
        ),
        (
            "evicted for memory without onOOM: the same",
            &eviction_only,
            MemoryEviction,
            1,
            ran,
            Some(ran),
        ),
    ];
    for (case, params, cause, attempt, ran, expected) in cases {
        assert_eq!(params.next(cause, attempt, ran), expected, "{case}");
    }
}

#[test]
fn an_attempt_runs_with_what_the_record_of_the_last_one_implies() {
    let p = params(Some(escalation(2.0, Some(1.5), 8 * GI, Some(4000))), true);
    let record = |reason: &str, message: &str, memory: &str, cpu: &str| AttemptRecord {
        reason: reason.into(),
        message: Some(message.into()),
        memory: Some(Quantity(memory.into())),
        cpu: Some(Quantity(cpu.into())),
    };
    assert_eq!(
        p.after(&record("OOMKilled", "", "64Mi", "1")),
        Some(amounts(128 * MI, 1500))
    );
    assert_eq!(
        p.after(&record(
            "Evicted",
            "The node was low on resource: memory.",
            "128Mi",
            "1500m"
        )),
        Some(amounts(256 * MI, 2250)),
        "a memory eviction escalates"
    );
    assert_eq!(
        p.after(&record("PodDeleted", "gone", "128Mi", "1500m")),
        Some(amounts(128 * MI, 1500)),
        "an eviction keeps what it ran with"
    );
    assert_eq!(p.after(&record("PodDeleted", "gone", "lots", "1")), None);
    assert_eq!(p.after(&record("Expired", "", "64Mi", "1")), None);

    // What goes into the Sandbox: nothing for the first attempt's amounts, else what changed.
    assert_eq!(p.resources(p.start), None);
    let grown = p.resources(amounts(128 * MI, 1000)).expect("grown");
    assert_eq!(grown.memory, Some(Quantity("128Mi".into())));
    assert_eq!(
        grown.cpu, None,
        "the CPU the template left to the default stays unset"
    );
    assert_eq!(
        grown.ephemeral_storage,
        Some(Quantity("1Gi".into())),
        "the rest is the template's"
    );
    let both = p.resources(amounts(128 * MI, 1500)).expect("grown");
    assert_eq!(both.cpu, Some(Quantity("1500m".into())));
    assert_eq!(
        p.ran(None),
        Some(amounts(2 * GI, 1000)),
        "the operator's defaults"
    );
    assert_eq!(p.ran(grown_ref(&both)), Some(amounts(128 * MI, 1500)));
}

fn grown_ref(resources: &SandboxResources) -> Option<&SandboxResources> {
    Some(resources)
}

#[test]
fn a_record_keeps_the_start_of_the_message() {
    let end = AttemptEnd {
        cause: Cause::OutOfMemory,
        reason: "Evicted".into(),
        message: format!("The node was low on resource: memory. {}", "é".repeat(400)),
    };
    let record = RetryParams::record(&end, amounts(64 * MI, 250));
    let message = record.message.expect("a message");
    assert!(message.len() <= MESSAGE_KEPT && message.len() > MESSAGE_KEPT - 2);
    assert!(message.starts_with("The node was low on resource: memory."));
    assert_eq!(record.memory, Some(Quantity("64Mi".into())));
    assert_eq!(record.cpu, Some(Quantity("250m".into())));
    assert_eq!(
        cause_of(&record.reason, &message),
        Some(Cause::MemoryEviction),
        "the kept message still says why"
    );
}
