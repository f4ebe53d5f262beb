//! `bench-real` (`make bench-real`): the hollow node and the real node (with the agent injected by an
//! init container, then by an image volume) side by side, same run, same driver (`bench-scale`),
//! in rounds (3 by default), each running every size on every setup with the setups' order rotating:
//! - one sandbox at a time (20 in a row): create -> Ready, split into its steps; exec through the gateway;
//! - 50 sandboxes at once: create -> Ready;
//! - 200 sandboxes: create -> Ready -> 4 execs -> delete, success rate and total time.
//!
//! Every cell is the median over the rounds with the lowest and highest. Records the load average
//! before and after each run (the machine is shared), each bench-scale run's quiet wait and CPU
//! steal, and the CPU split per component of the largest size. Writes the section "Real node" of
//! `--write-doc`.
//!
//! ```text
//! bench-real [--rounds N] [--write-doc docs/BENCHMARKS.md]
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use orchard_bench_support::{median, median_spread};
use orchard_testcluster::cluster_process::load_average;
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
        // One bench-scale round per run: every run needs a cluster of its own (the setups differ),
        // so bench-real makes the rounds itself, alternating the setups.
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

/// The runs of one setup at one size, one per round (`None`: the run failed to start or report).
type Rounds = Vec<Option<Value>>;

/// `median (min–max)` over the rounds of the number `pick` finds in each run's summary, shown with
/// `show`; rounds without it are left out, and failed rounds are named (pure).
fn over_rounds(
    rounds: &[Option<Value>],
    pick: impl Fn(&Value) -> Option<f64>,
    show: impl Fn(f64) -> String,
) -> String {
    let values: Vec<f64> = rounds.iter().flatten().filter_map(pick).collect();
    over_rounds_of(rounds, &values, show)
}

fn seconds(v: f64) -> String {
    format!("{v:.2} s")
}

fn milliseconds(v: f64) -> String {
    format!("{v:.1} ms")
}

/// Successes over every round of one setup and size, e.g. `600/600` (pure).
fn success(rounds: &[Option<Value>]) -> String {
    let ran: Vec<&Value> = rounds.iter().flatten().collect();
    let ok: u64 = ran.iter().filter_map(|s| s["ok"].as_u64()).sum();
    let all: u64 = ran.iter().filter_map(|s| s["sandboxes"].as_u64()).sum();
    let failed = rounds.len() - ran.len();
    if failed == 0 {
        format!("{ok}/{all}")
    } else {
        format!(
            "{ok}/{all}; {failed} of {} rounds failed to run",
            rounds.len()
        )
    }
}

