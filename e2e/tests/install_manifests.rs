//! The install manifests, for real: the Helm chart and the kustomize bases are rendered, checked, and
//! applied to the local cluster, and the operator then runs under the chart's own ServiceAccount token
//! (not as admin) until a sample Sandbox is Ready, answers an exec through the gateway and through its
//! agent, and is deleted. That proves the chart's RBAC is sufficient; the static checks prove it has no
//! wildcards and that the chart and kustomize grant exactly the same rules.
//!
//! Also here, because they guard the same files: kubeconform -strict on every render
//! (`hack/manifests-check.sh`), the committed Kubernetes schemas against the live kube-apiserver, the
//! Grafana dashboard against docs/METRICS.md, and docs/CONFIGURATION.md against values.yaml.
//!
//! Regenerate instead of failing: `ORCHARD_UPDATE_SCHEMAS=1` (e2e/packaging-tools/schemas) and
//! `ORCHARD_UPDATE_DOCS=1` (docs/CONFIGURATION.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common_sandbox;

use common_sandbox::{is_ready, token_of};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use orchard_e2e::binaries::{operator_bin, workspace_root};
use orchard_e2e::env::{EnvOptions, TestEnv};
use orchard_e2e::operator_process::{OperatorProcess, metric_sum};
use orchard_e2e::wait;
use orchard_operator::api::{RolloutGroup, Sandbox};
use serde_json::{Value, json};

const CHART: &str = "charts/orchard-env";
const RELEASE_NAMESPACE: &str = "orchard-system";
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// The pod name the test gives the operator process (POD_NAME, its identity in the Lease).
const IDENTITY: &str = "orchard-operator-e2e-0";

// ---------------------------------------------------------------------------------------------------
// Rendering

/// Directory of helm, kubeconform and openapi2schema (built once by e2e/packaging-tools/build.sh).
fn tools_dir() -> PathBuf {
    let script = workspace_root().join("e2e/packaging-tools/build.sh");
    let output = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("build.sh prints the tool directory")
            .trim(),
    )
}

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// `helm template orchard charts/orchard-env -n orchard-system [args]`.
fn helm_template(args: &[&str]) -> String {
    let helm = tools_dir().join("helm");
    run(Command::new(helm)
        .current_dir(workspace_root())
        .args([
            "template",
            "orchard",
            CHART,
            "--namespace",
            RELEASE_NAMESPACE,
        ])
        .args(args))
}

fn helm_default() -> String {
    helm_template(&[])
}

fn helm_full() -> String {
    helm_template(&["-f", &format!("{CHART}/ci/full-values.yaml")])
}

/// `kubectl kustomize config/<dir>`.
fn kustomize(dir: &str) -> String {
    run(Command::new("kubectl")
        .current_dir(workspace_root())
        .args(["kustomize", &format!("config/{dir}")]))
}

/// Every non-empty document of a YAML stream, as JSON.
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .filter_map(|document| {
            let value: Value = serde::Deserialize::deserialize(document).expect("valid YAML");
            (!value.is_null()).then_some(value)
        })
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one_of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "expected exactly one {kind}");
    found[0]
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|s| s.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Every (role kind, role name, namespace, apiGroup, resource, verb) the rendered Roles and
/// ClusterRoles grant.
fn granted(docs: &[Value]) -> BTreeSet<(String, String, String, String, String, String)> {
    let mut grants = BTreeSet::new();
    for role in docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
    {
        let kind = role["kind"].as_str().unwrap_or_default().to_string();
        let name = role["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = role["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for rule in role["rules"].as_array().expect("rules") {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        grants.insert((
                            kind.clone(),
                            name.clone(),
                            namespace.clone(),
                            group.clone(),
                            resource.clone(),
                            verb,
                        ));
                    }
                }
            }
        }
    }
    grants
}

/// (apiGroup, resource, verb) regardless of which role grants it.
fn permissions(docs: &[Value]) -> BTreeSet<(String, String, String)> {
    granted(docs)
        .into_iter()
        .map(|(_, _, _, group, resource, verb)| (group, resource, verb))
        .collect()
}

