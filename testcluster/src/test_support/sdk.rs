//! Runs the Python SDK's tests (`sdk/python/tests`, pytest) against a gateway of the local cluster:
//! a namespace where the test user `alice` has a trainer Role (plus `get sandboxes/token` for direct mode), one
//! where she has none, and `bob` without rights. Shared by `python_sdk.rs` (the operator process) and
//! `in_cluster.rs` (the chart-installed operator).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::binaries::workspace_root;
use crate::env::TestEnv;
use serde_json::json;

use super::gateway::{grant, trainer_rules};

/// Where the SDK tests run.
pub struct SdkTarget {
    /// Gateway base URL.
    pub gateway: String,
    /// A `/metrics` URL of the operator serving that gateway.
    pub metrics: String,
    /// Image with a POSIX shell.
    pub image: String,
    /// Image with python3.
    pub python_image: String,
    /// Whether this process reaches agents at their pod IPs (direct mode).
    pub direct: bool,
}

/// Runs a venv script of `sdk/python/scripts` (it creates or refreshes the venv; `what` says what it
/// installs, for the failure message) and answers `bin/<program>` of the venv at `$<variable>`, else
/// `~/.cache/orchard/<default_dir>`.
fn venv_program(
    script: &str,
    what: &str,
    variable: &str,
    default_dir: &str,
    program: &str,
) -> PathBuf {
    let script = workspace_root().join("sdk/python/scripts").join(script);
    let output = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{} failed (it installs {what} from PyPI):\n{}{}",
        script.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let venv = std::env::var(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/orchard")
                .join(default_dir)
        });
    venv.join("bin").join(program)
}

/// The SDK's venv (pinned httpx, pytest, pytest-asyncio, mini-swe-agent), created or refreshed by its script.
pub fn sdk_python() -> PathBuf {
    venv_program(
        "venv.sh",
        "httpx, pytest, pytest-asyncio and mini-swe-agent",
        "ORCHARD_SDK_VENV",
        "sdk-venv",
        "python",
    )
}

/// Harbor's `harbor` command in the Harbor venv (Python 3.12, harbor 0.25.0 pinned, the SDK editable),
/// created or refreshed by its script (`make harbor-venv`).
pub fn harbor_bin() -> PathBuf {
    venv_program(
        "harbor-venv.sh",
        "harbor 0.25.0 and its pinned dependencies",
        "ORCHARD_HARBOR_VENV",
        "harbor-venv",
        "harbor",
    )
}

/// The wheels of the SDK's dependencies and build backend that `venv.sh` keeps (after running it), for
/// a pip without an index.
pub fn wheelhouse() -> PathBuf {
    sdk_python();
    std::env::var("ORCHARD_WHEELHOUSE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/orchard/wheels")
        })
}

/// What pytest did.
pub struct SdkRun {
    /// Its exit status, when it failed.
    pub failure: Option<String>,
    /// Its standard output (`-rA`: one line per test outcome).
    pub stdout: String,
}

/// Runs pytest against `target` (its output is printed).
pub async fn run_sdk_tests(env: &TestEnv, target: &SdkTarget) -> SdkRun {
    let python = sdk_python();
    let namespace = env.namespace("sdk").await;
    let other = env.namespace("sdk-other").await;
    let mut rules = trainer_rules();
    if let Some(list) = rules.as_array_mut() {
        // Direct mode asks the gateway for the agent's address and token.
        list.push(json!({"apiGroups": ["orchard.dev"], "resources": ["sandboxes/token"], "verbs": ["get"]}));
        // The dispatcher's queue test creates its own RolloutQueue (a platform object, so kubectl
        // rather than the gateway).
        list.push(json!({"apiGroups": ["orchard.dev"], "resources": ["rolloutqueues"], "verbs": ["get", "create", "delete"]}));
    }
    grant(env, &namespace, "alice", "trainer", rules).await;

    let root = workspace_root();
    let mut command = tokio::process::Command::new(&python);
    command
        .args([
            "-m",
            "pytest",
            "sdk/python/tests",
            "-p",
            "no:cacheprovider",
            "-rA",
            "--durations=5",
        ])
        .current_dir(&root)
        .env("PYTHONPATH", root.join("sdk/python/src"))
        .env("PYTHONUNBUFFERED", "1")
        .env("ORCHARD_TEST_GATEWAY_URL", &target.gateway)
        .env("ORCHARD_TEST_TOKEN", &env.control_plane.tokens["alice"])
        .env("ORCHARD_TEST_BOB_TOKEN", &env.control_plane.tokens["bob"])
        .env("ORCHARD_TEST_NAMESPACE", &namespace)
        .env("ORCHARD_TEST_OTHER_NAMESPACE", &other)
        .env("ORCHARD_TEST_KUBE_SERVER", &env.control_plane.server)
        .env(
            "ORCHARD_TEST_KUBE_CA",
            env.control_plane.dir.join("pki/apiserver.crt"),
        )
        .env("ORCHARD_TEST_METRICS_URL", &target.metrics)
        .env("ORCHARD_TEST_IMAGE", &target.image)
        .env("ORCHARD_TEST_PYTHON_IMAGE", &target.python_image)
        .env("ORCHARD_TEST_DIRECT", if target.direct { "1" } else { "0" })
        .env("KUBECONFIG", &env.control_plane.kubeconfig)
        .env("CI", "true")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(600), command.output())
        .await
        .expect("pytest finished within 10 minutes")
        .expect("pytest runs");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    env.delete_namespace(&namespace).await;
    env.delete_namespace(&other).await;
    SdkRun {
        failure: (!output.status.success()).then(|| output.status.to_string()),
        stdout,
    }
}
