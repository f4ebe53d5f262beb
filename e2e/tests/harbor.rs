//! Harbor (Terminal-Bench 2.0's framework) on the real node through our environment
//! (`orchard_env.integrations.harbor:OrchardEnvironment`): `harbor run` itself, in the Harbor venv
//! (`make harbor-venv`), over the task set `e2e/harbor-tasks` (a file, a Python function, a non-root
//! agent, a host in `allowed_hosts` served by the fake internet, a `no-network` task whose solution
//! fails if it gets out, a directory artifact, a health check, an agent time-out, a task's env and
//! workdir), with the chart and its egress proxy on a node that enforces NetworkPolicies, as a user
//! holding only the rules the environment's preflight asks for.
//!
//! Checked: Harbor's `oracle` agent gets reward 1 on every task and `nop` reward 0; the time-out is
//! Harbor's `AgentTimeoutError` and its solution's whole process group is gone before the verifier
//! runs; the artifact directory comes back with modes and a symbolic link; every sandbox is deleted.
//! Then the paper's equivalence check in miniature: the same tasks through mini-swe-agent's
//! `LocalEnvironment` on the same image's root filesystem (`e2e/harbor-local/local_trials.py`, no
//! Kubernetes), with the same reward on every task. Printed: each trial's wall time beside its
//! sandbox's own create -> Ready time (docs/HARNESSES.md quotes a run).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use orchard_operator::api::Sandbox;
use orchard_testcluster::binaries::workspace_root;
use orchard_testcluster::env::{EnvOptions, NodeKind, TestEnv};
use orchard_testcluster::fake_internet::FakeInternet;
use orchard_testcluster::test_support::gateway::grant;
use orchard_testcluster::test_support::internet::{self, InternetRelease};
use orchard_testcluster::test_support::sandboxes::is_ready;
use orchard_testcluster::test_support::sdk::{harbor_bin, sdk_python};
use serde_json::{Value, json};

/// The task set: directory name -> what the oracle's trial ends with besides reward 1.
const TASKS: [&str; 9] = [
    "agent-timeout",
    "allowlist-fetch",
    "dir-artifact",
    "env-workdir",
    "healthcheck",
    "hello-file",
    "no-network",
    "non-root-user",
    "python-function",
];

/// Trials at once (`--n-concurrent`): the node has two cores.
const CONCURRENT: &str = "3";

/// The image every task names (`docker_image`): the node's Debian image.
const TASK_IMAGE: &str = "localhost:5000/debian-python:trixie";

fn env() -> &'static TestEnv {
    static ENV: std::sync::OnceLock<TestEnv> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        TestEnv::start_named_on_own_thread(
            "harbor",
            EnvOptions {
                operator: false,
                node: NodeKind::Real,
                enforce_network_policies: true,
                ..EnvOptions::default()
            },
        )
    })
}

/// The rules `OrchardEnvironment.preflight` checks (`REQUIRED_ACCESS`), and nothing else.
fn harbor_rules() -> Value {
    json!([
        {"apiGroups": ["orchard.dev"], "resources": ["sandboxes"], "verbs": ["create", "get", "delete"]},
        {"apiGroups": ["orchard.dev"], "resources": ["sandboxes/exec", "sandboxes/heartbeat"], "verbs": ["create"]},
        {"apiGroups": ["orchard.dev"], "resources": ["sandboxes/files"], "verbs": ["create", "get"]},
        {"apiGroups": ["orchard.dev"], "resources": ["sandboxes/network"], "verbs": ["update"]},
    ])
}

/// When each sandbox of `ns` was first seen and first Ready, by the sandbox's name (with its trial's
/// name, the `harbor/session-id` annotation).
#[derive(Default)]
struct Seen {
    created: BTreeMap<String, (String, Instant)>,
    ready: BTreeMap<String, Instant>,
}

fn watch_sandboxes(
    client: kube::Client,
    ns: &str,
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api: Api<Sandbox> = Api::namespaced(client, ns);
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let (watcher::Event::Apply(sandbox) | watcher::Event::InitApply(sandbox)) = (match event
            {
                Ok(event) => event,
                Err(_) => continue,
            }) else {
                continue;
            };
            let now = Instant::now();
            let name = sandbox.name_any();
            let trial = sandbox
                .annotations()
                .get("harbor/session-id")
                .cloned()
                .unwrap_or_default();
            let mut seen = record.lock().unwrap_or_else(|p| p.into_inner());
            seen.created.entry(name.clone()).or_insert((trial, now));
            if is_ready(Some(&sandbox)) {
                seen.ready.entry(name).or_insert(now);
            }
        }
    });
    (seen, task)
}

