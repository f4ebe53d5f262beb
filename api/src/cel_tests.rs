//! Every CEL rule of the CRDs, evaluated client-side with kube's CEL validator against the schema the
//! API server receives: one accepted and one rejected example each, asserting the rejection message.

use kube::CustomResourceExt;
use kube::core::cel::Validator;
use serde_json::{Value, json};

use crate::{RolloutGroup, Sandbox, SandboxPool, SandboxSnapshot};

fn schema_of<K: CustomResourceExt>() -> Value {
    let crd = K::crd();
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("derived CRDs carry an openAPIV3Schema");
    serde_json::to_value(schema).expect("schema serialises")
}

/// Messages of the rules the object (optionally an update from `old`) violates.
fn violations<K: CustomResourceExt>(object: Value, old: Option<Value>) -> Vec<String> {
    match Validator::new().validate(&schema_of::<K>(), &object, old.as_ref()) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.into_vec().into_iter().map(|e| e.message).collect(),
    }
}

fn sandbox(spec: Value) -> Value {
    json!({"apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "s"}, "spec": spec})
}

fn sandbox_with_status(status: Value) -> Value {
    let mut object = sandbox(json!({"image": "python:3.11"}));
    object["status"] = status;
    object
}

fn group(spec: Value) -> Value {
    let mut full = json!({
        "groupSize": 8, "maxTrajectories": 16, "stride": 4,
        "positiveFraction": {"min": 0.375, "max": 0.625},
        "template": {"spec": {"image": "python:3.11", "run": {"command": ["python", "run.py"], "timeoutSeconds": 60, "resultPath": "/tmp/r.json"}}}
    });
    if let (Some(full), Some(overrides)) = (full.as_object_mut(), spec.as_object()) {
        for (key, value) in overrides {
            full.insert(key.clone(), value.clone());
        }
    }
    json!({"apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutGroup", "metadata": {"name": "g"}, "spec": full})
}

fn assert_rejects(found: Vec<String>, message: &str) {
    assert!(
        found.iter().any(|m| m.contains(message)),
        "expected a violation containing {message:?}, got {found:?}"
    );
}

#[test]
fn minimal_sandbox_is_valid() {
    assert_eq!(
        violations::<Sandbox>(sandbox(json!({"image": "python:3.11"})), None),
        Vec::<String>::new()
    );
}

#[test]
fn allow_list_only_with_allow_list_egress() {
    let ok = sandbox(
        json!({"image": "i", "network": {"egress": "AllowList", "allow": [{"cidr": "10.0.0.0/8", "ports": [{"port": 443}]}]}}),
    );
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let bad = sandbox(
        json!({"image": "i", "network": {"egress": "Deny", "allow": [{"cidr": "10.0.0.0/8"}]}}),
    );
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "network.allow may only be set when network.egress is AllowList",
    );
}

#[test]
fn allow_list_egress_needs_a_rule() {
    let ok = sandbox(json!({"image": "i", "network": {"egress": "AllowAll"}}));
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let bad = sandbox(json!({"image": "i", "network": {"egress": "AllowList"}}));
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "AllowList needs at least one network.allow rule",
    );
}

fn allow_list(allow: Value) -> Value {
    sandbox(json!({"image": "i", "network": {"egress": "AllowList", "allow": allow}}))
}

#[test]
fn egress_host_patterns_are_names_wildcards_or_any() {
    for host in [
        "pypi.org",
        "*.github.com",
        "*",
        "files.pythonhosted.org",
        "a-b.example",
        "localhost",
    ] {
        let ok = allow_list(json!([{"host": host, "ports": [{"port": 443}]}]));
        assert_eq!(
            violations::<Sandbox>(ok, None),
            Vec::<String>::new(),
            "{host}"
        );
    }
    for host in [
        "https://pypi.org",
        "pypi.org/simple",
        "pypi.org:443",
        "PyPI.org",
        "*github.com",
        "a.*.com",
        "10.0.0.1",
        "*.10.0.0.1",
        "-bad.example",
        "two..dots",
        "",
    ] {
        let bad = allow_list(json!([{"host": host}]));
        assert_rejects(
            violations::<Sandbox>(bad, None),
            "network.allow[].host must be a host name such as pypi.org",
        );
    }
    let bad = sandbox(
        json!({"image": "i", "network": {"egress": "AllowList", "allow": [{"host": "*"}], "deny": [{"host": "http://huggingface.co"}]}}),
    );
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "network.deny[].host must be a host name",
    );
}

