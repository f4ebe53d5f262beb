//! The gateway on the local cluster with the real operator: authentication (TokenReview) and
//! authorisation (SubjectAccessReview against real RBAC Roles of the test users), the sandbox lifecycle,
//! exec (unary and streamed), files, patches and background processes proxied to the agent at the pod
//! IP, result recording (write-once), and the error codes a client acts on.

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::{Caller, grant, sandbox_path, trainer_rules};
use serde_json::json;

#[tokio::test]
async fn callers_are_authenticated_and_authorised_with_rbac() {
    let env = TestEnv::shared();
    let team_a = env.namespace("gw-auth-a").await;
    let team_b = env.namespace("gw-auth-b").await;
    grant(env, &team_a, "alice", "trainer", trainer_rules()).await;
    // bob may only read files in team A.
    grant(
        env,
        &team_a,
        "bob",
        "reader",
        json!([{"apiGroups": ["orchard.dev"], "resources": ["sandboxes/files"], "verbs": ["get"]}]),
    )
    .await;
    let alice = Caller::user(env, "alice");
    let bob = Caller::user(env, "bob");
    let admin = Caller::user(env, "admin");

    let anonymous = Caller::with_token(env, None)
        .get(&format!("/v1/namespaces/{team_a}/sandboxes"))
        .await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert_eq!(anonymous.code(), "Unauthorized");
    assert!(
        anonymous.message().contains("Authorization: Bearer"),
        "{anonymous:?}"
    );
    let forged = Caller::with_token(env, Some("not-a-real-token"))
        .get(&format!("/v1/namespaces/{team_a}/sandboxes"))
        .await;
    assert_eq!(forged.status, 401, "{forged:?}");
    assert!(forged.message().contains("not accepted"), "{forged:?}");

    let denied = bob.get(&format!("/v1/namespaces/{team_a}/sandboxes")).await;
    assert_eq!(denied.status, 403, "{denied:?}");
    assert!(
        denied.message().starts_with(&format!(
            "user bob cannot list sandboxes in namespace {team_a}"
        )),
        "{denied:?}"
    );

    let name = alice
        .create_sandbox(&team_a, json!({"image": "busybox", "name": "mine"}))
        .await;
    alice.wait_ready(&team_a, &name).await;
    let ran = alice
        .exec(
            &team_a,
            &name,
            json!({"argv": ["/bin/sh", "-c", "echo $ORCHARD_SANDBOX"]}),
        )
        .await;
    assert_eq!(ran.status, 200, "{ran:?}");
    assert_eq!(ran.body["stdout"], "mine\n");

    // alice has no rights in team B, even on a sandbox that exists there.
    let theirs = admin
        .create_sandbox(&team_b, json!({"image": "busybox", "name": "theirs"}))
        .await;
    admin.wait_ready(&team_b, &theirs).await;
    let cross = alice
        .exec(&team_b, &theirs, json!({"argv": ["true"]}))
        .await;
    assert_eq!(cross.status, 403, "{cross:?}");
    assert!(
        cross.message().starts_with(&format!(
            "user alice cannot create sandboxes/exec in namespace {team_b}"
        )),
        "{cross:?}"
    );
    let peek = alice.get(&sandbox_path(&team_b, &theirs, "")).await;
    assert_eq!(peek.status, 403, "{peek:?}");

    // Subresources are separate permissions: bob reads files but cannot write them or exec.
    let upload = alice
        .send(
            alice
                .request(
                    reqwest::Method::PUT,
                    &sandbox_path(&team_a, &name, "/files?path=notes.txt"),
                )
                .body("from alice"),
        )
        .await;
    assert_eq!(upload.status, 201, "{upload:?}");
    let read = bob
        .get(&sandbox_path(&team_a, &name, "/files?path=notes.txt"))
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.bytes, b"from alice");
    let write = bob
        .send(
            bob.request(
                reqwest::Method::PUT,
                &sandbox_path(&team_a, &name, "/files?path=x"),
            )
            .body("no"),
        )
        .await;
    assert_eq!(write.status, 403, "{write:?}");
    assert!(
        write.message().contains("cannot create sandboxes/files"),
        "{write:?}"
    );
    let exec = bob.exec(&team_a, &name, json!({"argv": ["true"]})).await;
    assert!(
        exec.message().contains("cannot create sandboxes/exec"),
        "{exec:?}"
    );

    // Decisions are cached briefly, and the cache shows up in the metrics.
    let metrics = env.operator().metrics().await.expect("metrics");
    assert!(
        orchard_testcluster::operator_process::metric_sum(
            &metrics,
            "orchard_gateway_auth_cache_total",
            &[("result", "hit")]
        ) > 0.0,
        "auth cache hits counted"
    );
    env.delete_namespace(&team_a).await;
    env.delete_namespace(&team_b).await;
}

