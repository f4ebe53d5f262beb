//! The pure parts of bench-egress: statistics, the `/proc` and HTTP parsing, the tables, and the
//! Sandbox objects the policy measurements build from.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use orchard_operator::egress::rules::Target;
use orchard_operator::egress::sandboxes::TableBuilder;

use crate::client::Route;
use crate::cpu::Cpu;
use crate::policy::{self, PolicyCost};
use crate::report::{self, Download, RouteRuns};
use crate::stats;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn percentiles_are_nearest_rank_on_the_sorted_samples() {
    let samples: Vec<Duration> = (1..=100).rev().map(ms).collect();
    assert_eq!(stats::percentile(&samples, 0.5), Some(ms(51)));
    assert_eq!(stats::percentile(&samples, 0.99), Some(ms(99)));
    assert_eq!(stats::percentile(&samples, 0.0), Some(ms(1)));
    assert_eq!(stats::percentile(&samples, 1.0), Some(ms(100)));
    assert_eq!(stats::percentile(&samples, 7.0), Some(ms(100)), "clamped");
    assert_eq!(stats::percentile(&[ms(3)], 0.99), Some(ms(3)));
    assert_eq!(stats::percentile(&[], 0.5), None);
}

#[test]
fn vm_rss_is_read_in_bytes_from_proc_status() {
    let status =
        "Name:\tbench-egress\nVmPeak:\t  200000 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n";
    assert_eq!(stats::vm_rss_bytes(status), Some(12345 * 1024));
    assert_eq!(stats::vm_rss_bytes("Name:\tx\n"), None);
    assert_eq!(
        stats::vm_rss_bytes("VmRSS:\t12 MB\n"),
        None,
        "unit must be kB"
    );
    assert_eq!(stats::vm_rss_bytes("VmRSS:\n"), None);
}

