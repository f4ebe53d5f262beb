//! Documentation that must follow the code and the chart, with no cluster: the Grafana dashboard
//! queries only metrics docs/METRICS.md documents, every metric the operator registers is documented
//! there, the values reference of docs/CONFIGURATION.md is what `make docs` generates from
//! values.yaml (the test only compares; it never writes the file), and every code block of the user
//! docs is run by a test or marked illustrative with the reason (`orchard_testcluster::doc_blocks`).

use std::collections::BTreeSet;

use orchard_testcluster::binaries::workspace_root;
use orchard_testcluster::test_support::manifests::CHART;
use serde_json::Value;
use xtask::config_reference::{self, CONFIGURATION_MD, MAKE_TARGET};

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
    let source = [
        "operator/src/plumbing/metrics.rs",
        "operator/src/gateway/http/metrics.rs",
    ]
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
        "metrics registered in operator/src/plumbing/metrics.rs or gateway/http/metrics.rs but not in docs/METRICS.md: {missing:?}"
    );
}

#[test]
fn configuration_reference_is_generated_from_values_yaml() {
    let doc = config_reference::generate(&workspace_root()).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        doc.is_up_to_date(),
        "{CONFIGURATION_MD} is out of date with values.yaml: run `{MAKE_TARGET}`\n\
         expected table:\n{}",
        doc.table
    );
}

/// The user documentation whose code blocks a reader pastes.
const USER_DOCS: &[&str] = &[
    "README.md",
    "docs/QUICKSTART.md",
    "docs/SDK.md",
    "docs/TRAINERS.md",
    "docs/INSTALL.md",
    "docs/POOLS.md",
    "docs/KUBECTL.md",
    "docs/HARNESSES.md",
];

/// The documents a test runs whole, block by block (they need no markers), and that test.
const RUN_WHOLE: &[(&str, &str)] = &[("docs/QUICKSTART.md", "e2e/tests/docs_run.rs")];

#[test]
fn every_code_block_of_the_user_docs_is_run_by_a_test_or_says_why_not() {
    let root = workspace_root();
    let mut problems = Vec::new();
    for doc in USER_DOCS {
        let text = std::fs::read_to_string(root.join(doc)).expect("doc");
        if let Some((_, test)) = RUN_WHOLE.iter().find(|(whole, _)| whole == doc) {
            let runner = std::fs::read_to_string(root.join(test)).unwrap_or_default();
            assert!(runner.contains(doc), "{test} does not read {doc}");
            continue;
        }
        problems.extend(orchard_testcluster::doc_blocks::unaccounted(
            doc,
            &text,
            |path| {
                // The test named must exist and read this document.
                std::fs::read_to_string(root.join(path))
                    .is_ok_and(|test| test.contains(doc.rsplit('/').next().unwrap_or(doc)))
            },
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