/// `; failed: N x first message, ...` for a run whose summary lists failed sandboxes, else empty
/// (pure).
fn failures(summary: &Value) -> String {
    let groups: Vec<String> = summary["errors"]
        .as_array()
        .map(|groups| {
            groups
                .iter()
                .map(|g| format!("{} x `{}`", g["count"], g["first"].as_str().unwrap_or("?")))
                .collect()
        })
        .unwrap_or_default();
    if groups.is_empty() {
        String::new()
    } else {
        format!("; failed: {}", groups.join(", "))
    }
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

/// Component -> CPU seconds of one run (bench-scale's `cpuSeconds`).
fn cpu_split(run: &Value) -> Vec<(String, f64)> {
    run["cpuSeconds"]
        .as_array()
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
}

/// The CPU split of the runs of one size, one column per setup: each component's median CPU
/// seconds over the rounds with the lowest and highest in brackets, and its share of the median
/// total; components by their median in the last setup, then those only earlier setups have (pure).
fn cpu_table(headers: &[&str], setups: &[Rounds]) -> String {
    let splits: Vec<Vec<Vec<(String, f64)>>> = setups
        .iter()
        .map(|rounds| rounds.iter().flatten().map(cpu_split).collect())
        .collect();
    let seconds_of = |runs: &[Vec<(String, f64)>], name: &str| -> Vec<f64> {
        runs.iter()
            .filter_map(|rows| rows.iter().find(|(n, _)| n == name).map(|(_, s)| *s))
            .collect()
    };
    let totals: Vec<Vec<f64>> = splits
        .iter()
        .map(|runs| {
            runs.iter()
                .map(|rows| rows.iter().map(|(_, s)| s).sum())
                .collect()
        })
        .collect();
    let mut names: Vec<String> = Vec::new();
    for runs in splits.iter().rev() {
        let mut seen: Vec<(String, f64)> = Vec::new();
        for (name, _) in runs.iter().flatten() {
            if !seen.iter().any(|(n, _)| n == name) {
                let median_seconds = median(&seconds_of(runs, name)).unwrap_or(0.0);
                seen.push((name.clone(), median_seconds));
            }
        }
        seen.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, _) in seen {
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
            .map(|(runs, totals)| {
                let values = seconds_of(runs, name);
                match (median(&values), median(totals)) {
                    (Some(value), Some(total)) => format!(
                        "{} ({:.0} %)",
                        median_spread(&values, |s| format!("{s:.1} s")),
                        100.0 * value / total.max(1e-9)
                    ),
                    _ => "—".to_string(),
                }
            })
            .collect();
        table.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    let totals: Vec<String> = setups
        .iter()
        .zip(&totals)
        .map(|(rounds, totals)| over_rounds_of(rounds, totals, |t| format!("{t:.1} s")))
        .collect();
    table.push_str(&format!("| **total** | {} |\n", totals.join(" | ")));
    table
}

/// `median (min–max)` of `values`, taken from those of `rounds` that ran, naming the failed ones
/// (pure).
fn over_rounds_of(
    rounds: &[Option<Value>],
    values: &[f64],
    show: impl Fn(f64) -> String,
) -> String {
    let failed = rounds.iter().filter(|r| r.is_none()).count();
    let shown = median_spread(values, show);
    match (failed, values.is_empty()) {
        (0, _) => shown,
        (_, true) => "failed to run".to_string(),
        _ => format!("{shown}; {failed} of {} rounds failed to run", rounds.len()),
    }
}

/// The order of the setups in `round`: rotated by one each round, so no setup always runs right
/// after another one's load (pure).
fn setup_order(round: usize, setups: usize) -> Vec<usize> {
    (0..setups).map(|i| (round + i) % setups).collect()
}

/// A numeric row of the comparison table: its metric, where a run's summary has it, how it is shown.
type NumberRow = (&'static str, fn(&Value) -> Option<f64>, fn(f64) -> String);

/// The comparison table: one block of rows per size, one column per setup, every cell over the
/// rounds (pure).
fn matrix(headers: &[&str], results: &[(&str, Vec<Rounds>)]) -> String {
    let numbers: [NumberRow; 5] = [
        ("total time", |s| s["endToEndSeconds"].as_f64(), seconds),
        (
            "create -> Ready p50",
            |s| s["readySeconds"]["p50"].as_f64(),
            seconds,
        ),
        (
            "create -> Ready p99",
            |s| s["readySeconds"]["p99"].as_f64(),
            seconds,
        ),
        (
            "exec through the gateway p50",
            |s| s["execMilliseconds"]["p50"].as_f64(),
            milliseconds,
        ),
        (
            "exec through the gateway p99",
            |s| s["execMilliseconds"]["p99"].as_f64(),
            milliseconds,
        ),
    ];
    let mut table = header(&["run", "metric"], headers);
    for (label, setups) in results {
        let cells: Vec<String> = setups.iter().map(|rounds| success(rounds)).collect();
        table.push_str(&format!(
            "| {label} | success, all rounds | {} |\n",
            cells.join(" | ")
        ));
        for (metric, pick, show) in numbers {
            let cells: Vec<String> = setups
                .iter()
                .map(|rounds| over_rounds(rounds, pick, show))
                .collect();
            table.push_str(&format!("| {label} | {metric} | {} |\n", cells.join(" | ")));
        }
        let step_names: Vec<String> = setups
            .iter()
            .flatten()
            .flatten()
            .filter_map(|s| s["steps"].as_array())
            .max_by_key(|steps| steps.len())
            .map(|steps| {
                steps
                    .iter()
                    .map(|s| s["step"].as_str().unwrap_or("?").to_string())
                    .collect()
            })
            .unwrap_or_default();
        for (i, name) in step_names.iter().enumerate() {
            let cells: Vec<String> = setups
                .iter()
                .map(|rounds| {
                    let p50 = over_rounds(rounds, |s| s["steps"][i]["p50"].as_f64(), seconds);
                    let p99 = over_rounds(rounds, |s| s["steps"][i]["p99"].as_f64(), seconds);
                    format!("{p50} / {p99}")
                })
                .collect();
            table.push_str(&format!(
                "| {label} | step: {name} (p50 / p99) | {} |\n",
                cells.join(" | ")
            ));
        }
    }
    table
}

fn main() {
    let mut write_doc: Option<PathBuf> = None;
    let mut rounds = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--write-doc", Some(path)) => write_doc = Some(PathBuf::from(path)),
            ("--rounds", Some(n)) if n.parse::<usize>().is_ok_and(|n| n > 0) => {
                rounds = n.parse().unwrap_or(rounds);
            }
            _ => {
                eprintln!(
                    "usage: bench-real [--rounds N (default 3, at least 1)] [--write-doc PATH]"
                );
                std::process::exit(2);
            }
        }
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("."));
    let headers: Vec<&str> = NODES.iter().map(|n| n.header).collect();
    // results[size][setup][round]
    let mut results: Vec<(&str, Vec<Rounds>)> = SIZES
        .iter()
        .map(|(label, _, _)| (*label, vec![Vec::new(); NODES.len()]))
        .collect();
    let mut machines: Vec<String> = Vec::new();
    for round in 0..rounds {
        for (size, (label, sandboxes, concurrency)) in SIZES.iter().enumerate() {
            for setup in setup_order(round, NODES.len()) {
                let node = &NODES[setup];
                eprintln!("bench-real: round {} of {rounds}", round + 1);
                let summary = run(&exe_dir, node, *sandboxes, *concurrency);
                machines.push(match &summary {
                    Some(s) => format!(
                        "{}. round {}, {label}, {}: load average {} before, {} after; {}{}",
                        machines.len() + 1,
                        round + 1,
                        node.header,
                        s["loadBefore"].as_str().unwrap_or("?"),
                        s["loadAfter"].as_str().unwrap_or("?"),
                        s["machine"].as_str().unwrap_or("?"),
                        failures(s)
                    ),
                    None => format!(
                        "{}. round {}, {label}, {}: failed to run",
                        machines.len() + 1,
                        round + 1,
                        node.header
                    ),
                });
                results[size].1[setup].push(summary);
            }
        }
    }

    let table = matrix(&headers, &results);
    let (largest, setups) = &results[results.len() - 1];
    let cpu = cpu_table(&headers, setups);
    let machine_list = machines
        .iter()
        .map(|line| format!("- {line}"))
        .collect::<Vec<_>>()
        .join("\n");
    println!("{table}\n{cpu}\n{machine_list}");
    if let Some(path) = write_doc {
        let section = format!(
            "## Real node\n\nCommand: `make bench-real` (release build). The same driver (`bench-scale`) on the hollow node (each sandbox's agent a host process) and on the real node (kubelet, containerd 2.4, runc, CNI bridge; every sandbox a container from the busybox image built here, with the real-node environment's defaults of {cpu_request} CPU and {memory} memory: the scheduler counts these requests against the node's two cores and 24 GiB, CPU limits are not enforced as quotas there), once with the agent copied in by an init container (`--agent-injection=init-container`, the default) and once mounted from the agent image as an image volume (`--agent-injection=image-volume`: no init container). {rounds} rounds; each round runs every size on every setup, each run on a fresh cluster, and the order of the setups rotates from round to round. Every cell is the median over the rounds with the lowest and highest in brackets. Steps are the first time the driver's watches saw each milestone. Everything shares this machine's two cores.\n\n{table}\nWhere the CPU goes in the run \"{largest}\", from the first create until every pod was gone (median CPU seconds over the rounds, lowest and highest in brackets; the share is of the median total). For the control plane, the operator, the driver and the hollow node: CPU seconds of each process from `/proc/<pid>/stat`. On the real node, each component runs in its own cgroup v1 `cpuacct` group (accounting only, like a systemd unit's slice), which also counts the processes it starts; containerd puts its shims in one (`ShimCgroup`), so every `runc` call is counted there; the pods' containers are counted in the kubelet's `kubepods` cgroup.\n\n{cpu}\nThe machine in each run, in order (load averages from `/proc/loadavg` around the run; bench-scale's own quiet wait, load and CPU steal):\n\n{machine_list}\n",
            cpu_request = orchard_testcluster::env::REAL_NODE_DEFAULT_CPU,
            memory = orchard_testcluster::env::REAL_NODE_DEFAULT_MEMORY,
        );
        if let Err(err) = orchard_bench::docs::write_section(&path, "## Real node", &section) {
            eprintln!("bench-real: cannot write {}: {err}", path.display());
        }
    }
    if results
        .iter()
        .any(|(_, setups)| setups.iter().flatten().any(Option::is_none))
    {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_table_takes_medians_over_rounds_and_keeps_rows_only_earlier_setups_have() {
        let hollow = |apiserver: f64| {
            Some(serde_json::json!({"cpuSeconds": [
                {"component": "kube-apiserver", "seconds": apiserver},
                {"component": "local-node", "seconds": 1.0},
            ]}))
        };
        let real = |shims: f64| {
            Some(serde_json::json!({"cpuSeconds": [
                {"component": "kube-apiserver", "seconds": 2.0},
                {"component": "containerd shims and runc", "seconds": shims},
            ]}))
        };
        let table = cpu_table(
            &["hollow", "real", "failed"],
            &[
                vec![hollow(3.0), hollow(5.0), hollow(4.0)],
                vec![real(6.0), None, real(8.0)],
                vec![None, None],
            ],
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines,
            [
                "| component | hollow | real | failed |",
                "|---|---|---|---|",
                "| containerd shims and runc | — | 8.0 s (6.0 s–8.0 s) (80 %) | — |",
                "| kube-apiserver | 4.0 s (3.0 s–5.0 s) (80 %) | 2.0 s (2.0 s–2.0 s) (20 %) | — |",
                "| local-node | 1.0 s (1.0 s–1.0 s) (20 %) | — | — |",
                "| **total** | 5.0 s (4.0 s–6.0 s) | 10.0 s (8.0 s–10.0 s); 1 of 3 rounds failed to run | failed to run |",
            ]
        );
    }

    #[test]
    fn cells_are_medians_over_the_rounds_and_name_failed_rounds() {
        let run = |seconds: f64, ok: u64| {
            Some(serde_json::json!({"endToEndSeconds": seconds, "ok": ok, "sandboxes": 200}))
        };
        let rounds = vec![run(90.0, 200), run(70.0, 200), run(80.0, 199)];
        let pick = |s: &Value| s["endToEndSeconds"].as_f64();
        assert_eq!(
            over_rounds(&rounds, pick, seconds),
            "80.00 s (70.00 s–90.00 s)"
        );
        assert_eq!(success(&rounds), "599/600");
        let with_failure = vec![run(90.0, 200), None];
        assert_eq!(
            over_rounds(&with_failure, pick, seconds),
            "90.00 s; 1 of 2 rounds failed to run"
        );
        assert_eq!(
            success(&with_failure),
            "200/200; 1 of 2 rounds failed to run"
        );
        assert_eq!(over_rounds(&[None], pick, seconds), "failed to run");
    }

    #[test]
    fn failed_sandboxes_are_listed_with_their_first_message() {
        let summary = serde_json::json!({"errors": [
            {"count": 2, "first": "wait: error sending request (after 30.1 s)"},
        ]});
        assert_eq!(
            failures(&summary),
            "; failed: 2 x `wait: error sending request (after 30.1 s)`"
        );
        assert_eq!(failures(&serde_json::json!({"errors": []})), "");
        assert_eq!(failures(&serde_json::json!({})), "");
    }

    #[test]
    fn the_setups_order_rotates_each_round() {
        assert_eq!(setup_order(0, 3), [0, 1, 2]);
        assert_eq!(setup_order(1, 3), [1, 2, 0]);
        assert_eq!(setup_order(2, 3), [2, 0, 1]);
        assert_eq!(setup_order(3, 3), [0, 1, 2]);
    }

    #[test]
    fn the_matrix_has_a_row_per_metric_and_step() {
        let summary = serde_json::json!({
            "ok": 20, "sandboxes": 20, "endToEndSeconds": 2.0,
            "readySeconds": {"p50": 0.5, "p99": 1.0},
            "execMilliseconds": {"p50": 1.5, "p99": 3.0},
            "steps": [{"step": "Pod created -> Pod bound", "p50": 0.1, "p99": 0.2}],
        });
        let table = matrix(
            &["one"],
            &[(
                "20 in a row",
                vec![vec![Some(summary.clone()), Some(summary)]],
            )],
        );
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[2], "| 20 in a row | success, all rounds | 40/40 |");
        assert_eq!(
            lines[3],
            "| 20 in a row | total time | 2.00 s (2.00 s–2.00 s) |"
        );
        assert_eq!(
            lines[8],
            "| 20 in a row | step: Pod created -> Pod bound (p50 / p99) | 0.10 s (0.10 s–0.10 s) / 0.20 s (0.20 s–0.20 s) |"
        );
        assert_eq!(lines.len(), 9);
    }
}