/// One trial's result.json.
struct Trial {
    task: String,
    dir: PathBuf,
    result: Value,
}

impl Trial {
    fn reward(&self) -> Option<f64> {
        self.result["verifier_result"]["rewards"]["reward"].as_f64()
    }

    fn exception(&self) -> Option<String> {
        self.result["exception_info"]["exception_type"]
            .as_str()
            .map(String::from)
    }

    /// Seconds between two of Harbor's timestamps (`started_at`/`finished_at` of `section`, or of the
    /// trial when `section` is empty).
    fn seconds(&self, section: &str) -> Option<f64> {
        let timing = if section.is_empty() {
            &self.result
        } else {
            &self.result[section]
        };
        let at = |key: &str| timing[key].as_str().and_then(timestamp);
        Some(
            at("finished_at")?
                .duration_since(at("started_at")?)
                .as_secs_f64(),
        )
    }
}

/// A Harbor timestamp (ISO 8601, with or without an offset: UTC then).
fn timestamp(text: &str) -> Option<jiff::Timestamp> {
    text.parse::<jiff::Timestamp>().ok().or_else(|| {
        text.parse::<jiff::civil::DateTime>()
            .ok()
            .and_then(|t| t.to_zoned(jiff::tz::TimeZone::UTC).ok())
            .map(|z| z.timestamp())
    })
}

/// Where and as whom `harbor run` runs: the gateway, the user's token, the namespace, the working
/// directory and the `harbor` executable.
struct Caller<'a> {
    harbor: &'a Path,
    work: &'a Path,
    gateway: &'a str,
    token: &'a str,
    ns: &'a str,
}

/// Runs `harbor run` with `agent` over the tasks under `tasks` as job `job`; the trials' results,
/// one per name of `expect`.
async fn harbor_run(
    caller: &Caller<'_>,
    tasks: &Path,
    agent: &str,
    job: &str,
    expect: &[&str],
) -> Vec<Trial> {
    let Caller {
        harbor,
        work,
        gateway,
        token,
        ns,
    } = caller;
    let jobs = work.join("jobs");
    let output = tokio::process::Command::new(harbor)
        .args(["run", "--path"])
        .arg(tasks)
        .args([
            "--agent",
            agent,
            "--env",
            "orchard_env.integrations.harbor:OrchardEnvironment",
            "--ek",
            "ttl_seconds=1800",
            "--n-concurrent",
            CONCURRENT,
            "--job-name",
            job,
            "--yes",
            "--jobs-dir",
        ])
        .arg(&jobs)
        .current_dir(work)
        .env("ORCHARD_GATEWAY_URL", gateway)
        .env("ORCHARD_TOKEN", token)
        .env("ORCHARD_NAMESPACE", ns)
        .env("HARBOR_TELEMETRY", "0")
        .env("HOME", work.join("home"))
        .env("COLUMNS", "200")
        .kill_on_drop(true)
        .output()
        .await
        .expect("harbor run starts");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "harbor run --agent {agent} failed: {log}"
    );
    let mut trials = Vec::new();
    for entry in std::fs::read_dir(jobs.join(job)).expect("the job's directory") {
        let dir = entry.expect("a trial directory").path();
        let Ok(text) = std::fs::read_to_string(dir.join("result.json")) else {
            continue;
        };
        let result: Value = serde_json::from_str(&text).expect("result.json is JSON");
        let Some(task) = result["task_name"].as_str().map(String::from) else {
            continue;
        };
        trials.push(Trial { task, dir, result });
    }
    trials.sort_by(|a, b| a.task.cmp(&b.task));
    let names: Vec<&str> = trials.iter().map(|t| t.task.as_str()).collect();
    assert_eq!(names, expect, "one trial per task: {log}");
    trials
}

/// The verifier's output of a trial, for a failure message.
fn verifier_output(trial: &Trial) -> String {
    std::fs::read_to_string(trial.dir.join("verifier/test-stdout.txt")).unwrap_or_default()
}