#[test]
fn an_allow_entry_names_a_cidr_or_a_host() {
    for entry in [
        json!({"cidr": "10.0.0.0/8", "host": "pypi.org"}),
        json!({"ports": [{"port": 443}]}),
    ] {
        assert_rejects(
            violations::<Sandbox>(allow_list(json!([entry])), None),
            "names exactly one of cidr",
        );
    }
    let udp = allow_list(json!([{"host": "pypi.org", "ports": [{"port": 53, "protocol": "UDP"}]}]));
    assert_rejects(violations::<Sandbox>(udp, None), "carries TCP only");
    let tcp =
        allow_list(json!([{"host": "pypi.org", "ports": [{"port": 443, "protocol": "TCP"}]}]));
    assert!(violations::<Sandbox>(tcp, None).is_empty());
}

#[test]
fn deny_needs_host_allows() {
    let ok = sandbox(
        json!({"image": "i", "network": {"egress": "AllowList", "allow": [{"host": "*"}], "deny": [{"host": "huggingface.co"}, {"host": "*.github.com"}]}}),
    );
    assert_eq!(violations::<Sandbox>(ok, None), Vec::<String>::new());
    for network in [
        json!({"egress": "AllowAll", "deny": [{"host": "huggingface.co"}]}),
        json!({"egress": "AllowList", "allow": [{"cidr": "10.0.0.0/8"}], "deny": [{"host": "huggingface.co"}]}),
    ] {
        let bad = sandbox(json!({"image": "i", "network": network}));
        assert_rejects(
            violations::<Sandbox>(bad, None),
            "network.deny needs egress AllowList with at least one allow[].host entry",
        );
    }
}

#[test]
fn network_may_change_on_a_running_sandbox() {
    let old = sandbox(
        json!({"image": "i", "network": {"egress": "AllowList", "allow": [{"host": "pypi.org"}]}}),
    );
    let new = sandbox(
        json!({"image": "i", "network": {"egress": "AllowList", "allow": [{"host": "*.github.com"}]}}),
    );
    assert_eq!(violations::<Sandbox>(new, Some(old)), Vec::<String>::new());
}

#[test]
fn egress_cidr_must_be_a_cidr() {
    let ok = sandbox(
        json!({"image": "i", "network": {"egress": "AllowList", "allow": [{"cidr": "2001:db8::/32"}]}}),
    );
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let bad = sandbox(
        json!({"image": "i", "network": {"egress": "AllowList", "allow": [{"cidr": "10.0.0.300/8"}]}}),
    );
    assert_rejects(violations::<Sandbox>(bad, None), "cidr must be a CIDR");
}

#[test]
fn ttl_must_be_positive() {
    let ok = sandbox(json!({"image": "i", "lifecycle": {"ttlSeconds": 60}}));
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let bad = sandbox(json!({"image": "i", "lifecycle": {"ttlSeconds": 0}}));
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "lifecycle.ttlSeconds must be positive",
    );
}

#[test]
fn heartbeat_timeout_must_not_be_negative() {
    let ok = sandbox(json!({"image": "i", "lifecycle": {"heartbeatTimeoutSeconds": 0}}));
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let bad = sandbox(json!({"image": "i", "lifecycle": {"heartbeatTimeoutSeconds": -3}}));
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "heartbeatTimeoutSeconds must be 0 (off) or positive",
    );
}

#[test]
fn run_needs_a_command_and_a_positive_timeout() {
    let ok = sandbox(
        json!({"image": "i", "run": {"command": ["/bin/run"], "timeoutSeconds": 5, "resultPath": "/out.json"}}),
    );
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let no_command = sandbox(
        json!({"image": "i", "run": {"command": [], "timeoutSeconds": 5, "resultPath": "/o"}}),
    );
    assert_rejects(
        violations::<Sandbox>(no_command, None),
        "run.command must name a program",
    );
    let zero_timeout = sandbox(
        json!({"image": "i", "run": {"command": ["x"], "timeoutSeconds": 0, "resultPath": "/o"}}),
    );
    assert_rejects(
        violations::<Sandbox>(zero_timeout, None),
        "run.timeoutSeconds must be positive",
    );
    // A relative result path resolves in the sandbox's working directory.
    let relative = sandbox(
        json!({"image": "i", "run": {"command": ["x"], "timeoutSeconds": 5, "resultPath": "out/result.json"}}),
    );
    assert!(violations::<Sandbox>(relative, None).is_empty());
}

#[test]
fn startup_needs_a_command() {
    let ok = sandbox(json!({"image": "i", "startup": {"command": ["/usr/bin/Xvfb", ":1"]}}));
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let bad = sandbox(json!({"image": "i", "startup": {"command": []}}));
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "startup.command must name a program",
    );
}

