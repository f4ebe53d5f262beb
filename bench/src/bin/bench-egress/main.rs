//! `make bench-egress`: what the egress proxy (`orchard_operator::egress::proxy::serve`) costs a
//! sandbox's HTTPS traffic, and what its policy table costs, in one process on loopback (no cluster).
//!
//! - An HTTPS origin (rustls, a certificate for `origin.test` from a throw-away authority made with
//!   `openssl`) on 127.0.0.2 serves `GET /big` (512 MiB) and `GET /small` (3 bytes), HTTP/1.1.
//! - The proxy on 127.0.0.1, on a runtime of its own (2 worker threads named `egress-proxy`), with
//!   a table built by `TableBuilder::rebuild` from 1,000 Sandbox objects: 127.0.0.1 (the client) is
//!   allowed `origin.test` (its fifth host pattern), 999 others on 127.1.x.y; the static resolver
//!   maps `origin.test` to 127.0.0.2; no protected ranges.
//! - A plain TCP relay to the origin (`copy_bidirectional`, no HTTP, no policy) on a runtime of its
//!   own (2 worker threads named `tcp-relay`): what any user-space hop costs at least here.
//! - The client (hyper over rustls, on the main thread) trusts the authority only and measures
//!   direct (TCP to 127.0.0.2), through the relay, and through the proxy (`CONNECT
//!   origin.test:<port>`, then TLS in the tunnel, as a client with `https_proxy` does), in 3 rounds,
//!   the order rotating each round: one 512 MiB download (MiB/s, CPU), 300 GETs each on a fresh
//!   connection, 300 GETs on one kept-alive connection.
//! - Before any runtime starts: the table of 1,000 and of 10,000 sandboxes (5 host patterns + 1 deny
//!   each): build time, RSS and heap held, `Rules::decide` and `PolicyTable::lookup` ns per call.
//!
//! Prints Markdown tables; with `--write-doc PATH` replaces the `## Egress proxy` section of that
//! file.

mod client;
mod cpu;
mod origin;
mod policy;
mod report;
mod stats;
#[cfg(test)]
mod tests;

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchard_bench_support::{Machine, load_1};
use orchard_operator::egress::audit::NoAudit;
use orchard_operator::egress::proxy::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, ProxyDeps, serve,
};
use orchard_operator::egress::resolve::{Protected, StaticResolver};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

use client::{Client, Route};
use report::{Download, RouteRuns};

#[global_allocator]
static ALLOCATOR: orchard_bench::alloc::Counting = orchard_bench::alloc::Counting;

/// The big body.
const BIG: u64 = 512 * 1024 * 1024;
/// Requests per route and round, fresh connections and kept-alive.
const FRESH: usize = 300;
const KEPT: usize = 300;
/// Rounds; each runs every route, the order rotating every round.
const ROUNDS: usize = 3;
/// Requests per route before the rounds (not counted).
const WARMUP: usize = 20;
/// Sandboxes in the proxy's table besides the client's.
const OTHER_SANDBOXES: usize = 999;
/// Fleet sizes of the policy measurements.
const FLEETS: [usize; 2] = [1_000, 10_000];
/// How long the benchmark waits for a quiet machine before it runs anyway (and says so).
const QUIET_WAIT: Duration = Duration::from_secs(120);
/// The origin's address.
const ORIGIN_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The routes in round `round`'s order: rotated each round, so each route runs first once in
/// three rounds.
fn order(round: usize) -> [Route; 3] {
    let mut routes = Route::ALL;
    routes.rotate_left(round % Route::ALL.len());
    routes
}

/// A plain TCP relay to `upstream` (bytes copied both ways by `copy_bidirectional`, TCP_NODELAY on
/// both sides as the proxy sets it, no HTTP, no policy), on the current runtime: what any
/// user-space hop costs at least on this machine.
async fn relay(listener: TcpListener, upstream: SocketAddr) {
    while let Ok((mut client, _)) = listener.accept().await {
        tokio::spawn(async move {
            let Ok(mut origin) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = origin.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut origin).await;
        });
    }
}

/// One download of `/big` on a fresh connection (opened before the clock starts).
async fn download(client: &Client, route: Route) -> io::Result<Download> {
    let mut connection = client.connect(route).await?;
    let before = cpu::now();
    let started = Instant::now();
    let bytes = client.get(&mut connection, "/big").await?;
    let elapsed = started.elapsed();
    let cpu = cpu::now() - before;
    assert_eq!(bytes, BIG, "{route:?}: the whole body");
    Ok(Download {
        bytes,
        elapsed,
        cpu,
    })
}

/// Checks the proxy is in the path and enforcing: a name the client's policy does not allow is
/// refused with 403 and `X-Orchard-Egress: denied`.
async fn check_denied(client: &Client) {
    let refused = client
        .tunnel("example.org:443")
        .await
        .expect_err("example.org is not allowed");
    let text = refused.to_string().to_ascii_lowercase();
    assert!(
        text.contains(" 403 ") && text.contains("x-orchard-egress: denied"),
        "{refused}"
    );
}

