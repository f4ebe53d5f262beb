//! The operator's and the egress proxy's Deployments as the install manifests render them, with no
//! cluster: every pod of every render is hardened (non-root, read-only root, no capabilities, no
//! privilege escalation, seccomp, probes, requests); the operator follows the replica count (leader
//! election, update strategy, watched namespace, refusing two replicas without leader election), and
//! every setting of `orchard-operator --help` is set by the chart and kustomize, which set nothing the
//! binary does not know; the egress proxy runs apart from the operator (its own ServiceAccount, labels
//! the operator's selector does not match) on the same protected ranges, behind the Service the operator
//! is told about, and every ORCHARD_* variable it is given is a flag of `orchard-operator egress-proxy
//! --help`; the placement allow-lists default to the safe policy and the chart's values reach the
//! operator.

use std::process::Command;

use orchard_testcluster::binaries::workspace_root;
use orchard_testcluster::test_support::manifests::{
    CHART, EGRESS_APP, OPERATOR_APP, RELEASE_NAMESPACE, container, documents, egress_deployment,
    egress_proxy_flags, env_map, helm_default, helm_full, helm_template, kustomize, named, of_kind,
    one_of_kind, operator_deployment, operator_flags, service_account_of, strings, tools_dir,
};
use serde_json::{Value, json};

/// Every render of the install manifests: the chart with default values, full values
/// (`watchNamespace`, two replicas, `fullnameOverride`) and `watchNamespace` alone, and the kustomize
/// default, HA and namespaced installs.
fn renders() -> Vec<(&'static str, Vec<Value>)> {
    vec![
        ("helm default", documents(&helm_default())),
        ("helm full values", documents(&helm_full())),
        (
            "helm watchNamespace",
            documents(&helm_template(&[
                "--set",
                "watchNamespace=orchard-sandboxes",
            ])),
        ),
        ("kustomize default", documents(&kustomize("default"))),
        ("kustomize ha", documents(&kustomize("overlays/ha"))),
        (
            "kustomize namespaced",
            documents(&kustomize("overlays/namespaced")),
        ),
    ]
}

/// The pod of `deployment` runs as a non-root user with the runtime's default seccomp profile, and
/// each container with a read-only root, no capabilities, no privilege escalation, probes and
/// resource requests.
fn assert_hardened(source: &str, deployment: &Value) {
    let name = &deployment["metadata"]["name"];
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["runAsNonRoot"], true,
        "{source} {name}"
    );
    assert_eq!(
        pod["securityContext"]["runAsUser"], 65532,
        "{source} {name}"
    );
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{source} {name}"
    );
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(
            pod.get(field).is_none_or(|v| *v == false),
            "{source} {name} sets {field}"
        );
    }
    let containers = pod["containers"].as_array().expect("containers");
    let init = pod["initContainers"].as_array().into_iter().flatten();
    for container in containers.iter().chain(init) {
        let security = &container["securityContext"];
        let which = format!("{source} {name} container {}", container["name"]);
        assert_eq!(security["runAsNonRoot"], true, "{which}");
        assert_eq!(security["readOnlyRootFilesystem"], true, "{which}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{which}");
        assert_eq!(security["capabilities"]["drop"], json!(["ALL"]), "{which}");
        assert!(
            security["capabilities"].get("add").is_none(),
            "{which} adds capabilities"
        );
        assert!(
            security.get("privileged").is_none_or(|v| *v == false),
            "{which}"
        );
        assert_eq!(
            container["livenessProbe"]["httpGet"]["path"], "/healthz",
            "{which}"
        );
        assert_eq!(
            container["readinessProbe"]["httpGet"]["path"], "/readyz",
            "{which}"
        );
        assert!(container["resources"]["requests"].is_object(), "{which}");
        assert!(
            container["resources"]["limits"]["memory"].is_string(),
            "{which}"
        );
    }
}

#[test]
fn every_deployment_of_every_render_is_hardened() {
    for (source, docs) in renders() {
        let deployments = of_kind(&docs, "Deployment");
        assert_eq!(
            deployments.len(),
            2,
            "{source}: the operator and the egress proxy, nothing else"
        );
        assert_hardened(source, operator_deployment(&docs));
        assert_hardened(source, egress_deployment(&docs));
    }
}