#[test]
fn image_resources_and_run_are_immutable() {
    let old = sandbox(
        json!({"image": "a", "resources": {"cpu": "1"}, "run": {"command": ["x"], "timeoutSeconds": 5, "resultPath": "/o"}}),
    );
    let same_with_new_lifecycle = sandbox(
        json!({"image": "a", "resources": {"cpu": "1"}, "run": {"command": ["x"], "timeoutSeconds": 5, "resultPath": "/o"}, "lifecycle": {"ttlSeconds": 10}}),
    );
    assert!(violations::<Sandbox>(same_with_new_lifecycle, Some(old.clone())).is_empty());
    let new_image = sandbox(
        json!({"image": "b", "resources": {"cpu": "1"}, "run": {"command": ["x"], "timeoutSeconds": 5, "resultPath": "/o"}}),
    );
    assert_rejects(
        violations::<Sandbox>(new_image, Some(old.clone())),
        "spec.image is immutable",
    );
    let new_resources = sandbox(
        json!({"image": "a", "resources": {"cpu": "2"}, "run": {"command": ["x"], "timeoutSeconds": 5, "resultPath": "/o"}}),
    );
    assert_rejects(
        violations::<Sandbox>(new_resources, Some(old.clone())),
        "spec.resources is immutable",
    );
    let no_run = sandbox(json!({"image": "a", "resources": {"cpu": "1"}}));
    assert_rejects(
        violations::<Sandbox>(no_run, Some(old)),
        "spec.run is immutable",
    );
}

#[test]
fn result_needs_a_reward_unless_aborted() {
    let ok =
        sandbox_with_status(json!({"result": {"status": "aborted", "reason": "TimeExceeded"}}));
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let bad = sandbox_with_status(json!({"result": {"status": "completed"}}));
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "result.reward is required unless status is aborted",
    );
}

#[test]
fn result_is_write_once() {
    let recorded = sandbox_with_status(
        json!({"phase": "Ready", "result": {"status": "completed", "reward": 1.0}}),
    );
    let other_fields_change = sandbox_with_status(
        json!({"phase": "Succeeded", "result": {"status": "completed", "reward": 1.0}}),
    );
    assert!(violations::<Sandbox>(other_fields_change, Some(recorded.clone())).is_empty());
    let overwritten = sandbox_with_status(
        json!({"phase": "Ready", "result": {"status": "completed", "reward": 0.0}}),
    );
    assert_rejects(
        violations::<Sandbox>(overwritten, Some(recorded.clone())),
        "status.result is write-once",
    );
    let removed = sandbox_with_status(json!({"phase": "Ready"}));
    assert_rejects(
        violations::<Sandbox>(removed, Some(recorded)),
        "status.result is write-once",
    );
}

#[test]
fn default_group_is_valid() {
    assert_eq!(
        violations::<RolloutGroup>(group(json!({})), None),
        Vec::<String>::new()
    );
}

#[test]
fn stride_must_divide_max_trajectories() {
    assert!(violations::<RolloutGroup>(group(json!({"stride": 8})), None).is_empty());
    assert_rejects(
        violations::<RolloutGroup>(group(json!({"stride": 5})), None),
        "stride must divide maxTrajectories",
    );
}

#[test]
fn group_size_must_not_exceed_max_trajectories() {
    assert!(violations::<RolloutGroup>(group(json!({"groupSize": 16})), None).is_empty());
    assert_rejects(
        violations::<RolloutGroup>(group(json!({"groupSize": 17})), None),
        "groupSize must not exceed maxTrajectories",
    );
}

#[test]
fn positive_fraction_min_must_not_exceed_max() {
    assert!(
        violations::<RolloutGroup>(
            group(json!({"positiveFraction": {"min": 0.5, "max": 0.5}})),
            None
        )
        .is_empty()
    );
    assert_rejects(
        violations::<RolloutGroup>(
            group(json!({"positiveFraction": {"min": 0.7, "max": 0.3}})),
            None,
        ),
        "positiveFraction.min must not exceed positiveFraction.max",
    );
}

#[test]
fn max_backfill_must_not_exceed_group_size() {
    assert!(
        violations::<RolloutGroup>(group(json!({"filter": {"maxBackfill": 8}})), None).is_empty()
    );
    assert_rejects(
        violations::<RolloutGroup>(group(json!({"filter": {"maxBackfill": 9}})), None),
        "filter.maxBackfill must not exceed groupSize",
    );
}

#[test]
fn group_spec_is_immutable() {
    let old = group(json!({}));
    assert!(violations::<RolloutGroup>(group(json!({})), Some(old.clone())).is_empty());
    assert_rejects(
        violations::<RolloutGroup>(group(json!({"groupSize": 4})), Some(old)),
        "RolloutGroup spec is immutable",
    );
}

