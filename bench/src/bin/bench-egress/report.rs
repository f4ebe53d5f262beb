//! The Markdown tables of bench-egress (pure).

use std::time::Duration;

use orchard_bench::docs::thousands;
use orchard_bench_support::{median, median_spread};

use crate::cpu::Cpu;
use crate::policy::PolicyCost;
use crate::stats::{self, mib, ms, signed_ms};

/// One download of the big body.
#[derive(Debug, Clone, Copy)]
pub struct Download {
    /// Bytes received.
    pub bytes: u64,
    /// From the request to the body's last byte.
    pub elapsed: Duration,
    /// CPU time meanwhile.
    pub cpu: Cpu,
}

impl Download {
    pub fn mib_per_s(&self) -> f64 {
        stats::mib_per_s(self.bytes, self.elapsed)
    }

    /// CPU seconds per GiB of `part` of [`Download::cpu`].
    pub fn per_gib(&self, part: impl Fn(&Cpu) -> f64) -> f64 {
        stats::per_gib(part(&self.cpu), self.bytes)
    }
}

/// Everything measured on one route, one entry per round.
#[derive(Debug, Clone, Default)]
pub struct RouteRuns {
    pub downloads: Vec<Download>,
    /// GET /small on a fresh connection each.
    pub fresh: Vec<Vec<Duration>>,
    /// GET /small on one kept-alive connection.
    pub kept: Vec<Vec<Duration>>,
}

/// `median (min–max)` of per-round values.
fn spread(values: &[f64], show: impl Fn(f64) -> String) -> String {
    median_spread(values, show)
}

/// Per round, `of(later) - of(direct)` (rounds paired).
fn paired<T>(direct: &[T], later: &[T], of: impl Fn(&T) -> f64) -> Vec<f64> {
    direct
        .iter()
        .zip(later)
        .map(|(d, l)| of(l) - of(d))
        .collect()
}

fn p50_ms(samples: &[Duration]) -> f64 {
    stats::percentile(samples, 0.5).map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
}

/// One row: the three routes' cells, then what the relay and the proxy add (empty when `added` is
/// `None`).
fn row(label: &str, cells: [String; 3], added: Option<[String; 2]>) -> String {
    let [direct, relay, proxy] = cells;
    let [by_relay, by_proxy] = added.unwrap_or_default();
    format!("| {label} | {direct} | {relay} | {proxy} | {by_relay} | {by_proxy} |\n")
}

/// The rows of one latency series (fresh or kept-alive): pooled p50 and p99 over every round, and
/// the per-round p50 and what the relay and the proxy add to it, paired round by round.
fn latency_rows(label: &str, series: [&[Vec<Duration>]; 3]) -> String {
    let pooled = series.map(|runs| runs.concat());
    let mut rows = String::new();
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        let [Some(d), Some(r), Some(p)] = pooled.each_ref().map(|all| stats::percentile(all, q))
        else {
            continue;
        };
        rows.push_str(&row(
            &format!("{label}, {name} ({} requests per route)", pooled[0].len()),
            [ms(d), ms(r), ms(p)],
            Some([signed_ms(r, d), signed_ms(p, d)]),
        ));
    }
    let per_round = series.map(|runs| runs.iter().map(|s| p50_ms(s)).collect::<Vec<f64>>());
    let added = |later: &[f64]| {
        spread(&paired(&per_round[0], later, |v| *v), |v| {
            format!("{v:+.2} ms")
        })
    };
    rows.push_str(&row(
        &format!(
            "{label}, p50 per round: median (min–max) of {} rounds",
            series[0].len()
        ),
        per_round
            .each_ref()
            .map(|values| spread(values, |v| format!("{v:.2} ms"))),
        Some([added(&per_round[1]), added(&per_round[2])]),
    ));
    rows
}

