//! The tables of the report: one row per round, CPU seconds per component, mean latencies from
//! Prometheus histograms.

use std::collections::BTreeMap;
use std::time::Duration;

use orchard_testcluster::proc_stats::percentile;

use super::batch::Outcome;

/// One round of the batch.
pub(crate) struct Round {
    pub(crate) outcomes: Vec<Outcome>,
    /// From the first create until the last delete was answered.
    pub(crate) end_to_end: Duration,
    /// Until every pod was gone.
    pub(crate) cleaned: Duration,
    pub(crate) operator_writes: f64,
    /// Every write the API server took (operator, node, garbage collector, driver).
    pub(crate) all_writes: f64,
    /// CPU seconds per component.
    pub(crate) cpu: BTreeMap<String, f64>,
    /// CPU seconds the whole machine was busy (every process and the kernel), if `/proc/stat` was
    /// readable.
    pub(crate) machine_busy: Option<f64>,
    pub(crate) machine: String,
}

impl Round {
    pub(crate) fn ok(&self) -> usize {
        self.outcomes.iter().filter(|o| o.ok).count()
    }
}

/// One row per round: success, times, create -> Ready p50, writes per sandbox, CPU seconds of every
/// component together and of the whole machine, and the machine (pure).
pub(crate) fn round_table(rounds: &[Round], sandboxes: usize) -> String {
    let mut table = String::from(
        "| round | success | end-to-end | all pods gone | create -> Ready p50 | all API writes per sandbox | CPU seconds: all components; the whole machine | machine |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (i, round) in rounds.iter().enumerate() {
        let mut ready: Vec<f64> = round
            .outcomes
            .iter()
            .filter(|o| o.ok)
            .map(|o| o.ready_ms)
            .collect();
        ready.sort_by(f64::total_cmp);
        table.push_str(&format!(
            "| {} | {}/{sandboxes} | {:.1} s | {:.1} s | {:.2} s | {:.2} | {:.1}; {} | {} |\n",
            i + 1,
            round.ok(),
            round.end_to_end.as_secs_f64(),
            round.cleaned.as_secs_f64(),
            percentile(&ready, 50.0) / 1e3,
            round.all_writes / sandboxes.max(1) as f64,
            round.cpu.values().fold(0.0, |total, s| total + s),
            round
                .machine_busy
                .map_or_else(|| "—".to_string(), |s| format!("{s:.1}")),
            round.machine
        ));
    }
    table
}

/// The CPU table: each component's CPU seconds per round (the mean over the rounds) with its share,
/// their total against the core-seconds the mean round had, and the whole machine's busy time with
/// the part no component accounts for (kernel threads, interrupts, processes outside the cluster).
/// Also returns the rows, largest first, and the machine's mean busy seconds per round (pure).
pub(crate) fn cpu_table(
    rounds: &[Round],
    mean_cleaned: f64,
    cpus: usize,
) -> (String, Vec<(String, f64)>, Option<f64>) {
    let mut table =
        String::from("| component | CPU seconds per round (mean) | share |\n|---|---|---|\n");
    let mut summed: BTreeMap<String, f64> = BTreeMap::new();
    for round in rounds {
        for (name, seconds) in &round.cpu {
            *summed.entry(name.clone()).or_default() += seconds;
        }
    }
    let per_round = rounds.len().max(1) as f64;
    let mut rows: Vec<(String, f64)> = summed
        .into_iter()
        .map(|(name, seconds)| (name, seconds / per_round))
        .collect();
    let total: f64 = rows.iter().map(|(_, s)| s).sum();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, seconds) in &rows {
        table.push_str(&format!(
            "| {name} | {seconds:.1} | {:.0} % |\n",
            100.0 * seconds / total.max(1e-9)
        ));
    }
    table.push_str(&format!(
        "| **total** ({cpus} cores x {mean_cleaned:.0} s, the mean round = {:.0} core-seconds available) | {total:.1} | |\n",
        cpus as f64 * mean_cleaned
    ));
    let busy: Vec<f64> = rounds.iter().filter_map(|r| r.machine_busy).collect();
    let machine_busy = (busy.len() == rounds.len() && !busy.is_empty())
        .then(|| busy.iter().sum::<f64>() / busy.len() as f64);
    if let Some(machine) = machine_busy {
        table.push_str(&format!(
            "| the whole machine busy (`/proc/stat`: every process and the kernel) | {machine:.1} | |\n\
             | of it not in a component above (kernel threads, interrupts, processes outside the cluster) | {:.1} | {:.0} % of the machine |\n",
            machine - total,
            100.0 * (machine - total) / machine.max(1e-9)
        ));
    }
    (table, rows, machine_busy)
}

/// Mean latency per label value of a Prometheus histogram (`_sum` / `_count`), as (label, seconds,
/// count). `label` may be `resource_verb` to combine kube-apiserver's `resource` and `verb` labels.
pub(crate) fn mean_latencies(text: &str, histogram: &str, label: &str) -> Vec<(String, f64, f64)> {
    let label_of = |line: &str, key: &str| -> Option<String> {
        let start = line.find(&format!("{key}=\""))? + key.len() + 2;
        let end = line[start..].find('"')? + start;
        Some(line[start..end].to_string())
    };
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (is_sum, is_count) = (
            line.starts_with(&format!("{histogram}_sum")),
            line.starts_with(&format!("{histogram}_count")),
        );
        if !is_sum && !is_count {
            continue;
        }
        let key = if label == "resource_verb" {
            match (
                label_of(line, "verb"),
                label_of(line, "resource"),
                label_of(line, "subresource"),
            ) {
                (Some(verb), Some(resource), sub) => {
                    let sub = sub
                        .filter(|s| !s.is_empty())
                        .map(|s| format!("/{s}"))
                        .unwrap_or_default();
                    format!("{verb} {resource}{sub}")
                }
                _ => continue,
            }
        } else {
            match label_of(line, label) {
                Some(value) => value,
                None => continue,
            }
        };
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let entry = sums.entry(key).or_default();
        if is_sum {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, count))| *count > 0.0)
        .map(|(key, (sum, count))| (key, sum / count, count))
        .collect()
}

pub(crate) fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}
