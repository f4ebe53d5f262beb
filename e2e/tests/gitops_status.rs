//! What GitOps tools see of our objects (issue 18): the kstatus result Flux and `kubectl`-style
//! waiters compute (sigs.k8s.io/cli-utils `status.Compute`, e2e/tools/kstatus) and the health our Argo
//! CD Lua checks report (config/argocd/health-*.lua run under gopher-lua as Argo CD runs them,
//! e2e/tools/luahealth), for live objects driven through their states on the local cluster (hollow
//! node):
//!
//! - a Sandbox is InProgress while Pending/Starting and Current once Ready; refused by placement, or
//!   waiting for a full ResourceQuota, it is Failed (Stalled);
//! - a RolloutGroup is InProgress while Pending/Queued/Generating and Current once Complete; naming a
//!   missing queue, a queue smaller than its stride, or failed with NameConflict, it is Failed;
//! - a RolloutQueue with `Active=True` is Current / Healthy.
//!
//! With `ORCHARD_RECORD_FIXTURES=1` (`make gitops-fixtures`) each live object is written to
//! `e2e/tests/fixtures/gitops/`; the
//! cluster-free tests at the end run both tools over those recorded objects (and over variants of
//! them: no status, being deleted, a generation not observed yet), and check that
//! `config/argocd/argocd-cm-patch.yaml` carries the scripts unchanged.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::runtime::watcher;
use orchard_operator::api::{RolloutGroup, RolloutQueue, Sandbox, SandboxPool};
use orchard_testcluster::binaries::{observability_tool, workspace_root};
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::test_support::rollouts::{GROUP_TIMEOUT, group, reward_script, template};
use orchard_testcluster::test_support::sandboxes::sandbox;
use orchard_testcluster::wait;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);
/// A new object gets its first status (with `observedGeneration`) at once (about 0.1 s on an idle
/// machine); later than this, a GitOps tool waiting on it would call it broken. What matters most is
/// checked without a clock: the first status comes while the object is still in progress.
const FIRST_STATUS_WITHIN: Duration = Duration::from_secs(10);
const FIXTURES: &str = "e2e/tests/fixtures/gitops";

fn env() -> &'static TestEnv {
    static ENV: OnceLock<TestEnv> = OnceLock::new();
    ENV.get_or_init(|| TestEnv::start_named_on_own_thread("gitops_status", EnvOptions::default()))
}

// ---------------------------------------------------------------------------------------------------
// The two tools.

/// A tool's verdict on one object.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    status: String,
    message: String,
}

fn parse_verdict(tool: &str, output: std::process::Output) -> Verdict {
    assert!(
        output.status.success(),
        "{tool} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{tool} printed no JSON ({e}): {:?}", output.stdout));
    Verdict {
        status: value["status"].as_str().unwrap_or_default().to_string(),
        message: value["message"].as_str().unwrap_or_default().to_string(),
    }
}

fn tool(name: &str) -> PathBuf {
    observability_tool(name).unwrap_or_else(|e| panic!("{e}"))
}