#[test]
fn template_rules_apply_inside_a_group() {
    let bad =
        group(json!({"template": {"spec": {"image": "i", "network": {"egress": "AllowList"}}}}));
    assert_rejects(
        violations::<RolloutGroup>(bad, None),
        "AllowList needs at least one network.allow rule",
    );
}

#[test]
fn names_must_fit_the_label_limits() {
    let mut ok = sandbox(json!({"image": "i"}));
    ok["metadata"]["name"] = json!("a".repeat(63));
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let mut long = sandbox(json!({"image": "i"}));
    long["metadata"]["name"] = json!("a".repeat(64));
    assert_rejects(
        violations::<Sandbox>(long, None),
        "a Sandbox name must be at most 63 characters",
    );
    let mut group_ok = group(json!({}));
    group_ok["metadata"]["name"] = json!("g".repeat(58));
    assert!(violations::<RolloutGroup>(group_ok, None).is_empty());
    let mut group_long = group(json!({}));
    group_long["metadata"]["name"] = json!("g".repeat(59));
    assert_rejects(
        violations::<RolloutGroup>(group_long, None),
        "a RolloutGroup name must be at most 58 characters",
    );
}

#[test]
fn tolerations_must_be_well_formed() {
    let ok = json!({"image": "python:3.11", "tolerations": [
        {"key": "pool", "operator": "Equal", "value": "sandboxes", "effect": "NoSchedule"},
        {"key": "pool", "operator": "Exists"},
        {"operator": "Exists"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
    ]});
    assert!(violations::<Sandbox>(sandbox(ok), None).is_empty());
    let exists_with_value = json!({"image": "python:3.11", "tolerations": [{"key": "pool", "operator": "Exists", "value": "x"}]});
    assert_rejects(
        violations::<Sandbox>(sandbox(exists_with_value), None),
        "tolerations[].value must be empty when the operator is Exists",
    );
    let empty_key_equal =
        json!({"image": "python:3.11", "tolerations": [{"operator": "Equal", "value": "x"}]});
    assert_rejects(
        violations::<Sandbox>(sandbox(empty_key_equal), None),
        "a toleration with an empty key must use operator Exists",
    );
    let seconds_without_no_execute = json!({"image": "python:3.11", "tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}]});
    assert_rejects(
        violations::<Sandbox>(sandbox(seconds_without_no_execute), None),
        "tolerations[].tolerationSeconds needs effect NoExecute",
    );
    let in_a_group = group(
        json!({"template": {"spec": {"image": "python:3.11", "tolerations": [{"operator": "Equal"}],
        "run": {"command": ["python", "run.py"], "timeoutSeconds": 60, "resultPath": "/tmp/r.json"}}}}),
    );
    assert_rejects(
        violations::<RolloutGroup>(in_a_group, None),
        "a toleration with an empty key must use operator Exists",
    );
}

#[test]
fn resources_must_be_greater_than_zero() {
    for (field, good) in [
        ("cpu", json!("1m")),
        ("cpu", json!("500m")),
        ("cpu", json!(2)),
        ("memory", json!("64Mi")),
        ("memory", json!("1")),
        ("ephemeralStorage", json!("10Gi")),
    ] {
        let ok = sandbox(json!({"image": "a", "resources": {field: good}}));
        assert_eq!(
            violations::<Sandbox>(ok, None),
            Vec::<String>::new(),
            "{field}: {good}"
        );
    }
    for field in ["cpu", "memory", "ephemeralStorage"] {
        for bad in [
            json!("0"),
            json!("0m"),
            json!("-1"),
            json!("-500m"),
            json!(0),
            json!(-1),
            json!("lots"),
        ] {
            let refused = sandbox(json!({"image": "a", "resources": {field: bad}}));
            assert_rejects(
                violations::<Sandbox>(refused, None),
                &format!("resources.{field} must be a quantity greater than 0 (e.g. "),
            );
        }
    }
    let zero_memory = sandbox(json!({"image": "a", "resources": {"memory": "0"}}));
    assert_rejects(
        violations::<Sandbox>(zero_memory, None),
        "leave it out to get the operator's default",
    );
}

#[test]
fn resource_rules_apply_inside_a_group_and_a_pool_template() {
    let ok = group(
        json!({"template": {"spec": {"image": "i", "resources": {"cpu": "1m", "memory": "64Mi"}}}}),
    );
    assert!(violations::<RolloutGroup>(ok, None).is_empty());
    let bad = group(json!({"template": {"spec": {"image": "i", "resources": {"memory": "0"}}}}));
    assert_rejects(
        violations::<RolloutGroup>(bad, None),
        "resources.memory must be a quantity greater than 0",
    );
    let pool = |resources: Value| {
        json!({"apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": "p"},
               "spec": {"replicas": 1, "template": {"image": "i", "resources": resources}}})
    };
    assert!(violations::<SandboxPool>(pool(json!({"cpu": "250m"})), None).is_empty());
    assert_rejects(
        violations::<SandboxPool>(pool(json!({"cpu": "0"})), None),
        "resources.cpu must be a quantity greater than 0",
    );
}

#[test]
fn a_group_template_may_not_use_the_operators_keys() {
    let ok = group(
        json!({"template": {"metadata": {"labels": {"team": "rl", "example.com/x": "1"},
        "annotations": {"note": "x"}}, "spec": {"image": "i"}}}),
    );
    assert!(violations::<RolloutGroup>(ok, None).is_empty());
    let label = group(
        json!({"template": {"metadata": {"labels": {"orchard.dev/rollout-queue": "shared"}},
        "spec": {"image": "i"}}}),
    );
    assert_rejects(
        violations::<RolloutGroup>(label, None),
        "template.metadata.labels may not use keys under orchard.dev/",
    );
    let annotation = group(
        json!({"template": {"metadata": {"annotations": {"orchard.dev/seal": "00"}},
        "spec": {"image": "i"}}}),
    );
    assert_rejects(
        violations::<RolloutGroup>(annotation, None),
        "template.metadata.annotations may not use keys under orchard.dev/",
    );
}

fn with_gpu(gpu: Value) -> Value {
    sandbox(json!({"image": "a", "resources": {"cpu": "2", "gpu": gpu}}))
}

#[test]
fn a_gpu_request_is_a_count_and_optional_types() {
    for gpu in [
        json!({"count": 1}),
        json!({"count": 64}),
        json!({"count": 2, "types": []}),
        json!({"count": 1, "types": ["h100", "a100-80gb", "L4", "gb200_nvl.72"]}),
        json!({"count": 8, "types": ["a".repeat(63)]}),
        json!({"count": 1, "types": ["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"]}),
    ] {
        assert_eq!(
            violations::<Sandbox>(with_gpu(gpu.clone()), None),
            Vec::<String>::new(),
            "{gpu}"
        );
    }
}

#[test]
fn a_gpu_count_is_between_1_and_64() {
    for count in [0, 65, 1000] {
        assert_rejects(
            violations::<Sandbox>(with_gpu(json!({"count": count})), None),
            "resources.gpu.count must be between 1 and 64",
        );
    }
}

#[test]
fn gpu_type_names_are_label_like_unique_and_few() {
    for name in [
        "",
        "-h100",
        ".h100",
        "h100 80gb",
        "nvidia.com/gpu",
        "h100=1",
        "ä100",
        &"a".repeat(64),
    ] {
        assert_rejects(
            violations::<Sandbox>(with_gpu(json!({"count": 1, "types": [name]})), None),
            "resources.gpu.types[] must be GPU type names such as h100",
        );
    }
    for twice in [json!(["h100", "h100"]), json!(["H100", "a100", "h100"])] {
        assert_rejects(
            violations::<Sandbox>(with_gpu(json!({"count": 1, "types": twice})), None),
            "resources.gpu.types must not list a type twice",
        );
    }
    let nine: Vec<String> = (1..=9).map(|i| format!("t{i}")).collect();
    assert_rejects(
        violations::<Sandbox>(with_gpu(json!({"count": 1, "types": nine})), None),
        "resources.gpu.types lists at most 8 GPU types",
    );
}

#[test]
fn gpu_rules_apply_inside_a_group_and_a_pool_template_and_gpus_are_immutable() {
    let bad =
        group(json!({"template": {"spec": {"image": "i", "resources": {"gpu": {"count": 0}}}}}));
    assert_rejects(
        violations::<RolloutGroup>(bad, None),
        "resources.gpu.count must be between 1 and 64",
    );
    let pool = |gpu: Value| {
        json!({"apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": "p"},
               "spec": {"replicas": 1, "template": {"image": "i", "resources": {"gpu": gpu}}}})
    };
    assert!(
        violations::<SandboxPool>(pool(json!({"count": 1, "types": ["h100"]})), None).is_empty()
    );
    assert_rejects(
        violations::<SandboxPool>(pool(json!({"count": 1, "types": ["h 100"]})), None),
        "resources.gpu.types[] must be GPU type names",
    );
    let old = with_gpu(json!({"count": 1}));
    let more = with_gpu(json!({"count": 2}));
    assert_rejects(
        violations::<Sandbox>(more, Some(old.clone())),
        "spec.resources is immutable",
    );
    assert!(violations::<Sandbox>(old.clone(), Some(old)).is_empty());
}

fn retry(on_oom: Value, resources: Value) -> Value {
    group(json!({
        "retry": {"maxAttempts": 3, "onOOM": on_oom},
        "template": {"spec": {"image": "i", "resources": resources}}
    }))
}

#[test]
fn a_retry_policy_escalates_within_its_limits() {
    for (on_oom, resources) in [
        (json!({"maxMemory": "8Gi"}), json!({})),
        (
            json!({"memoryFactor": 2, "maxMemory": "8Gi"}),
            json!({"memory": "1Gi"}),
        ),
        (
            json!({"memoryFactor": 1.5, "maxMemory": "1Gi"}),
            json!({"memory": "1Gi"}),
        ),
        (
            json!({"memoryFactor": 2.0, "cpuFactor": 1.5, "maxMemory": "4Gi", "maxCpu": 4}),
            json!({"memory": "512Mi", "cpu": "500m"}),
        ),
        (
            json!({"maxMemory": 17179869184_u64, "maxCpu": "2"}),
            json!({"memory": "16Gi", "cpu": 2}),
        ),
    ] {
        let ok = retry(on_oom.clone(), resources.clone());
        assert_eq!(
            violations::<RolloutGroup>(ok, None),
            Vec::<String>::new(),
            "{on_oom} {resources}"
        );
    }
    let eviction_only = group(json!({"retry": {"onEviction": true}}));
    assert!(violations::<RolloutGroup>(eviction_only, None).is_empty());
}

#[test]
fn a_retry_policy_refuses_factors_that_do_not_grow() {
    for factor in [json!(1), json!(1.0), json!(0.5), json!(0), json!(-2)] {
        let bad = retry(
            json!({"memoryFactor": factor, "maxMemory": "8Gi"}),
            json!({}),
        );
        assert_rejects(
            violations::<RolloutGroup>(bad, None),
            "retry.onOOM.memoryFactor must be greater than 1",
        );
        let bad = retry(json!({"cpuFactor": factor, "maxMemory": "8Gi"}), json!({}));
        assert_rejects(
            violations::<RolloutGroup>(bad, None),
            "retry.onOOM.cpuFactor must be greater than 1 when set",
        );
    }
}

#[test]
fn a_retry_policy_needs_positive_limits() {
    for bad_amount in [json!("0"), json!("-1Gi"), json!("lots"), json!(0)] {
        let bad = retry(json!({"maxMemory": bad_amount}), json!({}));
        assert_rejects(
            violations::<RolloutGroup>(bad, None),
            "retry.onOOM.maxMemory must be a quantity greater than 0",
        );
        let bad = retry(json!({"maxMemory": "1Gi", "maxCpu": bad_amount}), json!({}));
        assert_rejects(
            violations::<RolloutGroup>(bad, None),
            "retry.onOOM.maxCpu must be a quantity greater than 0",
        );
    }
}

#[test]
fn a_retry_limit_below_what_the_template_starts_with_is_refused() {
    let bad = retry(json!({"maxMemory": "512Mi"}), json!({"memory": "1Gi"}));
    assert_rejects(
        violations::<RolloutGroup>(bad, None),
        "retry.onOOM.maxMemory must not be below template.spec.resources.memory",
    );
    // Compared as quantities, not as text: 950Mi is below 1G (953.67Mi), 960Mi is not.
    let ok = retry(json!({"maxMemory": "960Mi"}), json!({"memory": "1G"}));
    assert!(violations::<RolloutGroup>(ok, None).is_empty());
    let bad = retry(json!({"maxMemory": "950Mi"}), json!({"memory": "1G"}));
    assert_rejects(
        violations::<RolloutGroup>(bad, None),
        "retry.onOOM.maxMemory must not be below template.spec.resources.memory",
    );
    let bad = retry(
        json!({"maxMemory": "8Gi", "cpuFactor": 2, "maxCpu": "1"}),
        json!({"cpu": "1500m"}),
    );
    assert_rejects(
        violations::<RolloutGroup>(bad, None),
        "retry.onOOM.maxCpu must not be below template.spec.resources.cpu",
    );
    // An unparsable template amount is refused by its own rule, not this one.
    let bad = retry(json!({"maxMemory": "8Gi"}), json!({"memory": "lots"}));
    let found = violations::<RolloutGroup>(bad, None);
    assert_rejects(
        found.clone(),
        "resources.memory must be a quantity greater than 0",
    );
    assert!(
        !found.iter().any(|m| m.contains("must not be below")),
        "{found:?}"
    );
}

fn retrying_sandbox(retry: Value, resources: Value) -> Value {
    sandbox(json!({"image": "i", "resources": resources, "retry": retry}))
}

#[test]
fn a_sandbox_retry_policy_escalates_within_its_limits() {
    for (retry, resources) in [
        (json!({"onEviction": true}), json!({})),
        (
            json!({"maxAttempts": 3, "onOOM": {"maxMemory": "8Gi"}}),
            json!({}),
        ),
        (
            json!({"onOOM": {"memoryFactor": 1.5, "maxMemory": "1Gi"}}),
            json!({"memory": "1Gi"}),
        ),
        (
            json!({"onOOM": {"cpuFactor": 2, "maxMemory": "4Gi", "maxCpu": 4}, "onEviction": true}),
            json!({"memory": "512Mi", "cpu": "500m"}),
        ),
    ] {
        assert_eq!(
            violations::<Sandbox>(retrying_sandbox(retry.clone(), resources.clone()), None),
            Vec::<String>::new(),
            "{retry} {resources}"
        );
    }
    // The policy's own rules hold on a Sandbox as in a RolloutGroup: one shared type.
    assert_rejects(
        violations::<Sandbox>(
            retrying_sandbox(
                json!({"onOOM": {"memoryFactor": 1, "maxMemory": "8Gi"}}),
                json!({}),
            ),
            None,
        ),
        "retry.onOOM.memoryFactor must be greater than 1",
    );
}

#[test]
fn a_sandbox_retry_limit_below_what_it_starts_with_is_refused() {
    let bad = retrying_sandbox(
        json!({"onOOM": {"maxMemory": "512Mi"}}),
        json!({"memory": "1Gi"}),
    );
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "retry.onOOM.maxMemory must not be below spec.resources.memory",
    );
    // Compared as quantities: 960Mi is not below 1G (953.67Mi), 950Mi is.
    let ok = retrying_sandbox(
        json!({"onOOM": {"maxMemory": "960Mi"}}),
        json!({"memory": "1G"}),
    );
    assert!(violations::<Sandbox>(ok, None).is_empty());
    let bad = retrying_sandbox(
        json!({"onOOM": {"maxMemory": "8Gi", "cpuFactor": 2, "maxCpu": "1"}}),
        json!({"cpu": "1500m"}),
    );
    assert_rejects(
        violations::<Sandbox>(bad, None),
        "retry.onOOM.maxCpu must not be below spec.resources.cpu",
    );
}

