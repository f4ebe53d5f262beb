//! The static binary runs in an empty root: a chroot holding nothing but the agent serves /healthz and
//! execs (argv, no shell needed). Needs root; under `CI=true` a missing precondition fails the test.

use std::path::PathBuf;
use std::process::Command;

use serde_json::json;

use crate::common::{Agent, AgentOptions, TempDir};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true")
}

/// Skips (locally) or fails (CI) with `reason`.
fn unavailable(reason: &str) -> Option<PathBuf> {
    if in_ci() {
        panic!("empty-root test cannot run under CI=true: {reason}");
    }
    eprintln!("skipping the empty-root test: {reason}");
    None
}

fn is_static(path: &std::path::Path) -> bool {
    // A dynamically linked ELF has a PT_INTERP program header; `ldd`-free check via `file`-less parsing.
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return false;
    }
    let read_u64 = |offset: usize| {
        u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap_or_default()) as usize
    };
    let read_u16 = |offset: usize| {
        u16::from_le_bytes(bytes[offset..offset + 2].try_into().unwrap_or_default()) as usize
    };
    let (table, entry_size, count) = (read_u64(0x20), read_u16(0x36), read_u16(0x38));
    (0..count).all(|index| {
        let offset = table + index * entry_size;
        offset + 4 > bytes.len()
            || u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap_or_default()) != 3
    })
}

/// The statically linked agent: `ORCHARD_AGENT_STATIC_BIN` (set by `make test-agent`), else the output of
/// `make agent` beside the test build, else built here (debug profile, crt-static).
fn static_agent() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("ORCHARD_AGENT_STATIC_BIN") {
        let path = PathBuf::from(path);
        assert!(
            is_static(&path),
            "ORCHARD_AGENT_STATIC_BIN={} is not a static executable",
            path.display()
        );
        return Some(path);
    }
    let test_build = crate::common::agent_binary();
    let target_dir = test_build.parent()?.parent()?.to_path_buf();
    let made = target_dir.join("x86_64-unknown-linux-gnu/agent/orchard-agent");
    if made.exists() && is_static(&made) {
        return Some(made);
    }
    let build_dir = target_dir.join("static-test");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "build",
            "-p",
            "orchard-agent",
            "--target",
            "x86_64-unknown-linux-gnu",
            "-j",
            "2",
        ])
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env("CARGO_TARGET_DIR", &build_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status();
    let built = build_dir.join("x86_64-unknown-linux-gnu/debug/orchard-agent");
    match status {
        Ok(status) if status.success() && is_static(&built) => Some(built),
        other => unavailable(&format!(
            "could not build a static agent ({other:?}); run `make test-agent`"
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_agent_serves_from_an_empty_root() {
    if unsafe { libc::geteuid() } != 0 {
        unavailable("chroot needs root");
        return;
    }
    let Some(binary) = static_agent() else { return };
    let jail = TempDir::new("empty-root");
    std::fs::copy(&binary, jail.path().join("orchard-agent")).unwrap();
    let contents: Vec<_> = std::fs::read_dir(jail.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(
        contents,
        vec![std::ffi::OsString::from("orchard-agent")],
        "the root must hold only the agent"
    );

    let version = Command::new("chroot")
        .arg(jail.path())
        .arg("/orchard-agent")
        .arg("--version")
        .output()
        .unwrap();
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("orchard-agent {}", env!("CARGO_PKG_VERSION"))
    );

    let agent = Agent::start_with(AgentOptions {
        with_token: false,
        wrapper: vec!["chroot".into(), jail.path().display().to_string()],
        binary: Some(PathBuf::from("/orchard-agent")),
        root: Some("/".into()),
        ..AgentOptions::default()
    });
    assert_eq!(agent.get("/healthz").await.1["status"], "ok");
    let out = agent
        .exec(json!({"argv": ["/orchard-agent", "--version"]}))
        .await;
    assert_eq!(out["exitCode"], 0, "{out}");
    assert_eq!(
        out["stdout"],
        format!("orchard-agent {}\n", env!("CARGO_PKG_VERSION"))
    );
    // No shell in the root: `command` fails cleanly with 127, the agent keeps serving.
    let out = agent.exec(json!({"command": "echo hi"})).await;
    assert_eq!(out["exitCode"], 127, "{out}");
    // Without /proc the agent still knows (from argv[0]) which file is its own executable.
    let (status, _) = agent
        .call(
            hyper::Method::PUT,
            "/v1/files?path=/orchard-agent",
            "overwrite",
        )
        .await;
    assert_eq!(status, hyper::StatusCode::FORBIDDEN);
    // The install subcommand works without a shell (and without /proc) too.
    let out = agent
        .exec(json!({"argv": ["/orchard-agent", "install", "/opt/orchard"]}))
        .await;
    assert_eq!(out["stdout"], "/opt/orchard/orchard-agent\n", "{out}");
    let installed = jail.path().join("opt/orchard/orchard-agent");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read(&installed).unwrap(),
        std::fs::read(&binary).unwrap()
    );
}
