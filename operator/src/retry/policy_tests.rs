//! The escalation arithmetic and the policy's next attempts as tables.

use super::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use orchard_api::OomEscalation;

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

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

fn policy(max_attempts: i32, on_oom: Option<OomEscalation>, on_eviction: bool) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        on_oom,
        on_eviction,
    }
}

fn oom(max_memory: &str, cpu_factor: Option<f64>, max_cpu: Option<&str>) -> OomEscalation {
    OomEscalation {
        memory_factor: 2.0,
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
fn a_policy_resolves_against_the_first_attempts_resources_and_names_their_field() {
    let params = resolve(
        &policy(3, Some(oom("8Gi", None, None)), true),
        resources(Some("64Mi"), None).as_ref(),
        "spec.resources",
        &defaults(),
    )
    .expect("valid");
    assert_eq!(params.start, amounts(64 * MI, 1000), "the default CPU");
    assert_eq!(params.base, resources(Some("64Mi"), None));
    let refused = [
        (
            policy(3, Some(oom("1Gi", None, None)), false),
            None,
            "retry.onOOM.maxMemory 1Gi is below the 2Gi a first attempt runs with (the operator's default memory (--default-memory), since spec.resources.memory is unset)",
        ),
        (
            policy(3, Some(oom("1Gi", None, None)), false),
            resources(Some("4Gi"), None),
            "(spec.resources.memory): escalation only ever raises memory; raise maxMemory or set a smaller spec.resources.memory",
        ),
        (
            policy(3, Some(oom("8Gi", Some(2.0), Some("500m"))), false),
            None,
            "retry.onOOM.maxCpu 500m is below the 1 CPU a first attempt runs with (the operator's default cpu (--default-cpu), since spec.resources.cpu is unset)",
        ),
        (
            policy(3, Some(oom("8Gi", None, None)), false),
            resources(Some("lots"), None),
            "spec.resources.memory: `lots` is not a quantity",
        ),
        (
            policy(0, None, true),
            None,
            "retry.maxAttempts must be 1 to 10, got 0",
        ),
    ];
    for (policy, resources, message) in refused {
        let error =
            resolve(&policy, resources.as_ref(), "spec.resources", &defaults()).expect_err(message);
        assert!(error.contains(message), "{error}");
    }
    let bad_defaults = ResourceDefaults {
        cpu: "1".into(),
        memory: "much".into(),
    };
    let error = resolve(
        &policy(2, None, true),
        None,
        "spec.resources",
        &bad_defaults,
    )
    .expect_err("unparsable defaults");
    assert!(error.contains("the operator's --default-memory"), "{error}");
}

fn params(on_oom: Option<Escalation>, on_eviction: bool) -> RetryParams {
    RetryParams {
        max_attempts: 3,
        on_oom,
        on_eviction,
        defaults: amounts(2 * GI, 1000),
        base: resources(Some("64Mi"), None),
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

#[test]
fn each_attempt_runs_with_what_the_records_before_it_imply() {
    let p = params(Some(escalation(2.0, None, 8 * GI, None)), true);
    let record = |reason: &str, memory: &str| AttemptRecord {
        reason: reason.into(),
        message: None,
        memory: Some(Quantity(memory.into())),
        cpu: Some(Quantity("1".into())),
    };
    assert_eq!(p.amounts_of(&[]), p.start, "the first attempt");
    assert_eq!(
        p.amounts_of(&[record("OOMKilled", "64Mi")]),
        amounts(128 * MI, 1000)
    );
    assert_eq!(
        p.amounts_of(&[record("OOMKilled", "64Mi"), record("OOMKilled", "128Mi")]),
        amounts(256 * MI, 1000),
        "the last record counts"
    );
    assert_eq!(
        p.amounts_of(&[record("Expired", "64Mi")]),
        p.start,
        "a record that says nothing retried: the first attempt's"
    );
}

#[test]
fn a_retry_is_told_with_what_ended_and_what_comes_next() {
    let ended = AttemptRecord {
        reason: "OOMKilled".into(),
        message: None,
        memory: Some(Quantity("64Mi".into())),
        cpu: Some(Quantity("1".into())),
    };
    assert_eq!(
        retry_message(1, &ended, Some(amounts(128 * MI, 1000))),
        "attempt 1 ended OOMKilled (memory 64Mi, cpu 1); attempt 2 gets memory 128Mi, cpu 1"
    );
    assert_eq!(
        retry_message(2, &ended, None),
        "attempt 2 ended OOMKilled (memory 64Mi, cpu 1); attempt 3 gets the same resources"
    );
}
