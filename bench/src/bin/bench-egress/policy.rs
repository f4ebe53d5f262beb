//! The policy side: Sandbox objects as the proxy's watch cache holds them, the table the proxy
//! builds from them (`TableBuilder::rebuild`), what that table costs in time and memory, and what one
//! decision costs.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use orchard_operator::api::{
    EgressPolicy, EgressRule, EgressStatus, HostDeny, NetworkSpec, Sandbox, SandboxSpec,
    SandboxStatus,
};
use orchard_operator::egress::rules::{Decision, Target};
use orchard_operator::egress::sandboxes::TableBuilder;
use orchard_operator::egress::table::PolicyTable;

use crate::stats;
use orchard_bench::alloc;

/// The name the benchmark's own sandbox is allowed (its fifth and last host pattern).
pub const ORIGIN_HOST: &str = "origin.test";

/// A name every benchmark sandbox's fifth pattern (`*.githubusercontent.com`) allows: the hit
/// measured in [`Rules::decide`](orchard_operator::egress::rules::Rules::decide), after the deny
/// entry and four allow patterns that do not match.
pub const HIT: &str = "raw.githubusercontent.com";

/// A name no benchmark sandbox allows: the deny entry and all five patterns are tried.
pub const MISS: &str = "example.org";

/// How many rebuilds are timed after the first.
const REBUILDS: usize = 5;

/// Calls per timing of `decide` or `lookup`, and how many timings.
const CALLS: usize = 1_000_000;
const TIMINGS: usize = 5;

/// The `spec.network` of sandbox `index`: `AllowList` of 5 host patterns (two exact package-index
/// names, a wildcard, one name of its own, and `last`) and 1 deny.
fn network(index: usize, last: &str) -> NetworkSpec {
    let own = format!("bucket-{index}.storage.example.com");
    let hosts = [
        "pypi.org",
        "files.pythonhosted.org",
        "*.github.com",
        own.as_str(),
        last,
    ];
    NetworkSpec {
        egress: EgressPolicy::AllowList,
        allow: hosts
            .iter()
            .map(|host| EgressRule {
                cidr: None,
                host: Some((*host).to_string()),
                ports: vec![],
            })
            .collect(),
        deny: vec![HostDeny {
            host: "gist.github.com".into(),
        }],
    }
}

/// Sandbox `index` with pod IP `ip`, its last host pattern `last`, and the `status.egress` the proxy
/// reported for it already (the steady state: a rebuild owes no status write).
pub fn sandbox(index: usize, ip: IpAddr, last: &str) -> Sandbox {
    let mut sandbox = Sandbox::new(
        &format!("sandbox-{index}"),
        SandboxSpec {
            image: "python:3.12".into(),
            network: Some(network(index, last)),
            ..SandboxSpec::default()
        },
    );
    sandbox.metadata.namespace = Some(format!("team-{}", index % 20));
    sandbox.metadata.uid = Some(format!("00000000-0000-4000-8000-{index:012}"));
    sandbox.metadata.generation = Some(1);
    sandbox.status = Some(SandboxStatus {
        pod_ip: Some(ip.to_string()),
        egress: Some(EgressStatus {
            observed_generation: 1,
            pod_ip: ip.to_string(),
            message: None,
        }),
        ..SandboxStatus::default()
    });
    sandbox
}

/// The pod IP of sandbox `index` of a fleet: 10.0.0.0/8 from 10.1.0.0 on.
pub fn pod_ip(index: usize) -> IpAddr {
    let n = (1u32 << 16) + index as u32;
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | n))
}

/// `count` sandboxes, each with its own pod IP and the same shape of policy.
pub fn fleet(count: usize) -> Vec<Sandbox> {
    (0..count)
        .map(|index| sandbox(index, pod_ip(index), "*.githubusercontent.com"))
        .collect()
}

