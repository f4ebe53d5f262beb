//! `bench-pool` (part of `make bench-real`): warm pools against cold starts on the real node, in one
//! run. Each of `--rounds` rounds (default 3) alternates: `--claims` Sandboxes (default 10) one at a
//! time from a SandboxPool of that size (create -> Ready as the client's watch sees it), the same
//! number cold (their own Pod from the same image), then a RolloutGroup (N 4, Nmax 8, stride 4,
//! runners that report at once) from the pool and one cold (create -> Complete). Waits (bounded) for a
//! quiet machine first and reports the load and CPU steal (`orchard-bench-support`). Prints p50/p99 of
//! each over all rounds, and the median and spread of the rounds' p50s, and writes the section "Warm
//! pools" of docs/BENCHMARKS.md.
//!
//! ```text
//! bench-pool [--claims N] [--rounds R] [--hollow-node] [--write-doc docs/BENCHMARKS.md]
//! ```

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use orchard_operator::api::{RolloutGroup, Sandbox, SandboxPool};
use orchard_testcluster::cluster_process::ClusterProcess;
use orchard_testcluster::control_plane::client_from_kubeconfig;
use orchard_testcluster::test_support::rollouts::{group, is_complete, reward_script};
use orchard_testcluster::wait;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(300);

/// How long the benchmark waits for a quiet machine before it runs anyway (and says so).
const QUIET_WAIT: Duration = Duration::from_secs(120);

struct Args {
    claims: usize,
    rounds: usize,
    real_node: bool,
    write_doc: Option<std::path::PathBuf>,
}

fn usage() -> ! {
    eprintln!("usage: bench-pool [--claims N] [--rounds R] [--hollow-node] [--write-doc PATH]");
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut args = Args {
        claims: 10,
        rounds: 3,
        real_node: true,
        write_doc: None,
    };
    let mut it = std::env::args().skip(1);
    let number = |v: Option<String>| {
        v.and_then(|v| v.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or_else(|| usage())
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--claims" => args.claims = number(it.next()),
            "--rounds" => args.rounds = number(it.next()),
            "--hollow-node" => args.real_node = false,
            "--write-doc" => {
                args.write_doc = Some(it.next().map(Into::into).unwrap_or_else(|| usage()))
            }
            _ => usage(),
        }
    }
    args
}

fn ready(s: Option<&Sandbox>) -> bool {
    s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Creates sandbox `name` from `spec` and returns create -> Ready (the watch's view), and whether it
/// came from the pool.
async fn one_sandbox(api: &Api<Sandbox>, name: &str, spec: Value) -> (f64, bool) {
    let object: Sandbox = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("sandbox JSON");
    let started = Instant::now();
    if let Err(err) = api.create(&PostParams::default(), &object).await {
        eprintln!("bench-pool: create {name}: {err}");
        std::process::exit(1);
    }
    let done = wait::until(api, name, "Ready", TIMEOUT, ready).await;
    let seconds = started.elapsed().as_secs_f64();
    let warm = done
        .status
        .and_then(|s| s.pod_name)
        .is_some_and(|pod| pod != name);
    let _ = api.delete(name, &DeleteParams::default()).await;
    (seconds, warm)
}

/// Creates a group from `template` and returns create -> Complete.
async fn one_group(api: &Api<RolloutGroup>, name: &str, template: Value) -> f64 {
    let object = group(
        name,
        json!({"groupSize": 4, "maxTrajectories": 8, "stride": 4, "template": template}),
    );
    let started = Instant::now();
    if let Err(err) = api.create(&PostParams::default(), &object).await {
        eprintln!("bench-pool: create group {name}: {err}");
        std::process::exit(1);
    }
    wait::until(api, name, "Complete", TIMEOUT, is_complete).await;
    let seconds = started.elapsed().as_secs_f64();
    let _ = api.delete(name, &DeleteParams::default()).await;
    seconds
}

async fn filled(pools: &Api<SandboxPool>, count: i32) {
    wait::until(
        pools,
        "warm",
        "filled",
        TIMEOUT,
        move |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.ready_replicas == count && s.replicas == count)
        },
    )
    .await;
}

