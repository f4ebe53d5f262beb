//! What `bench-control-plane` measured and the section of docs/BENCHMARKS.md it writes (pure): the
//! control plane at scale on KWOK nodes, beside kubernetes-sigs/agent-sandbox's release gate.

use crate::audit_summary::WriteRow;
use orchard_testcluster::proc_stats::percentile;

/// agent-sandbox's KWOK release gate: claim latency p50 at most this many seconds.
pub const GATE_P50: f64 = 0.300;
/// agent-sandbox's KWOK release gate: claim latency p99 at most this many seconds.
pub const GATE_P99: f64 = 0.500;

/// The heading of the section this benchmark writes.
pub const HEADING: &str = "## Control plane at scale";

/// A latency distribution, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Latencies {
    /// How many.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Latencies {
    /// The distribution of `values` (any order).
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        if values.is_empty() {
            return Self::default();
        }
        Self {
            count: values.len(),
            p50: percentile(&values, 50.0),
            p99: percentile(&values, 99.0),
            max: values[values.len() - 1],
        }
    }

    fn cells(&self) -> String {
        format!(
            "{} | {} | {}",
            millis(self.p50),
            millis(self.p99),
            millis(self.max)
        )
    }

    /// Whether p50 and p99 are within agent-sandbox's gate, said in words.
    pub fn against_gate(&self) -> &'static str {
        match (self.p50 <= GATE_P50, self.p99 <= GATE_P99) {
            (true, true) => "within",
            (true, false) => "p50 within, p99 over",
            (false, true) => "p50 over, p99 within",
            (false, false) => "over",
        }
    }
}

fn millis(seconds: f64) -> String {
    if seconds >= 10.0 {
        format!("{seconds:.1} s")
    } else {
        format!("{:.0} ms", seconds * 1000.0)
    }
}

/// CPU seconds and memory of the processes of the control plane over one phase.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Costs {
    /// The operator's CPU seconds.
    pub operator_cpu: f64,
    /// kube-apiserver's CPU seconds.
    pub apiserver_cpu: f64,
    /// etcd's CPU seconds.
    pub etcd_cpu: f64,
    /// kube-scheduler's, KWOK's and kube-controller-manager's CPU seconds.
    pub others_cpu: f64,
    /// The driver's own CPU seconds (this process: creates, watches, the harness's results).
    pub driver_cpu: f64,
    /// The operator's resident memory at the end, bytes.
    pub operator_rss: u64,
}

impl Costs {
    /// Every process's CPU seconds.
    pub fn total_cpu(&self) -> f64 {
        self.operator_cpu + self.apiserver_cpu + self.etcd_cpu + self.others_cpu + self.driver_cpu
    }
}

/// One timed phase of sandboxes created and made Ready.
#[derive(Debug, Clone, PartialEq)]
pub struct Creation {
    /// What the phase did, in words (`10,000 at 100/s`).
    pub label: String,
    /// Creates a second asked for (0: all at once).
    pub rate: f64,
    /// Creates a second sent (the number over the time from the first to the last create).
    pub sent_rate: f64,
    /// Ready a second (the number over the time from the first create to the last Ready).
    pub ready_rate: f64,
    /// create -> Ready, as the driver saw it (its create call to its watch's Ready).
    pub latency: Latencies,
    /// create -> Ready of the last tenth created (latency growing under the load shows here).
    pub last_tenth: Latencies,
    /// The operator's own part of create -> Ready: create -> its Pod seen, plus the Pod seen Ready ->
    /// the Sandbox seen Ready (the rest is kube-scheduler's and KWOK's); `None` where the sandbox
    /// makes no Pod (a pool claim).
    pub operator_share: Option<Latencies>,
    /// What it cost.
    pub costs: Costs,
}

/// RolloutGroups through one queue.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Groups {
    /// Groups created at once.
    pub groups: usize,
    /// groupSize.
    pub size: u32,
    /// maxTrajectories.
    pub max_trajectories: u32,
    /// The queue's maxRunningTrajectories.
    pub slots: u32,
    /// From the creates to the last group Complete, seconds.
    pub seconds: f64,
    /// Trajectories launched in all.
    pub trajectories: u64,
    /// Groups recorded Balanced.
    pub balanced: usize,
    /// Groups dropped.
    pub dropped: usize,
    /// What it cost.
    pub costs: Costs,
}

