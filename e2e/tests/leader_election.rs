//! Two operator processes with leader election on the local cluster: exactly one writes, both serve
//! the gateway, and when the leader is SIGKILLed the other takes over within the lease duration.

mod common_sandbox;

use std::time::{Duration, Instant};

use common_sandbox::{is_ready, sandbox};
use kube::api::{Api, PostParams};
use orchard_e2e::binaries::operator_bin;
use orchard_e2e::env::{EnvOptions, TestEnv};
use orchard_e2e::operator_process::{OperatorProcess, metric_sum};
use orchard_e2e::wait;
use orchard_operator::api::Sandbox;
use serde_json::json;

const LEASE_SECONDS: u64 = 3;

async fn start(env: &TestEnv, identity: &str) -> OperatorProcess {
    let args = vec![
        "--leader-election".to_string(),
        "--lease-namespace=default".to_string(),
        format!("--lease-duration-seconds={LEASE_SECONDS}"),
        format!("--identity={identity}"),
    ];
    OperatorProcess::start(
        &operator_bin().expect("operator binary"),
        &env.control_plane.kubeconfig,
        &env.dir
            .join(format!("logs/orchard-operator-{identity}.log")),
        &args,
    )
    .await
    .expect("operator starts")
}

async fn is_leader(operator: &OperatorProcess) -> bool {
    operator
        .metrics()
        .await
        .is_ok_and(|m| metric_sum(&m, "orchard_leader", &[]) == 1.0)
}

async fn writes(operator: &OperatorProcess) -> f64 {
    metric_sum(
        &operator.metrics().await.expect("metrics"),
        "orchard_api_writes_total",
        &[],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_writes_and_the_standby_takes_over() {
    let env = TestEnv::start(
        "leader",
        EnvOptions {
            operator: false,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    let a = start(&env, "op-a").await;
    let b = start(&env, "op-b").await;
    let leader_is_a = wait::poll("one leader elected", Duration::from_secs(20), || async {
        match (is_leader(&a).await, is_leader(&b).await) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    })
    .await;
    let (leader, standby) = if leader_is_a { (&a, &b) } else { (&b, &a) };

    let client = env.client().await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), "default");
    api.create(
        &PostParams::default(),
        &sandbox("first", json!({"image": "busybox"})),
    )
    .await
    .expect("create");
    wait::until(&api, "first", "Ready", Duration::from_secs(60), is_ready).await;
    assert!(writes(leader).await > 0.0, "the leader wrote");
    assert_eq!(writes(standby).await, 0.0, "the standby wrote nothing");
    for operator in [leader, standby] {
        let (status, _) =
            orchard_e2e::http_get(&format!("127.0.0.1:{}", operator.gateway_port), "/healthz")
                .await
                .expect("gateway answers");
        assert_eq!(status, 200, "the gateway serves on every replica");
    }

    leader.kill();
    let killed = Instant::now();
    wait::poll(
        "the standby takes over",
        Duration::from_secs(20),
        || async { is_leader(standby).await.then_some(()) },
    )
    .await;
    let takeover = killed.elapsed();
    println!(
        "takeover after SIGKILL of the leader: {:.2} s (lease {LEASE_SECONDS} s)",
        takeover.as_secs_f64()
    );
    assert!(
        takeover <= Duration::from_secs(LEASE_SECONDS) + Duration::from_millis(1500),
        "takeover took {takeover:?}; the lease is {LEASE_SECONDS} s"
    );
    api.create(
        &PostParams::default(),
        &sandbox("second", json!({"image": "busybox"})),
    )
    .await
    .expect("create");
    wait::until(
        &api,
        "second",
        "Ready after takeover",
        Duration::from_secs(60),
        is_ready,
    )
    .await;
    env.stop().await;
}
