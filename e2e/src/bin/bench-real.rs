//! `bench-real` (`make bench-real`): the hollow node and the real node (with the agent injected by an
//! init container, then by an image volume) side by side, same run, same driver (`bench-scale`),
//! alternating setups for each size:
//! - one sandbox at a time (20 in a row): create -> Ready, split into its steps; exec through the gateway;
//! - 50 sandboxes at once: create -> Ready;
//! - 200 sandboxes: create -> Ready -> 4 execs -> delete, success rate and total time.
//!
//! Records the load average before and after each run (the machine is shared), and each bench-scale
//! run's quiet wait and CPU steal, and the CPU split per component of the largest size. Writes the
//! section "Real node" of `--write-doc`.
//!
//! ```text
//! bench-real [--write-doc docs/BENCHMARKS.md]
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use orchard_e2e::cluster_process::load_average;
use serde_json::Value;

/// One row of the matrix: label, sandboxes, client concurrency.
const SIZES: [(&str, usize, usize); 3] = [
    ("1 at a time (20 in a row)", 20, 1),
    ("50 at once", 50, 50),
    ("200, create -> Ready -> 4 execs -> delete", 200, 200),
];

/// The compared setups, in the order each size runs them: the hollow node, then the real node with
/// each way of injecting the agent.
const NODES: [Node; 3] = [
    Node {
        header: "hollow node",
        real: false,
        operator_args: &[],
    },
    Node {
        header: "real node (agent by init container)",
        real: true,
        operator_args: &["--agent-injection=init-container"],
    },
    Node {
        header: "real node (agent by image volume)",
        real: true,
        operator_args: &["--agent-injection=image-volume"],
    },
];

/// One compared setup.
struct Node {
    header: &'static str,
    real: bool,
    operator_args: &'static [&'static str],
}

fn run(exe_dir: &Path, node: &Node, sandboxes: usize, concurrency: usize) -> Option<Value> {
    let json = std::env::temp_dir().join(format!(
        "bench-real-{}-{sandboxes}.json",
        std::process::id()
    ));
    let mut command = Command::new(exe_dir.join("bench-scale"));
    command.args([
        "--sandboxes",
        &sandboxes.to_string(),
        "--concurrency",
        &concurrency.to_string(),
        "--execs",
        "4",
        // One round per setup and size: the setups need clusters of their own, so bench-real
        // alternates them across sizes instead (bench-scale's rounds give the spread of a repeat).
        "--rounds",
        "1",
        "--json",
    ]);
    command.arg(&json);
    if node.real {
        command.arg("--real-node");
    }
    if !node.operator_args.is_empty() {
        command.arg("--").args(node.operator_args);
    }
    let before = load_average();
    eprintln!(
        "bench-real: {}, {sandboxes} sandboxes, concurrency {concurrency} (load {before})",
        node.header
    );
    let status = command.status().ok()?;
    let after = load_average();
    let mut summary: Value = serde_json::from_str(&std::fs::read_to_string(&json).ok()?).ok()?;
    let _ = std::fs::remove_file(&json);
    summary["loadBefore"] = Value::String(before);
    summary["loadAfter"] = Value::String(after);
    summary["exitOk"] = Value::Bool(status.success());
    Some(summary)
}

/// How one metric of a run's summary is shown.
type Render = Box<dyn Fn(&Value) -> String>;

fn cell(summary: Option<&Value>, render: impl Fn(&Value) -> String) -> String {
    summary.map_or_else(|| "failed to run".into(), render)
}

fn seconds(v: &Value) -> String {
    format!("{:.2} s", v.as_f64().unwrap_or(f64::NAN))
}

/// A table header row and its separator for `headers` after the leading `first` columns (pure).
fn header(first: &[&str], headers: &[&str]) -> String {
    let columns: Vec<&str> = first.iter().chain(headers).copied().collect();
    format!(
        "| {} |\n|{}\n",
        columns.join(" | "),
        "---|".repeat(columns.len())
    )
}