/// The data-path table: direct, through the relay and through the proxy (indexed by
/// `Route::index`), and what the relay and the proxy add to direct.
pub fn data_path_table(routes: &[RouteRuns; 3], big: u64) -> String {
    let [direct, relay, proxy] = routes;
    let mut table = String::from(
        "| HTTPS to `origin.test` on loopback | direct | through a plain TCP relay | through the egress proxy | added by the relay | added by the proxy |\n|---|---|---|---|---|---|\n",
    );
    let rates = routes.each_ref().map(|runs| {
        runs.downloads
            .iter()
            .map(Download::mib_per_s)
            .collect::<Vec<f64>>()
    });
    let change = |later: &[f64]| -> String {
        let changes: Vec<f64> = rates[0]
            .iter()
            .zip(later)
            .map(|(d, l)| 100.0 * (l / d - 1.0))
            .collect();
        spread(&changes, |v| format!("{v:+.1} %"))
    };
    table.push_str(&row(
        &format!(
            "download of {} (`GET /big`, one connection), MiB/s: median (min–max) of {} rounds",
            mib(big as i64),
            direct.downloads.len()
        ),
        rates
            .each_ref()
            .map(|values| spread(values, |v| format!("{v:.0}"))),
        Some([change(&rates[1]), change(&rates[2])]),
    ));
    table.push_str(&latency_rows(
        "fresh connection per `GET /small` (TCP + full TLS 1.3 handshake + request)",
        routes.each_ref().map(|runs| runs.fresh.as_slice()),
    ));
    table.push_str(&latency_rows(
        "`GET /small` on one kept-alive connection (for the proxy: one tunnel)",
        routes.each_ref().map(|runs| runs.kept.as_slice()),
    ));
    let cpu_row = |label: &str, part: &dyn Fn(&Cpu) -> f64, added: bool| {
        let per = |runs: &RouteRuns| -> String {
            let values: Vec<f64> = runs.downloads.iter().map(|d| d.per_gib(part)).collect();
            spread(&values, |v| format!("{v:.3}"))
        };
        let difference = |later: &RouteRuns| -> String {
            let values = paired(&direct.downloads, &later.downloads, |d| d.per_gib(part));
            spread(&values, |v| format!("{v:+.3}"))
        };
        row(
            &format!("{label}, CPU s per GiB downloaded: median (min–max)"),
            [per(direct), per(relay), per(proxy)],
            added.then(|| [difference(relay), difference(proxy)]),
        )
    };
    table.push_str(&cpu_row(
        "the whole process during the download (getrusage, user + system)",
        &|cpu| cpu.process,
        true,
    ));
    table.push_str(&cpu_row(
        "of which the relay's threads (`tcp-relay`, schedstat)",
        &|cpu| cpu.relay,
        false,
    ));
    table.push_str(&cpu_row(
        "of which the proxy's threads (`egress-proxy`, schedstat)",
        &|cpu| cpu.proxy,
        false,
    ));
    table.push_str(&cpu_row(
        "of which the origin's thread (TLS encryption, HTTP)",
        &|cpu| cpu.origin,
        false,
    ));
    table.push_str(&cpu_row(
        "of which the client's thread (TLS decryption, HTTP)",
        &|cpu| cpu.client,
        false,
    ));
    table
}

/// `median (min–max)` of nanoseconds.
fn ns(values: &[f64]) -> String {
    spread(values, |v| format!("{v:.0} ns"))
}

/// The policy table: build time, memory and lookups per fleet size.
pub fn policy_table(costs: &[PolicyCost]) -> String {
    let mut table = String::from(
        "| sandboxes (5 host patterns + 1 deny each) | first build | rebuild: median (min–max) | RSS growth (per sandbox) | heap held (per sandbox) | `Rules::decide` hit | `Rules::decide` miss | `PolicyTable::lookup` |\n|---|---|---|---|---|---|---|---|\n",
    );
    for cost in costs {
        let n = cost.sandboxes as f64;
        let rebuilds: Vec<f64> = cost
            .rebuilds
            .iter()
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect();
        table.push_str(&format!(
            "| {} | {:.1} ms | {} | {} ({:.0} B) | {} ({:.0} B) | {} | {} | {} |\n",
            thousands(cost.sandboxes),
            cost.first_build.as_secs_f64() * 1000.0,
            spread(&rebuilds, |v| format!("{v:.1} ms")),
            mib(cost.rss_bytes),
            cost.rss_bytes as f64 / n,
            mib(cost.heap_bytes),
            cost.heap_bytes as f64 / n,
            ns(&cost.decide_hit_ns),
            ns(&cost.decide_miss_ns),
            ns(&cost.lookup_ns),
        ));
    }
    table
}

/// `min–max` of the load averages sampled during the run.
pub fn load_range(loads: &[f64]) -> String {
    let min = loads.iter().copied().fold(f64::INFINITY, f64::min);
    let max = loads.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    match median(loads) {
        Some(m) => format!("{min:.2}–{max:.2} (median {m:.2}, {} samples)", loads.len()),
        None => "n/a".into(),
    }
}