/// kstatus (what Flux's health checks report) of `object`, given on stdin.
fn kstatus(object: &Value) -> Verdict {
    let mut child = Command::new(tool("kstatus"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kstatus");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(object.to_string().as_bytes())
        .expect("write the object to kstatus");
    parse_verdict("kstatus", child.wait_with_output().expect("kstatus output"))
}

/// The Argo CD health check of `object`'s kind, run under gopher-lua.
fn argo_health(object: &Value) -> Verdict {
    let kind = object["kind"].as_str().expect("kind").to_lowercase();
    let script = workspace_root().join(format!("config/argocd/health-{kind}.lua"));
    // One file per call, removed after it: nothing of the run stays in the temp directory.
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("orchard-luahealth-{}-{n}.json", std::process::id()));
    std::fs::write(&path, object.to_string()).expect("write the object");
    let output = Command::new(tool("luahealth"))
        .arg(&script)
        .arg(&path)
        .output()
        .expect("run luahealth");
    let _ = std::fs::remove_file(&path);
    parse_verdict("luahealth", output)
}

/// Both verdicts are the expected ones, or a message showing the object.
fn assert_verdicts(what: &str, object: &Value, kstatus_want: &str, argo_want: &str) {
    let k = kstatus(object);
    let a = argo_health(object);
    assert!(
        k.status == kstatus_want && a.status == argo_want,
        "{what}: kstatus {k:?} (want {kstatus_want}), Argo CD health {a:?} (want {argo_want})\n{}",
        serde_json::to_string_pretty(&object["status"]).unwrap_or_default()
    );
}

// ---------------------------------------------------------------------------------------------------
// Recording fixtures.

/// The object as committed: no managedFields, uids or resourceVersions, a fixed namespace.
fn stripped(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(meta) = object["metadata"].as_object_mut() {
        for key in ["managedFields", "uid", "resourceVersion"] {
            meta.remove(key);
        }
        if meta.contains_key("namespace") {
            meta.insert("namespace".into(), json!("gitops"));
        }
        if let Some(owners) = meta
            .get_mut("ownerReferences")
            .and_then(Value::as_array_mut)
        {
            for owner in owners {
                if let Some(owner) = owner.as_object_mut() {
                    owner.remove("uid");
                }
            }
        }
    }
    object
}

/// Writes `object` to `fixtures/gitops/<name>.json` when `ORCHARD_RECORD_FIXTURES=1`.
fn record(name: &str, object: &Value) {
    if std::env::var("ORCHARD_RECORD_FIXTURES").as_deref() != Ok("1") {
        return;
    }
    let dir = workspace_root().join(FIXTURES);
    std::fs::create_dir_all(&dir).expect("fixtures dir");
    let text = serde_json::to_string_pretty(&stripped(object)).expect("JSON") + "\n";
    std::fs::write(dir.join(format!("{name}.json")), text).expect("write fixture");
}

// ---------------------------------------------------------------------------------------------------
// Live objects.

fn dynamic<K>(client: &kube::Client, ns: &str) -> Api<DynamicObject>
where
    K: kube::Resource<DynamicType = ()>,
{
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<K>(&()))
}

fn to_json(object: &DynamicObject) -> Value {
    serde_json::to_value(object).expect("object JSON")
}

/// Every version of `name` a watch delivers (watch events carry each write), with when it arrived.
/// Returns once the watch's initial list is done, so a create after this is seen from its first write.
async fn versions_of(api: Api<DynamicObject>, name: &str) -> Arc<Mutex<Vec<(Instant, Value)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        let mut events = watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    record
                        .lock()
                        .expect("lock")
                        .push((Instant::now(), to_json(&o)));
                }
                _ => {}
            }
        }
    });
    tokio::time::timeout(TIMEOUT, ready_rx)
        .await
        .expect("the watch started")
        .expect("the watch task lives");
    seen
}

/// Every version the watch behind `versions` delivered, once it has delivered `last` (the version a
/// read returned): a watch delivers versions in order, so none before it is missing.
async fn seen_through(
    versions: &Mutex<Vec<(Instant, Value)>>,
    last: &Value,
) -> Vec<(Instant, Value)> {
    let version = last["metadata"]["resourceVersion"].clone();
    wait::poll("the watch delivers the version read", TIMEOUT, || async {
        let seen = versions.lock().expect("lock");
        seen.iter()
            .any(|(_, v)| v["metadata"]["resourceVersion"] == version)
            .then(|| seen.clone())
    })
    .await
}