#[test]
fn chart_deployment_is_hardened_and_follows_the_replica_count() {
    let default = documents(&helm_default());
    let deployment = operator_deployment(&default);
    assert_hardened("helm default", deployment);
    let operator = container(deployment);
    let env = env_map(operator);
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
        operator["image"], "ghcr.io/orchard-env/orchard-operator:0.1.0",
        "image tags default to the chart's appVersion"
    );

    let full = documents(&helm_full());
    let deployment = operator_deployment(&full);
    let env = env_map(container(deployment));
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
    let role = named(&full, "Role", "orchard-ha");
    assert_eq!(
        role["metadata"]["namespace"], "rl-sandboxes",
        "watchNamespace grants the namespaced rules with a Role in that namespace"
    );
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
    for (source, docs) in &renders() {
        let container = container(operator_deployment(docs));
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

/// `--simulated-agent` (KWOK test clusters: agent calls answered in process) never reaches an
/// install: no render passes it, it has no environment variable, and `--help` does not show it.
#[test]
fn no_install_simulates_the_agent() {
    let flags = operator_flags();
    assert!(
        flags.values().all(|(flag, _)| flag != "--simulated-agent"),
        "--simulated-agent is in `orchard-operator --help`"
    );
    for (source, docs) in &renders() {
        let container = container(operator_deployment(docs));
        for arg in strings(&container["args"])
            .into_iter()
            .chain(strings(&container["command"]))
        {
            assert!(
                !arg.contains("simulated-agent"),
                "{source} passes {arg}: a test-only flag"
            );
        }
        assert!(
            env_map(container).keys().all(|k| !k.contains("SIMULATED")),
            "{source} sets a SIMULATED variable"
        );
    }
}

#[test]
fn placement_values_reach_the_operator_and_default_to_the_safe_policy() {
    let placement = |docs: &[serde_json::Value]| {
        let env = env_map(container(operator_deployment(docs)));
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

/// Variables of the egress proxy's container that are not flags of `orchard-operator egress-proxy`:
/// the log filter, and the pod's name, which the proxy reads itself (its Kubernetes client's identity
/// and the reporting instance of its events, operator/src/app/egress_proxy.rs).
const EGRESS_ENV_NOT_FLAGS: [&str; 2] = ["RUST_LOG", "POD_NAME"];

/// Flags of `orchard-operator egress-proxy` no install sets: the binary's default applies.
/// `--header-read-timeout-seconds` (10 s for a client to send its request head) has no chart value.
const EGRESS_FLAGS_LEFT_TO_DEFAULT: [&str; 1] = ["ORCHARD_EGRESS_HEADER_READ_TIMEOUT_SECONDS"];

#[test]
fn every_egress_proxy_setting_is_a_flag_of_the_egress_proxy() {
    let flags = egress_proxy_flags();
    for name in EGRESS_FLAGS_LEFT_TO_DEFAULT {
        assert!(
            flags.contains_key(name),
            "{name} is no longer a flag of `orchard-operator egress-proxy`: drop it from the list"
        );
    }
    for (source, docs) in &renders() {
        let container = container(egress_deployment(docs));
        let env = env_map(container);
        for name in env.keys() {
            assert!(
                flags.contains_key(name) || EGRESS_ENV_NOT_FLAGS.contains(&name.as_str()),
                "{source} sets {name} for the egress proxy, which `orchard-operator egress-proxy \
                 --help` does not know"
            );
        }
        for name in flags.keys() {
            assert!(
                env.contains_key(name) || EGRESS_FLAGS_LEFT_TO_DEFAULT.contains(&name.as_str()),
                "{source} does not set {name} (a flag of `orchard-operator egress-proxy`): add it to \
                 values.yaml, templates/egress.yaml and config/egress/deployment.yaml, or to \
                 EGRESS_FLAGS_LEFT_TO_DEFAULT"
            );
        }
        assert!(env.contains_key("RUST_LOG"), "{source} sets no RUST_LOG");
        let args = strings(&container["args"]);
        assert_eq!(
            args.first().map(String::as_str),
            Some("egress-proxy"),
            "{source}: the egress container runs `orchard-operator egress-proxy`"
        );
        for arg in &args[1..] {
            let flag = arg.split('=').next().unwrap_or_default().to_string();
            assert!(
                flags.values().any(|(known, _)| *known == flag),
                "{source} passes the egress proxy unknown flag {arg}"
            );
        }
    }
}

/// The port of a `host:port` listen address.
fn port_of(listen: &str) -> i64 {
    listen
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("not host:port: {listen}"))
}

/// The container port named `name`.
fn container_port(container: &Value, name: &str) -> i64 {
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("no container port {name}"))
}

#[test]
fn the_egress_proxy_runs_apart_from_the_operator_on_the_same_protected_ranges() {
    for (source, docs) in &renders() {
        let operator = operator_deployment(docs);
        let egress = egress_deployment(docs);
        let (operator_container, egress_container) = (container(operator), container(egress));
        let (operator_env, egress_env) = (env_map(operator_container), env_map(egress_container));

        // Its own identity: not the operator's ServiceAccount, and one whose token is mounted only
        // where the pod asks for it.
        let account = service_account_of(egress);
        assert_ne!(account, service_account_of(operator), "{source}");
        let service_account = named(docs, "ServiceAccount", &account);
        assert_eq!(service_account["metadata"]["namespace"], RELEASE_NAMESPACE);
        assert_eq!(
            service_account["automountServiceAccountToken"], false,
            "{source}: {account}"
        );
        assert_eq!(
            egress["spec"]["template"]["spec"]["automountServiceAccountToken"], true,
            "{source}: the proxy watches Sandboxes"
        );

        // Only operator pods reach sandbox agents (the baseline NetworkPolicy selects them by
        // ORCHARD_OPERATOR_POD_SELECTOR): the proxy's pods must not match that selector, and the
        // operator's Deployment must not select them.
        let labels = &egress["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/name"], EGRESS_APP, "{source}");
        let operator_selector = &operator_env["ORCHARD_OPERATOR_POD_SELECTOR"];
        let matches_operator = operator_selector.split(',').all(|pair| {
            let (key, value) = pair.split_once('=').expect("key=value");
            labels[key] == value
        });
        assert!(
            !matches_operator,
            "{source}: the egress pods match the operator's pod selector {operator_selector}"
        );
        assert_eq!(
            operator["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], OPERATOR_APP,
            "{source}"
        );

        // The operator's image, the egress-proxy subcommand.
        assert_eq!(
            egress_container["image"], operator_container["image"],
            "{source}"
        );
        assert_eq!(
            egress_container["imagePullPolicy"], operator_container["imagePullPolicy"],
            "{source}"
        );

        // The same protected ranges, namespace and log format as the operator's.
        for name in [
            "ORCHARD_WATCH_NAMESPACE",
            "ORCHARD_LOG_FORMAT",
            "ORCHARD_EGRESS_EXCEPT_CIDRS",
            "ORCHARD_EGRESS_ALLOW_API_SERVER",
            "ORCHARD_CLUSTER_POD_CIDRS",
            "ORCHARD_DISCOVER_POD_CIDRS",
        ] {
            assert_eq!(
                egress_env[name], operator_env[name],
                "{source}: the egress proxy and the operator disagree on {name}"
            );
        }

        // The operator is told the Service in front of these pods, whose `proxy` port reaches the
        // proxy's listener by number and whose `metrics` port its admin server.
        let service_name = &operator_env["ORCHARD_EGRESS_PROXY_SERVICE"];
        let service = named(docs, "Service", service_name);
        assert_eq!(
            service["metadata"]["namespace"], RELEASE_NAMESPACE,
            "{source}"
        );
        assert_eq!(
            service["spec"]["selector"], egress["spec"]["selector"]["matchLabels"],
            "{source}: {service_name} selects the egress pods"
        );
        let port = |name: &str| -> &Value {
            service["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"] == name)
                .unwrap_or_else(|| panic!("{source}: {service_name} has no port {name}"))
        };
        let listen = port_of(&egress_env["ORCHARD_EGRESS_LISTEN"]);
        assert_eq!(
            container_port(egress_container, "proxy"),
            listen,
            "{source}"
        );
        assert_eq!(
            port("proxy")["targetPort"].as_i64(),
            Some(listen),
            "{source}: the proxy port's target is the listener's number"
        );
        let admin = port_of(&egress_env["ORCHARD_EGRESS_ADMIN_LISTEN"]);
        assert_eq!(
            container_port(egress_container, "metrics"),
            admin,
            "{source}"
        );
        assert_eq!(port("metrics")["targetPort"], "metrics", "{source}");
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(
                egress_container[probe]["httpGet"]["port"], "metrics",
                "{source}: {probe}"
            );
        }
    }

    // Without the proxy: none of its objects, and the operator is told of none.
    let off = documents(&helm_template(&["--set", "egress.enabled=false"]));
    assert!(
        off.iter().all(|d| {
            d["metadata"]["labels"]["app.kubernetes.io/name"] != EGRESS_APP
                && !d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .ends_with("-egress-service")
        }),
        "egress.enabled=false renders egress objects"
    );
    assert_eq!(of_kind(&off, "Deployment").len(), 1);
    assert_eq!(
        env_map(container(operator_deployment(&off)))["ORCHARD_EGRESS_PROXY_SERVICE"],
        ""
    );
}