#[test]
fn the_proxys_answer_to_connect_is_parsed() {
    let answer = b"HTTP/1.1 200 Connection established\r\ndate: x\r\n\r\n";
    assert_eq!(stats::head_end(answer), Some(answer.len()));
    assert_eq!(stats::head_end(b"HTTP/1.1 200 OK\r\n"), None, "incomplete");
    assert_eq!(
        stats::head_end(b"HTTP/1.1 200 OK\r\n\r\n\x16\x03"),
        Some(19)
    );
    assert_eq!(stats::status_code(answer), Ok(200));
    assert_eq!(
        stats::status_code(b"HTTP/1.1 403 Forbidden\r\nx-orchard-egress: denied\r\n\r\n"),
        Ok(403)
    );
    assert!(stats::status_code(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    assert!(stats::status_code(b"HTTP/1.1 abc\r\n\r\n").is_err());
    assert!(stats::status_code(b"HTTP/1.1 42 x\r\n\r\n").is_err());
}

#[test]
fn rates_and_cpu_are_per_mib_and_per_gib() {
    assert_eq!(
        stats::mib_per_s(512 * 1024 * 1024, Duration::from_secs(2)),
        256.0
    );
    assert_eq!(stats::per_gib(0.5, 512 * 1024 * 1024), 1.0);
    assert_eq!(stats::signed_ms(ms(3), ms(5)), "-2.00 ms");
    assert_eq!(stats::mib(3 * 1024 * 1024 / 2), "1.5 MiB");
}

#[test]
fn the_load_range_names_min_max_and_median() {
    assert_eq!(
        report::load_range(&[2.5, 1.0, 3.25]),
        "1.00–3.25 (median 2.50, 3 samples)"
    );
    assert_eq!(report::load_range(&[]), "n/a");
}

/// A download of 1 GiB in `seconds`, with the process's CPU and the relay's and the proxy's.
fn download(seconds: u64, process: f64, relay: f64, proxy: f64) -> Download {
    Download {
        bytes: 1024 * 1024 * 1024,
        elapsed: Duration::from_secs(seconds),
        cpu: Cpu {
            process,
            proxy,
            relay,
            origin: 0.25,
            client: 0.25,
        },
    }
}

fn runs(downloads: Vec<Download>, fresh: [u64; 2], kept: [u64; 2]) -> RouteRuns {
    RouteRuns {
        downloads,
        fresh: fresh.iter().map(|n| vec![ms(*n); 10]).collect(),
        kept: kept.iter().map(|n| vec![ms(*n); 10]).collect(),
    }
}

#[test]
fn the_data_path_table_pairs_the_rounds() {
    let direct = runs(
        vec![download(1, 0.5, 0.0, 0.0), download(2, 0.5, 0.0, 0.0)],
        [2, 4],
        [1, 1],
    );
    let relay = runs(
        vec![download(1, 0.625, 0.125, 0.0), download(2, 0.75, 0.25, 0.0)],
        [2, 5],
        [1, 2],
    );
    let proxy = runs(
        vec![download(2, 0.75, 0.0, 0.25), download(3, 1.0, 0.0, 0.5)],
        [3, 6],
        [2, 2],
    );
    let table = report::data_path_table(&[direct, relay, proxy], 1024 * 1024 * 1024);
    let row = |start: &str| {
        table
            .lines()
            .find(|line| line.starts_with(start))
            .unwrap_or_else(|| panic!("no row {start:?} in\n{table}"))
            .to_string()
    };
    assert_eq!(
        row("| download of 1024.0 MiB"),
        "| download of 1024.0 MiB (`GET /big`, one connection), MiB/s: median (min–max) of 2 rounds \
         | 1024 (512–1024) | 1024 (512–1024) | 512 (341–512) | +0.0 % (+0.0 %–+0.0 %) | -33.3 % (-50.0 %–-33.3 %) |"
    );
    let fresh = "| fresh connection per `GET /small` (TCP + full TLS 1.3 handshake + request)";
    assert_eq!(
        row(&format!("{fresh}, p50")),
        format!(
            "{fresh}, p50 (20 requests per route) | 4.00 ms | 5.00 ms | 6.00 ms | +1.00 ms | +2.00 ms |"
        )
    );
    assert!(
        row(&format!("{fresh}, p50 per round")).ends_with(
            "| 4.00 ms (2.00 ms–4.00 ms) | 5.00 ms (2.00 ms–5.00 ms) | 6.00 ms (3.00 ms–6.00 ms) \
             | +1.00 ms (+0.00 ms–+1.00 ms) | +2.00 ms (+1.00 ms–+2.00 ms) |"
        ),
        "{table}"
    );
    assert!(
        row("| `GET /small` on one kept-alive connection (for the proxy: one tunnel), p99")
            .ends_with("| 1.00 ms | 2.00 ms | 2.00 ms | +1.00 ms | +1.00 ms |"),
        "{table}"
    );
    assert!(
        row("| the whole process").ends_with(
            "| 0.500 (0.500–0.500) | 0.750 (0.625–0.750) | 1.000 (0.750–1.000) \
             | +0.250 (+0.125–+0.250) | +0.500 (+0.250–+0.500) |"
        ),
        "{table}"
    );
    assert!(
        row("| of which the proxy's")
            .ends_with("| 0.000 (0.000–0.000) | 0.000 (0.000–0.000) | 0.500 (0.250–0.500) |  |  |"),
        "{table}"
    );
    assert!(
        row("| of which the relay's").contains("| 0.250 (0.125–0.250) | 0.000 (0.000–0.000) |"),
        "{table}"
    );
}

#[test]
fn the_policy_table_gives_per_sandbox_figures() {
    let cost = PolicyCost {
        sandboxes: 1000,
        first_build: Duration::from_micros(2500),
        rebuilds: vec![ms(2), ms(3), ms(2)],
        rss_bytes: 2 * 1024 * 1024,
        heap_bytes: 1_000_000,
        decide_hit_ns: vec![40.0, 42.0, 41.0],
        decide_miss_ns: vec![90.0],
        lookup_ns: vec![10.0, 12.0],
    };
    let table = report::policy_table(&[cost]);
    assert_eq!(
        table.lines().nth(2),
        Some(
            "| 1,000 | 2.5 ms | 2.0 ms (2.0 ms–3.0 ms) | 2.0 MiB (2097 B) | 1.0 MiB (1000 B) | 41 ns (40 ns–42 ns) | 90 ns | 12 ns (10 ns–12 ns) |"
        ),
        "{table}"
    );
}

#[test]
fn fleets_get_distinct_pod_ips_and_the_policy_shape_the_doc_describes() {
    let fleet = policy::fleet(300);
    let table = TableBuilder::default().rebuild(&fleet).table;
    assert_eq!(table.len(), 300, "one address each");
    assert_eq!(policy::pod_ip(0), IpAddr::V4(Ipv4Addr::new(10, 1, 0, 0)));
    assert_eq!(policy::pod_ip(257), IpAddr::V4(Ipv4Addr::new(10, 1, 1, 1)));
    let rules = &table.lookup(policy::pod_ip(150)).expect("policy").rules;
    let allowed = |host: &str| {
        rules
            .decide(&Target::parse(host).expect(host), 443)
            .is_allowed()
    };
    assert!(allowed(policy::HIT));
    assert!(allowed("pypi.org"));
    assert!(allowed("bucket-150.storage.example.com"));
    assert!(!allowed("bucket-151.storage.example.com"));
    assert!(!allowed("gist.github.com"), "denied");
    assert!(!allowed(policy::MISS));
    assert!(!allowed(policy::ORIGIN_HOST));
}

#[test]
fn the_proxy_table_lets_the_client_reach_the_origin_only() {
    let table = policy::proxy_table(999);
    assert_eq!(table.len(), 1000);
    let client = table
        .lookup(IpAddr::V4(Ipv4Addr::LOCALHOST))
        .expect("the client");
    let origin = Target::parse(policy::ORIGIN_HOST).expect("origin");
    assert!(client.rules.decide(&origin, 40_000).is_allowed());
    assert!(
        !client
            .rules
            .decide(&Target::parse(policy::MISS).expect("miss"), 443)
            .is_allowed()
    );
    let other = table
        .lookup(IpAddr::V4(Ipv4Addr::new(127, 1, 3, 250)))
        .expect("sandbox 999");
    assert_eq!(other.name, "sandbox-999");
    assert!(!other.rules.decide(&origin, 443).is_allowed());
}

#[test]
fn every_route_runs_first_once_in_three_rounds() {
    let firsts: Vec<Route> = (0..3).map(|round| crate::order(round)[0]).collect();
    assert_eq!(firsts, Route::ALL.to_vec());
    for round in 0..6 {
        let mut routes = crate::order(round).to_vec();
        routes.sort_by_key(|route| route.index());
        assert_eq!(
            routes,
            Route::ALL.to_vec(),
            "round {round} runs every route once"
        );
    }
}