fn phase(object: &Value) -> &str {
    object["status"]["phase"].as_str().unwrap_or("")
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn condition_reason(object: &Value, kind: &str) -> String {
    condition(object, kind)
        .map(|c| c["reason"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// Polls the object until `probe` accepts it; returns that version.
async fn until_json(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    timeout: Duration,
    probe: impl Fn(&Value) -> bool,
) -> Value {
    let last = Mutex::new(Value::Null);
    let found = tokio::time::timeout(timeout, async {
        loop {
            if let Ok(Some(object)) = api.get_opt(name).await {
                let value = to_json(&object);
                if probe(&value) {
                    return value;
                }
                *last.lock().expect("lock") = value;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out after {timeout:?} waiting for {name}: {what}; last seen status: {}",
            serde_json::to_string_pretty(&last.lock().expect("lock")["status"]).unwrap_or_default()
        )
    })
}

/// The first status write came soon after creation and carried `observedGeneration`.
fn assert_first_status_prompt(what: &str, created: Instant, versions: &[(Instant, Value)]) {
    let (at, first) = versions
        .iter()
        .find(|(_, v)| !v["status"].is_null())
        .unwrap_or_else(|| panic!("{what}: no status was ever written"));
    assert!(
        at.saturating_duration_since(created) <= FIRST_STATUS_WITHIN,
        "{what}: the first status came {:?} after creation (broken beyond {FIRST_STATUS_WITHIN:?})",
        at.saturating_duration_since(created)
    );
    assert!(
        first["status"]["observedGeneration"].as_i64().is_some(),
        "{what}: the first status has no observedGeneration: {}",
        first["status"]
    );
}

#[tokio::test]
async fn a_sandbox_is_in_progress_until_ready_then_current() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("gitops-sandbox").await;
    let api = dynamic::<Sandbox>(&client, &ns);
    let versions = versions_of(api.clone(), "web").await;
    let typed: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    typed
        .create(
            &PostParams::default(),
            &sandbox("web", json!({"image": "busybox"})),
        )
        .await
        .expect("create the sandbox");
    let created = Instant::now();
    let ready = until_json(&api, "web", "Ready", TIMEOUT, |o| {
        phase(o) == "Ready" && condition(o, "Ready").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let seen = seen_through(&versions, &ready).await;
    if let Some((_, first)) = seen
        .iter()
        .find(|(_, v)| matches!(phase(v), "Pending" | "Starting"))
    {
        record("sandbox-in-progress", first);
    }
    record("sandbox-ready", &ready);
    assert_first_status_prompt("sandbox web", created, &seen);
    // Every version the watch delivered: in flight -> InProgress / Progressing; Ready -> Current / Healthy.
    let mut phases = BTreeSet::new();
    for (_, version) in seen.iter().filter(|(_, v)| !v["status"].is_null()) {
        let p = phase(version).to_string();
        let (k, a) = match p.as_str() {
            "Pending" | "Starting" => ("InProgress", "Progressing"),
            "Ready" => ("Current", "Healthy"),
            other => panic!("sandbox web went through phase {other:?} on its way to Ready"),
        };
        assert_verdicts(&format!("sandbox web in phase {p}"), version, k, a);
        phases.insert(p);
    }
    assert!(
        phases.contains("Pending") || phases.contains("Starting"),
        "a status was written before Ready (phases seen: {phases:?})"
    );
    assert_verdicts("sandbox web, Ready", &ready, "Current", "Healthy");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_sandbox_refused_by_placement_is_failed() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("gitops-placement").await;
    let api = dynamic::<Sandbox>(&client, &ns);
    let typed: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    typed
        .create(
            &PostParams::default(),
            &sandbox(
                "refused",
                json!({"image": "busybox", "priorityClassName": "not-allowed"}),
            ),
        )
        .await
        .expect("create the sandbox");
    let failed = until_json(&api, "refused", "phase Failed", TIMEOUT, |o| {
        phase(o) == "Failed"
    })
    .await;
    record("sandbox-failed-placement", &failed);
    assert_eq!(failed["status"]["reason"], "PlacementRefused", "{failed}");
    assert_eq!(condition_reason(&failed, "Stalled"), "PlacementRefused");
    assert_verdicts(
        "sandbox refused by placement",
        &failed,
        "Failed",
        "Degraded",
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_sandbox_over_a_full_quota_is_failed_while_it_waits() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("gitops-quota").await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "pods"}, "spec": {"hard": {"pods": "0"}},
    }))
    .expect("quota JSON");
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the quota");
    // The quota controller must have counted the namespace before admission enforces it.
    wait::until(
        &quotas,
        "pods",
        "quota counted",
        TIMEOUT,
        |q: Option<&ResourceQuota>| {
            q.and_then(|q| q.status.as_ref())
                .and_then(|s| s.used.as_ref())
                .is_some_and(|u| u.contains_key("pods"))
        },
    )
    .await;
    let api = dynamic::<Sandbox>(&client, &ns);
    let typed: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    typed
        .create(
            &PostParams::default(),
            &sandbox("squeezed", json!({"image": "busybox"})),
        )
        .await
        .expect("create the sandbox");
    let waiting = until_json(
        &api,
        "squeezed",
        "Scheduled=False QuotaExceeded",
        TIMEOUT,
        |o| condition_reason(o, "Scheduled") == "QuotaExceeded",
    )
    .await;
    record("sandbox-quota-exceeded", &waiting);
    assert_eq!(
        phase(&waiting),
        "Pending",
        "it waits: {}",
        waiting["status"]
    );
    assert_eq!(condition_reason(&waiting, "Stalled"), "QuotaExceeded");
    assert_verdicts("sandbox over quota", &waiting, "Failed", "Degraded");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_rollout_group_is_in_progress_while_generating_then_current() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("gitops-group").await;
    let api = dynamic::<RolloutGroup>(&client, &ns);
    let versions = versions_of(api.clone(), "prompt").await;
    let typed: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    typed
        .create(
            &PostParams::default(),
            &group(
                "prompt",
                json!({"groupSize": 2, "maxTrajectories": 2, "stride": 2,
                    "template": template(&reward_script(7, 50, None, Some(2)), 60)}),
            ),
        )
        .await
        .expect("create the group");
    let created = Instant::now();
    let complete = until_json(&api, "prompt", "Complete", GROUP_TIMEOUT, |o| {
        condition(o, "Complete").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let seen = seen_through(&versions, &complete).await;
    if let Some((_, generating)) = seen.iter().find(|(_, v)| phase(v) == "Generating") {
        record("rolloutgroup-generating", generating);
    }
    record("rolloutgroup-complete", &complete);
    assert_first_status_prompt("group prompt", created, &seen);
    let mut phases = BTreeSet::new();
    for (_, version) in seen.iter().filter(|(_, v)| !v["status"].is_null()) {
        let p = phase(version).to_string();
        let (k, a) = match p.as_str() {
            "Pending" | "Generating" => ("InProgress", "Progressing"),
            "Complete" => ("Current", "Healthy"),
            other => panic!("group prompt went through phase {other:?} on its way to Complete"),
        };
        assert_verdicts(&format!("group prompt in phase {p}"), version, k, a);
        phases.insert(p);
    }
    assert!(
        phases.contains("Generating"),
        "the watch saw the group generating (phases seen: {phases:?})"
    );
    assert_verdicts("group prompt, Complete", &complete, "Current", "Healthy");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_sandbox_pool_is_in_progress_while_filling_then_current_and_failed_when_stalled() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("gitops-pool").await;
    let api = dynamic::<SandboxPool>(&client, &ns);
    let versions = versions_of(api.clone(), "warm").await;
    let typed: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    let pool: SandboxPool = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": "warm"},
        "spec": {"replicas": 2, "template": {"image": "busybox:1.36"}},
    }))
    .expect("pool JSON");
    typed
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the pool");
    let created = Instant::now();
    let ready = until_json(&api, "warm", "Ready", TIMEOUT, |o| {
        condition(o, "Ready").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let seen = seen_through(&versions, &ready).await;
    assert_first_status_prompt("pool warm", created, &seen);
    let filling = seen
        .iter()
        .map(|(_, v)| v)
        .find(|v| condition(v, "Reconciling").is_some_and(|c| c["status"] == "True"))
        .expect("the watch saw the pool filling");
    record("sandboxpool-filling", filling);
    record("sandboxpool-ready", &ready);
    assert_verdicts("pool warm, filling", filling, "InProgress", "Progressing");
    assert_verdicts("pool warm, Ready", &ready, "Current", "Healthy");
    // Members that keep failing stall the pool (the condition the operator writes then).
    let mut stalled = ready.clone();
    if let Some(conditions) = stalled["status"]["conditions"].as_array_mut() {
        for c in conditions.iter_mut() {
            if c["type"] == "Stalled" {
                c["status"] = json!("True");
                c["reason"] = json!("MemberFailed");
                c["message"] = json!("warm-abcde: ErrImagePull: not found");
            }
        }
    }
    assert_verdicts("pool warm, Stalled", &stalled, "Failed", "Degraded");
    env.delete_namespace(&ns).await;
}

fn queue(name: &str, max: i32) -> RolloutQueue {
    serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutQueue",
        "metadata": {"name": name},
        "spec": {"maxRunningTrajectories": max, "admission": "Fair"},
    }))
    .expect("valid RolloutQueue JSON")
}

#[tokio::test]
async fn queued_groups_are_in_progress_and_groups_a_queue_cannot_run_are_failed() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("gitops-queue").await;
    let queues: Api<RolloutQueue> = Api::namespaced(client.clone(), &ns);
    queues
        .create(&PostParams::default(), &queue("small", 2))
        .await
        .expect("create the queue");
    let queue_api = dynamic::<RolloutQueue>(&client, &ns);
    let active = until_json(&queue_api, "small", "Active=True", TIMEOUT, |o| {
        condition(o, "Active").is_some_and(|c| c["status"] == "True")
    })
    .await;
    record("rolloutqueue-active", &active);
    assert_verdicts("queue small, Active", &active, "Current", "Healthy");

    let api = dynamic::<RolloutGroup>(&client, &ns);
    let typed: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let spec = |queue: &str, stride: i32, sleep: u32| {
        json!({"groupSize": 2, "maxTrajectories": stride, "stride": stride, "queue": queue,
            "template": template(&reward_script(11, 50, None, Some(sleep)), 120)})
    };
    // `first` holds both slots of `small` for a while; `second` waits for them.
    typed
        .create(
            &PostParams::default(),
            &group("first", spec("small", 2, 20)),
        )
        .await
        .expect("create group first");
    until_json(&api, "first", "phase Generating", TIMEOUT, |o| {
        phase(o) == "Generating"
    })
    .await;
    for (name, spec) in [
        ("second", spec("small", 2, 1)),
        ("too-big", spec("small", 4, 1)),
        ("lost", spec("missing", 2, 1)),
    ] {
        typed
            .create(&PostParams::default(), &group(name, spec))
            .await
            .unwrap_or_else(|e| panic!("create group {name}: {e}"));
    }
    let queued = until_json(&api, "second", "phase Queued", TIMEOUT, |o| {
        phase(o) == "Queued"
    })
    .await;
    record("rolloutgroup-queued", &queued);
    assert_eq!(condition_reason(&queued, "Reconciling"), "Queued");
    assert_verdicts(
        "group waiting for its queue",
        &queued,
        "InProgress",
        "Progressing",
    );

    let too_big = until_json(
        &api,
        "too-big",
        "Admitted reason StrideExceedsQueue",
        TIMEOUT,
        |o| condition_reason(o, "Admitted") == "StrideExceedsQueue",
    )
    .await;
    record("rolloutgroup-stride-exceeds-queue", &too_big);
    assert_eq!(condition_reason(&too_big, "Stalled"), "StrideExceedsQueue");
    assert_verdicts(
        "group with a stride larger than its queue",
        &too_big,
        "Failed",
        "Degraded",
    );

    let lost = until_json(
        &api,
        "lost",
        "Admitted reason QueueNotFound",
        TIMEOUT,
        |o| condition_reason(o, "Admitted") == "QueueNotFound",
    )
    .await;
    record("rolloutgroup-queue-not-found", &lost);
    assert_eq!(condition_reason(&lost, "Stalled"), "QueueNotFound");
    assert_verdicts("group naming a missing queue", &lost, "Failed", "Degraded");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_rollout_group_failed_with_a_name_conflict_is_failed() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("gitops-conflict").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("taken-0", json!({"image": "busybox"})),
        )
        .await
        .expect("create the sandbox holding trajectory 0's name");
    let typed: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    typed
        .create(
            &PostParams::default(),
            &group(
                "taken",
                json!({"groupSize": 2, "maxTrajectories": 2, "stride": 2,
                    "template": template(&reward_script(5, 50, None, None), 60)}),
            ),
        )
        .await
        .expect("create the group");
    let api = dynamic::<RolloutGroup>(&client, &ns);
    let failed = until_json(&api, "taken", "phase Failed", TIMEOUT, |o| {
        phase(o) == "Failed"
    })
    .await;
    record("rolloutgroup-failed-name-conflict", &failed);
    assert_eq!(condition_reason(&failed, "Complete"), "NameConflict");
    assert_eq!(condition_reason(&failed, "Stalled"), "NameConflict");
    assert_verdicts(
        "group failed with NameConflict",
        &failed,
        "Failed",
        "Degraded",
    );
    env.delete_namespace(&ns).await;
}