/// The same tasks with mini-swe-agent's `LocalEnvironment` on the image's root filesystem: task ->
/// reward.
async fn local_rewards(
    env: &TestEnv,
    internet: &FakeInternet,
    work: &Path,
    agent: &str,
) -> BTreeMap<String, Option<f64>> {
    let node = env.node.real();
    let layout = node
        .layouts
        .get("debian-python")
        .expect("the Debian image's layout");
    let out = work.join(format!("local-{agent}.json"));
    let output = tokio::process::Command::new(sdk_python())
        .arg(workspace_root().join("e2e/harbor-local/local_trials.py"))
        .arg("--tasks")
        .arg(workspace_root().join("e2e/harbor-tasks"))
        .arg("--image-layout")
        .arg(layout)
        .arg("--netns")
        .arg(format!("/proc/{}/ns/net", node.namespaces.init_pid))
        .args([
            "--nameserver",
            &internet.dns().to_string(),
            "--agent",
            agent,
        ])
        .arg("--out")
        .arg(&out)
        .env("MSWEA_SILENT_STARTUP", "1")
        .kill_on_drop(true)
        .output()
        .await
        .expect("local_trials.py starts");
    assert!(
        output.status.success(),
        "local_trials.py --agent {agent} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let results: BTreeMap<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("local results"))
            .expect("local results are JSON");
    results
        .into_iter()
        .map(|(task, result)| (task, result["reward"].as_f64()))
        .collect()
}

#[tokio::test]
async fn harbor_runs_the_task_set_on_orchard_like_a_local_run() {
    let env = env();
    env.on_env_runtime(async move {
        let InternetRelease {
            release,
            internet,
            gateway,
        } = internet::install(env, &["allowed.test", "other.test"]).await;
        let client = env.client().await;
        assert_eq!(env.node.real().image("debian-python"), TASK_IMAGE);

        let ns = env.namespace("harbor").await;
        grant(env, &ns, "alice", "harbor-trials", harbor_rules()).await;
        let token = env.control_plane.tokens["alice"].clone();
        let work = env.dir.join("harbor");
        std::fs::create_dir_all(&work).expect("work directory");
        let harbor = harbor_bin();
        let (seen, watch) = watch_sandboxes(client.clone(), &ns);

        let caller = Caller {
            harbor: &harbor,
            work: &work,
            gateway: &gateway,
            token: &token,
            ns: &ns,
        };
        let tasks = workspace_root().join("e2e/harbor-tasks");
        let oracle = harbor_run(&caller, &tasks, "oracle", "oracle", &TASKS).await;
        for trial in &oracle {
            assert_eq!(
                trial.reward(),
                Some(1.0),
                "oracle on {}: {:?}, verifier said: {}",
                trial.task,
                trial.result["exception_info"],
                verifier_output(trial)
            );
            let expected = (trial.task == "agent-timeout").then(|| "AgentTimeoutError".to_string());
            assert_eq!(trial.exception(), expected, "{}", trial.task);
        }
        let artifacts = &oracle[2].dir.join("artifacts/app/report");
        check_artifacts(artifacts, &oracle[2].dir);

        let nop = harbor_run(&caller, &tasks, "nop", "nop", &TASKS).await;
        for trial in &nop {
            assert_eq!(trial.reward(), Some(0.0), "nop on {}", trial.task);
            assert_eq!(trial.exception(), None, "nop on {}", trial.task);
        }

        // Every sandbox was deleted when its trial stopped.
        let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
        orchard_testcluster::wait::poll(
            "the trials' sandboxes to be deleted",
            Duration::from_secs(60),
            || async {
                api.list(&Default::default())
                    .await
                    .ok()
                    .filter(|l| l.items.is_empty())
            },
        )
        .await;
        watch.abort();

        // The same outcomes without Kubernetes.
        for (agent, trials) in [("oracle", &oracle), ("nop", &nop)] {
            let local = local_rewards(env, &internet, &work, agent).await;
            let orchard: BTreeMap<String, Option<f64>> = trials
                .iter()
                .map(|t| (t.task.clone(), t.reward()))
                .collect();
            assert_eq!(
                orchard, local,
                "{agent}: Orchard (left) and a local run (right) differ"
            );
        }

        report(&oracle, &seen.lock().unwrap_or_else(|p| p.into_inner()));
        over_quota(env, &caller).await;
        env.delete_namespace(&ns).await;
        drop(release);
        drop(internet);
    })
    .await;
}

/// The artifact directory came back whole: files, a nested one, an executable's mode, a symbolic link.
fn check_artifacts(report: &Path, trial: &Path) {
    let listing = || {
        walk(trial)
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
    };
    let summary = std::fs::read_to_string(report.join("summary.txt"))
        .unwrap_or_else(|e| panic!("summary.txt: {e}; the trial has {:?}", listing()));
    assert_eq!(summary, "3 rows\n");
    assert_eq!(
        std::fs::read_to_string(report.join("data/values.csv")).expect("values.csv"),
        "n,square\n1,1\n2,4\n3,9\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(report.join("bin/show.sh"))
        .expect("show.sh")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "the executable keeps its mode");
    assert_eq!(
        std::fs::read_link(report.join("latest.csv")).expect("latest.csv is a link"),
        Path::new("data/values.csv")
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        }
        found.push(path);
    }
    found
}

