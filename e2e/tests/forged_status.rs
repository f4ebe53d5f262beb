//! A forged Sandbox status never steers the gateway: a forged `status.agentEndpoint` never receives a
//! call or the token (the gateway derives the endpoint from the sandbox's own sealed pod), and a forged
//! Ready status on a sandbox without a pod opens nothing (409 `NotReady`).
//!
//! Without a race: an operator that reconciles rewrites a forged status at once, so a gateway beside it
//! might never hold the forgery when the call comes. Here the gateway that answers is a standby
//! replica (leader election, its Lease held by somebody else for an hour): it serves from its watch
//! caches like every replica and never reconciles, so nothing corrects the forgery. Each test waits
//! until that gateway's own GET returns the forged status (its cache holds it), calls, and checks
//! again afterwards that the cache still held it. A scoped operator that does reconcile prepares the
//! sandbox and is SIGKILLed before the standby starts. The pure decision is unit-tested in
//! `operator/src/gateway/objects/lookup.rs` (`ready_sandboxes_give_their_endpoint`,
//! `sandboxes_not_ready_are_409_with_their_phase`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::now_rfc3339;
use orchard_testcluster::operator_process::{OperatorProcess, metric_sum};
use orchard_testcluster::test_support::gateway::{Answer, Caller, sandbox_path, scoped_operator};
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A cluster without an operator of its own: each test starts the operators of its namespace.
fn env() -> &'static TestEnv {
    static ENV: OnceLock<TestEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        TestEnv::start_named_on_own_thread(
            "forged",
            EnvOptions {
                operator: false,
                ..EnvOptions::default()
            },
        )
    })
}

/// A listener standing in for whatever a forged `status.agentEndpoint` points at; counts connections.
async fn decoy() -> (String, std::sync::Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        while let Ok((_socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    (format!("http://{address}"), hits)
}

/// Writes `status` fields as anyone allowed to patch a Sandbox's status could.
async fn forge_status(env: &TestEnv, ns: &str, name: &str, status: Value) {
    let api: Api<Sandbox> = Api::namespaced(env.client().await, ns);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .expect("status patched");
}

/// A gateway replica of `ns` that never reconciles: leader election on a Lease that somebody else
/// holds for an hour (created here first).
async fn standby_gateway(env: &TestEnv, ns: &str) -> OperatorProcess {
    let leases: Api<Lease> = Api::namespaced(env.client().await, ns);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "held", "namespace": ns},
        "spec": {"holderIdentity": "somebody-else", "leaseDurationSeconds": 3600,
            "acquireTime": now_rfc3339(), "renewTime": now_rfc3339()},
    }))
    .expect("lease JSON");
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("create the held Lease");
    let lease_namespace = format!("--lease-namespace={ns}");
    let standby = scoped_operator(
        env,
        ns,
        &format!("standby-{ns}"),
        &["--leader-election", &lease_namespace, "--lease-name=held"],
    )
    .await;
    let metrics = standby.metrics().await.expect("standby metrics");
    assert_eq!(
        metric_sum(&metrics, "orchard_leader", &[]),
        0.0,
        "the standby must not lead"
    );
    standby
}

/// Waits until `caller`'s gateway answers GET of the sandbox with a status for which `forged` holds
/// (its watch cache has the forged status); returns that answer.
async fn until_the_gateway_holds(
    caller: &Caller,
    ns: &str,
    name: &str,
    forged: impl Fn(&Value) -> bool,
) -> Answer {
    let path = sandbox_path(ns, name, "");
    wait::poll(
        "the gateway's cache holds the forged status",
        TIMEOUT,
        || async {
            let answer = caller.get(&path).await;
            (answer.status == 200 && forged(&answer.body["status"])).then_some(answer)
        },
    )
    .await
}

/// Asserts the gateway's cache still holds the forged status after the calls. Nothing here writes a
/// status but the test (the standby never reconciles), so the calls in between were decided on it.
async fn assert_still_holds(caller: &Caller, ns: &str, name: &str, before: &Answer) {
    let after = caller.get(&sandbox_path(ns, name, "")).await;
    assert_eq!(after.status, 200, "{after:?}");
    assert_eq!(
        after.body["status"], before.body["status"],
        "the sandbox's status changed while the gateway was called: {after:?}"
    );
}

#[tokio::test]
async fn a_forged_agent_endpoint_never_receives_the_token() {
    let env = env();
    let ns = env.namespace("forged-endpoint").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(env.client().await, &ns);
    let maker = scoped_operator(env, &ns, &format!("maker-{ns}"), &[]).await;
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("victim", json!({"image": "busybox"})),
        )
        .await
        .expect("sandbox accepted");
    wait::until(&sandboxes, "victim", "Ready", TIMEOUT, is_ready).await;
    maker.kill();

    let standby = standby_gateway(env, &ns).await;
    let admin = Caller::at(
        &standby.gateway_url(),
        Some(&env.control_plane.tokens["admin"]),
    );
    let exec = || admin.exec(&ns, "victim", json!({"argv": ["echo", "real"]}));
    // The standby's gateway reaches the real agent (the refusals below are not a broken replica).
    let control = exec().await;
    assert_eq!(
        (control.status, &control.body["stdout"]),
        (200, &json!("real\n")),
        "{control:?}"
    );

    let (fake, hits) = decoy().await;
    forge_status(env, &ns, "victim", json!({"agentEndpoint": fake})).await;
    let held = until_the_gateway_holds(&admin, &ns, "victim", |s| s["agentEndpoint"] == fake).await;
    for _ in 0..5 {
        let answer = exec().await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.body["stdout"], "real\n", "{answer:?}");
    }
    assert_still_holds(&admin, &ns, "victim", &held).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the gateway connected to the forged endpoint"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_forged_ready_status_without_a_pod_opens_nothing() {
    let env = env();
    let ns = env.namespace("forged-ready").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(env.client().await, &ns);
    // A sandbox that waits for a pool that does not exist: it never gets a pod.
    let maker = scoped_operator(env, &ns, &format!("maker-{ns}"), &[]).await;
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox(
                "waiting",
                json!({"image": "busybox", "pool": "nope", "whenPoolEmpty": "Wait"}),
            ),
        )
        .await
        .expect("sandbox accepted");
    wait::until(
        &sandboxes,
        "waiting",
        "waiting for its pool",
        TIMEOUT,
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.conditions.iter().any(|c| c.reason == "PoolNotFound"))
        },
    )
    .await;
    maker.kill();

    let standby = standby_gateway(env, &ns).await;
    let admin = Caller::at(
        &standby.gateway_url(),
        Some(&env.control_plane.tokens["admin"]),
    );
    let (fake, hits) = decoy().await;
    forge_status(
        env,
        &ns,
        "waiting",
        json!({"phase": "Ready", "agentEndpoint": fake, "conditions": [{
            "type": "Ready", "status": "True", "reason": "Forged", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    )
    .await;
    let held = until_the_gateway_holds(&admin, &ns, "waiting", |s| {
        s["phase"] == "Ready" && s["agentEndpoint"] == fake
    })
    .await;
    let answer = admin.exec(&ns, "waiting", json!({"argv": ["true"]})).await;
    // Refused for want of a pod of its own, although the status it holds says Ready (the answer
    // names the phase it read: the forged one).
    assert_eq!(
        (answer.status, answer.code(), &answer.body["phase"]),
        (409, "NotReady", &json!("Ready")),
        "{answer:?}"
    );
    assert_still_holds(&admin, &ns, "waiting", &held).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the gateway connected to the forged endpoint"
    );
    env.delete_namespace(&ns).await;
}