/// The CPU split of the runs of one size (bench-scale's `cpuSeconds`), one column per run:
/// components by their CPU seconds in the last run, then those only earlier runs have (pure).
fn cpu_table(headers: &[&str], runs: &[Option<Value>]) -> String {
    let split = |run: &Option<Value>| -> Vec<(String, f64)> {
        run.as_ref()
            .and_then(|r| r["cpuSeconds"].as_array().cloned())
            .map(|rows| {
                rows.iter()
                    .filter_map(|row| {
                        Some((
                            row["component"].as_str()?.to_string(),
                            row["seconds"].as_f64()?,
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let splits: Vec<Vec<(String, f64)>> = runs.iter().map(split).collect();
    let totals: Vec<f64> = splits
        .iter()
        .map(|rows| rows.iter().map(|(_, s)| s).sum())
        .collect();
    let mut names: Vec<String> = Vec::new();
    for rows in splits.iter().rev() {
        let mut sorted = rows.clone();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, _) in sorted {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    let mut table = header(&["component"], headers);
    for name in &names {
        let cells: Vec<String> = splits
            .iter()
            .zip(&totals)
            .map(|(rows, total)| {
                rows.iter().find(|(n, _)| n == name).map_or_else(
                    || "—".to_string(),
                    |(_, s)| format!("{s:.1} s ({:.0} %)", 100.0 * s / total.max(1e-9)),
                )
            })
            .collect();
        table.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    let totals: Vec<String> = runs
        .iter()
        .zip(&totals)
        .map(|(run, t)| match run {
            Some(_) => format!("{t:.1} s"),
            None => "failed to run".to_string(),
        })
        .collect();
    table.push_str(&format!("| **total** | {} |\n", totals.join(" | ")));
    table
}

fn main() {
    let mut write_doc: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--write-doc" => write_doc = args.next().map(PathBuf::from),
            _ => {
                eprintln!("usage: bench-real [--write-doc PATH]");
                std::process::exit(2);
            }
        }
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("."));
    let headers: Vec<&str> = NODES.iter().map(|n| n.header).collect();
    let mut results: Vec<(&str, Vec<Option<Value>>)> = Vec::new();
    for (label, sandboxes, concurrency) in SIZES {
        let runs = NODES
            .iter()
            .map(|node| run(&exe_dir, node, sandboxes, concurrency))
            .collect();
        results.push((label, runs));
    }

    let mut table = header(&["run", "metric"], &headers);
    for (label, runs) in &results {
        let rows: [(&str, Render); 6] = [
            (
                "success",
                Box::new(|s: &Value| format!("{}/{}", s["ok"], s["sandboxes"])),
            ),
            (
                "total time",
                Box::new(|s: &Value| seconds(&s["endToEndSeconds"])),
            ),
            (
                "create -> Ready p50 / p99",
                Box::new(|s: &Value| {
                    format!(
                        "{} / {}",
                        seconds(&s["readySeconds"]["p50"]),
                        seconds(&s["readySeconds"]["p99"])
                    )
                }),
            ),
            (
                "exec through the gateway p50 / p99",
                Box::new(|s: &Value| {
                    format!(
                        "{:.1} / {:.1} ms",
                        s["execMilliseconds"]["p50"].as_f64().unwrap_or(f64::NAN),
                        s["execMilliseconds"]["p99"].as_f64().unwrap_or(f64::NAN)
                    )
                }),
            ),
            (
                "load average before -> after",
                Box::new(|s: &Value| {
                    format!(
                        "{} -> {}",
                        s["loadBefore"].as_str().unwrap_or("?"),
                        s["loadAfter"].as_str().unwrap_or("?")
                    )
                }),
            ),
            (
                "machine (bench-scale's quiet wait, load, CPU steal)",
                Box::new(|s: &Value| s["machine"].as_str().unwrap_or("?").to_string()),
            ),
        ];
        for (metric, render) in rows {
            let cells: Vec<String> = runs.iter().map(|r| cell(r.as_ref(), &render)).collect();
            table.push_str(&format!("| {label} | {metric} | {} |\n", cells.join(" | ")));
        }
        let steps: Vec<Vec<Value>> = runs
            .iter()
            .map(|r| {
                r.as_ref()
                    .and_then(|s| s["steps"].as_array().cloned())
                    .unwrap_or_default()
            })
            .collect();
        let step_names = steps
            .iter()
            .max_by_key(|s| s.len())
            .cloned()
            .unwrap_or_default();
        for (i, step) in step_names.iter().enumerate() {
            let cells: Vec<String> = steps
                .iter()
                .map(|s| {
                    s.get(i).map_or_else(
                        || "—".into(),
                        |s| format!("{} / {}", seconds(&s["p50"]), seconds(&s["p99"])),
                    )
                })
                .collect();
            table.push_str(&format!(
                "| {label} | step: {} (p50 / p99) | {} |\n",
                step["step"].as_str().unwrap_or("?"),
                cells.join(" | ")
            ));
        }
    }
    let (largest, runs) = &results[results.len() - 1];
    let cpu = cpu_table(&headers, runs);
    println!("{table}\n{cpu}");
    if let Some(path) = write_doc {
        let section = format!(
            "## Real node\n\nCommand: `make bench-real` (release build). The same driver (`bench-scale`) on the hollow node (each sandbox's agent a host process) and on the real node (kubelet, containerd 2.4, runc, CNI bridge; every sandbox a container from the busybox image built here, with the real-node environment's defaults of {cpu_request} CPU and {memory} memory: the scheduler counts these requests against the node's two cores and 24 GiB, CPU limits are not enforced as quotas there), once with the agent copied in by an init container (`--agent-injection=init-container`, the default) and once mounted from the agent image as an image volume (`--agent-injection=image-volume`: no init container), sizes alternating between the setups in one run. Steps are the first time the driver's watches saw each milestone. Everything shares this machine's two cores.\n\n{table}\nWhere the CPU goes in the run \"{largest}\", from the first create until every pod was gone. For the control plane, the operator, the driver and the hollow node: CPU seconds of each process from `/proc/<pid>/stat`. On the real node, each component runs in its own cgroup v1 `cpuacct` group (accounting only, like a systemd unit's slice), which also counts the processes it starts; containerd puts its shims in one (`ShimCgroup`), so every `runc` call is counted there; the pods' containers are counted in the kubelet's `kubepods` cgroup.\n\n{cpu}",
            cpu_request = orchard_e2e::env::REAL_NODE_DEFAULT_CPU,
            memory = orchard_e2e::env::REAL_NODE_DEFAULT_MEMORY,
        );
        if let Err(err) = orchard_e2e::docs::write_section(&path, "## Real node", &section) {
            eprintln!("bench-real: cannot write {}: {err}", path.display());
        }
    }
    if results
        .iter()
        .any(|(_, runs)| runs.iter().any(Option::is_none))
    {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_table_orders_by_the_last_run_and_keeps_rows_only_earlier_runs_have() {
        let hollow = serde_json::json!({"cpuSeconds": [
            {"component": "kube-apiserver", "seconds": 3.0},
            {"component": "local-node", "seconds": 1.0},
        ]});
        let real = serde_json::json!({"cpuSeconds": [
            {"component": "kube-apiserver", "seconds": 2.0},
            {"component": "containerd shims and runc", "seconds": 6.0},
        ]});
        let table = cpu_table(
            &["hollow", "real", "failed"],
            &[Some(hollow), Some(real), None],
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                "| component | hollow | real | failed |",
                "|---|---|---|---|",
                "| containerd shims and runc | — | 6.0 s (75 %) | — |",
                "| kube-apiserver | 3.0 s (75 %) | 2.0 s (25 %) | — |",
                "| local-node | 1.0 s (25 %) | — | — |",
                "| **total** | 4.0 s | 8.0 s | failed to run |",
            ]
        );
    }
}