/// Many sandboxes held, and the operator restarted among them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Held {
    /// Sandboxes held (Ready).
    pub sandboxes: usize,
    /// The operator's resident memory with none, bytes.
    pub operator_rss_empty: u64,
    /// The operator's resident memory with them all, bytes.
    pub operator_rss: u64,
    /// kube-apiserver's resident memory with them all, bytes.
    pub apiserver_rss: u64,
    /// etcd's resident memory with them all, bytes.
    pub etcd_rss: u64,
    /// From the kill to the restarted operator's `/readyz` (caches filled), seconds.
    pub restart_ready: f64,
    /// From the kill until the restarted operator had finished as many Sandbox reconciles as there are
    /// Sandboxes (each is reconciled once after its watch cache fills), seconds.
    pub restart_reconciled: f64,
    /// Writes the restarted operator sent until then (`orchard_api_writes_total`).
    pub restart_writes: f64,
    /// The restarted operator's CPU seconds until then.
    pub restart_cpu: f64,
    /// The restarted operator's peak resident memory until then, bytes.
    pub restart_peak_rss: u64,
    /// The restarted operator's resident memory once every Sandbox was reconciled, bytes.
    pub restart_rss: u64,
    /// What one object takes in the operator's watch caches.
    pub cache_heap: Option<CacheHeap>,
}

/// What one object takes in the operator's watch caches: a sample of the held objects as the API
/// server served them, decoded into a reflector store by the driver with a counting allocator
/// (`orchard_bench::cache_heap`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheHeap {
    /// Objects of each kind in the sample.
    pub sample: usize,
    /// A sandbox Pod decoded whole (its metadata trimmed as every watch of the operator trims it:
    /// `plumbing::watch::trim_metadata`), heap bytes.
    pub pod_whole: f64,
    /// The same Pod as the operator's Pod cache keeps it (`CachedPod`), heap bytes.
    pub pod_cached: f64,
    /// A Sandbox, heap bytes.
    pub sandbox: f64,
}

/// The requests one phase cost per sandbox, by sender (the API server's audit log).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Requests {
    /// Which phase the rows are of, in words.
    pub phase: String,
    /// Sandboxes in it.
    pub sandboxes: usize,
    /// The rows.
    pub rows: Vec<WriteRow>,
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// The command that produced it.
    pub command: String,
    /// The day, `YYYY-MM-DD`.
    pub date: String,
    /// The machine sentence of `orchard-bench-support`.
    pub machine: String,
    /// KWOK nodes.
    pub nodes: u16,
    /// The timed creation phases, in the order they ran.
    pub creations: Vec<Creation>,
    /// Heartbeat expiry lateness (deletion seen minus `status.expiresAt`), seconds.
    pub expiry: Latencies,
    /// RolloutGroups through a queue.
    pub groups: Option<Groups>,
    /// Many held and a restart.
    pub held: Option<Held>,
    /// Requests per sandbox, by sender.
    pub requests: Option<Requests>,
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Per 1,000 of `count`.
fn per_thousand(value: f64, count: usize) -> f64 {
    value * 1000.0 / count.max(1) as f64
}

