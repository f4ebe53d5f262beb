//! Drives the Python SDK's tests (`sdk/python/tests`, pytest) against the local cluster with the
//! operator process (the hollow node): every test runs, direct mode included. Fails when pytest fails.

use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::sdk::{SdkTarget, run_sdk_tests};

#[tokio::test]
async fn python_sdk_tests_pass_against_the_local_cluster() {
    let env = TestEnv::shared();
    let operator = env.operator();
    let target = SdkTarget {
        gateway: operator.gateway_url(),
        metrics: format!("http://127.0.0.1:{}/metrics", operator.metrics_port),
        image: "busybox".into(),
        python_image: "python:3.11".into(),
        direct: true,
    };
    let run = run_sdk_tests(env, &target).await;
    if let Some(status) = run.failure {
        panic!(
            "pytest failed ({status}); operator log tail:\n{}",
            env.operator_log_tail(40)
        );
    }
    assert!(
        !run.stdout.contains(" skipped"),
        "no SDK test may be skipped against the cluster"
    );
}