#[test]
fn a_sandbox_retry_policy_is_immutable() {
    let old = retrying_sandbox(json!({"maxAttempts": 2, "onEviction": true}), json!({}));
    assert!(violations::<Sandbox>(old.clone(), Some(old.clone())).is_empty());
    for new in [
        retrying_sandbox(json!({"maxAttempts": 5, "onEviction": true}), json!({})),
        sandbox(json!({"image": "i", "resources": {}})),
    ] {
        assert_rejects(
            violations::<Sandbox>(new, Some(old.clone())),
            "spec.retry is immutable",
        );
    }
    let plain = sandbox(json!({"image": "i", "resources": {}}));
    assert_rejects(
        violations::<Sandbox>(old, Some(plain)),
        "spec.retry is immutable",
    );
}

fn snapshot(spec: Value) -> Value {
    json!({"apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxSnapshot", "metadata": {"name": "snap"}, "spec": spec})
}

#[test]
fn a_snapshot_names_a_sandbox_and_keeps_absolute_paths_inside_the_root() {
    assert_eq!(
        violations::<SandboxSnapshot>(snapshot(json!({"sandbox": "prep"})), None),
        Vec::<String>::new()
    );
    let paths = |paths: Value| snapshot(json!({"sandbox": "prep", "paths": paths}));
    assert!(
        violations::<SandboxSnapshot>(
            paths(json!([
                "/work",
                "/usr/local/lib/python3.11",
                "/",
                "/a/..b/.c"
            ])),
            None
        )
        .is_empty()
    );
    for relative in [json!(["work"]), json!(["./work"]), json!([""])] {
        assert_rejects(
            violations::<SandboxSnapshot>(paths(relative), None),
            "spec.paths must be absolute paths inside the container (starting with /)",
        );
    }
    for escaping in [
        json!(["/work/../../etc"]),
        json!(["/.."]),
        json!(["/work/."]),
        json!(["/a/./b"]),
    ] {
        assert_rejects(
            violations::<SandboxSnapshot>(paths(escaping), None),
            "spec.paths may not contain . or .. components",
        );
    }
    assert_rejects(
        violations::<SandboxSnapshot>(paths(json!(["/work//x"])), None),
        "spec.paths must be clean paths",
    );
    assert_rejects(
        violations::<SandboxSnapshot>(
            snapshot(json!({"sandbox": "prep", "ttlSecondsAfterUnused": 0})),
            None,
        ),
        "spec.ttlSecondsAfterUnused must be positive",
    );
}

