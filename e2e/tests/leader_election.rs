//! Two operator processes with leader election on the local cluster: exactly one writes, both serve
//! the gateway, and when the leader is SIGKILLed the other takes over within the lease duration; and
//! a leader cut off from the API server (its traffic, not its process) steps down in time: no write
//! of it lands after the standby took over.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use orchard_operator::api::Sandbox;
use orchard_operator::plumbing::leader::Timing;
use orchard_testcluster::binaries::operator_bin;
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::operator_process::{OperatorProcess, metric_sum};
use orchard_testcluster::tcp_proxy::{TcpProxy, kubeconfig_through, server_address};
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

const LEASE_SECONDS: u64 = 3;

/// Each test starts a cluster of its own; on two cores they run one at a time, so that the lease
/// timing is not measured on a machine running two clusters.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start(env: &TestEnv, identity: &str) -> OperatorProcess {
    start_with(env, identity, &env.control_plane.kubeconfig).await
}

async fn start_with(env: &TestEnv, identity: &str, kubeconfig: &Path) -> OperatorProcess {
    let args = vec![
        "--leader-election".to_string(),
        "--lease-namespace=default".to_string(),
        format!("--lease-duration-seconds={LEASE_SECONDS}"),
        format!("--identity={identity}"),
    ];
    OperatorProcess::start(
        &operator_bin().expect("operator binary"),
        kubeconfig,
        &env.dir
            .join(format!("logs/orchard-operator-{identity}.log")),
        &args,
    )
    .await
    .expect("operator starts")
}

/// Whether `operator` says it leads; `None` when its metrics do not answer, which tells nothing (a
/// replica cut off from the API server still serves them).
async fn leads(operator: &OperatorProcess) -> Option<bool> {
    let metrics = operator.metrics().await.ok()?;
    Some(metric_sum(&metrics, "orchard_leader", &[]) == 1.0)
}

/// Whether `operator` says it leads; a replica whose metrics do not answer is not taken for one.
async fn is_leader(operator: &OperatorProcess) -> bool {
    leads(operator).await == Some(true)
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
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
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
        let (status, _) = orchard_testcluster::http_get(
            &format!("127.0.0.1:{}", operator.gateway_port),
            "/healthz",
        )
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
    // Correctness, not speed (`make bench-lifecycle` measures the takeover): the Lease blocks the
    // standby for one lease duration after the dead leader's last renewal, which was at most a renew
    // deadline before the kill; two lease durations plus the renew deadline is what a user would
    // call a takeover that did not happen.
    let broken = Duration::from_secs(LEASE_SECONDS) * 2
        + Timing::for_lease(Duration::from_secs(LEASE_SECONDS)).renew_deadline;
    assert!(
        takeover <= broken,
        "takeover took {takeover:?}; the lease is {LEASE_SECONDS} s (broken beyond {broken:?})"
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

/// A write the API server accepted, from its audit log.
#[derive(Debug)]
struct LandedWrite {
    user_agent: String,
    verb: String,
    resource: String,
    /// Shown in failure messages.
    #[allow(dead_code)]
    name: String,
    received: Timestamp,
}

/// Every successful write in the audit log at `path`.
fn landed_writes(path: &Path) -> Vec<LandedWrite> {
    let text = std::fs::read_to_string(path).expect("audit log");
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["stage"] == "ResponseComplete")
        .filter(|event| {
            event["responseStatus"]["code"]
                .as_u64()
                .is_some_and(|code| (200..300).contains(&code))
        })
        .filter_map(|event| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            let object = &event["objectRef"];
            let resource = match object["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", text(&object["resource"])),
                None => text(&object["resource"]),
            };
            Some(LandedWrite {
                user_agent: text(&event["userAgent"]),
                verb: text(&event["verb"]),
                resource,
                name: text(&object["name"]),
                received: event["requestReceivedTimestamp"].as_str()?.parse().ok()?,
            })
        })
        .collect()
}

/// Whether the replica `identity` sent `write` (the operator's User-Agent names its identity).
fn by(write: &LandedWrite, identity: &str) -> bool {
    write.user_agent.starts_with("orchard-operator/")
        && write.user_agent.ends_with(&format!("({identity})"))
}

async fn metric(operator: &OperatorProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(&operator.metrics().await.expect("metrics"), name, labels)
}

async fn create_all(api: &Api<Sandbox>, names: &[String]) {
    for name in names {
        api.create(
            &PostParams::default(),
            &sandbox(name, json!({"image": "busybox"})),
        )
        .await
        .expect("create");
    }
}