#[tokio::test]
async fn sandboxes_run_commands_move_files_and_apply_patches_through_the_gateway() {
    let env = TestEnv::shared();
    let ns = env.namespace("gw-life").await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let alice = Caller::user(env, "alice");

    let started = Instant::now();
    let created = alice
        .post(
            &format!("/v1/namespaces/{ns}/sandboxes"),
            json!({"image": "python:3.11", "env": {"GREETING": "hi"}, "ttlSeconds": 600,
                   "labels": {"experiment": "e1"}}),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert!(
        created.body["status"].is_null(),
        "create answers before the sandbox starts: {created:?}"
    );
    println!("create answered in {:?}", started.elapsed());
    let name = created.body["metadata"]["name"]
        .as_str()
        .expect("name")
        .to_string();
    assert!(name.starts_with("sbx-"), "{name}");
    assert_eq!(
        created.body["metadata"]["annotations"]["orchard.dev/created-by"],
        "alice"
    );
    let ready = alice.wait_ready(&ns, &name).await;
    assert!(ready["status"]["agentEndpoint"].as_str().is_some());
    println!(
        "create -> Ready through the gateway: {:?}",
        started.elapsed()
    );

    let got = alice.get(&sandbox_path(&ns, &name, "")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["spec"]["lifecycle"]["ttlSeconds"], 600);
    let listed = alice
        .get(&format!(
            "/v1/namespaces/{ns}/sandboxes?labelSelector=experiment%3De1"
        ))
        .await;
    assert_eq!(
        listed.body["items"].as_array().map(Vec::len),
        Some(1),
        "{listed:?}"
    );
    let none = alice
        .get(&format!(
            "/v1/namespaces/{ns}/sandboxes?labelSelector=experiment%3De2"
        ))
        .await;
    assert_eq!(none.body["items"].as_array().map(Vec::len), Some(0));

    // Exec: argv, env from the spec and the request, cwd, stdin.
    let ran = alice
        .exec(
            &ns,
            &name,
            json!({"argv": ["/bin/sh", "-c", "cat; echo \" $GREETING $EXTRA\"; pwd"],
                   "env": {"EXTRA": "there"}, "cwd": "/tmp", "stdin": "in"}),
        )
        .await;
    assert_eq!(ran.status, 200, "{ran:?}");
    assert_eq!(ran.body["stdout"], "in hi there\n/tmp\n");
    assert_eq!(ran.body["exitCode"], 0);
    // A proxied call whose body the agent read keeps the caller's connection open for the next one
    // (it once answered every exec with `Connection: close`, a TCP handshake per call).
    let kept = alice
        .request(reqwest::Method::POST, &sandbox_path(&ns, &name, "/exec"))
        .json(&json!({"argv": ["true"]}))
        .send()
        .await
        .expect("exec");
    assert_eq!(kept.status(), 200);
    assert_eq!(
        kept.headers().get(reqwest::header::CONNECTION),
        None,
        "{:?}",
        kept.headers()
    );
    let failed = alice
        .exec(&ns, &name, json!({"command": "echo oops >&2; exit 3"}))
        .await;
    assert_eq!(failed.body["exitCode"], 3);
    assert_eq!(failed.body["stderr"], "oops\n");
    // Agent errors pass through unchanged.
    let bad_cwd = alice
        .exec(&ns, &name, json!({"argv": ["true"], "cwd": "/no/such/dir"}))
        .await;
    assert_eq!(bad_cwd.status, 400, "{bad_cwd:?}");
    assert_eq!(bad_cwd.code(), "InvalidCwd");

    // Streaming: the first line arrives while the command still runs. The command waits for a file
    // the test creates only once it has read the first line, so a gateway that held the output back
    // until the command ended would deliver nothing (the read gives up after 60 s) and the command
    // would be killed at its 90 s time-out without printing "second".
    let stream = alice
        .request(
            reqwest::Method::POST,
            &sandbox_path(&ns, &name, "/exec/stream"),
        )
        .json(&json!({
            "command": "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second",
            "timeoutSeconds": 90,
        }));
    let mut text = String::new();
    let mut chunks = tokio::time::timeout(Duration::from_secs(60), async {
        let response = stream.send().await.expect("stream");
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap_or(""),
            "application/x-ndjson"
        );
        let mut chunks = response.bytes_stream();
        while !text.contains("first") {
            let chunk = chunks
                .next()
                .await
                .expect("the stream ended before the first line");
            text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
        }
        chunks
    })
    .await
    .expect("the first line was not streamed while the command ran");
    assert!(!text.contains("second"), "{text}");
    let go = alice
        .exec(&ns, &name, json!({"argv": ["touch", "go"]}))
        .await;
    assert_eq!(go.status, 200, "{go:?}");
    while let Some(chunk) = chunks.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("NDJSON line"))
        .collect();
    assert_eq!(
        events.first().map(|e| e["type"].clone()),
        Some(json!("started"))
    );
    assert_eq!(events.last().map(|e| e["exitCode"].clone()), Some(json!(0)));

    // Files: a binary round trip, listing, deletion.
    let payload: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    let put = alice
        .send(
            alice
                .request(
                    reqwest::Method::PUT,
                    &sandbox_path(&ns, &name, "/files?path=work/data.bin"),
                )
                .body(payload.clone()),
        )
        .await;
    assert_eq!(put.status, 201, "{put:?}");
    assert_eq!(put.body["size"], 1 << 20);
    let got = alice
        .get(&sandbox_path(&ns, &name, "/files?path=work/data.bin"))
        .await;
    assert_eq!(got.status, 200);
    assert!(got.bytes == payload, "download differs");
    let listing = alice
        .get(&sandbox_path(&ns, &name, "/files/list?path=work"))
        .await;
    assert_eq!(
        listing.body["entries"][0]["name"], "data.bin",
        "{listing:?}"
    );
    let deleted = alice
        .delete(&sandbox_path(&ns, &name, "/files?path=work/data.bin"))
        .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let missing = alice
        .get(&sandbox_path(&ns, &name, "/files?path=work/data.bin"))
        .await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.code(), "NotFound");

    // Patches: applied natively; a conflicting one changes nothing and says which hunk failed.
    alice
        .send(
            alice
                .request(
                    reqwest::Method::PUT,
                    &sandbox_path(&ns, &name, "/files?path=repo/a.txt"),
                )
                .body("one\ntwo\nthree\n"),
        )
        .await;
    let diff = "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n";
    let patched = alice
        .post(
            &sandbox_path(&ns, &name, "/patch"),
            json!({"patch": diff, "cwd": "repo"}),
        )
        .await;
    assert_eq!(patched.status, 200, "{patched:?}");
    assert_eq!(patched.body["files"][0]["action"], "modified");
    let content = alice
        .get(&sandbox_path(&ns, &name, "/files?path=repo/a.txt"))
        .await;
    assert_eq!(content.bytes, b"one\n2\nthree\n");
    let conflict = alice
        .post(
            &sandbox_path(&ns, &name, "/patch"),
            json!({"patch": diff, "cwd": "repo"}),
        )
        .await;
    assert_eq!(conflict.status, 409, "{conflict:?}");
    assert_eq!(conflict.code(), "PatchConflict");
    assert!(conflict.body["failedHunks"].is_array());

    // Background processes: start, list, signal, wait for the exit, forget.
    let process = alice
        .post(
            &sandbox_path(&ns, &name, "/processes"),
            json!({"id": "server", "argv": ["sleep", "60"]}),
        )
        .await;
    assert_eq!(process.status, 201, "{process:?}");
    assert_eq!(process.body["state"], "running");
    let list = alice
        .get(&sandbox_path(&ns, &name, "/processes?output=false"))
        .await;
    assert_eq!(list.body["processes"][0]["id"], "server", "{list:?}");
    let signalled = alice
        .post(
            &sandbox_path(&ns, &name, "/processes/server/signal"),
            json!({"signal": "TERM"}),
        )
        .await;
    assert_eq!(signalled.status, 200, "{signalled:?}");
    let exited = alice
        .get(&sandbox_path(&ns, &name, "/processes/server?wait=10"))
        .await;
    assert_eq!(exited.body["state"], "exited", "{exited:?}");
    let forgotten = alice
        .delete(&sandbox_path(&ns, &name, "/processes/server"))
        .await;
    assert_eq!(forgotten.status, 200);
    let gone = alice
        .get(&sandbox_path(&ns, &name, "/processes/server"))
        .await;
    assert_eq!(gone.status, 404);

    // Delete: answered as soon as the API server took it, and from then on this gateway shows the
    // sandbox as gone, whether or not its watch cache has seen the deletion yet.
    let removed = alice.delete(&sandbox_path(&ns, &name, "")).await;
    assert_eq!(removed.status, 200, "{removed:?}");
    assert_eq!(removed.body["deleted"], true);
    let read = alice.get(&sandbox_path(&ns, &name, "")).await;
    assert_eq!(read.status, 404, "read right after the delete: {read:?}");
    let listed = alice.get(&format!("/v1/namespaces/{ns}/sandboxes")).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let names: Vec<&str> = listed.body["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item["metadata"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !names.contains(&name.as_str()),
        "listed right after the delete: {names:?}"
    );
    let waited = alice
        .get(&sandbox_path(&ns, &name, "/wait?timeoutSeconds=5"))
        .await;
    assert_eq!(
        waited.status, 404,
        "wait right after the delete: {waited:?}"
    );
    let sandboxes: Api<Sandbox> = Api::namespaced(env.client().await, &ns);
    orchard_testcluster::wait::deleted(&sandboxes, &name, Duration::from_secs(30)).await;
    let after = alice.exec(&ns, &name, json!({"argv": ["true"]})).await;
    assert_eq!(after.status, 404, "{after:?}");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn errors_say_what_to_do() {
    let env = TestEnv::shared();
    let ns = env.namespace("gw-errors").await;
    let admin = Caller::user(env, "admin");

    let unknown = admin.get(&sandbox_path(&ns, "nope", "")).await;
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert_eq!(unknown.code(), "NotFound");
    assert_eq!(unknown.message(), format!("sandbox {ns}/nope not found"));
    let unknown_exec = admin.exec(&ns, "nope", json!({"argv": ["true"]})).await;
    assert_eq!(unknown_exec.status, 404);
    let unknown_wait = admin
        .get(&sandbox_path(&ns, "nope", "/wait?timeoutSeconds=1"))
        .await;
    assert_eq!(unknown_wait.status, 404);

    // A sandbox that cannot be scheduled stays Pending: 409 with the phase, retryable.
    let pending = admin
        .create_sandbox(
            &ns,
            json!({"name": "stuck", "image": "busybox", "nodeSelector": {"orchard.dev/test": "nowhere"}}),
        )
        .await;
    let early = admin.exec(&ns, &pending, json!({"argv": ["true"]})).await;
    assert_eq!(early.status, 409, "{early:?}");
    assert_eq!(early.code(), "NotReady");
    assert_eq!(early.body["phase"], "Pending");
    assert_eq!(early.body["retryable"], true);
    let started = Instant::now();
    let waited = admin
        .get(&sandbox_path(&ns, &pending, "/wait?timeoutSeconds=1"))
        .await;
    assert_eq!(waited.status, 504, "{waited:?}");
    assert_eq!(waited.code(), "WaitTimeout");
    assert_eq!(waited.body["phase"], "Pending");
    assert!(started.elapsed() < Duration::from_secs(5));

    let typo = admin
        .post(
            &format!("/v1/namespaces/{ns}/sandboxes"),
            json!({"imgae": "busybox"}),
        )
        .await;
    assert_eq!(typo.status, 400, "{typo:?}");
    assert!(typo.message().contains("imgae"), "{typo:?}");
    let invalid = admin
        .post(
            &format!("/v1/namespaces/{ns}/sandboxes"),
            json!({"image": "busybox", "ttlSeconds": 0}),
        )
        .await;
    assert_eq!(invalid.status, 422, "{invalid:?}");
    assert!(
        invalid
            .message()
            .contains("lifecycle.ttlSeconds must be positive"),
        "{invalid:?}"
    );
    let duplicate = admin
        .post(
            &format!("/v1/namespaces/{ns}/sandboxes"),
            json!({"name": "stuck", "image": "busybox"}),
        )
        .await;
    assert_eq!(duplicate.status, 409, "{duplicate:?}");
    assert_eq!(duplicate.code(), "AlreadyExists");
    let selector = admin
        .get(&format!(
            "/v1/namespaces/{ns}/sandboxes?labelSelector=a%20in%20b"
        ))
        .await;
    assert_eq!(selector.status, 400, "{selector:?}");
    let timeout_header = admin
        .send(
            admin
                .request(reqwest::Method::POST, &sandbox_path(&ns, &pending, "/exec"))
                .header("x-orchard-timeout", "soon")
                .json(&json!({"argv": ["true"]})),
        )
        .await;
    assert_eq!(timeout_header.status, 400, "{timeout_header:?}");

    let route = admin.get("/v2/nothing").await;
    assert_eq!(route.status, 404);
    assert_eq!(route.code(), "NotFound");
    let health = Caller::with_token(env, None).get("/healthz").await;
    assert_eq!(health.status, 200);
    let openapi = Caller::with_token(env, None).get("/openapi.json").await;
    assert_eq!(openapi.status, 200);
    assert!(
        openapi.body["paths"]["/v1/namespaces/{namespace}/sandboxes/{name}/exec"]["post"]
            .is_object(),
        "exec documented"
    );
    assert!(openapi.body["components"]["schemas"]["Sandbox"]["properties"]["spec"].is_object());
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn trajectory_results_are_recorded_once() {
    let env = TestEnv::shared();
    let ns = env.namespace("gw-result").await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let alice = Caller::user(env, "alice");
    let name = alice
        .create_sandbox(&ns, json!({"name": "traj", "image": "busybox"}))
        .await;
    alice.wait_ready(&ns, &name).await;

    let result =
        json!({"reward": 1.0, "status": "completed", "length": 12, "artifact": "s3://bucket/traj"});
    let recorded = alice
        .post(&sandbox_path(&ns, &name, "/result"), result.clone())
        .await;
    assert_eq!(recorded.status, 200, "{recorded:?}");
    assert_eq!(recorded.body["recorded"], true);
    let sandboxes: Api<Sandbox> = Api::namespaced(env.client().await, &ns);
    let stored = sandboxes.get(&name).await.expect("sandbox");
    let stored = stored
        .status
        .and_then(|s| s.result)
        .expect("result recorded");
    assert_eq!(stored.reward, Some(1.0));
    assert_eq!(stored.artifact.as_deref(), Some("s3://bucket/traj"));

    // The same result again is fine (a retried request); a different one is a 409.
    let again = alice
        .post(&sandbox_path(&ns, &name, "/result"), result)
        .await;
    assert_eq!(again.status, 200, "{again:?}");
    let other = alice
        .post(
            &sandbox_path(&ns, &name, "/result"),
            json!({"reward": 0.0, "status": "completed"}),
        )
        .await;
    assert_eq!(other.status, 409, "{other:?}");
    assert_eq!(other.code(), "ResultAlreadyRecorded");
    assert!(other.message().contains("write-once"), "{other:?}");
    let invalid = alice
        .post(
            &sandbox_path(&ns, &name, "/result"),
            json!({"status": "completed"}),
        )
        .await;
    assert_eq!(invalid.status, 400, "{invalid:?}");
    env.delete_namespace(&ns).await;
}

/// A `spec.run` of `seconds` of sleep that then writes reward 0.
fn run_writing_reward_zero(seconds: u32) -> serde_json::Value {
    json!({"command": ["/bin/sh", "-c",
                       format!("sleep {seconds}; echo '{{\"reward\": 0}}' > result.json")],
           "timeoutSeconds": 120, "resultPath": "result.json"})
}

#[tokio::test]
async fn the_result_of_a_run_driven_sandbox_is_the_runners_alone() {
    let env = TestEnv::shared();
    let ns = env.namespace("gw-rundriven").await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    // bob is an evaluator that only posts results (the Role docs/API.md suggests for that).
    grant(
        env,
        &ns,
        "bob",
        "evaluator",
        json!([{"apiGroups": ["orchard.dev"], "resources": ["sandboxes/result"], "verbs": ["create"]}]),
    )
    .await;
    let alice = Caller::user(env, "alice");
    let bob = Caller::user(env, "bob");
    let sandboxes: Api<Sandbox> = Api::namespaced(env.client().await, &ns);

    // Through the gateway: refused, whoever asks, and the runner's result is recorded later.
    let name = alice
        .create_sandbox(
            &ns,
            json!({"name": "run", "image": "busybox", "run": run_writing_reward_zero(2)}),
        )
        .await;
    alice.wait_ready(&ns, &name).await;
    for caller in [&bob, &alice] {
        let forged = caller
            .post(
                &sandbox_path(&ns, &name, "/result"),
                json!({"reward": 1.0, "status": "completed"}),
            )
            .await;
        assert_eq!(forged.status, 409, "{forged:?}");
        assert_eq!(forged.code(), "RunDriven", "{forged:?}");
        assert!(forged.message().contains("spec.run"), "{forged:?}");
    }
    let recorded = orchard_testcluster::wait::until(
        &sandboxes,
        &name,
        "the run's result",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| s.and_then(|s| s.status.as_ref()?.result.as_ref()).is_some(),
    )
    .await;
    let result = recorded.status.and_then(|s| s.result).expect("result");
    assert_eq!(result.reward, Some(0.0), "{result:?}");

    // Around the gateway, with `patch sandboxes/status`: the first result stays (write-once), and
    // the runner says that its own lost, in a condition and a Warning event.
    let name = alice
        .create_sandbox(
            &ns,
            json!({"name": "preempted", "image": "busybox", "run": run_writing_reward_zero(3)}),
        )
        .await;
    alice.wait_ready(&ns, &name).await;
    sandboxes
        .patch_status(
            &name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"status": {"result": {"reward": 1.0, "status": "completed"}}}),
            ),
        )
        .await
        .expect("an administrator patches the result");
    let preempted = orchard_testcluster::wait::until(
        &sandboxes,
        &name,
        "the ResultPreempted condition",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "ResultPreempted" && c.status == "True")
            })
        },
    )
    .await;
    let status = preempted.status.expect("status");
    assert_eq!(status.result.and_then(|r| r.reward), Some(1.0));
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "ResultPreempted")
        .expect("condition");
    assert!(
        condition.message.contains("\"reward\":1.0"),
        "the condition names the result that won: {}",
        condition.message
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client().await, &ns);
    let warned = orchard_testcluster::wait::poll(
        "the ResultPreempted event",
        Duration::from_secs(30),
        || {
            let events = events.clone();
            let name = name.clone();
            async move {
                let list = events.list(&Default::default()).await.ok()?;
                list.items.into_iter().find(|e| {
                    e.reason.as_deref() == Some("ResultPreempted")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&name)
                })
            }
        },
    )
    .await;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn waits_end_early_on_a_stalled_sandbox_and_say_why_when_they_time_out() {
    let env = TestEnv::shared();
    let ns = env.namespace("gw-why").await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let alice = Caller::user(env, "alice");
    // A pool that does not exist: the sandbox cannot go on without help (Stalled), and the wait says
    // so at once instead of running out its timeout.
    let stuck = alice
        .create_sandbox(&ns, json!({"name": "stuck", "pool": "missing"}))
        .await;
    let started = Instant::now();
    let settled = alice
        .get(&sandbox_path(&ns, &stuck, "/wait?timeoutSeconds=120"))
        .await;
    assert_eq!(settled.status, 200, "{settled:?}");
    let conditions = settled.body["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let stalled = conditions
        .iter()
        .find(|c| c["type"] == "Stalled")
        .expect("a Stalled condition");
    assert_eq!(stalled["status"], "True", "{stalled}");
    assert_eq!(stalled["reason"], "PoolNotFound", "{stalled}");
    assert!(
        started.elapsed() < Duration::from_secs(100),
        "the wait ran out its timeout instead of settling"
    );
    // A wait that runs out says why the sandbox is not Ready yet: a pool that exists but has no
    // member, waited for.
    let pool: orchard_operator::api::SandboxPool = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool",
        "metadata": {"name": "empty"},
        "spec": {"replicas": 0, "template": {"image": "busybox"}},
    }))
    .expect("pool JSON");
    Api::<orchard_operator::api::SandboxPool>::namespaced(env.client().await, &ns)
        .create(&kube::api::PostParams::default(), &pool)
        .await
        .expect("create pool");
    let waiting = alice
        .create_sandbox(
            &ns,
            json!({"name": "waiting", "pool": "empty", "whenPoolEmpty": "Wait"}),
        )
        .await;
    // Past the operator's 10 s window in which a young sandbox's transient status is not written.
    let timed_out = alice
        .get(&sandbox_path(&ns, &waiting, "/wait?timeoutSeconds=15"))
        .await;
    assert_eq!(timed_out.status, 504, "{timed_out:?}");
    assert_eq!(timed_out.code(), "WaitTimeout");
    assert_eq!(
        timed_out.body["reason"], "WaitingForPoolMember",
        "{timed_out:?}"
    );
    assert!(
        timed_out.body["conditionMessage"]
            .as_str()
            .is_some_and(|m| m.contains("empty")),
        "{timed_out:?}"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn roles_limited_to_resource_names_are_honoured() {
    // The gateway first asks namespace-wide (one review covers every sandbox of a namespace); a Role
    // limited to resourceNames is denied that and must still be allowed by name, for that name only.
    let env = TestEnv::shared();
    let namespace = env.namespace("gw-names").await;
    let admin = Caller::user(env, "admin");
    let allowed = admin
        .create_sandbox(&namespace, json!({"image": "busybox"}))
        .await;
    let other = admin
        .create_sandbox(&namespace, json!({"image": "busybox"}))
        .await;
    admin.wait_ready(&namespace, &allowed).await;
    admin.wait_ready(&namespace, &other).await;
    grant(
        env,
        &namespace,
        "bob",
        "one-sandbox",
        json!([{"apiGroups": ["orchard.dev"], "resources": ["sandboxes/exec"],
                "verbs": ["create"], "resourceNames": [allowed]}]),
    )
    .await;
    let bob = Caller::user(env, "bob");
    let ok = bob
        .exec(
            &namespace,
            &allowed,
            json!({"argv": ["/bin/echo", "named"]}),
        )
        .await;
    assert_eq!(ok.status, 200, "{ok:?}");
    let denied = bob
        .exec(&namespace, &other, json!({"argv": ["/bin/echo", "named"]}))
        .await;
    assert_eq!(denied.status, 403, "{denied:?}");
    assert!(
        denied.message().contains("cannot create sandboxes/exec"),
        "{denied:?}"
    );
    env.delete_namespace(&namespace).await;
}

#[tokio::test]
async fn shell_sessions_directories_and_metrics_through_the_gateway() {
    let env = TestEnv::shared();
    let ns = env.namespace("gw-harness").await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    grant(
        env,
        &ns,
        "bob",
        "viewer",
        json!([{"apiGroups": ["orchard.dev"], "resources": ["sandboxes"], "verbs": ["get", "list"]}]),
    )
    .await;
    let alice = Caller::user(env, "alice");
    let bob = Caller::user(env, "bob");
    let name = alice.create_sandbox(&ns, json!({"image": "busybox"})).await;
    alice.wait_ready(&ns, &name).await;
    let at = |rest: &str| sandbox_path(&ns, &name, rest);

    // A session keeps its shell's state between runs.
    let session = alice.post(&at("/sessions"), json!({})).await;
    assert_eq!(session.status, 201, "{session:?}");
    let id = session.body["id"].as_str().expect("session id").to_string();
    let first = alice
        .post(
            &at(&format!("/sessions/{id}/run")),
            json!({"command": "cd /tmp && export ORCHARD_GW_X=42"}),
        )
        .await;
    assert_eq!(
        (first.status, &first.body["exitCode"]),
        (200, &json!(0)),
        "{first:?}"
    );
    let second = alice
        .post(
            &at(&format!("/sessions/{id}/run")),
            json!({"command": "pwd; echo $ORCHARD_GW_X"}),
        )
        .await;
    assert_eq!(second.body["output"], "/tmp\n42\n", "{second:?}");
    // An interrupt with nothing running signals nothing.
    let idle = alice
        .post(&at(&format!("/sessions/{id}/signal")), json!({}))
        .await;
    assert_eq!(
        (
            idle.status,
            &idle.body["running"],
            &idle.body["session"]["id"]
        ),
        (200, &json!(false), &json!(id)),
        "{idle:?}"
    );
    // Reading sessions needs exec: a viewer may not, nor signal one.
    let refused = bob.post(&at("/sessions"), json!({})).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    let refused = bob
        .post(&at(&format!("/sessions/{id}/signal")), json!({}))
        .await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert_eq!(
        alice.delete(&at(&format!("/sessions/{id}"))).await.status,
        200
    );
    let gone = alice.get(&at(&format!("/sessions/{id}"))).await;
    assert_eq!(gone.status, 404, "{gone:?}");

    // Directories: mkdir -p, a file in it, the tree as a tar stream and back elsewhere, stat, rename.
    let made = alice
        .post(&at("/files/mkdir"), json!({"path": "d/e", "parents": true}))
        .await;
    assert_eq!(made.status, 201, "{made:?}");
    let written = alice
        .request(reqwest::Method::PUT, &at("/files?path=d/e/f.txt"))
        .body("hello")
        .send()
        .await
        .expect("upload");
    assert_eq!(written.status(), 201);
    let tar = alice
        .request(reqwest::Method::GET, &at("/files/tar?path=d"))
        .send()
        .await
        .expect("tar download");
    assert_eq!(tar.status(), 200);
    let tar = tar.bytes().await.expect("tar bytes");
    assert!(tar.len() >= 1024, "a tar stream: {} bytes", tar.len());
    let extracted = alice
        .request(reqwest::Method::PUT, &at("/files/tar?path=copy"))
        .body(tar)
        .send()
        .await
        .expect("tar upload");
    assert_eq!(extracted.status(), 201);
    let stat = alice.get(&at("/files/stat?path=copy/e/f.txt")).await;
    assert_eq!(
        (&stat.body["exists"], &stat.body["size"]),
        (&json!(true), &json!(5)),
        "{stat:?}"
    );
    let renamed = alice
        .post(
            &at("/files/rename"),
            json!({"from": "copy/e/f.txt", "to": "copy/g.txt"}),
        )
        .await;
    assert_eq!(renamed.status, 200, "{renamed:?}");
    let old = alice.get(&at("/files/stat?path=copy/e/f.txt")).await;
    assert_eq!(old.body["exists"], json!(false), "{old:?}");
    let moved = alice
        .request(reqwest::Method::GET, &at("/files?path=copy/g.txt"))
        .send()
        .await
        .expect("download");
    assert_eq!(moved.text().await.expect("text"), "hello");

    // Usage: readable by whoever may read the sandbox.
    let metrics = bob.get(&at("/metrics")).await;
    assert_eq!(metrics.status, 200, "{metrics:?}");
    assert!(metrics.body["diskPath"].is_string(), "{metrics:?}");
    env.delete_namespace(&ns).await;
}
