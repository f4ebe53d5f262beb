//! The GPU flags, refusals, tolerations and node affinity, with literal expectations.

use super::*;
use orchard_api::SandboxResources;
use serde_json::json;

fn flags(types: &[&str]) -> GpuFlags {
    GpuFlags {
        gpu_types: types.iter().map(|t| t.to_string()).collect(),
        ..GpuFlags::default()
    }
}

fn label(key: &str, value: &str) -> NodeLabel {
    NodeLabel {
        key: key.into(),
        value: value.into(),
    }
}

fn two_types() -> GpuShape {
    shape_from_flags(&flags(&[
        "H100=nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
        "a100=cloud.google.com/gke-accelerator=nvidia-tesla-a100",
    ]))
    .expect("valid flags")
}

fn gpu_spec(count: u32, types: &[&str]) -> SandboxSpec {
    SandboxSpec {
        image: "x".into(),
        resources: Some(SandboxResources {
            gpu: Some(GpuRequest {
                count,
                types: types.iter().map(|t| t.to_string()).collect(),
            }),
            ..SandboxResources::default()
        }),
        ..SandboxSpec::default()
    }
}

#[test]
fn the_type_map_is_parsed_with_lower_case_names() {
    let shape = two_types();
    assert_eq!(shape.resource, "nvidia.com/gpu");
    assert!(shape.toleration);
    assert_eq!(
        shape.types,
        GpuTypes::from([
            (
                "a100".to_string(),
                label("cloud.google.com/gke-accelerator", "nvidia-tesla-a100")
            ),
            (
                "h100".to_string(),
                label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
            ),
        ])
    );
    assert_eq!(
        parse_type(" l4 = node-type = gpu "),
        Ok(("l4".to_string(), label("node-type", "gpu")))
    );
    assert_eq!(
        parse_type("any=gpu="),
        Ok(("any".to_string(), label("gpu", ""))),
        "an empty label value is a value"
    );
}

#[test]
fn malformed_type_entries_are_start_up_errors_naming_the_flag() {
    for (entry, why) in [
        ("h100", "no `=`"),
        ("h100=nvidia.com/gpu.product", "no LABEL=VALUE"),
        ("=a=b", "is not a GPU type name"),
        ("h 100=a=b", "is not a GPU type name"),
        ("h100=Bad_Prefix.com/x=y", "is not a label key"),
        ("h100=/x=y", "is not a label key"),
        ("h100=a=b=c", "is not a label value"),
        ("h100=a=-x", "is not a label value"),
    ] {
        let err = shape_from_flags(&flags(&[entry])).unwrap_err();
        assert!(err.contains(why), "{entry}: {err}");
        assert!(
            err.contains("--gpu-type") && err.contains("gpu.types") && err.contains(entry.trim()),
            "{err}"
        );
    }
    let twice = shape_from_flags(&flags(&["h100=a=b", "H100=c=d"])).unwrap_err();
    assert!(twice.contains("`h100` twice"), "{twice}");
    for resource in [
        "gpu",
        "nvidia.com/",
        "/gpu",
        "NVIDIA.com/gpu",
        "kubernetes.io/gpu",
    ] {
        let err = shape_from_flags(&GpuFlags {
            gpu_resource: resource.into(),
            ..GpuFlags::default()
        })
        .unwrap_err();
        assert!(
            err.contains("--gpu-resource") && err.contains("gpu.resource"),
            "{err}"
        );
    }
    let amd = shape_from_flags(&GpuFlags {
        gpu_resource: "amd.com/gpu".into(),
        gpu_toleration: false,
        ..GpuFlags::default()
    })
    .expect("another vendor's resource");
    assert_eq!(amd.resource, "amd.com/gpu");
    assert!(!amd.toleration);
    assert_eq!(
        shape_from_flags(&flags(&["", " "])).map(|s| s.types.len()),
        Ok(0),
        "empty entries (an empty environment variable) are none"
    );
}

#[test]
fn unknown_types_are_refused_naming_them_the_known_ones_and_the_flag() {
    let types = two_types().types;
    assert_eq!(refusal(&gpu_spec(1, &["H100", "a100"]), &types), None);
    assert_eq!(refusal(&gpu_spec(1, &[]), &types), None);
    assert_eq!(refusal(&gpu_spec(1, &[]), &GpuTypes::new()), None);
    assert_eq!(refusal(&SandboxSpec::default(), &GpuTypes::new()), None);
    assert_eq!(
        refusal(&gpu_spec(1, &["h100", "V100"]), &types).as_deref(),
        Some(
            "spec.resources.gpu.types: unknown GPU type \"v100\" (known: a100, h100); the operator's GPU type map gets a type with --gpu-type NAME=LABEL=VALUE (env ORCHARD_GPU_TYPES, Helm value gpu.types)"
        )
    );
    let none = refusal(&gpu_spec(2, &["t4", "l4"]), &GpuTypes::new()).expect("refused");
    assert!(
        none.contains("unknown GPU types \"l4\", \"t4\" (known: none)"),
        "{none}"
    );
}

