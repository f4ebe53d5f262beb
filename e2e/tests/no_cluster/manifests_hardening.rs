//! The operator's Deployment as the install manifests render it, with no cluster: the chart's pod is
//! hardened (non-root, read-only root, no capabilities, seccomp, probes, requests) and follows the
//! replica count (leader election, update strategy, watched namespace, refusing two replicas without
//! leader election), and every setting of `orchard-operator --help` is set by the chart and kustomize,
//! which set nothing the binary does not know; the placement allow-lists default to the safe policy and
//! the chart's values reach the operator.

use std::process::Command;

use orchard_testcluster::binaries::workspace_root;
use orchard_testcluster::test_support::manifests::{
    CHART, documents, env_map, helm_default, helm_full, kustomize, of_kind, one_of_kind,
    operator_flags, strings, tools_dir,
};
use serde_json::json;

#[test]
fn chart_deployment_is_hardened_and_follows_the_replica_count() {
    let default = documents(&helm_default());
    let deployment = one_of_kind(&default, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["requests"].is_object());
    let env = env_map(container);
    assert_eq!(env["ORCHARD_LEADER_ELECTION"], "false");
    assert_eq!(
        deployment["spec"]["strategy"]["type"], "Recreate",
        "one writer at a time"
    );
    assert_eq!(
        env["ORCHARD_AGENT_IMAGE"],
        "ghcr.io/orchard-env/orchard-agent:0.1.0"
    );
    assert_eq!(
        container["image"], "ghcr.io/orchard-env/orchard-operator:0.1.0",
        "image tags default to the chart's appVersion"
    );

    let full = documents(&helm_full());
    let deployment = one_of_kind(&full, "Deployment");
    let env = env_map(&deployment["spec"]["template"]["spec"]["containers"][0]);
    assert_eq!(
        env["ORCHARD_LEADER_ELECTION"], "true",
        "replicas > 1 switches leader election on"
    );
    assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
    assert_eq!(env["ORCHARD_WATCH_NAMESPACE"], "rl-sandboxes");
    assert!(
        env["ORCHARD_AGENT_IMAGE"]
            .ends_with("@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    );
    let role = of_kind(&full, "Role")
        .into_iter()
        .find(|r| r["metadata"]["namespace"] == "rl-sandboxes")
        .expect("watchNamespace grants the namespaced rules with a Role in that namespace");
    assert!(strings(&role["rules"][0]["resources"]).contains(&"sandboxes".to_string()));
    for kind in [
        "NetworkPolicy",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "ConfigMap",
    ] {
        one_of_kind(&full, kind);
    }

    // Two replicas without leader election would both reconcile: the chart refuses to render that.
    let helm = tools_dir().join("helm");
    let refused = Command::new(helm)
        .current_dir(workspace_root())
        .args([
            "template",
            "orchard",
            CHART,
            "--set",
            "replicas=2",
            "--set",
            "leaderElection.enabled=false",
        ])
        .output()
        .expect("helm runs");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("replicas > 1 needs leader election")
    );
}

#[test]
fn every_operator_setting_is_set_by_the_chart_and_kustomize_and_known_to_the_binary() {
    let flags = operator_flags();
    let renders = [
        ("helm default", documents(&helm_default())),
        ("helm full values", documents(&helm_full())),
        ("kustomize default", documents(&kustomize("default"))),
        (
            "kustomize namespaced",
            documents(&kustomize("overlays/namespaced")),
        ),
    ];
    for (source, docs) in &renders {
        let container =
            &one_of_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
        let env = env_map(container);
        for name in env.keys() {
            let ours = name.starts_with("ORCHARD_") || name.starts_with("POD_");
            assert!(
                !ours || flags.contains_key(name),
                "{source} sets {name}, which `orchard-operator --help` does not know"
            );
        }
        for name in flags.keys() {
            assert!(
                env.contains_key(name),
                "{source} does not set {name} (a flag of orchard-operator): add it to values.yaml, \
                 templates/deployment.yaml and config/manager/manager.yaml"
            );
        }
        assert!(env.contains_key("RUST_LOG"), "{source} sets no RUST_LOG");
        for arg in strings(&container["args"]) {
            let flag = arg.split('=').next().unwrap_or_default().to_string();
            assert!(
                flags.values().any(|(known, _)| *known == flag),
                "{source} passes unknown flag {arg}"
            );
        }
    }
}

#[test]
fn placement_values_reach_the_operator_and_default_to_the_safe_policy() {
    let placement = |docs: &[serde_json::Value]| {
        let env =
            env_map(&one_of_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]);
        [
            "ORCHARD_ALLOWED_PRIORITY_CLASSES",
            "ORCHARD_ALLOWED_TOLERATION_KEYS",
            "ORCHARD_ALLOW_WILDCARD_TOLERATIONS",
            "ORCHARD_ALLOW_CONTROL_PLANE_PLACEMENT",
            "ORCHARD_ALLOWED_RUNTIME_CLASSES",
            "ORCHARD_ALLOWED_NODE_SELECTOR_KEYS",
        ]
        .map(|name| env[name].clone())
    };
    let safe = ["", "", "false", "false", "", ""].map(String::from);
    assert_eq!(placement(&documents(&helm_default())), safe);
    assert_eq!(placement(&documents(&kustomize("default"))), safe);
    assert_eq!(
        placement(&documents(&helm_full())),
        [
            "sandbox-low,sandbox-high",
            "orchard.dev/sandbox-pool",
            "true",
            "true",
            "gvisor,kata",
            "orchard.dev/sandbox-pool,topology.kubernetes.io/zone",
        ]
        .map(String::from)
    );
}