async fn all_ready(api: &Api<Sandbox>, names: &[String], what: &str) {
    for name in names {
        wait::until(api, name, what, Duration::from_secs(30), is_ready).await;
    }
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_the_api_server_writes_nothing_after_the_takeover() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let began = Instant::now();
    let env = TestEnv::start(
        "leader-cut",
        EnvOptions {
            operator: false,
            audit_log: true,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    let plane = &env.control_plane;
    let audit = plane.audit_log().expect("audit log on");

    // The leader reaches the API server only through a proxy the test can cut; the standby directly.
    let proxy = TcpProxy::start(server_address(&plane.server).expect("server address"))
        .await
        .expect("proxy");
    let through_proxy = plane.dir.join("kubeconfig-through-proxy");
    kubeconfig_through(&plane.kubeconfig, &plane.server, &proxy, &through_proxy)
        .expect("kubeconfig through the proxy");
    let old = start_with(&env, "op-cut", &through_proxy).await;
    wait::poll("op-cut leads", Duration::from_secs(20), || async {
        is_leader(&old).await.then_some(())
    })
    .await;
    let standby = start(&env, "op-standby").await;

    let client = env.client().await;
    let namespace = env.namespace("cut").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &namespace);
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");

    // The leader works before the cut.
    let before = names("before", 2);
    create_all(&api, &before).await;
    all_ready(&api, &before, "Ready before the cut").await;

    // Work in flight at the cut: sandboxes the leader has just begun on.
    let during = names("during", 3);
    create_all(&api, &during).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let forwarded_before_cut = proxy.forwarded_bytes();
    proxy.cut();
    let cut_at = Timestamp::now();
    let cut_instant = Instant::now();

    // The standby takes the Lease once it expired, and reconciles.
    let took_over_at = wait::poll(
        "the standby takes the lease",
        Duration::from_secs(20),
        || async {
            let spec = leases.get("orchard-operator").await.ok()?.spec?;
            (spec.holder_identity.as_deref() == Some("op-standby")).then_some(spec.acquire_time?.0)
        },
    )
    .await;
    println!(
        "takeover {:.2} s after the cut (lease {LEASE_SECONDS} s)",
        cut_instant.elapsed().as_secs_f64()
    );
    let two_leaders = leads(&old).await;
    let after_takeover = names("after-takeover", 1);
    create_all(&api, &after_takeover).await;
    all_ready(&api, &during, "Ready by the new leader").await;
    all_ready(&api, &after_takeover, "Ready by the new leader").await;

    // Heal: the old leader is back in touch, sees new work, and must leave it to the new leader.
    let reconciles_at_heal = metric(
        &old,
        "orchard_reconciles_total",
        &[("controller", "sandbox")],
    )
    .await;
    proxy.heal();
    let after_heal = names("after-heal", 2);
    create_all(&api, &after_heal).await;
    all_ready(&api, &after_heal, "Ready after the heal").await;
    let total = (before.len() + during.len() + after_takeover.len() + after_heal.len()) as f64;
    wait::poll(
        "the old leader's cache shows every sandbox Ready again",
        Duration::from_secs(30),
        || async {
            let ready = metric(&old, "orchard_sandboxes", &[("phase", "Ready")]).await;
            (ready == total).then_some(())
        },
    )
    .await;
    // Time for anything it still had queued (its Lease steps, requeues, retries) to reach the server.
    tokio::time::sleep(Duration::from_secs(2 * LEASE_SECONDS)).await;
    let reconciles_after_heal = metric(
        &old,
        "orchard_reconciles_total",
        &[("controller", "sandbox")],
    )
    .await;
    let leader_after_heal = leads(&old).await;

    let writes = landed_writes(&audit);
    let old_writes: Vec<&LandedWrite> = writes.iter().filter(|w| by(w, "op-cut")).collect();
    let new_writes: Vec<&LandedWrite> = writes.iter().filter(|w| by(w, "op-standby")).collect();
    let stepped_down = std::fs::read_to_string(&old.log)
        .unwrap_or_default()
        .contains("could not renew the lease within the renew deadline");
    println!(
        "proxy: {forwarded_before_cut} bytes forwarded before the cut, {} dropped during it; \
         audit: {} writes of the old leader, {} of the new one; the old leader stepped down on its \
         renew deadline: {stepped_down}; whole test {:.1} s",
        proxy.dropped_bytes(),
        old_writes.len(),
        new_writes.len(),
        began.elapsed().as_secs_f64()
    );

    // The property: nothing from the old leader landed after the takeover, and the standby wrote
    // nothing before it.
    let late: Vec<&&LandedWrite> = old_writes
        .iter()
        .filter(|w| w.received >= took_over_at)
        .collect();
    assert!(
        late.is_empty(),
        "writes of the old leader landed after the takeover at {took_over_at}: {late:#?}"
    );
    let early: Vec<&&LandedWrite> = new_writes
        .iter()
        .filter(|w| w.received < took_over_at)
        .collect();
    assert!(
        early.is_empty(),
        "the standby wrote before it took over at {took_over_at}: {early:#?}"
    );
    assert_eq!(
        two_leaders,
        Some(false),
        "the cut-off replica still considered itself the leader while the standby held the lease (None: its metrics did not answer)"
    );
    assert_eq!(
        leader_after_heal,
        Some(false),
        "the old leader stays a standby after the heal (None: its metrics did not answer)"
    );
    assert!(
        stepped_down,
        "the old leader stepped down on its renew deadline (log {})",
        old.log.display()
    );

    // Positive controls, so that the above cannot pass vacuously: the leader's traffic went through
    // the proxy and the cut dropped some; the attribution sees the old leader's writes before the cut
    // and the new leader's after the takeover; the old leader reconciled again after the heal (as a
    // standby: it had work it would have written for).
    assert!(
        forwarded_before_cut > 0,
        "the leader talked through the proxy"
    );
    assert!(
        proxy.dropped_bytes() > 0,
        "the cut dropped the leader's traffic"
    );
    assert!(
        old_writes
            .iter()
            .any(|w| w.received < cut_at && w.resource == "pods" && w.verb == "create"),
        "the audit log shows the old leader's writes before the cut: {old_writes:#?}"
    );
    assert!(
        new_writes
            .iter()
            .any(|w| w.received >= took_over_at && w.resource == "pods"),
        "the audit log shows the new leader's writes after the takeover"
    );
    assert!(
        reconciles_after_heal > reconciles_at_heal,
        "the old leader reconciled after the heal (as a standby), so it had the chance to write"
    );
    drop(old);
    drop(standby);
    env.stop().await;
}
