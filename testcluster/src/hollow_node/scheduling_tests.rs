//! The hollow node's fit decision against literal pods and nodes.

use super::*;
use serde_json::{Value, json};

fn node(labels: Value, taints: Value, allocatable: Value) -> NodeOffer {
    NodeOffer::from_node(
        &serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": allocatable},
        }))
        .expect("Node JSON"),
    )
}

fn gpu_node() -> NodeOffer {
    node(
        json!({"nvidia.com/gpu.product": "FAKE-H100", "kubernetes.io/os": "linux"}),
        json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]),
        json!({"cpu": "512", "memory": "2Ti", "nvidia.com/gpu": "2", "example.com/fpga": "1k"}),
    )
}

fn pod(spec: Value) -> Pod {
    let mut full = json!({"containers": [{"name": "sandbox"}]});
    if let (Some(full), Some(spec)) = (full.as_object_mut(), spec.as_object()) {
        for (key, value) in spec {
            full.insert(key.clone(), value.clone());
        }
    }
    serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": full})).expect("Pod JSON")
}

fn gpu_pod(count: &str, affinity: Value) -> Pod {
    pod(json!({
        "containers": [{"name": "sandbox", "resources": {
            "requests": {"cpu": "1", "nvidia.com/gpu": count}, "limits": {"cpu": "1", "nvidia.com/gpu": count}}}],
        "initContainers": [{"name": "install", "resources": {"requests": {"cpu": "1"}}}],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": affinity,
    }))
}

