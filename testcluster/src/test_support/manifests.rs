//! Helpers of the install-manifest tests (used by
//! `manifests_rbac.rs`, `manifests_hardening.rs`, `manifests_kubeconform.rs` and
//! `manifests_install.rs`): the packaging tools, rendering the Helm chart and the kustomize bases, YAML
//! streams as JSON documents, a container's environment, and the operator's flags.

use std::collections::BTreeMap;
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