/// Prints each oracle trial's wall time beside its sandbox's create -> Ready time.
fn report(trials: &[Trial], seen: &Seen) {
    println!(
        "{:<16} {:>8} {:>8} {:>8} {:>8} {:>10}",
        "task", "trial s", "setup s", "agent s", "verify s", "create->Ready s"
    );
    let mut ready_times = Vec::new();
    for trial in trials {
        let ready = seen
            .created
            .iter()
            .filter(|(_, (session, _))| {
                // Harbor's session id of a trial's environment: `<trial name>__env`.
                trial.result["trial_name"]
                    .as_str()
                    .map(|t| format!("{t}__env"))
                    == Some(session.clone())
            })
            .filter_map(|(name, (_, created))| {
                Some(seen.ready.get(name)?.duration_since(*created).as_secs_f64())
            })
            .next();
        ready_times.extend(ready);
        let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!(
            "{:<16} {:>8} {:>8} {:>8} {:>8} {:>10}",
            trial.task,
            show(trial.seconds("")),
            show(trial.seconds("environment_setup")),
            show(trial.seconds("agent_execution")),
            show(trial.seconds("verifier")),
            show(ready),
        );
    }
    assert_eq!(
        ready_times.len(),
        trials.len(),
        "every trial's sandbox was seen Ready"
    );
}

/// A task asking for more CPU than the namespace's ResourceQuota allows fails at `start` with the
/// sandbox's own reason (`QuotaExceeded`, the quota's words), long before Harbor's build timeout; no
/// sandbox is left.
async fn over_quota(env: &TestEnv, caller: &Caller<'_>) {
    let client = env.client().await;
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), caller.ns);
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "cpu"}, "spec": {"hard": {"limits.cpu": "2"}},
    }))
    .expect("quota JSON");
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the quota");
    // Admission enforces a quota once the quota controller has counted the namespace.
    orchard_testcluster::wait::until(
        &quotas,
        "cpu",
        "quota counted",
        Duration::from_secs(60),
        |q: Option<&ResourceQuota>| {
            q.and_then(|q| q.status.as_ref())
                .and_then(|s| s.used.as_ref())
                .is_some_and(|u| u.contains_key("limits.cpu"))
        },
    )
    .await;
    let tasks = caller.work.join("over-quota");
    let task = tasks.join("too-big");
    copy_dir(&workspace_root().join("e2e/harbor-tasks/hello-file"), &task);
    let toml = std::fs::read_to_string(task.join("task.toml")).expect("task.toml");
    std::fs::write(
        task.join("task.toml"),
        toml.replace("cpus = 0.5", "cpus = 8"),
    )
    .expect("write task.toml");
    let started = Instant::now();
    let [trial] = harbor_run(caller, &tasks, "oracle", "over-quota", &["too-big"])
        .await
        .try_into()
        .unwrap_or_else(|_| unreachable!("harbor_run checked the trials"));
    let took = started.elapsed();
    assert_eq!(
        trial.exception().as_deref(),
        Some("SandboxStartError"),
        "{:?}",
        trial.result["exception_info"]
    );
    let message = trial.result["exception_info"]["exception_message"]
        .as_str()
        .unwrap_or_default();
    for part in ["QuotaExceeded", "exceeded quota", "limits.cpu", "cpu=8"] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert!(
        took < Duration::from_secs(120),
        "the refusal comes at once, not at the build timeout: {took:?}"
    );
    let api: Api<Sandbox> = Api::namespaced(client, caller.ns);
    let left = api.list(&Default::default()).await.expect("list sandboxes");
    assert!(left.items.is_empty(), "the refused sandbox is deleted");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create directory");
    for entry in std::fs::read_dir(from).expect("read directory").flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}
