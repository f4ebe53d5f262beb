//! Helpers of the install-manifest tests (used by
//! `manifests_rbac.rs`, `manifests_hardening.rs`, `manifests_kubeconform.rs` and
//! `manifests_install.rs`): the packaging tools, rendering the Helm chart and the kustomize bases, YAML
//! streams as JSON documents, the operator's and the egress proxy's Deployments, a container's
//! environment, the flags of `orchard-operator` and `orchard-operator egress-proxy`, and what the
//! rendered bindings grant a ServiceAccount.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use crate::binaries::{operator_bin, workspace_root};
use serde_json::Value;

/// The Helm chart, relative to the workspace root.
pub const CHART: &str = "charts/orchard-env";
/// The namespace every render and install uses (as docs/INSTALL.md does).
pub const RELEASE_NAMESPACE: &str = "orchard-system";

/// Directory of helm, kubeconform and openapi2schema (built once by e2e/packaging-tools/build.sh).
pub fn tools_dir() -> PathBuf {
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

pub fn run(command: &mut Command) -> String {
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
pub fn helm_template(args: &[&str]) -> String {
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

pub fn helm_default() -> String {
    helm_template(&[])
}

pub fn helm_full() -> String {
    helm_template(&["-f", &format!("{CHART}/ci/full-values.yaml")])
}

/// `kubectl kustomize config/<dir>`.
pub fn kustomize(dir: &str) -> String {
    run(Command::new("kubectl")
        .current_dir(workspace_root())
        .args(["kustomize", &format!("config/{dir}")]))
}

/// Every non-empty document of a YAML stream, as JSON.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .filter_map(|document| {
            let value: Value = serde::Deserialize::deserialize(document).expect("valid YAML");
            (!value.is_null()).then_some(value)
        })
        .collect()
}

pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

pub fn one_of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "expected exactly one {kind}");
    found[0]
}

/// `app.kubernetes.io/name` of the operator's pods (the chart's `orchard-env.selectorLabels`).
pub const OPERATOR_APP: &str = "orchard-operator";
/// `app.kubernetes.io/name` of the egress proxy's pods (the chart's `orchard-env.egressSelectorLabels`).
pub const EGRESS_APP: &str = "orchard-egress";

/// The one Deployment whose selector picks pods labelled `app.kubernetes.io/name: <app>`: a render
/// has the operator's and the egress proxy's, told apart by their labels (their names follow the
/// release or `fullnameOverride`).
pub fn deployment<'a>(docs: &'a [Value], app: &str) -> &'a Value {
    let found: Vec<&Value> = of_kind(docs, "Deployment")
        .into_iter()
        .filter(|d| d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == app)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one Deployment of pods labelled app.kubernetes.io/name={app}"
    );
    found[0]
}

/// The operator's Deployment.
pub fn operator_deployment(docs: &[Value]) -> &Value {
    deployment(docs, OPERATOR_APP)
}

/// The egress proxy's Deployment.
pub fn egress_deployment(docs: &[Value]) -> &Value {
    deployment(docs, EGRESS_APP)
}

/// The one container of a Deployment's pod.
pub fn container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(
        containers.len(),
        1,
        "{} runs one container",
        deployment["metadata"]["name"]
    );
    &containers[0]
}

/// The ServiceAccount a Deployment's pods run as.
pub fn service_account_of(deployment: &Value) -> String {
    deployment["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName")
        .to_string()
}

/// The one object of `kind` named `name`.
pub fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = of_kind(docs, kind)
        .into_iter()
        .filter(|d| d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "expected exactly one {kind} {name}");
    found[0]
}

/// One permission a rendered Role or ClusterRole grants: (role kind, role name, role namespace — empty
/// for a ClusterRole —, apiGroup, resource, resourceNames joined by commas — empty: any —, verb).
pub type Grant = (String, String, String, String, String, String, String);

/// Every permission the rendered Roles and ClusterRoles grant, whoever they are bound to.
pub fn grants(docs: &[Value]) -> BTreeSet<Grant> {
    let mut grants = BTreeSet::new();
    for role in docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
    {
        let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
        let (kind, name, namespace) = (
            text(&role["kind"]),
            text(&role["metadata"]["name"]),
            text(&role["metadata"]["namespace"]),
        );
        for rule in role["rules"].as_array().expect("rules") {
            let names = strings(&rule["resourceNames"]).join(",");
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        grants.insert((
                            kind.clone(),
                            name.clone(),
                            namespace.clone(),
                            group.clone(),
                            resource.clone(),
                            names.clone(),
                            verb,
                        ));
                    }
                }
            }
        }
    }
    grants
}

/// The roles, as (kind, name, namespace), that the rendered RoleBindings and ClusterRoleBindings bind
/// to ServiceAccount `namespace/name` (a RoleBinding of a ClusterRole grants it in the binding's
/// namespace only: such a pair is reported with that namespace).
pub fn roles_bound_to(
    docs: &[Value],
    namespace: &str,
    name: &str,
) -> BTreeSet<(String, String, String)> {
    let mut roles = BTreeSet::new();
    for binding in docs
        .iter()
        .filter(|d| d["kind"] == "RoleBinding" || d["kind"] == "ClusterRoleBinding")
    {
        let binds = binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| {
                s["kind"] == "ServiceAccount" && s["name"] == name && s["namespace"] == namespace
            });
        if !binds {
            continue;
        }
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_namespace = match binding["kind"].as_str() {
            Some("RoleBinding") => binding["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default(),
            _ => "",
        };
        roles.insert((
            role_kind.to_string(),
            binding["roleRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            role_namespace.to_string(),
        ));
    }
    roles
}

/// What the rendered bindings grant ServiceAccount `namespace/name`: the grants of every role bound to
/// it. A ClusterRole bound by a RoleBinding is left out (no render has one; its grants are
/// namespace-scoped and would need a key of their own).
pub fn grants_to(docs: &[Value], namespace: &str, name: &str) -> BTreeSet<Grant> {
    let bound = roles_bound_to(docs, namespace, name);
    grants(docs)
        .into_iter()
        .filter(|(kind, role, role_namespace, ..)| {
            bound.contains(&(kind.clone(), role.clone(), role_namespace.clone()))
        })
        .collect()
}

pub fn strings(value: &Value) -> Vec<String> {
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

pub fn env_map(container: &Value) -> BTreeMap<String, String> {
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
pub fn operator_flags() -> BTreeMap<String, (String, bool)> {
    flags_of(&[], 11)
}

/// Flags of `orchard-operator egress-proxy --help` by environment variable: `(flag, takes a value)`.
pub fn egress_proxy_flags() -> BTreeMap<String, (String, bool)> {
    flags_of(&["egress-proxy"], 6)
}

/// Flags of `orchard-operator <subcommand...> --help` by environment variable; fewer than
/// `at_least` means the help text was not understood.
fn flags_of(subcommand: &[&str], at_least: usize) -> BTreeMap<String, (String, bool)> {
    let help = run(
        Command::new(operator_bin().expect("orchard-operator is built"))
            .args(subcommand)
            .arg("--help"),
    );
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
        flags.len() >= at_least,
        "could not parse `orchard-operator {} --help`:\n{help}",
        subcommand.join(" ")
    );
    flags
}