fn product_affinity(values: &[&str]) -> Value {
    let terms: Vec<Value> = values
        .iter()
        .map(|v| json!({"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [v]}]}))
        .collect();
    json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
}

fn check(pod: &Pod, offer: &NodeOffer, in_use: &BTreeMap<String, i64>) -> Option<String> {
    let wanted = extended_requests(pod).expect("whole units");
    unfit(pod, &wanted, offer, in_use)
}

#[test]
fn the_offer_keeps_extended_resources_labels_and_taints() {
    let offer = gpu_node();
    assert_eq!(
        offer.extended,
        BTreeMap::from([
            ("example.com/fpga".to_string(), 1000),
            ("nvidia.com/gpu".to_string(), 2)
        ])
    );
    assert_eq!(offer.labels["nvidia.com/gpu.product"], "FAKE-H100");
    assert_eq!(offer.taints.len(), 1);
    assert_eq!(offer.name, "n1");
    for native in [
        "cpu",
        "memory",
        "kubernetes.io/x",
        "hugepages-2Mi",
        "requests.nvidia.com/gpu",
    ] {
        assert!(!is_extended(native), "{native}");
    }
}

#[test]
fn requests_add_up_over_app_containers_and_init_containers_are_a_floor() {
    let p = pod(json!({
        "containers": [
            {"name": "a", "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "1"}}}
        ],
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "4", "example.com/fpga": "1"}}}]
    }));
    assert_eq!(
        extended_requests(&p),
        Ok(BTreeMap::from([
            ("example.com/fpga".to_string(), 1),
            ("nvidia.com/gpu".to_string(), 4)
        ]))
    );
    let fractional = pod(
        json!({"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "500m"}}}]}),
    );
    assert!(
        extended_requests(&fractional)
            .unwrap_err()
            .contains("whole numbers")
    );
    assert_eq!(extended_requests(&pod(json!({}))), Ok(BTreeMap::new()));
}

#[test]
fn a_gpu_pod_fits_while_the_node_has_free_gpus_of_a_listed_type() {
    let offer = gpu_node();
    let none = BTreeMap::new();
    let any_listed = gpu_pod("1", product_affinity(&["FAKE-A100", "FAKE-H100"]));
    assert_eq!(check(&any_listed, &offer, &none), None);
    let both = gpu_pod("2", json!(null));
    assert_eq!(check(&both, &offer, &none), None);
    let one_used = BTreeMap::from([("nvidia.com/gpu".to_string(), 1)]);
    assert_eq!(
        check(&both, &offer, &one_used).as_deref(),
        Some("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    );
    assert_eq!(
        check(&gpu_pod("3", json!(null)), &offer, &none).as_deref(),
        Some("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    );
    assert_eq!(
        check(
            &gpu_pod("1", product_affinity(&["FAKE-A100"])),
            &offer,
            &none
        )
        .as_deref(),
        Some("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.")
    );
    let plain_node = node(json!({}), json!([]), json!({"cpu": "512"}));
    assert_eq!(
        check(&gpu_pod("1", json!(null)), &plain_node, &none).as_deref(),
        Some("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."),
        "a node without the resource has none of it"
    );
}

#[test]
fn taints_keep_off_pods_that_do_not_tolerate_them() {
    let offer = gpu_node();
    let none = BTreeMap::new();
    let untolerating = pod(json!({}));
    assert_eq!(
        check(&untolerating, &offer, &none).as_deref(),
        Some("0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}.")
    );
    for toleration in [
        json!({"key": "nvidia.com/gpu", "operator": "Exists"}),
        json!({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}),
        json!({"key": "nvidia.com/gpu", "value": "present"}),
        json!({"operator": "Exists"}),
    ] {
        let p = pod(json!({"tolerations": [toleration]}));
        assert_eq!(check(&p, &offer, &none), None, "{toleration}");
    }
    for toleration in [
        json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}),
        json!({"key": "nvidia.com/gpu", "value": "absent"}),
        json!({"key": "other", "operator": "Exists"}),
    ] {
        let p = pod(json!({"tolerations": [toleration]}));
        assert!(check(&p, &offer, &none).is_some(), "{toleration}");
    }
    let soft = node(
        json!({}),
        json!([{"key": "x", "effect": "PreferNoSchedule"}]),
        json!({}),
    );
    assert_eq!(check(&untolerating, &soft, &none), None);
    // The control plane's view of the node's heartbeat keeps nothing off the hollow node.
    let lost = node(
        json!({}),
        json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
               {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]),
        json!({}),
    );
    assert_eq!(check(&untolerating, &lost, &none), None);
}

#[test]
fn node_selectors_and_affinity_operators_match_like_kube_scheduler() {
    let offer = node(
        json!({"zone": "a", "gpus": "8", "pool": "gpu"}),
        json!([]),
        json!({}),
    );
    let none = BTreeMap::new();
    let with = |spec: Value| check(&pod(spec), &offer, &none).is_none();
    let term = |expressions: Value| {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}})
    };
    assert!(with(json!({"nodeSelector": {"zone": "a"}})));
    assert!(!with(json!({"nodeSelector": {"zone": "b"}})));
    assert!(with(term(
        json!([{"key": "zone", "operator": "In", "values": ["b", "a"]}])
    )));
    assert!(!with(term(
        json!([{"key": "zone", "operator": "NotIn", "values": ["a"]}])
    )));
    assert!(with(term(
        json!([{"key": "spot", "operator": "NotIn", "values": ["true"]}])
    )));
    assert!(with(term(
        json!([{"key": "pool", "operator": "Exists"}, {"key": "spot", "operator": "DoesNotExist"}])
    )));
    assert!(!with(term(
        json!([{"key": "pool", "operator": "Exists"}, {"key": "zone", "operator": "DoesNotExist"}])
    )));
    assert!(with(term(
        json!([{"key": "gpus", "operator": "Gt", "values": ["4"]}])
    )));
    assert!(!with(term(
        json!([{"key": "gpus", "operator": "Lt", "values": ["4"]}])
    )));
    assert!(!with(term(json!([]))), "an empty term matches nothing");
    assert!(with(
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}})
    ));
    // The node selector and the affinity are ANDed.
    let both = |zone: &str| {
        let mut spec = term(json!([{"key": "pool", "operator": "In", "values": ["gpu"]}]));
        spec["nodeSelector"] = json!({"zone": zone});
        with(spec)
    };
    assert!(both("a"));
    assert!(!both("b"));
}