/// The section of docs/BENCHMARKS.md (pure).
pub fn render(report: &Report) -> String {
    let mut text = format!(
        "{HEADING}\n\nCommand: `{}`. Run {} on this machine: {}. The local control plane (etcd, kube-apiserver, \
         kube-controller-manager, kube-scheduler) with {} KWOK nodes (`sigs.k8s.io/kwok` v0.8.0; its pods run nothing \
         and are Running and Ready as soon as they are bound) and the release operator with `--simulated-agent` \
         (docs/TESTING.md, \"KWOK nodes\"): what is measured is the control plane, with no process starts. \
         Everything shares the same two cores, the driver too. One run: each phase once.\n\n",
        report.command, report.date, report.machine, report.nodes
    );
    text.push_str(&format!(
        "create -> Ready is the driver's create call to its watch seeing `Ready` (the Sandbox's whole path: \
         the API server, the operator's Pod, kube-scheduler's binding, KWOK's status, the operator's status \
         write). agent-sandbox gates its releases on claim latency p50 <= {:.0} ms and p99 <= {:.0} ms on KWOK \
         (a claim of a warm sandbox); the last column compares each row with that gate.\n\n",
        GATE_P50 * 1000.0,
        GATE_P99 * 1000.0
    ));
    text.push_str(
        "| phase | sent/s | Ready/s | create -> Ready p50 | p99 | max | last tenth p50 / p99 | the operator's part p50 / p99 | against the gate |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for phase in &report.creations {
        let share = phase
            .operator_share
            .map_or("(no Pod: a claim)".to_string(), |l| {
                format!("{} / {}", millis(l.p50), millis(l.p99))
            });
        text.push_str(&format!(
            "| {} | {} | {:.0} | {} | {} / {} | {share} | {} |\n",
            phase.label,
            if phase.rate > 0.0 {
                format!("{:.0}", phase.sent_rate)
            } else {
                "at once".to_string()
            },
            phase.ready_rate,
            phase.latency.cells(),
            millis(phase.last_tenth.p50),
            millis(phase.last_tenth.p99),
            phase.latency.against_gate(),
        ));
    }
    text.push_str(
        "\nWhere the two cores went, CPU seconds per 1,000 sandboxes of the phase, and the rate at which they would be \
         full (2 cores over the CPU seconds one sandbox costs all processes together):\n\n\
         | phase | operator | kube-apiserver | etcd | kube-scheduler, KWOK, kube-controller-manager | the driver | all | cores full at | operator RSS after |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for phase in &report.creations {
        let n = phase.latency.count;
        let c = &phase.costs;
        let per_sandbox = c.total_cpu() / n.max(1) as f64;
        text.push_str(&format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0}/s | {} |\n",
            phase.label,
            per_thousand(c.operator_cpu, n),
            per_thousand(c.apiserver_cpu, n),
            per_thousand(c.etcd_cpu, n),
            per_thousand(c.others_cpu, n),
            per_thousand(c.driver_cpu, n),
            per_thousand(c.total_cpu(), n),
            if per_sandbox > 0.0 {
                2.0 / per_sandbox
            } else {
                f64::NAN
            },
            mib(c.operator_rss),
        ));
    }
    text.push('\n');
    if report.expiry.count > 0 {
        text.push_str(&format!(
            "Heartbeat expiry: the first phase's {} sandboxes all got the same heartbeat, so they timed out in the \
             same second; lateness (deletion seen by a watch minus `status.expiresAt`) p50 {}, p99 {}, max {}.\n\n",
            report.expiry.count,
            millis(report.expiry.p50),
            millis(report.expiry.p99),
            millis(report.expiry.max)
        ));
    }
    if let Some(groups) = &report.groups {
        text.push_str(&format!(
            "RolloutGroups: {} groups (groupSize {}, maxTrajectories {}) created at once through one RolloutQueue of \
             {} trajectory slots; a harness in the driver records each Ready trajectory's result through the gateway \
             (reward 1 or 0 from the name's hash). All Complete {:.1} s after the creates; {} trajectories launched, \
             {} groups Balanced, {} dropped; operator CPU {:.1} s, kube-apiserver {:.1} s.\n\n",
            groups.groups,
            groups.size,
            groups.max_trajectories,
            groups.slots,
            groups.seconds,
            groups.trajectories,
            groups.balanced,
            groups.dropped,
            groups.costs.operator_cpu,
            groups.costs.apiserver_cpu
        ));
    }
    if let Some(held) = &report.held {
        let per_sandbox = |rss: u64| {
            rss.saturating_sub(held.operator_rss_empty) as f64
                / held.sandboxes.max(1) as f64
                / 1024.0
        };
        text.push_str(&format!(
            "Held: {} Ready sandboxes (and their Pods). The operator's RSS {} ({} with none): {:.1} KiB per sandbox \
             (target <= 10 KiB). kube-apiserver {}, etcd {}. The operator SIGKILLed and started again: `/readyz` \
             (caches filled) {:.1} s after the kill; the new process had finished as many Sandbox reconciles as there \
             are Sandboxes {:.1} s after it (target <= 60 s), with {:.0} API writes, {:.1} CPU seconds and a peak RSS of {}; \
             its RSS then {}, {:.1} KiB per sandbox.",
            held.sandboxes,
            mib(held.operator_rss),
            mib(held.operator_rss_empty),
            per_sandbox(held.operator_rss),
            mib(held.apiserver_rss),
            mib(held.etcd_rss),
            held.restart_ready,
            held.restart_reconciled,
            // An empty sum is -0.0.
            held.restart_writes.abs(),
            held.restart_cpu,
            mib(held.restart_peak_rss),
            mib(held.restart_rss),
            per_sandbox(held.restart_rss),
        ));
        if let Some(heap) = &held.cache_heap {
            text.push_str(&format!(
                " Heap per object in the operator's watch caches ({} of the held objects as the API server serves them, \
                 decoded into a reflector store by the driver under a counting allocator): a sandbox Pod whole {:.1} KiB, \
                 as the Pod cache keeps it {:.1} KiB; a Sandbox {:.1} KiB.",
                heap.sample,
                heap.pod_whole / 1024.0,
                heap.pod_cached / 1024.0,
                heap.sandbox / 1024.0,
            ));
        }
        text.push_str("\n\n");
    }
    if let Some(requests) = &report.requests {
        text.push_str(&format!(
            "Requests per sandbox in the phase \"{}\" ({} sandboxes), from kube-apiserver's audit log of every request \
             (reads and writes; a second cluster, because the log costs the API server a file write per request; \
             the nodes' Lease renewals and the controllers' own traffic during the phase are in the rows too):\n\n",
            requests.phase, requests.sandboxes
        ));
        text.push_str(&crate::audit_summary::table(
            &requests.rows,
            requests.sandboxes,
        ));
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creation(label: &str, p50: f64, p99: f64) -> Creation {
        Creation {
            label: label.into(),
            rate: 100.0,
            sent_rate: 100.0,
            ready_rate: 99.0,
            latency: Latencies {
                count: 1000,
                p50,
                p99,
                max: p99,
            },
            last_tenth: Latencies::default(),
            operator_share: Some(Latencies {
                count: 1000,
                p50: 0.05,
                p99: 0.1,
                max: 0.1,
            }),
            costs: Costs {
                operator_cpu: 2.0,
                apiserver_cpu: 10.0,
                etcd_cpu: 1.0,
                others_cpu: 3.0,
                driver_cpu: 4.0,
                operator_rss: 50 << 20,
            },
        }
    }

    #[test]
    fn latencies_are_nearest_rank_percentiles() {
        let l = Latencies::of((1..=100).rev().map(|i| i as f64 / 100.0).collect());
        assert_eq!(l.count, 100);
        assert!(
            (l.p50 - 0.51).abs() < 1e-9 || (l.p50 - 0.50).abs() < 1e-9,
            "{l:?}"
        );
        assert!((l.max - 1.0).abs() < 1e-9);
        assert_eq!(Latencies::of(Vec::new()), Latencies::default());
    }

    #[test]
    fn each_row_is_compared_with_the_gate() {
        assert_eq!(creation("a", 0.2, 0.4).latency.against_gate(), "within");
        assert_eq!(
            creation("a", 0.2, 0.6).latency.against_gate(),
            "p50 within, p99 over"
        );
        assert_eq!(creation("a", 0.4, 0.6).latency.against_gate(), "over");
    }

    #[test]
    fn the_section_names_the_phase_of_its_requests_table_and_costs_per_thousand() {
        let report = Report {
            command: "make bench-control-plane".into(),
            date: "2026-11-29".into(),
            machine: "2 CPUs".into(),
            nodes: 100,
            creations: vec![creation("1,000 at 100/s", 0.25, 0.45)],
            requests: Some(Requests {
                phase: "1,000 at 100/s, create -> Ready -> delete".into(),
                sandboxes: 1000,
                rows: vec![WriteRow {
                    who: "operator".into(),
                    what: "create pods".into(),
                    code: 201,
                    count: 1000,
                }],
            }),
            ..Report::default()
        };
        let text = render(&report);
        assert!(text.starts_with(HEADING));
        assert!(
            text.contains(
                "in the phase \"1,000 at 100/s, create -> Ready -> delete\" (1000 sandboxes)"
            ),
            "{text}"
        );
        assert!(
            text.contains("| operator | create pods | 201 | 1.00 |"),
            "{text}"
        );
        assert!(
            text.contains("| 1,000 at 100/s | 100 | 99 | 250 ms | 450 ms | 450 ms | 0 ms / 0 ms | 50 ms / 100 ms | within |"),
            "{text}"
        );
        assert!(
            text.contains(
                "| 1,000 at 100/s | 2.00 | 10.00 | 1.00 | 3.00 | 4.00 | 20.00 | 100/s | 50.0 MiB |"
            ),
            "{text}"
        );
        assert!(!text.contains("Held:"), "no held phase was run");
    }

    #[test]
    fn the_held_paragraph_gives_memory_per_sandbox_before_and_after_the_restart() {
        let mib = 1024 * 1024;
        let report = Report {
            held: Some(Held {
                sandboxes: 1024,
                operator_rss_empty: 50 * mib,
                operator_rss: 70 * mib,
                restart_rss: 60 * mib,
                cache_heap: Some(CacheHeap {
                    sample: 1000,
                    pod_whole: 24.0 * 1024.0,
                    pod_cached: 4.0 * 1024.0,
                    sandbox: 3.5 * 1024.0,
                }),
                ..Held::default()
            }),
            ..Report::default()
        };
        let text = render(&report);
        assert!(
            text.contains("70.0 MiB (50.0 MiB with none): 20.0 KiB per sandbox"),
            "{text}"
        );
        assert!(
            text.contains("its RSS then 60.0 MiB, 10.0 KiB per sandbox."),
            "{text}"
        );
        assert!(
            text.contains("(1000 of the held objects") && text.contains("a sandbox Pod whole 24.0 KiB, as the Pod cache keeps it 4.0 KiB; a Sandbox 3.5 KiB."),
            "{text}"
        );
    }
}