#[test]
fn a_group_template_and_a_pool_template_may_not_set_a_sandbox_retry() {
    let bad = group(json!({
        "retry": {"onEviction": true},
        "template": {"spec": {"image": "i", "retry": {"onEviction": true}}}
    }));
    assert_rejects(
        violations::<RolloutGroup>(bad, None),
        "template.spec.retry cannot be set: a RolloutGroup retries its trajectories itself; set the group's own spec.retry",
    );
    let ok = group(json!({"retry": {"onEviction": true}}));
    assert!(violations::<RolloutGroup>(ok, None).is_empty());
    let pool = json!({"apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": "p"},
                      "spec": {"replicas": 1, "template": {"image": "i", "retry": {"onEviction": true}}}});
    assert_rejects(
        violations::<SandboxPool>(pool, None),
        "template.retry cannot be set",
    );
}

#[test]
fn a_snapshots_sandbox_and_paths_are_immutable() {
    let old = snapshot(json!({"sandbox": "prep", "paths": ["/work"]}));
    let ttl_changed =
        snapshot(json!({"sandbox": "prep", "paths": ["/work"], "ttlSecondsAfterUnused": 60}));
    assert!(violations::<SandboxSnapshot>(ttl_changed, Some(old.clone())).is_empty());
    assert_rejects(
        violations::<SandboxSnapshot>(
            snapshot(json!({"sandbox": "other", "paths": ["/work"]})),
            Some(old.clone()),
        ),
        "spec.sandbox is immutable",
    );
    assert_rejects(
        violations::<SandboxSnapshot>(snapshot(json!({"sandbox": "prep"})), Some(old)),
        "spec.paths is immutable",
    );
    assert_rejects(
        violations::<SandboxSnapshot>(
            json!({"apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxSnapshot",
                   "metadata": {"name": "x".repeat(64)}, "spec": {"sandbox": "prep"}}),
            None,
        ),
        "a SandboxSnapshot name must be at most 63 characters",
    );
}

