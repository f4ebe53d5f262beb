//! `bench-real` (`make bench-real`): the hollow node and the real node side by side, same run, same
//! driver (`bench-scale`), alternating nodes for each size:
//! - one sandbox at a time (20 in a row): create -> Ready, split into its steps; exec through the gateway;
//! - 50 sandboxes at once: create -> Ready;
//! - 200 sandboxes: create -> Ready -> 4 execs -> delete, success rate and total time.
//!
//! Records the load average before and after each run (the machine is shared), and each bench-scale
//! run's quiet wait and CPU steal. Writes the section "Real node" of `--write-doc`.
//!
//! ```text
//! bench-real [--write-doc docs/BENCHMARKS.md] [--large N]
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

fn run(exe_dir: &Path, real: bool, sandboxes: usize, concurrency: usize) -> Option<Value> {
    let json = std::env::temp_dir().join(format!(
        "bench-real-{}-{}-{sandboxes}.json",
        std::process::id(),
        if real { "real" } else { "hollow" }
    ));
    let mut command = Command::new(exe_dir.join("bench-scale"));
    command.args([
        "--sandboxes",
        &sandboxes.to_string(),
        "--concurrency",
        &concurrency.to_string(),
        "--execs",
        "4",
        "--json",
    ]);
    command.arg(&json);
    if real {
        command.arg("--real-node");
    }
    let before = load_average();
    eprintln!(
        "bench-real: {} node, {sandboxes} sandboxes, concurrency {concurrency} (load {before})",
        if real { "real" } else { "hollow" }
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
    let mut results = Vec::new();
    for (label, sandboxes, concurrency) in SIZES {
        let hollow = run(&exe_dir, false, sandboxes, concurrency);
        let real = run(&exe_dir, true, sandboxes, concurrency);
        results.push((label, hollow, real));
    }

    let mut table = String::from("| run | metric | hollow node | real node |\n|---|---|---|---|\n");
    for (label, hollow, real) in &results {
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
            table.push_str(&format!(
                "| {label} | {metric} | {} | {} |\n",
                cell(hollow.as_ref(), &render),
                cell(real.as_ref(), &render)
            ));
        }
        let steps = |s: &Value| s["steps"].as_array().cloned().unwrap_or_default();
        let hollow_steps = hollow.as_ref().map(steps).unwrap_or_default();
        let real_steps = real.as_ref().map(steps).unwrap_or_default();
        for (i, step) in real_steps.iter().enumerate() {
            let render = |s: Option<&Value>| {
                s.map_or_else(
                    || "—".into(),
                    |s| format!("{} / {}", seconds(&s["p50"]), seconds(&s["p99"])),
                )
            };
            table.push_str(&format!(
                "| {label} | step: {} (p50 / p99) | {} | {} |\n",
                step["step"].as_str().unwrap_or("?"),
                render(hollow_steps.get(i)),
                render(Some(step))
            ));
        }
    }
    println!("{table}");
    if let Some(path) = write_doc {
        let section = format!(
            "## Real node\n\nCommand: `make bench-real` (release build). The same driver (`bench-scale`) on the hollow node (each sandbox's agent a host process) and on the real node (kubelet, containerd 2.4, runc, CNI bridge; every sandbox a container from the busybox image built here, with the real-node environment's defaults of {cpu} CPU and {memory} memory: the scheduler counts these requests against the node's two cores and 24 GiB, CPU limits are not enforced as quotas there), sizes alternating between the nodes in one run. Steps are the first time the driver's watches saw each milestone. Everything shares this machine's two cores.\n\n{table}",
            cpu = orchard_e2e::env::REAL_NODE_DEFAULT_CPU,
            memory = orchard_e2e::env::REAL_NODE_DEFAULT_MEMORY,
        );
        if let Err(err) = orchard_e2e::docs::write_section(&path, "## Real node", &section) {
            eprintln!("bench-real: cannot write {}: {err}", path.display());
        }
    }
    if results.iter().any(|(_, h, r)| h.is_none() || r.is_none()) {
        std::process::exit(1);
    }
}