// ---------------------------------------------------------------------------------------------------
// No cluster: the recorded objects under both tools, and the argocd-cm patch.

/// Each committed fixture and what kstatus and the Argo CD check must say of it.
const EXPECTED: &[(&str, &str, &str)] = &[
    ("sandbox-in-progress", "InProgress", "Progressing"),
    ("sandbox-ready", "Current", "Healthy"),
    ("sandbox-failed-placement", "Failed", "Degraded"),
    ("sandbox-quota-exceeded", "Failed", "Degraded"),
    ("rolloutgroup-generating", "InProgress", "Progressing"),
    ("rolloutgroup-queued", "InProgress", "Progressing"),
    ("rolloutgroup-complete", "Current", "Healthy"),
    ("rolloutgroup-queue-not-found", "Failed", "Degraded"),
    ("rolloutgroup-stride-exceeds-queue", "Failed", "Degraded"),
    ("rolloutgroup-failed-name-conflict", "Failed", "Degraded"),
    ("rolloutqueue-active", "Current", "Healthy"),
    ("sandboxpool-filling", "InProgress", "Progressing"),
    ("sandboxpool-ready", "Current", "Healthy"),
];

fn fixture(name: &str) -> Value {
    let path = workspace_root().join(FIXTURES).join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; record the fixtures with `make gitops-fixtures`",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn recorded_objects_get_the_expected_kstatus_and_argo_cd_health() {
    let mut failures = Vec::new();
    for (name, kstatus_want, argo_want) in EXPECTED {
        let object = fixture(name);
        let k = kstatus(&object);
        let a = argo_health(&object);
        if k.status != *kstatus_want || a.status != *argo_want {
            failures.push(format!(
                "{name}: kstatus {k:?} (want {kstatus_want}), Argo CD {a:?} (want {argo_want})"
            ));
        }
        assert!(
            !a.message.is_empty(),
            "{name}: the Argo CD check gives no message"
        );
    }
    // Every committed fixture is in the table (a new recording needs an expectation).
    let dir = workspace_root().join(FIXTURES);
    for entry in std::fs::read_dir(&dir).expect("fixtures dir") {
        let file = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        let stem = file.trim_end_matches(".json");
        assert!(
            EXPECTED.iter().any(|(n, _, _)| *n == stem),
            "{file} has no expectation in EXPECTED"
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn objects_without_status_being_deleted_or_not_yet_observed_are_progressing() {
    for name in [
        "sandbox-ready",
        "rolloutgroup-complete",
        "rolloutqueue-active",
        "sandboxpool-ready",
    ] {
        let healthy = fixture(name);
        // No status yet: Argo CD waits. kstatus calls an object without status or conditions
        // Current, which is why the operator writes the first status at once.
        let mut fresh = healthy.clone();
        fresh.as_object_mut().expect("object").remove("status");
        assert_eq!(
            argo_health(&fresh).status,
            "Progressing",
            "{name} without status"
        );
        assert_eq!(
            argo_health(&fresh).message,
            "Waiting for the operator",
            "{name} without status"
        );
        assert_eq!(kstatus(&fresh).status, "Current", "{name} without status");
        // Being deleted.
        let mut deleting = healthy.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-24T12:00:00Z");
        assert_verdicts(
            &format!("{name} being deleted"),
            &deleting,
            "Terminating",
            "Progressing",
        );
        // The spec changed and the operator has not observed it yet.
        let mut edited = healthy.clone();
        let observed = healthy["status"]["observedGeneration"]
            .as_i64()
            .unwrap_or_else(|| panic!("{name} has no status.observedGeneration"));
        edited["metadata"]["generation"] = json!(observed + 1);
        assert_verdicts(
            &format!("{name} with an unobserved generation"),
            &edited,
            "InProgress",
            "Progressing",
        );
    }
}

#[test]
fn the_argocd_cm_patch_carries_the_health_scripts_unchanged() {
    let root = workspace_root();
    let text = std::fs::read_to_string(root.join("config/argocd/argocd-cm-patch.yaml"))
        .expect("config/argocd/argocd-cm-patch.yaml");
    let patch: Value = serde_yaml::from_str(&text).expect("YAML");
    assert_eq!(patch["kind"], "ConfigMap");
    assert_eq!(patch["metadata"]["name"], "argocd-cm");
    let data = patch["data"].as_object().expect("data");
    assert_eq!(data.len(), 4, "{:?}", data.keys().collect::<Vec<_>>());
    for (kind, file) in [
        ("Sandbox", "sandbox"),
        ("RolloutGroup", "rolloutgroup"),
        ("RolloutQueue", "rolloutqueue"),
        ("SandboxPool", "sandboxpool"),
    ] {
        let script = std::fs::read_to_string(root.join(format!("config/argocd/health-{file}.lua")))
            .expect("script");
        assert_eq!(
            data.get(&format!(
                "resource.customizations.health.orchard.dev_{kind}"
            ))
            .and_then(Value::as_str),
            Some(script.as_str()),
            "config/argocd/argocd-cm-patch.yaml differs from health-{file}.lua: run config/argocd/generate.sh"
        );
    }
}

#[test]
fn the_health_scripts_use_only_the_libraries_argo_cd_opens() {
    // Argo CD opens only the base, table and package libraries (and a safe os): string.*, math.*
    // and io.* are nil there. luahealth runs the same way, so the fixture tests would fail too; this
    // names the offending line.
    for file in [
        "health-sandbox.lua",
        "health-rolloutgroup.lua",
        "health-rolloutqueue.lua",
        "health-sandboxpool.lua",
    ] {
        let text = std::fs::read_to_string(workspace_root().join("config/argocd").join(file))
            .expect("script");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("--").next().unwrap_or_default();
            for library in [
                "string.", "math.", "io.", "os.", ":find(", ":match(", ":sub(",
            ] {
                assert!(
                    !code.contains(library),
                    "{file}:{}: uses {library}, which Argo CD's Lua VM does not open",
                    n + 1
                );
            }
        }
    }
}