fn assert_no_wildcards(source: &str, docs: &[Value]) {
    let roles: Vec<_> = docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
        .collect();
    assert!(!roles.is_empty(), "{source} renders no Role or ClusterRole");
    for role in roles {
        let name = &role["metadata"]["name"];
        for rule in role["rules"].as_array().expect("rules") {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                for item in strings(&rule[field]) {
                    assert!(
                        !item.contains('*'),
                        "{source}: {} {name} has a wildcard in {field}: {rule}",
                        role["kind"]
                    );
                }
            }
            assert!(
                rule.get("nonResourceURLs").is_none(),
                "{source}: {name} grants non-resource URLs: {rule}"
            );
        }
    }
}

/// What the controllers and the gateway need: the contract of docs/SECURITY.md.
fn expected_permissions() -> BTreeSet<(String, String, String)> {
    let mut expected = BTreeSet::new();
    let mut add = |group: &str, resource: &str, verbs: &[&str]| {
        for verb in verbs {
            expected.insert((group.to_string(), resource.to_string(), verb.to_string()));
        }
    };
    let crud = ["get", "list", "watch", "create", "patch", "delete"];
    add("orchard.dev", "sandboxes", &crud);
    add(
        "orchard.dev",
        "sandboxes/status",
        &["get", "patch", "update"],
    );
    add("orchard.dev", "rolloutgroups", &crud);
    add(
        "orchard.dev",
        "rolloutgroups/status",
        &["get", "patch", "update"],
    );
    add("", "pods", &crud);
    add("", "secrets", &["get", "list", "watch", "create"]);
    add("events.k8s.io", "events", &["create", "patch"]);
    add("networking.k8s.io", "networkpolicies", &crud);
    add(
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update", "patch"],
    );
    add("authentication.k8s.io", "tokenreviews", &["create"]);
    add("authorization.k8s.io", "subjectaccessreviews", &["create"]);
    add("discovery.k8s.io", "endpointslices", &["get"]);
    expected
}