#[test]
fn a_sandbox_starts_from_an_image_or_a_snapshot_never_both() {
    assert!(violations::<Sandbox>(sandbox(json!({"fromSnapshot": "prepared"})), None).is_empty());
    assert_rejects(
        violations::<Sandbox>(
            sandbox(json!({"image": "python:3.11", "fromSnapshot": "prepared"})),
            None,
        ),
        "spec.image and spec.fromSnapshot are mutually exclusive",
    );
    assert_rejects(
        violations::<Sandbox>(sandbox(json!({})), None),
        "spec.image is required unless spec.pool names a SandboxPool or spec.fromSnapshot names a SandboxSnapshot",
    );
    let old = sandbox(json!({"fromSnapshot": "prepared"}));
    assert!(
        violations::<Sandbox>(
            sandbox(json!({"fromSnapshot": "prepared", "lifecycle": {"ttlSeconds": 60}})),
            Some(old.clone())
        )
        .is_empty()
    );
    assert_rejects(
        violations::<Sandbox>(sandbox(json!({"fromSnapshot": "other"})), Some(old)),
        "spec.fromSnapshot is immutable",
    );
}

#[test]
fn group_and_pool_templates_may_start_from_a_snapshot() {
    let ok = group(
        json!({"template": {"spec": {"fromSnapshot": "prepared", "run": {"command": ["python", "run.py"], "timeoutSeconds": 60, "resultPath": "/tmp/r.json"}}}}),
    );
    assert_eq!(violations::<RolloutGroup>(ok, None), Vec::<String>::new());
    let both = group(json!({"template": {"spec": {"image": "i", "fromSnapshot": "prepared"}}}));
    assert_rejects(
        violations::<RolloutGroup>(both, None),
        "spec.image and spec.fromSnapshot are mutually exclusive",
    );
    let pool = |template: Value| {
        json!({"apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": "p"},
               "spec": {"replicas": 1, "template": template}})
    };
    assert!(violations::<SandboxPool>(pool(json!({"fromSnapshot": "prepared"})), None).is_empty());
    assert_rejects(
        violations::<SandboxPool>(pool(json!({})), None),
        "template.image (or template.fromSnapshot) is required",
    );
}
