//! The `kubectl orchard` plugin (kubectl-orchard/, docs/KUBECTL.md) against the local cluster with the
//! real operator's gateway: wait, exec (output and exit status, 124 on timeout), a shell session fed
//! on standard input, cp of a directory (an executable and a symlink kept) up and back down and of a
//! file, extend, metrics, port-forward to an HTTP server on the sandbox's loopback, and its errors.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use orchard_testcluster::binaries::{kubectl_orchard_bin, target_dir};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::{Caller, grant, sandbox_path, trainer_rules};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// The plugin, set up for one namespace as a user would: gateway and token from the environment,
/// the namespace with `-n`, and no kubeconfig to fall back on.
struct Plugin {
    bin: PathBuf,
    gateway: String,
    token: String,
    namespace: String,
}

impl Plugin {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.bin);
        command
            .args(["-n", &self.namespace])
            .args(args)
            .env("ORCHARD_GATEWAY_URL", &self.gateway)
            .env("ORCHARD_TOKEN", &self.token)
            .env_remove("ORCHARD_TOKEN_FILE")
            .env_remove("ORCHARD_NAMESPACE")
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// Runs the plugin to the end with `stdin` as its standard input.
    async fn run_with_input(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kubectl-orchard");
        let mut input = child.stdin.take().expect("stdin");
        input
            .write_all(stdin.as_bytes())
            .await
            .expect("write stdin");
        drop(input);
        let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .expect("kubectl-orchard ends within 120 s")
            .expect("kubectl-orchard output");
        eprintln!(
            "kubectl orchard {}: {}\n--- stdout ---\n{}--- stderr ---\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    async fn run(&self, args: &[&str]) -> Output {
        self.run_with_input(args, "").await
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

/// A directory of its own under the target directory (removed first if a run left it).
fn scratch(name: &str) -> PathBuf {
    let dir = target_dir()
        .join("e2e")
        .join(format!("kubectl-plugin-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubectl_plugin_drives_a_sandbox_through_the_gateway() {
    let env = TestEnv::shared();
    let ns = env.namespace("kubectl-plugin").await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let alice = Caller::user(env, "alice");
    let plugin = Plugin {
        bin: kubectl_orchard_bin().expect("kubectl-orchard binary"),
        gateway: env.operator().gateway_url(),
        token: env.control_plane.tokens["alice"].clone(),
        namespace: ns.clone(),
    };
    let name = alice
        .create_sandbox(&ns, json!({"image": "busybox", "ttlSeconds": 900}))
        .await;

    // wait: until Ready.
    let waited = plugin.run(&["wait", &name, "--timeout", "90"]).await;
    assert!(waited.status.success());
    assert_eq!(stdout(&waited), format!("sandbox {ns}/{name} is Ready\n"));

    // exec: output on the matching streams, the command's exit status, 124 on timeout.
    let ran = plugin
        .run(&[
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "echo hi; echo oops >&2; exit 3",
        ])
        .await;
    assert_eq!(ran.status.code(), Some(3));
    assert_eq!(stdout(&ran), "hi\n");
    assert_eq!(stderr(&ran), "oops\n");
    let slow = plugin
        .run(&["exec", &name, "--timeout", "1", "--", "sleep", "30"])
        .await;
    assert_eq!(slow.status.code(), Some(124));
    assert!(stderr(&slow).contains("timed out"));

    // shell: one session, so `cd` and `export` carry over; piped stdin, no prompt.
    let shell = plugin
        .run_with_input(&["shell", &name], "cd /tmp\nexport X=5\npwd; echo $X\n")
        .await;
    assert!(shell.status.success());
    assert_eq!(stdout(&shell), "/tmp\n5\n");

    // cp: a directory with an executable and a symlink, up and back down.
    let local = scratch("cp");
    let up = local.join("up");
    std::fs::create_dir_all(up.join("sub")).expect("mkdir");
    std::fs::write(up.join("run.sh"), "#!/bin/sh\necho ran\n").expect("write");
    std::fs::set_permissions(up.join("run.sh"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    std::fs::write(up.join("sub/data.txt"), "data\n").expect("write");
    std::os::unix::fs::symlink("sub/data.txt", up.join("link")).expect("symlink");
    let up_text = up.display().to_string();
    let copied = plugin.run(&["cp", &up_text, &format!("{name}:tree")]).await;
    assert!(copied.status.success());
    let check = plugin
        .run(&[
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "./tree/run.sh && readlink tree/link && cat tree/link",
        ])
        .await;
    assert!(check.status.success());
    assert_eq!(stdout(&check), "ran\nsub/data.txt\ndata\n");
    let down = local.join("down");
    let down_text = down.display().to_string();
    let back = plugin
        .run(&["cp", &format!("{name}:tree"), &down_text])
        .await;
    assert!(back.status.success());
    assert_eq!(mode(&down.join("run.sh")), 0o755);
    assert_eq!(
        std::fs::read_link(down.join("link")).expect("a symlink"),
        PathBuf::from("sub/data.txt")
    );
    assert_eq!(
        std::fs::read_to_string(down.join("link")).expect("read"),
        "data\n"
    );
    // A file into an existing directory keeps its name, and comes back as a file.
    let one = local.join("one.txt");
    std::fs::write(&one, "one\n").expect("write");
    let one_text = one.display().to_string();
    assert!(
        plugin
            .run(&["cp", &one_text, &format!("{name}:tree")])
            .await
            .status
            .success()
    );
    let fetched = local.join("fetched.txt");
    let fetched_text = fetched.display().to_string();
    let file_back = plugin
        .run(&["cp", &format!("{name}:tree/one.txt"), &fetched_text])
        .await;
    assert!(file_back.status.success());
    assert_eq!(std::fs::read_to_string(&fetched).expect("read"), "one\n");

    // extend: the new end is printed.
    let extended = plugin.run(&["extend", &name, "1800"]).await;
    assert!(extended.status.success());
    let line = stdout(&extended);
    assert!(
        line.starts_with(&format!("sandbox {ns}/{name} expires at 20")) && line.contains("Z"),
        "{line}"
    );

    // metrics: the agent's JSON.
    let metrics = plugin.run(&["metrics", &name]).await;
    assert!(metrics.status.success());
    let metrics: Value = serde_json::from_slice(&metrics.stdout).expect("metrics JSON");
    assert!(metrics["diskPath"].is_string(), "{metrics}");
    assert!(metrics.get("memoryBytes").is_some(), "{metrics}");

    // port-forward: an HTTP server bound to the sandbox's loopback, reached from a local port.
    let site = local.join("site");
    std::fs::create_dir_all(&site).expect("mkdir");
    std::fs::write(site.join("hello.txt"), "hello through kubectl orchard\n").expect("write");
    let site_text = site.display().to_string();
    assert!(
        plugin
            .run(&["cp", &site_text, &format!("{name}:site")])
            .await
            .status
            .success()
    );
    let remote = free_port();
    let server = alice
        .post(
            &sandbox_path(&ns, &name, "/processes"),
            json!({"argv": ["python3", "-m", "http.server", "--bind", "127.0.0.1",
                            "--directory", "site", remote.to_string()]}),
        )
        .await;
    assert_eq!(server.status, 201, "{server:?}");
    let local_port = free_port();
    let ports = format!("{local_port}:{remote}");
    let mut forward = plugin
        .command(&["port-forward", &name, &ports])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start port-forward");
    let mut lines = BufReader::new(forward.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("port-forward prints its address")
        .expect("read")
        .expect("a line");
    assert_eq!(
        first,
        format!("Forwarding from 127.0.0.1:{local_port} -> {remote}")
    );
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        // Until the server listens, the tunnel is refused and the connection closed.
        let answer = http
            .get(format!("http://127.0.0.1:{local_port}/hello.txt"))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match answer {
            Ok(answer) if answer.status() == 200 => break answer.text().await.expect("body"),
            other if Instant::now() < deadline => {
                eprintln!("not yet: {other:?}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            other => panic!("nothing came through the port-forward: {other:?}"),
        }
    };
    assert_eq!(body, "hello through kubectl orchard\n");
    forward.kill().await.expect("stop port-forward");

    // Errors: the gateway's code and message, exit status 1.
    let missing = plugin.run(&["exec", "no-such-sandbox", "--", "true"]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).starts_with("error: NotFound: "),
        "{}",
        stderr(&missing)
    );
    let mut no_token = plugin.command(&["metrics", &name]);
    no_token.env_remove("ORCHARD_TOKEN");
    let no_token = no_token.output().await.expect("run");
    assert_eq!(no_token.status.code(), Some(1));
    let complaint = stderr(&no_token);
    assert!(
        complaint.contains("--token") && complaint.contains("ORCHARD_TOKEN"),
        "{complaint}"
    );
    assert_eq!(complaint.lines().count(), 1, "{complaint}");

    let deleted = alice.delete(&sandbox_path(&ns, &name, "")).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let _ = std::fs::remove_dir_all(&local);
}