/// `doc` without labels and annotations, every number as a float: Helm re-serialises the CRDs
/// (`fromYaml | toYaml`), which writes the generated `minimum: 1.0` as `1`; both are the same number to
/// the API server.
fn without_labels(mut doc: Value) -> Value {
    fn floats(value: &mut Value) {
        match value {
            Value::Number(n) => {
                if let Some(f) = n.as_f64().and_then(serde_json::Number::from_f64) {
                    *n = f;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(floats),
            Value::Object(map) => map.values_mut().for_each(floats),
            _ => {}
        }
    }
    if let Some(metadata) = doc["metadata"].as_object_mut() {
        metadata.remove("labels");
        metadata.remove("annotations");
    }
    floats(&mut doc);
    doc
}

fn crd_files() -> BTreeMap<String, Value> {
    let dir = workspace_root().join("crds");
    let mut crds = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("crds/") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("CRD file");
        for doc in documents(&text) {
            crds.insert(doc["metadata"]["name"].as_str().unwrap().to_string(), doc);
        }
    }
    crds
}

// ---------------------------------------------------------------------------------------------------
// Static checks (no cluster)

#[test]
fn no_wildcards_in_any_rendered_role_and_every_permission_is_accounted_for() {
    let renders = [
        ("helm default", documents(&helm_default())),
        ("helm full values", documents(&helm_full())),
        ("kustomize default", documents(&kustomize("default"))),
        ("kustomize ha", documents(&kustomize("overlays/ha"))),
    ];
    for (source, docs) in &renders {
        assert_no_wildcards(source, docs);
        // Cluster-wide (ClusterRole) or namespace-scoped (watchNamespace: Role), the operator is
        // granted exactly the documented permissions: nothing missing, nothing extra.
        assert_eq!(
            permissions(docs),
            expected_permissions(),
            "{source}: granted permissions differ from the documented contract"
        );
    }
}

#[test]
fn chart_and_kustomize_grant_the_same_rules_and_run_the_same_pod() {
    let chart = documents(&helm_default());
    let kustomized = documents(&kustomize("default"));
    assert_eq!(
        granted(&chart),
        granted(&kustomized),
        "config/rbac and the chart's RBAC templates differ"
    );
    for kind in ["ClusterRoleBinding", "RoleBinding", "ServiceAccount"] {
        let names = |docs: &[Value]| -> BTreeSet<String> {
            of_kind(docs, kind)
                .into_iter()
                .map(|d| {
                    json!([
                        d["metadata"]["name"],
                        d["metadata"]["namespace"],
                        d["roleRef"],
                        d["subjects"]
                    ])
                    .to_string()
                })
                .collect()
        };
        assert_eq!(names(&chart), names(&kustomized), "{kind}s differ");
    }
    // Same Deployment spec (pod template, probes, env, security) and Services.
    assert_eq!(
        one_of_kind(&chart, "Deployment")["spec"],
        one_of_kind(&kustomized, "Deployment")["spec"],
        "config/manager/manager.yaml and the chart's deployment.yaml (default values, release `orchard`) differ"
    );
    let services = |docs: &[Value]| -> BTreeMap<String, Value> {
        of_kind(docs, "Service")
            .into_iter()
            .map(|s| {
                (
                    s["metadata"]["name"].as_str().unwrap().to_string(),
                    s["spec"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(services(&chart), services(&kustomized), "Services differ");

    // Both install the generated CRDs unchanged (apart from labels and annotations).
    let generated = crd_files();
    for (source, docs) in [("chart", &chart), ("kustomize", &kustomized)] {
        let crds: BTreeMap<String, Value> = of_kind(docs, "CustomResourceDefinition")
            .into_iter()
            .map(|d| {
                (
                    d["metadata"]["name"].as_str().unwrap().to_string(),
                    without_labels(d.clone()),
                )
            })
            .collect();
        let expected: BTreeMap<String, Value> = generated
            .iter()
            .map(|(name, crd)| (name.clone(), without_labels(crd.clone())))
            .collect();
        assert_eq!(
            crds.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{source} installs other CRDs than crds/"
        );
        for (name, crd) in &crds {
            assert!(
                *crd == expected[name],
                "{source}'s {name} differs from crds/ (run `make sync-crds`)"
            );
        }
    }
    let keep = of_kind(&chart, "CustomResourceDefinition")
        .iter()
        .all(|crd| crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep");
    assert!(
        keep,
        "the chart's CRDs must survive `helm uninstall` by default"
    );
}

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

fn env_map(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_array()
        .expect("env")
        .iter()
        .map(|e| {
            let value = match e.get("value") {
                Some(v) => v.as_str().unwrap_or_default().to_string(),
                None => format!(
                    "valueFrom:{}",
                    e["valueFrom"]["fieldRef"]["fieldPath"]
                        .as_str()
                        .unwrap_or("?")
                ),
            };
            (e["name"].as_str().unwrap().to_string(), value)
        })
        .collect()
}

/// Flags of `orchard-operator --help` by environment variable: `(flag, takes a value)`.
fn operator_flags() -> BTreeMap<String, (String, bool)> {
    let help = run(Command::new(operator_bin().expect("orchard-operator is built")).arg("--help"));
    let mut flags = BTreeMap::new();
    let mut current: Option<(String, bool)> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("--").or_else(|| {
            trimmed
                .strip_prefix('-')
                .and_then(|r| r.split_once(", --").map(|(_, long)| long))
        }) {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            let takes_value = rest[name.len()..].trim_start().starts_with(['<', '[', '=']);
            current = Some((format!("--{name}"), takes_value));
        }
        let mut text = line;
        while let Some(start) = text.find("[env: ") {
            let after = &text[start + 6..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if let Some(flag) = &current {
                flags.insert(name.clone(), flag.clone());
            }
            text = &after[name.len()..];
        }
    }
    assert!(
        flags.len() > 10,
        "could not parse `orchard-operator --help`:\n{help}"
    );
    flags
}

#[test]
fn every_operator_setting_is_set_by_the_chart_and_kustomize_and_known_to_the_binary() {
    let flags = operator_flags();
    let renders = [
        ("helm default", documents(&helm_default())),
        ("helm full values", documents(&helm_full())),
        ("kustomize default", documents(&kustomize("default"))),
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

/// Metric names listed in docs/METRICS.md (backticked in table rows).
fn documented_metrics() -> BTreeSet<String> {
    let text =
        std::fs::read_to_string(workspace_root().join("docs/METRICS.md")).expect("docs/METRICS.md");
    text.lines()
        .filter(|l| l.starts_with('|'))
        .flat_map(|l| metric_names(l.split('|').nth(1).unwrap_or_default()))
        .collect()
}

/// Every `orchard_...` identifier in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("orchard_") {
        let boundary =
            start == 0 || !rest[..start].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let name: String = rest[start..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if boundary {
            names.push(name.clone());
        }
        rest = &rest[start + name.len()..];
    }
    names
}

#[test]
fn the_dashboard_uses_only_documented_metrics() {
    let documented = documented_metrics();
    assert!(
        documented.contains("orchard_sandboxes"),
        "docs/METRICS.md lists no metrics?"
    );
    let path = workspace_root()
        .join(CHART)
        .join("dashboards/orchard-env.json");
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard")).expect("JSON");
    let mut expressions = Vec::new();
    fn collect(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    match (key.as_str(), child) {
                        ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => collect(child, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|c| collect(c, out)),
            _ => {}
        }
    }
    collect(&dashboard, &mut expressions);
    assert!(expressions.len() >= 10, "the dashboard has queries");
    let mut used = BTreeSet::new();
    for expression in &expressions {
        for name in metric_names(expression) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|b| documented.contains(*b))
                })
                .unwrap_or(&name)
                .to_string();
            assert!(
                documented.contains(&base),
                "the dashboard queries {name}, which docs/METRICS.md does not document (in: {expression})"
            );
            used.insert(base);
        }
    }
    assert!(
        used.len() >= 6,
        "the dashboard uses too few metrics: {used:?}"
    );
}

#[test]
fn every_metric_registered_in_metrics_rs_is_documented() {
    let documented = documented_metrics();
    let source = ["operator/src/metrics.rs", "operator/src/gateway/metrics.rs"]
        .iter()
        .map(|file| std::fs::read_to_string(workspace_root().join(file)).expect("metrics source"))
        .collect::<Vec<_>>()
        .join("\n");
    let registered: BTreeSet<String> = source
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("orchard_")
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_string)
        .collect();
    assert!(registered.contains("orchard_reconciles_total"));
    let missing: Vec<_> = registered.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "metrics registered in operator/src/metrics.rs or gateway/metrics.rs but not in docs/METRICS.md: {missing:?}"
    );
}

/// One row of the values reference.
struct ValueDoc {
    key: String,
    default: String,
    description: String,
}

/// The `# --` documented keys of values.yaml, in file order, with their defaults.
fn values_reference(text: &str) -> Vec<ValueDoc> {
    let values: Value = serde_yaml::from_str(text).expect("values.yaml parses");
    let mut docs = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(description) = trimmed.strip_prefix("# --") {
            pending = Some(description.trim().to_string());
            continue;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('-') {
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            continue;
        };
        if key.contains(' ') || key.starts_with(['"', '\'']) {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let path: Vec<String> = stack
            .iter()
            .map(|(_, k)| k.clone())
            .chain([key.to_string()])
            .collect();
        if let Some(description) = pending.take() {
            let value = path.iter().fold(&values, |v, k| &v[k.as_str()]);
            docs.push(ValueDoc {
                key: path.join("."),
                default: serde_json::to_string(value).expect("JSON"),
                description,
            });
        }
        stack.push((indent, key.to_string()));
    }
    // Every leaf value is documented itself or through a documented ancestor.
    fn leaves(value: &Value, prefix: &str, out: &mut Vec<String>) {
        match value.as_object() {
            Some(map) if !map.is_empty() => {
                for (key, child) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    leaves(child, &path, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let mut all = Vec::new();
    leaves(&values, "", &mut all);
    for leaf in all {
        assert!(
            docs.iter()
                .any(|d| leaf == d.key || leaf.starts_with(&format!("{}.", d.key))),
            "values.yaml: `{leaf}` has no `# --` description"
        );
    }
    docs
}

#[test]
fn configuration_reference_is_generated_from_values_yaml() {
    let root = workspace_root();
    let values =
        std::fs::read_to_string(root.join(CHART).join("values.yaml")).expect("values.yaml");
    let mut table = String::from("| Key | Default | Description |\n|---|---|---|\n");
    for doc in values_reference(&values) {
        table.push_str(&format!(
            "| `{}` | `{}` | {} |\n",
            doc.key,
            doc.default.replace('|', "\\|"),
            doc.description.replace('|', "\\|")
        ));
    }
    let path = root.join("docs/CONFIGURATION.md");
    let text = std::fs::read_to_string(&path).expect("docs/CONFIGURATION.md");
    let begin = "<!-- BEGIN VALUES: generated from charts/orchard-env/values.yaml by e2e/tests/install_manifests.rs -->\n";
    let end = "<!-- END VALUES -->";
    let (head, rest) = text.split_once(begin).expect("BEGIN VALUES marker");
    let (current, tail) = rest.split_once(end).expect("END VALUES marker");
    if current != table {
        if std::env::var("ORCHARD_UPDATE_DOCS").is_ok() {
            std::fs::write(&path, format!("{head}{begin}{table}{end}{tail}")).expect("write docs");
        } else {
            panic!(
                "docs/CONFIGURATION.md is out of date with values.yaml: rerun this test with ORCHARD_UPDATE_DOCS=1\n\
                 expected table:\n{table}"
            );
        }
    }
}

#[test]
fn kubeconform_strict_accepts_every_render() {
    // The same check as `make manifests-check`, so `make e2e` covers it too.
    let script = workspace_root().join("hack/manifests-check.sh");
    let output = run(&mut Command::new(&script));
    assert!(output.contains("Invalid: 0, Errors: 0"), "{output}");
}

// ---------------------------------------------------------------------------------------------------
// On the local cluster

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    let output = child.wait_with_output().expect("kubectl finishes");
    assert!(
        output.status.success(),
        "kubectl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// Server-side apply, as `docs/INSTALL.md` tells users to.
fn apply(env: &TestEnv, manifests: &str, dry_run: bool) -> String {
    let mut args = vec![
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=orchard-install-e2e",
        "-f",
        "-",
    ];
    if dry_run {
        args.push("--dry-run=server");
    }
    kubectl(&env.control_plane.kubeconfig, &args, Some(manifests))
}

async fn create_namespace(env: &TestEnv, name: &str) {
    let api: Api<Namespace> = Api::all(env.client().await);
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    match api.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(err) => panic!("cannot create namespace {name}: {err}"),
    }
}

/// A token of `namespace/service_account` from the TokenRequest API (what the kubelet mounts into pods).
async fn service_account_token(env: &TestEnv, namespace: &str, service_account: &str) -> String {
    let api: Api<ServiceAccount> = Api::namespaced(env.client().await, namespace);
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    }))
    .expect("TokenRequest JSON");
    let issued = api
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{service_account}: {e}"));
    serde_json::to_value(&issued).expect("JSON")["status"]["token"]
        .as_str()
        .expect("issued token")
        .to_string()
}

/// The operator's flags from a rendered Deployment's environment, as the container would see it
/// (downward API values filled in). Flags the harness sets itself (listen addresses, agent image, log
/// format) are left out.
fn flags_from_deployment(deployment: &Value) -> Vec<String> {
    let flags = operator_flags();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let set_by_harness = [
        "ORCHARD_GATEWAY_LISTEN",
        "ORCHARD_METRICS_LISTEN",
        "ORCHARD_AGENT_IMAGE",
        "ORCHARD_LOG_FORMAT",
    ];
    let mut args = Vec::new();
    for (name, value) in env_map(container) {
        let value = match value.as_str() {
            "valueFrom:metadata.namespace" => RELEASE_NAMESPACE.to_string(),
            "valueFrom:metadata.name" => IDENTITY.to_string(),
            other => other.to_string(),
        };
        if set_by_harness.contains(&name.as_str()) {
            continue;
        }
        let Some((flag, takes_value)) = flags.get(&name) else {
            continue;
        };
        if *takes_value {
            args.push(format!("{flag}={value}"));
        } else if value == "true" {
            args.push(flag.clone());
        }
    }
    args.extend(strings(&container["args"]));
    args
}

/// Runs the operator under the ServiceAccount token and proves a sample Sandbox goes through its life.
async fn operator_under_service_account_runs_a_sandbox(
    env: &TestEnv,
    rendered: &[Value],
    sample: &str,
    sandbox_name: &str,
) {
    let service_account = one_of_kind(rendered, "ServiceAccount")["metadata"]["name"]
        .as_str()
        .expect("ServiceAccount name")
        .to_string();
    let token = service_account_token(env, RELEASE_NAMESPACE, &service_account).await;
    let kubeconfig = env.dir.join(format!("kubeconfig-{service_account}"));
    env.control_plane
        .write_token_kubeconfig(&token, &kubeconfig)
        .expect("write kubeconfig");
    // Sanity: the token is not admin.
    let cannot = Command::new("kubectl")
        .args(["auth", "can-i", "list", "configmaps", "--all-namespaces"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .expect("kubectl auth can-i");
    assert_eq!(
        String::from_utf8_lossy(&cannot.stdout).trim(),
        "no",
        "the ServiceAccount must not read ConfigMaps"
    );

    let args = flags_from_deployment(one_of_kind(rendered, "Deployment"));
    let log = env
        .dir
        .join(format!("logs/orchard-operator-{service_account}.log"));
    let operator = OperatorProcess::start(
        &operator_bin().expect("operator binary"),
        &kubeconfig,
        &log,
        &args,
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the operator did not become ready under the {service_account} token ({e}); log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });

    let deployment_env =
        env_map(&one_of_kind(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]);
    if deployment_env["ORCHARD_LEADER_ELECTION"] == "true" {
        // Leader election under the chart's RBAC: the Role in the release namespace lets it take the Lease.
        let leases: Api<Lease> = Api::namespaced(env.client().await, RELEASE_NAMESPACE);
        let lease_name = deployment_env["ORCHARD_LEASE_NAME"].clone();
        wait::poll(
            "the operator holds its Lease",
            Duration::from_secs(30),
            || {
                let leases = leases.clone();
                let lease_name = lease_name.clone();
                async move {
                    let lease = leases.get_opt(&lease_name).await.ok().flatten()?;
                    (lease.spec?.holder_identity? == IDENTITY).then_some(())
                }
            },
        )
        .await;
    }

    let namespace = format!("install-{sandbox_name}");
    create_namespace(env, &namespace).await;
    let sample_text = std::fs::read_to_string(workspace_root().join("config/samples").join(sample))
        .expect("sample");
    kubectl(
        &env.control_plane.kubeconfig,
        &["apply", "-n", &namespace, "-f", "-"],
        Some(&sample_text),
    );
    let client = env.client().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &namespace);
    let ready = wait::until(
        &sandboxes,
        sandbox_name,
        "Ready under the chart's RBAC",
        READY_TIMEOUT,
        is_ready,
    )
    .await;
    let endpoint = ready
        .status
        .and_then(|s| s.agent_endpoint)
        .expect("agent endpoint");

    // Exec straight at the agent with the sandbox's own token...
    let agent_token = token_of(&client, &namespace, sandbox_name).await;
    let http = reqwest::Client::new();
    let direct: Value = http
        .post(format!("{endpoint}/v1/exec"))
        .bearer_auth(&agent_token)
        .json(&json!({"argv": ["/bin/sh", "-c", "echo direct $ORCHARD_SANDBOX"]}))
        .send()
        .await
        .expect("agent exec")
        .json()
        .await
        .expect("agent JSON");
    assert_eq!(
        direct["stdout"],
        format!("direct {sandbox_name}\n"),
        "{direct}"
    );

    // ...and through the gateway, which authenticates the caller (TokenReview) and authorizes the call
    // (SubjectAccessReview) with the operator's ServiceAccount: both must be allowed by the chart's RBAC.
    let admin_token = env.control_plane.tokens["admin"].clone();
    let through_gateway = http
        .post(format!(
            "{}/v1/namespaces/{namespace}/sandboxes/{sandbox_name}/exec",
            operator.gateway_url()
        ))
        .bearer_auth(&admin_token)
        .json(&json!({"argv": ["/bin/sh", "-c", "echo gateway $ORCHARD_SANDBOX"]}))
        .send()
        .await
        .expect("gateway exec");
    let status = through_gateway.status();
    let body = through_gateway.text().await.unwrap_or_default();
    assert_eq!(status, 200, "gateway exec: {body}");
    assert!(
        body.contains(&format!("gateway {sandbox_name}")),
        "gateway exec: {body}"
    );

    // Delete: the operator's children go with the Sandbox.
    sandboxes
        .delete(sandbox_name, &DeleteParams::default())
        .await
        .expect("delete");
    wait::deleted(&sandboxes, sandbox_name, Duration::from_secs(60)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    wait::deleted(&pods, sandbox_name, Duration::from_secs(60)).await;

    // The RolloutGroup sample: its runner script writes a JSON result the operator records, and BAR
    // assembles the group; the RolloutGroup controller creates trajectory Sandboxes and writes the
    // group's status under the same RBAC.
    let group_text =
        std::fs::read_to_string(workspace_root().join("config/samples/rolloutgroup.yaml"))
            .expect("rolloutgroup sample");
    kubectl(
        &env.control_plane.kubeconfig,
        &["apply", "-n", &namespace, "-f", "-"],
        Some(&group_text),
    );
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &namespace);
    let complete = |g: Option<&RolloutGroup>| {
        g.and_then(|g| g.status.as_ref()).is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
    };
    let group = wait::until(
        &groups,
        "prompt-0042",
        "Complete",
        Duration::from_secs(120),
        complete,
    )
    .await;
    let status = group.status.expect("group status");
    // The sample's rewards are a checksum of each trajectory's name: strides 0 and 1 (prompt-0042-0..7)
    // hold 4 positives, inside [ceil(0.375 x 8), floor(0.625 x 8)] = [3, 5], so BAR records a
    // Balanced group of 8 after two strides.
    assert_eq!(
        serde_json::to_value(status.selection).expect("JSON"),
        json!("Balanced"),
        "{status:?}"
    );
    assert_eq!(status.group.len(), 8, "{status:?}");
    assert_eq!(status.positives, Some(4), "{status:?}");
    assert!(
        status.trajectories.iter().all(|t| t.status.is_some()),
        "every launched trajectory recorded an outcome: {:?}",
        status.trajectories
    );

    let metrics = operator.metrics().await.expect("metrics");
    assert_eq!(
        metric_sum(
            &metrics,
            "orchard_reconcile_errors_total",
            &[("error", "forbidden")]
        ),
        0.0,
        "the operator hit RBAC denials; log: {}",
        log.display()
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !log_text.contains("is forbidden"),
        "RBAC denial in the operator log:\n{log_text}"
    );
    operator.kill();
    env.delete_namespace(&namespace).await;
}

/// Stops this test's node and control plane only: `TestEnv::stop` also kills every process this test
/// binary started, which would take down the other test's cluster running in parallel.
async fn stop_own_cluster(env: &TestEnv) {
    env.node.hollow().shutdown().await;
    env.control_plane.stop();
}

#[tokio::test]
async fn helm_chart_installs_and_its_service_account_runs_the_operator() {
    let env = TestEnv::start(
        "install-helm",
        EnvOptions {
            operator: false,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    create_namespace(&env, RELEASE_NAMESPACE).await;
    let manifests = helm_default();
    apply(&env, &manifests, false);
    let rendered = documents(&manifests);

    // The fully customised render and the samples are accepted by the real API server too (dry run;
    // ServiceMonitor has no CRD here, the full render's watched namespace is created first).
    create_namespace(&env, "rl-sandboxes").await;
    create_namespace(&env, "monitoring").await;
    let full: Vec<String> = documents(&helm_full())
        .into_iter()
        .filter(|d| d["kind"] != "ServiceMonitor")
        .map(|d| serde_yaml::to_string(&d).expect("YAML"))
        .collect();
    apply(&env, &full.join("---\n"), true);
    let samples = kustomize("samples");
    kubectl(
        &env.control_plane.kubeconfig,
        &["apply", "--dry-run=server", "-n", "rl-sandboxes", "-f", "-"],
        Some(&samples),
    );

    operator_under_service_account_runs_a_sandbox(
        &env,
        &rendered,
        "sandbox_minimal.yaml",
        "minimal",
    )
    .await;
    stop_own_cluster(&env).await;
}

#[tokio::test]
async fn kustomize_default_installs_and_its_service_account_runs_the_operator() {
    let env = TestEnv::start(
        "install-kustomize",
        EnvOptions {
            operator: false,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    apply(&env, &kustomize("default"), false);
    // Then the HA overlay on top (two replicas, leader election, a PodDisruptionBudget), as a user
    // moving to HA would; the operator runs with the HA Deployment's flags, so the Lease RBAC is
    // exercised too.
    let manifests = kustomize("overlays/ha");
    apply(&env, &manifests, false);
    let rendered = documents(&manifests);
    // The AllowList sample also makes the operator create a per-sandbox egress NetworkPolicy.
    operator_under_service_account_runs_a_sandbox(
        &env,
        &rendered,
        "sandbox_allowlist.yaml",
        "allowlist",
    )
    .await;

    committed_schemas_match_the_live_api_server(&env).await;
    stop_own_cluster(&env).await;
}

/// e2e/packaging-tools/schemas/kubernetes-v1.36.3 is what openapi2schema makes of this cluster's
/// /openapi/v2 (the real kube-apiserver v1.36.3), for the kinds in kinds.txt.
async fn committed_schemas_match_the_live_api_server(env: &TestEnv) {
    let client = env.client().await;
    let request = http::Request::get("/openapi/v2")
        .body(Vec::new())
        .expect("request");
    let openapi = client.request_text(request).await.expect("GET /openapi/v2");
    let work = env.dir.join("schemas");
    std::fs::create_dir_all(&work).expect("schema dir");
    let document = work.join("openapi-v2.json");
    std::fs::write(&document, openapi).expect("write openapi");
    let generated = work.join("kubernetes");
    let root = workspace_root().join("e2e/packaging-tools/schemas");
    run(Command::new(tools_dir().join("openapi2schema"))
        .arg("openapi")
        .arg("-in")
        .arg(&document)
        .arg("-out")
        .arg(&generated)
        .arg("-only")
        .arg(root.join("kinds.txt")));
    let committed = root.join("kubernetes-v1.36.3");
    let listing = |dir: &Path| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    let update = std::env::var("ORCHARD_UPDATE_SCHEMAS").is_ok();
    if update {
        let _ = std::fs::remove_dir_all(&committed);
        std::fs::create_dir_all(&committed).expect("create schema dir");
    }
    for name in listing(&generated) {
        let fresh = std::fs::read(generated.join(&name)).expect("generated schema");
        if update {
            std::fs::write(committed.join(&name), &fresh).expect("write schema");
        } else {
            let old = std::fs::read(committed.join(&name)).unwrap_or_default();
            assert!(
                old == fresh,
                "{name} differs from what the live kube-apiserver serves: rerun with ORCHARD_UPDATE_SCHEMAS=1"
            );
        }
    }
    assert_eq!(
        listing(&committed),
        listing(&generated),
        "committed schema files differ from kinds.txt"
    );
}
