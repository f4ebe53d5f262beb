//! `orchard-local-cluster`: runs the local test cluster (etcd, kube-apiserver,
//! kube-controller-manager, the CRDs, a node and the operator) in the foreground until
//! SIGINT/SIGTERM, for `make demo` and for trying things by hand. The node is the hollow node, or with
//! `--real-node` a real one (kubelet, containerd, runc; root only), or with `--real-nodes N` N of them.
//!
//! ```text
//! orchard-local-cluster [--info-file PATH] [--no-operator] [--real-node | --real-nodes N | --kwok-nodes N] [--audit-log] [-- OPERATOR_FLAGS...]
//! ```
//! Once everything is up it writes a JSON file (`--info-file`, default `target/local-cluster.json`)
//! with the kubeconfig path, the gateway URL, the metrics URL and the admin token, and prints
//! `export KUBECONFIG=...`.

use std::path::PathBuf;

use orchard_testcluster::env::{ClusterNode, EnvOptions, NodeKind, TestEnv};
use serde_json::json;

fn usage() -> ! {
    eprintln!(
        "usage: orchard-local-cluster [--info-file PATH] [--no-operator] [--real-node | --real-nodes N | --kwok-nodes N] [--audit-log] [-- OPERATOR_FLAGS...]"
    );
    std::process::exit(2);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut info_file = orchard_testcluster::binaries::target_dir().join("local-cluster.json");
    let mut options = EnvOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--info-file" => info_file = PathBuf::from(args.next().unwrap_or_else(|| usage())),
            "--no-operator" => options.operator = false,
            "--real-node" => options.node = NodeKind::Real,
            "--real-nodes" => {
                options.node = NodeKind::Real;
                options.real_nodes = match args.next().and_then(|n| n.parse::<u8>().ok()) {
                    Some(n) if n >= 1 => n,
                    _ => usage(),
                };
            }
            "--kwok-nodes" => {
                options.node = NodeKind::Kwok;
                options.kwok_nodes = match args.next().and_then(|n| n.parse::<u16>().ok()) {
                    Some(n) if n >= 1 => n,
                    _ => usage(),
                };
            }
            "--audit-log" => options.audit_log = true,
            "--" => {
                options.operator_args.extend(args.by_ref());
            }
            "-h" | "--help" => usage(),
            other => {
                eprintln!("orchard-local-cluster: unknown argument `{other}`");
                usage();
            }
        }
    }
    let _ = std::fs::remove_file(&info_file);
    eprintln!(
        "starting etcd, kube-apiserver, kube-controller-manager, the {} node and the operator...",
        match options.node {
            NodeKind::Hollow => "hollow",
            NodeKind::Real => "real",
            NodeKind::Kwok => "KWOK",
        }
    );
    let started = std::time::Instant::now();
    let env = match TestEnv::start("local-cluster", options).await {
        Ok(env) => env,
        Err(err) => {
            eprintln!("orchard-local-cluster: {err}");
            std::process::exit(1);
        }
    };
    let mut pids = json!({
        "etcd": env.control_plane.pids().get("etcd"),
        "kube-apiserver": env.control_plane.pids().get("kube-apiserver"),
        "kube-controller-manager": env.control_plane.pids().get("kube-controller-manager"),
        "orchard-operator": env.operator.as_ref().and_then(|o| o.pid()),
        "local-node": std::process::id(),
    });
    match &env.node {
        ClusterNode::Real(_) => {
            for (name, pid) in env.node.real().host_pids() {
                pids[name] = json!(pid);
            }
            pids["local-node"] = json!(null);
        }
        ClusterNode::Kwok(nodes) => {
            for (name, pid) in nodes.pids() {
                pids[name] = json!(pid);
            }
            pids["local-node"] = json!(null);
        }
        ClusterNode::Hollow(_) => {}
    }
    let info = json!({
        "kubeconfig": env.control_plane.kubeconfig,
        "server": env.control_plane.server,
        "adminToken": env.control_plane.tokens.get("admin"),
        "gatewayURL": env.operator.as_ref().map(|o| o.gateway_url()),
        "metricsURL": env.operator.as_ref().map(|o| format!("http://127.0.0.1:{}/metrics", o.metrics_port)),
        "logs": env.dir.join("logs"),
        "node": match &env.node {
            ClusterNode::Hollow(_) => json!({"kind": "hollow"}),
            ClusterNode::Kwok(nodes) => json!({"kind": "kwok", "count": nodes.count}),
            ClusterNode::Real(nodes) => json!({
                "kind": "real",
                "nodes": nodes.iter().map(|n| n.name()).collect::<Vec<_>>(),
                "images": {
                    "debian-python": env.node.real().image("debian-python"),
                    "debian-chromium": env.node.real().image("debian-chromium"),
                    "busybox": env.node.real().image("busybox"),
                    "probe": env.node.real().image("probe"),
                },
            }),
        },
        "pid": std::process::id(),
        "pids": pids,
        "cpuUsageFiles": match &env.node {
            ClusterNode::Real(_) => env
                .node
                .real()
                .cpu_usage_files()
                .into_iter()
                .map(|(label, file)| (label, json!(file)))
                .collect::<serde_json::Map<_, _>>(),
            ClusterNode::Hollow(_) | ClusterNode::Kwok(_) => serde_json::Map::new(),
        },
    });
    if let Err(err) = std::fs::write(&info_file, info.to_string()) {
        eprintln!(
            "orchard-local-cluster: cannot write {}: {err}",
            info_file.display()
        );
    }
    eprintln!(
        "local cluster ready in {:.1}s; logs in {}",
        started.elapsed().as_secs_f64(),
        env.dir.join("logs").display()
    );
    println!(
        "export KUBECONFIG={}",
        env.control_plane.kubeconfig.display()
    );
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(err) => {
            eprintln!("orchard-local-cluster: cannot listen for SIGTERM: {err}");
            std::process::exit(1);
        }
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    let (spawns, seconds) = orchard_testcluster::supervise::spawn_stats();
    eprintln!(
        "stopping the local cluster... ({spawns} processes spawned, {seconds:.2} s in the spawner thread)"
    );
    env.stop().await;
    let _ = std::fs::remove_file(&info_file);
}