/// The data-path rounds; `loads` gets the load average at the start of every round.
async fn data_path(client: &Client, loads: &mut Vec<f64>) -> io::Result<[RouteRuns; 3]> {
    check_denied(client).await;
    for route in Route::ALL {
        client.fresh(route, "/small", WARMUP).await?;
        client.kept(route, "/small", WARMUP).await?;
    }
    let mut runs: [RouteRuns; 3] = Default::default();
    for round in 0..ROUNDS {
        loads.push(load_1());
        for route in order(round) {
            let done = download(client, route).await?;
            eprintln!(
                "round {}: {route:?} download {:.0} MiB/s, process CPU {:.2} s (relay {:.2} s, proxy {:.2} s)",
                round + 1,
                done.mib_per_s(),
                done.cpu.process,
                done.cpu.relay,
                done.cpu.proxy
            );
            runs[route.index()].downloads.push(done);
        }
        for route in order(round) {
            let samples = client.fresh(route, "/small", FRESH).await?;
            runs[route.index()].fresh.push(samples);
        }
        for route in order(round) {
            let samples = client.kept(route, "/small", KEPT).await?;
            runs[route.index()].kept.push(samples);
        }
    }
    loads.push(load_1());
    Ok(runs)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let doc = orchard_bench_support::write_doc_arg(&args);
    let machine = Machine::settle(QUIET_WAIT);
    let mut loads = vec![load_1()];

    // The policy table first, on this thread alone.
    let costs: Vec<policy::PolicyCost> = FLEETS
        .iter()
        .map(|&count| {
            let cost = policy::measure(count);
            eprintln!(
                "policy: {count} sandboxes built in {:.1} ms",
                cost.first_build.as_secs_f64() * 1000.0
            );
            loads.push(load_1());
            cost
        })
        .collect();
    let policy_table = report::policy_table(&costs);
    println!("\n{policy_table}");

    let dir = std::env::temp_dir().join(format!("orchard-bench-egress-{}", std::process::id()));
    let certs = origin::make_certs(&dir, policy::ORIGIN_HOST);
    let _ = std::fs::remove_dir_all(&dir);

    let origin_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(cpu::ORIGIN_THREADS)
        .enable_all()
        .build()
        .expect("origin runtime");
    let origin_listener = origin_runtime
        .block_on(TcpListener::bind(SocketAddr::new(IpAddr::V4(ORIGIN_IP), 0)))
        .expect("bind the origin on 127.0.0.2");
    let origin_address = origin_listener.local_addr().expect("origin address");
    origin_runtime.spawn(origin::serve(
        origin_listener,
        TlsAcceptor::from(origin::server_config(&certs)),
        BIG,
    ));

    let relay_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(cpu::RELAY_THREADS)
        .enable_all()
        .build()
        .expect("relay runtime");
    let relay_listener = relay_runtime
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind the relay");
    let relay_address = relay_listener.local_addr().expect("relay address");
    relay_runtime.spawn(relay(relay_listener, origin_address));

    let proxy_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(cpu::PROXY_THREADS)
        .enable_all()
        .build()
        .expect("proxy runtime");
    let (tables, table) = watch::channel(Arc::new(policy::proxy_table(OTHER_SANDBOXES)));
    let deps = ProxyDeps {
        table,
        resolver: Arc::new(
            StaticResolver::default().with(policy::ORIGIN_HOST, [IpAddr::V4(ORIGIN_IP)]),
        ),
        protected: watch::channel(Arc::new(Protected::none())).1,
        audit: Arc::new(NoAudit),
        connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
    };
    let proxy_listener = proxy_runtime
        .block_on(TcpListener::bind("127.0.0.1:0"))
        .expect("bind the proxy");
    let proxy_address = proxy_listener.local_addr().expect("proxy address");
    let shutdown = CancellationToken::new();
    let served = proxy_runtime.spawn(serve(proxy_listener, deps, shutdown.clone()));

    let client = Client {
        host: policy::ORIGIN_HOST.to_string(),
        origin: origin_address,
        relay: relay_address,
        proxy: proxy_address,
        tls: TlsConnector::from(origin::client_config(&certs)),
    };
    let client_runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let tls = client_runtime
        .block_on(client.tls_parameters())
        .expect("TLS to the origin");
    let runs = client_runtime
        .block_on(data_path(&client, &mut loads))
        .expect("the data-path rounds");

    shutdown.cancel();
    proxy_runtime
        .block_on(served)
        .expect("the proxy's task")
        .expect("the proxy stops cleanly");
    drop(tables);
    relay_runtime.shutdown_timeout(Duration::from_secs(1));
    origin_runtime.shutdown_timeout(Duration::from_secs(1));
    let machine = machine.report();

    let data_table = report::data_path_table(&runs, BIG);
    println!("\n{data_table}");
    let load = report::load_range(&loads);
    println!("load average (1 min) during the run: {load}\n{machine}");
    let section = format!(
        "## Egress proxy\n\n\
Command: `make bench-egress` (`cargo run --release -p orchard-bench --bin bench-egress -- --write-doc docs/BENCHMARKS.md`). \
One process, loopback only, no cluster. An HTTPS origin (hyper HTTP/1.1 over rustls with ring, {tls}, an ECDSA P-256 certificate for `origin.test` \
signed by a throw-away authority made with `openssl` at start) on 127.0.0.2 on a runtime of its own (one worker thread) serves `GET /big` \
({big_mib} MiB, sent as slices of one 64 KiB buffer) and `GET /small` (3 bytes). The egress proxy (`orchard_operator::egress::proxy::serve`) \
listens on 127.0.0.1 on a runtime of its own (two worker threads, as the operator's binary would run it on this machine; the operator's allocator, mimalloc, \
is the benchmark's too), with a table built by `TableBuilder::rebuild` from {sandboxes} Sandbox objects: the client's source address 127.0.0.1 allows \
`origin.test` as the fifth of its 5 host patterns (after a deny entry), {others} other sandboxes sit on 127.1.x.y with the same shape of policy; \
a `StaticResolver` maps `origin.test` to 127.0.0.2, `Protected::none()`, `NoAudit` (in the cluster the audit also counts metrics and queues Events, \
not measured here). The client (hyper over rustls on the main thread, trusting only the benchmark's authority, session resumption off so every fresh \
connection makes a full handshake) goes **direct** (TCP to 127.0.0.2, i.e. `origin.test` resolved by the client) or **through the proxy** \
(`CONNECT origin.test:<port>` to the proxy, then TLS inside the tunnel, as a client with `https_proxy` set does); the proxy sees only TLS. \
A third route, **through a plain TCP relay** to the origin (a runtime of its own with two worker threads, each accepted connection copied \
both ways to a new one to the origin by `copy_bidirectional`, TCP_NODELAY on both sides, no HTTP, no policy), is the least any user-space hop costs \
on this machine, so what the proxy adds beyond it is its own: the `CONNECT` exchange, the policy decision, resolving, and copying through hyper's \
upgraded connection. Before the rounds it checks that the proxy refuses a name the policy does not allow (403, `X-Orchard-Egress: denied`) and makes \
{WARMUP} warm-up requests per route. Then {ROUNDS} rounds, each running every route, the order rotating every round (each route first once): one \
{big_mib} MiB download on a connection opened before the clock starts, {FRESH} sequential `GET /small` each on a new connection (timed from the \
TCP connect to the body's last byte), {KEPT} sequential `GET /small` on one kept-alive connection (for the proxy: one tunnel). Latency rows pool \
the {ROUNDS} rounds' samples; per-round rows give the median over the rounds and the spread, the proxy's addition paired round by round. \
CPU: `getrusage(RUSAGE_SELF)` user + system around each download (origin, relay, proxy and client are one process, so the direct figure is \
origin + client and the difference is what the hop costs, the kernel's extra loopback copies included), and each thread's run time from \
`/proc/self/task/*/schedstat` by thread name. The policy table is measured first, on the main thread before any runtime starts: Sandbox objects \
with `status.podIP` and `status.egress` already reported (the steady state, no status writes), 5 host patterns (`pypi.org`, \
`files.pythonhosted.org`, `*.github.com`, one name of the sandbox's own, `*.githubusercontent.com`) and 1 deny (`gist.github.com`) each; first build \
into an empty builder, then 5 rebuilds with the same builder (what the proxy does on every watch change); RSS growth from `/proc/self/status` \
VmRSS after `mi_collect` before the build; heap held counted by the benchmark's allocator (bytes requested and not freed; the Sandbox objects \
themselves, the watch cache's, not included); `Rules::decide` of `{hit}` (a hit on the fifth pattern) and `{miss}` (a miss: the deny entry and all \
five patterns tried) and `PolicyTable::lookup` of one address, each the median (min–max) of 5 timings of 1,000,000 calls. \
Load average (1 min) sampled at the start, after each fleet and at every round: {load}. Machine: {machine}; the machine is shared and may be \
busy with other work (2 CPUs for origin, proxy and client together), so the figures are what this run saw, not a bound.\n\n\
{data_table}\n{policy_table}",
        big_mib = BIG / 1024 / 1024,
        sandboxes = OTHER_SANDBOXES + 1,
        others = OTHER_SANDBOXES,
        hit = policy::HIT,
        miss = policy::MISS,
    );
    if let Some(doc) = doc {
        orchard_bench::docs::write_section(&doc, "## Egress proxy", &section)
            .expect("write the benchmark doc");
        println!("wrote the Egress proxy section of {}", doc.display());
    }
}