/// The `q` quantile (nearest rank) of `values`, in milliseconds.
fn quantile_ms(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1] * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    eprintln!("starting the local cluster...");
    let cluster = ClusterProcess::start("bench-pool", args.real_node, &[])
        .await
        .unwrap_or_else(|e| {
            eprintln!("bench-pool: {e}");
            std::process::exit(1)
        });
    let image = cluster.info["node"]["images"]["busybox"]
        .as_str()
        .unwrap_or("busybox:1.36")
        .to_string();
    let kubeconfig = std::path::PathBuf::from(cluster.field("kubeconfig"));
    let client: Client = client_from_kubeconfig(&kubeconfig)
        .await
        .unwrap_or_else(|e| {
            eprintln!("bench-pool: {e}");
            std::process::exit(1)
        });
    let ns = "bench-pool";
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace JSON");
    if let Err(err) = namespaces.create(&PostParams::default(), &namespace).await {
        eprintln!("bench-pool: namespace {ns}: {err}");
        std::process::exit(1);
    }
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), ns);
    let size = i32::try_from(args.claims).unwrap_or(i32::MAX);
    let pool: SandboxPool = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool",
        "metadata": {"name": "warm"}, "spec": {"replicas": size, "template": {"image": image}},
    }))
    .expect("pool JSON");
    if let Err(err) = pools.create(&PostParams::default(), &pool).await {
        eprintln!("bench-pool: create pool: {err}");
        std::process::exit(1);
    }
    let machine = orchard_bench_support::Machine::settle(QUIET_WAIT);
    let (mut warm, mut cold, mut misses) = (Vec::new(), Vec::new(), 0);
    let (mut warm_p50s, mut cold_p50s) = (Vec::new(), Vec::new());
    let (mut group_warm, mut group_cold) = (Vec::new(), Vec::new());
    let run = reward_script(7, 50, None, None);
    for round in 0..args.rounds {
        filled(&pools, size).await;
        let (warm_from, cold_from) = (warm.len(), cold.len());
        for i in 0..args.claims {
            let (seconds, from_pool) = one_sandbox(
                &sandboxes,
                &format!("w{round}-{i}"),
                json!({"pool": "warm"}),
            )
            .await;
            if from_pool {
                warm.push(seconds);
            } else {
                misses += 1;
            }
        }
        for i in 0..args.claims {
            let (seconds, _) = one_sandbox(
                &sandboxes,
                &format!("c{round}-{i}"),
                json!({"image": image}),
            )
            .await;
            cold.push(seconds);
        }
        warm_p50s.push(quantile_ms(&warm[warm_from..], 0.5));
        cold_p50s.push(quantile_ms(&cold[cold_from..], 0.5));
        filled(&pools, size).await;
        let run_spec = json!({"command": ["/bin/sh", "-c", run], "timeoutSeconds": 60, "resultPath": "result.json"});
        group_warm.push(
            one_group(
                &groups,
                &format!("gw{round}"),
                json!({"spec": {"pool": "warm", "run": run_spec}}),
            )
            .await,
        );
        group_cold.push(
            one_group(
                &groups,
                &format!("gc{round}"),
                json!({"spec": {"image": image, "run": run_spec}}),
            )
            .await,
        );
        eprintln!(
            "round {round}: warm p50 {:.0} ms, cold p50 {:.0} ms, group {:.2} s from the pool, {:.2} s cold",
            warm_p50s.last().copied().unwrap_or(f64::NAN),
            cold_p50s.last().copied().unwrap_or(f64::NAN),
            group_warm.last().copied().unwrap_or_default(),
            group_cold.last().copied().unwrap_or_default()
        );
    }
    let machine = machine.report();
    let node = if args.real_node { "real" } else { "hollow" };
    let ms = |v: f64| format!("{v:.0} ms");
    let rounds = format!(
        "Per round (median of the rounds' p50s, spread): warm {}, cold {}.",
        orchard_bench_support::median_spread(&warm_p50s, ms),
        orchard_bench_support::median_spread(&cold_p50s, ms)
    );
    let table = format!(
        "| {node} node | p50 | p99 | samples |\n|---|---|---|---|\n\
         | claim -> Ready from a warm pool | {:.0} ms | {:.0} ms | {} |\n\
         | create -> Ready, cold | {:.0} ms | {:.0} ms | {} |\n\
         | RolloutGroup (N 4, Nmax 8, stride 4) create -> Complete, from the pool | {:.0} ms | {:.0} ms | {} |\n\
         | the same RolloutGroup, cold | {:.0} ms | {:.0} ms | {} |\n",
        quantile_ms(&warm, 0.5),
        quantile_ms(&warm, 0.99),
        warm.len(),
        quantile_ms(&cold, 0.5),
        quantile_ms(&cold, 0.99),
        cold.len(),
        quantile_ms(&group_warm, 0.5),
        quantile_ms(&group_warm, 0.99),
        group_warm.len(),
        quantile_ms(&group_cold, 0.5),
        quantile_ms(&group_cold, 0.99),
        group_cold.len(),
    );
    println!("{table}\n{rounds}");
    if misses > 0 {
        println!("{misses} claims found the pool empty and started cold (not counted as warm)");
    }
    if let Some(path) = &args.write_doc {
        let section = format!(
            "## Warm pools\n\nCommand: `make bench-real` (its `bench-pool` part; release build). On the {node} node, in one run: {count} rounds, each of {claims} Sandboxes created one at a time from a SandboxPool of {claims} busybox members (`spec.pool`), {claims} created cold from the same image, then a RolloutGroup whose template names the pool and the same group cold. Times are from the client's create call to the Ready (or Complete) its own watch saw. The pool is refilled between rounds. Machine: {machine}; the cluster, the node's containers and the client share it.\n\n{table}\n{rounds}",
            count = args.rounds,
            claims = args.claims,
        );
        if let Err(err) = orchard_bench::docs::write_section(path, "## Warm pools", &section) {
            eprintln!("bench-pool: {}: {err}", path.display());
            std::process::exit(1);
        }
    }
    let _ = namespaces.delete(ns, &DeleteParams::default()).await;
}
