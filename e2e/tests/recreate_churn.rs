//! Names are reused: a Sandbox or RolloutGroup deleted and recreated under the same name must come
//! up like a new one, never use or keep anything of its previous incarnation, and cost a bounded
//! number of API writes. `make soak` runs the same churn for minutes with 50 names.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::churn::{self, Churn, Kind};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::operator_process::metric_sum;
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

/// Operator writes one incarnation may cost on average (a Sandbox that reaches Ready and is deleted
/// costs about 4: Secret, Pod, status, and a policy for the open egress modes; a group's trajectory
/// about as much again). A loop that rewrites what it cannot see yet shows up as many times more.
const MAX_WRITES_PER_INCARNATION: f64 = 12.0;

/// The tests of this binary share one operator, and the write counts are read from its metrics: they
/// run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn seed() -> u64 {
    std::env::var("ORCHARD_CHURN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_124)
}

async fn operator_writes(env: &TestEnv) -> f64 {
    let text = env.operator().metrics().await.expect("operator metrics");
    metric_sum(&text, "orchard_api_writes_total", &[])
}

/// The reproduction: Ready, `kubectl delete --wait`, apply again, Ready again.
#[tokio::test]
async fn a_sandbox_recreated_under_its_old_name_becomes_ready() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("again").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    for round in 0..3 {
        let created = api
            .create(
                &PostParams::default(),
                &sandbox("again", json!({"image": "busybox:1.36"})),
            )
            .await
            .expect("create");
        let ready = wait::until(&api, "again", "Ready", Duration::from_secs(60), is_ready).await;
        assert_eq!(
            ready.uid(),
            created.uid(),
            "round {round}: the new incarnation is Ready"
        );
        api.delete("again", &DeleteParams::default())
            .await
            .expect("delete");
        wait::deleted(&api, "again", Duration::from_secs(30)).await;
    }
}

#[tokio::test]
async fn sandboxes_churned_under_the_same_names_come_up_clean() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("churn-sbx").await;
    let config = Churn {
        kind: Kind::Sandboxes,
        names: 6,
        rounds: 4,
        duration: None,
        seed: seed(),
        settle: Duration::from_secs(90),
    };
    let before = operator_writes(env).await;
    let report = churn::run(&client, &ns, &config).await;
    let writes = operator_writes(env).await - before;
    let per = writes / report.incarnations as f64;
    println!(
        "sandbox churn (seed {}): {:?}; {writes} operator writes, {per:.2} per incarnation",
        config.seed,
        churn::summary(&report)
    );
    assert!(
        report.clean(),
        "{report:#?}\noperator log:\n{}",
        env.operator_log_tail(60)
    );
    assert!(
        per <= MAX_WRITES_PER_INCARNATION,
        "{per:.2} operator writes per incarnation (bound {MAX_WRITES_PER_INCARNATION})"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn rollout_groups_churned_under_the_same_names_complete_with_their_own_trajectories() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("churn-rg").await;
    let config = Churn {
        kind: Kind::RolloutGroups,
        names: 3,
        rounds: 3,
        duration: None,
        seed: seed(),
        settle: Duration::from_secs(120),
    };
    let before = operator_writes(env).await;
    let report = churn::run(&client, &ns, &config).await;
    let writes = operator_writes(env).await - before;
    // A group launches up to 4 trajectories: bound per trajectory-sized unit of work.
    let per = writes / (report.incarnations as f64 * 4.0);
    println!(
        "group churn (seed {}): {:?}; {writes} operator writes, {per:.2} per possible trajectory",
        config.seed,
        churn::summary(&report)
    );
    assert!(
        report.clean(),
        "{report:#?}\noperator log:\n{}",
        env.operator_log_tail(60)
    );
    assert!(
        per <= MAX_WRITES_PER_INCARNATION,
        "{per:.2} operator writes per trajectory (bound {MAX_WRITES_PER_INCARNATION})"
    );
    env.delete_namespace(&ns).await;
}