#[test]
fn a_gpu_sandbox_tolerates_the_gpu_taint_once_unless_turned_off() {
    let shape = two_types();
    let expected = Toleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    };
    assert_eq!(
        tolerations(&gpu_spec(1, &[]), &shape),
        Some(vec![expected.clone()])
    );
    let mut own = gpu_spec(1, &[]);
    let pool = Toleration {
        key: Some("pool".into()),
        operator: Some("Exists".into()),
        ..Toleration::default()
    };
    own.tolerations = vec![pool.clone(), expected.clone()];
    assert_eq!(
        tolerations(&own, &shape),
        Some(vec![pool.clone(), expected.clone()]),
        "not twice"
    );
    let off = GpuShape {
        toleration: false,
        ..shape.clone()
    };
    assert_eq!(tolerations(&gpu_spec(1, &[]), &off), None);
    let mut plain = SandboxSpec::default();
    assert_eq!(tolerations(&plain, &shape), None);
    plain.tolerations = vec![pool.clone()];
    assert_eq!(tolerations(&plain, &shape), Some(vec![pool]));
}

#[test]
fn each_type_is_one_required_term_in_name_order() {
    let shape = two_types();
    let affinity = require_any(
        None,
        type_terms(&gpu_spec(1, &["H100", "a100"]), &shape.types),
    )
    .expect("an affinity");
    assert_eq!(
        serde_json::to_value(&affinity).expect("JSON"),
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": ["nvidia-tesla-a100"]}]},
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}
        ]}}})
    );
    assert_eq!(
        require_any(None, type_terms(&gpu_spec(1, &[]), &shape.types)),
        None
    );
    assert_eq!(
        require_any(None, type_terms(&SandboxSpec::default(), &shape.types)),
        None
    );
    // A type the map lost after the check selects a label no node has.
    let lost = type_terms(&gpu_spec(1, &["v100"]), &shape.types);
    assert_eq!(
        serde_json::to_value(&lost).expect("JSON"),
        json!([{"matchExpressions": [{"key": "orchard.dev/unknown-gpu-type", "operator": "In", "values": ["v100"]}]}])
    );
}

#[test]
fn gpu_terms_are_anded_with_existing_required_terms_and_keep_the_rest() {
    let existing: Affinity = serde_json::from_value(json!({
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
            ]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "spot", "operator": "Exists"}]}}
            ]
        },
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
        ]}
    }))
    .expect("affinity JSON");
    let terms = type_terms(&gpu_spec(1, &["h100", "a100"]), &two_types().types);
    let merged = require_any(Some(existing.clone()), terms).expect("an affinity");
    let a100 = json!({"key": "cloud.google.com/gke-accelerator", "operator": "In", "values": ["nvidia-tesla-a100"]});
    let h100 = json!({"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]});
    let zone = json!({"key": "zone", "operator": "In", "values": ["a"]});
    let name = json!({"key": "metadata.name", "operator": "In", "values": ["n1"]});
    assert_eq!(
        serde_json::to_value(
            &merged
                .node_affinity
                .as_ref()
                .expect("node affinity")
                .required_during_scheduling_ignored_during_execution
        )
        .expect("JSON"),
        json!({"nodeSelectorTerms": [
            {"matchExpressions": [zone, a100]},
            {"matchExpressions": [zone, h100]},
            {"matchExpressions": [a100], "matchFields": [name]},
            {"matchExpressions": [h100], "matchFields": [name]}
        ]})
    );
    let node = merged.node_affinity.clone().expect("node affinity");
    let old_node = existing.node_affinity.clone().expect("node affinity");
    assert_eq!(
        node.preferred_during_scheduling_ignored_during_execution,
        old_node.preferred_during_scheduling_ignored_during_execution
    );
    assert_eq!(merged.pod_anti_affinity, existing.pod_anti_affinity);
    assert_eq!(
        require_any(Some(existing.clone()), Vec::new()),
        Some(existing),
        "no GPU terms: unchanged"
    );
}

#[test]
fn an_unscheduled_gpu_sandbox_says_what_it_waits_for() {
    assert_eq!(unschedulable_hint(&SandboxSpec::default()), None);
    assert_eq!(
        unschedulable_hint(&gpu_spec(1, &[])).as_deref(),
        Some("the sandbox asks for 1 GPU on one node (any type)")
    );
    assert_eq!(
        unschedulable_hint(&gpu_spec(3, &["H100", "a100"])).as_deref(),
        Some("the sandbox asks for 3 GPUs on one node of GPU type a100 or h100")
    );
}
