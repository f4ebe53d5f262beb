//! The workspace's module graphs keep their rules: no import cycle between the files of any crate,
//! and the operator's layers import only downwards (docs/CONTROLLER.md, "Layers").

use std::path::{Path, PathBuf};

use orchard_layers::{Layers, cycles, graph, layer_violations, read_crate};

/// The operator's layers, lowest first: each may import the ones it lists (and itself).
const OPERATOR_LAYERS: Layers<'static> = &[
    ("plumbing", &[]),
    ("pod", &["plumbing"]),
    ("snapshot", &["plumbing", "pod"]),
    ("retry", &["plumbing", "pod"]),
    ("pool", &["plumbing", "pod", "snapshot"]),
    ("sandbox", &["plumbing", "pod", "pool", "retry", "snapshot"]),
    ("queue", &["plumbing"]),
    ("rollout", &["plumbing", "queue", "retry"]),
    ("gateway", &["plumbing", "pod"]),
    ("egress", &["plumbing", "pod"]),
    (
        "app",
        &[
            "plumbing", "pod", "snapshot", "retry", "pool", "sandbox", "queue", "rollout",
            "gateway", "egress",
        ],
    ),
];

/// Crates whose files must not import each other in a circle.
const CRATES: &[&str] = &[
    "operator",
    "agent",
    "api",
    "bar",
    "bench-support",
    "kubectl-orchard",
    "testcluster",
    "bench",
    "xtask",
];

fn src(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src")
}

#[test]
fn no_crate_has_an_import_cycle_between_its_files() {
    let mut report = Vec::new();
    for krate in CRATES {
        let files = read_crate(&src(krate)).expect("readable sources");
        assert!(!files.is_empty(), "{krate}: no sources read");
        for cycle in cycles(&graph(&files)) {
            report.push(format!("{krate}: {}", cycle.join(" <-> ")));
        }
    }
    assert!(
        report.is_empty(),
        "import cycles (break each by moving what both sides share into a module below both):\n{}",
        report.join("\n")
    );
}

#[test]
fn the_operators_layers_import_only_downwards() {
    let files = read_crate(&src("operator")).expect("readable sources");
    let tops: std::collections::BTreeSet<String> = files
        .iter()
        .filter_map(|f| f.module.first().cloned())
        .collect();
    for top in &tops {
        assert!(
            OPERATOR_LAYERS.iter().any(|(name, _)| name == top),
            "operator/src/{top}: a top-level module the layer table does not place"
        );
    }
    let violations = layer_violations(&graph(&files), OPERATOR_LAYERS);
    assert!(
        violations.is_empty(),
        "imports against the layers:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_layer_map_of_the_docs_names_every_layer_top_down() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/CONTROLLER.md");
    let doc = std::fs::read_to_string(&path).expect("docs/CONTROLLER.md");
    let map = doc
        .split("## Layers")
        .nth(1)
        .and_then(|section| section.split("\n## ").next())
        .expect("a `## Layers` section");
    let positions: Vec<(usize, &str)> = OPERATOR_LAYERS
        .iter()
        .map(|(name, _)| {
            let at = map
                .find(&format!("\n  {name}/"))
                .unwrap_or_else(|| panic!("docs/CONTROLLER.md's layer map does not name {name}/"));
            (at, *name)
        })
        .collect();
    // The table lists layers bottom-up, the map top-down.
    for pair in positions.windows(2) {
        assert!(
            pair[0].0 > pair[1].0,
            "docs/CONTROLLER.md lists {} above {}; the map goes top-down",
            pair[0].1,
            pair[1].1
        );
    }
}