/// The proxy's table for the data-path runs: 127.0.0.1 (the benchmark's client) allowed
/// [`ORIGIN_HOST`] as its fifth pattern, and `others` more sandboxes on 127.1.x.y.
pub fn proxy_table(others: usize) -> PolicyTable {
    let mut sandboxes = vec![sandbox(0, IpAddr::V4(Ipv4Addr::LOCALHOST), ORIGIN_HOST)];
    sandboxes.extend((1..=others).map(|index| {
        let ip = IpAddr::V4(Ipv4Addr::new(
            127,
            1,
            (index / 250) as u8,
            (index % 250) as u8 + 1,
        ));
        sandbox(index, ip, "*.githubusercontent.com")
    }));
    let rebuilt = TableBuilder::default().rebuild(&sandboxes);
    assert_eq!(
        rebuilt.table.len(),
        others + 1,
        "every sandbox has an entry"
    );
    rebuilt.table
}

/// What the table of one fleet costs.
pub struct PolicyCost {
    /// Sandboxes in the fleet.
    pub sandboxes: usize,
    /// The first rebuild, into an empty builder.
    pub first_build: Duration,
    /// The rebuilds after it (the steady state: a builder that remembers the last good policies).
    pub rebuilds: Vec<Duration>,
    /// VmRSS after building and holding the table minus before.
    pub rss_bytes: i64,
    /// Bytes allocated for it and still held (the counting allocator).
    pub heap_bytes: i64,
    /// `Rules::decide` ns per call, per timing: a hit on the fifth pattern.
    pub decide_hit_ns: Vec<f64>,
    /// The same for a miss.
    pub decide_miss_ns: Vec<f64>,
    /// `PolicyTable::lookup` of a source address ns per call, per timing.
    pub lookup_ns: Vec<f64>,
}

/// Resident bytes of this process now.
pub fn rss_now() -> i64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    stats::vm_rss_bytes(&status).map_or(0, |bytes| bytes as i64)
}

/// Nanoseconds per call of `call`, [`TIMINGS`] timings of [`CALLS`] calls each.
fn ns_per_call(mut call: impl FnMut()) -> Vec<f64> {
    (0..TIMINGS)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..CALLS {
                call();
            }
            started.elapsed().as_nanos() as f64 / CALLS as f64
        })
        .collect()
}

/// Builds the table of `count` sandboxes and measures it (on the calling thread, before any
/// runtime starts, so nothing else allocates meanwhile).
pub fn measure(count: usize) -> PolicyCost {
    let sandboxes = fleet(count);
    alloc::collect();
    let (rss_before, heap_before) = (rss_now(), alloc::live());
    alloc::count(true);
    let mut builder = TableBuilder::default();
    let started = Instant::now();
    let rebuilt = builder.rebuild(&sandboxes);
    let first_build = started.elapsed();
    alloc::count(false);
    let (rss_bytes, heap_bytes) = (rss_now() - rss_before, (alloc::live() - heap_before) as i64);
    assert_eq!(rebuilt.table.len(), count, "every sandbox has an entry");
    assert!(
        rebuilt.reports.is_empty(),
        "the steady state writes nothing"
    );

    let rebuilds = (0..REBUILDS)
        .map(|_| {
            let started = Instant::now();
            let again = builder.rebuild(&sandboxes);
            let elapsed = started.elapsed();
            drop(black_box(again));
            elapsed
        })
        .collect();

    let table = &rebuilt.table;
    let middle = pod_ip(count / 2);
    let policy = table.lookup(middle).expect("the middle sandbox's policy");
    let (hit, miss) = (
        Target::parse(HIT).expect("hit"),
        Target::parse(MISS).expect("miss"),
    );
    assert!(
        matches!(policy.rules.decide(&hit, 443), Decision::Allow { rule } if rule == "*.githubusercontent.com")
    );
    assert!(!policy.rules.decide(&miss, 443).is_allowed());
    let decide_hit_ns = ns_per_call(|| {
        black_box(policy.rules.decide(black_box(&hit), black_box(443)));
    });
    let decide_miss_ns = ns_per_call(|| {
        black_box(policy.rules.decide(black_box(&miss), black_box(443)));
    });
    let lookup_ns = ns_per_call(|| {
        black_box(table.lookup(black_box(middle)));
    });
    drop(rebuilt);
    drop(builder);
    PolicyCost {
        sandboxes: count,
        first_build,
        rebuilds,
        rss_bytes,
        heap_bytes,
        decide_hit_ns,
        decide_miss_ns,
        lookup_ns,
    }
}
