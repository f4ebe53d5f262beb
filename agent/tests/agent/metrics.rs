//! `GET /v1/metrics` and OOM detection through the agent's own cgroup: an agent started in a memory
//! cgroup of its own (when the tests may create one) reports its limit, and a command the OOM killer
//! ends is reported `oomKilled`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use crate::common::{Agent, AgentOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_the_container_and_its_disk() {
    let agent = Agent::start();
    let (status, metrics) = agent.get("/v1/metrics").await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    assert_eq!(metrics["diskPath"], agent.root.path().display().to_string());
    let total = metrics["diskTotalBytes"].as_u64().unwrap();
    let used = metrics["diskUsedBytes"].as_u64().unwrap();
    assert!(total > 0 && used <= total, "{metrics}");
    assert!(metrics["pids"].as_u64().unwrap() >= 1, "{metrics}");
    if !metrics["cgroup"].is_null() {
        assert!(["v1", "v2"].contains(&metrics["cgroup"].as_str().unwrap()));
        assert!(metrics["memoryBytes"].as_u64().unwrap() > 0, "{metrics}");
        assert!(metrics["cpuSeconds"].as_f64().unwrap() > 0.0, "{metrics}");
    }
}

/// A fresh memory cgroup below this process' own, limited to `limit` bytes (swap included), or `None`
/// where the tests cannot make one (not root, no writable cgroup file system).
struct MemoryCgroup {
    directory: PathBuf,
}

impl MemoryCgroup {
    fn create(limit: u64) -> Option<MemoryCgroup> {
        let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let unified = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let parent = if unified {
            let path = text.lines().find_map(|line| line.strip_prefix("0::"))?;
            PathBuf::from("/sys/fs/cgroup").join(path.trim_start_matches('/'))
        } else {
            let path = text
                .lines()
                .find_map(|line| line.split_once(":memory:").map(|(_, path)| path))?;
            PathBuf::from("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'))
        };
        let directory = parent.join(format!("orchard-oom-test-{}", std::process::id()));
        std::fs::create_dir(&directory).ok()?;
        let cgroup = MemoryCgroup { directory };
        let write =
            |name: &str, value: &str| std::fs::write(cgroup.directory.join(name), value).is_ok();
        let limited = if unified {
            write("memory.max", &limit.to_string())
                && (write("memory.swap.max", "0")
                    || !cgroup.directory.join("memory.swap.max").exists())
        } else {
            write("memory.limit_in_bytes", &limit.to_string())
                && (!cgroup
                    .directory
                    .join("memory.memsw.limit_in_bytes")
                    .exists()
                    || write("memory.memsw.limit_in_bytes", &limit.to_string()))
        };
        limited.then_some(cgroup)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.directory).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_the_oom_killer_ends_is_reported_oom_killed() {
    const LIMIT: u64 = 96 * 1024 * 1024;
    let Some(cgroup) = MemoryCgroup::create(LIMIT) else {
        eprintln!("skipped: cannot create a memory cgroup here");
        return;
    };
    let procs = cgroup.directory.join("cgroup.procs");
    let agent = Agent::start_with(AgentOptions {
        // The agent starts inside the limited cgroup, so it is its container's.
        wrapper: vec![
            "sh".into(),
            "-c".into(),
            format!("echo $$ > '{}' && exec \"$0\" \"$@\"", procs.display()),
        ],
        ..AgentOptions::default()
    });
    let (_, before) = agent.get("/v1/metrics").await;
    assert_eq!(before["memoryLimitBytes"], LIMIT, "{before}");
    assert_eq!(before["oomKills"], 0, "{before}");

    // `tail` keeps the current line, and /dev/zero has no newline: it grows until it is killed.
    let out = agent
        .exec(json!({"argv": ["tail", "-n", "1", "/dev/zero"], "timeoutSeconds": 60}))
        .await;
    assert_eq!(
        (out["signal"].as_i64(), out["timedOut"].as_bool()),
        (Some(9), Some(false)),
        "{out}"
    );
    assert_eq!(out["oomKilled"], true, "{out}");
    let (_, after) = agent.get("/v1/metrics").await;
    assert!(after["oomKills"].as_u64().unwrap() >= 1, "{after}");
    assert!(
        after["memoryPeakBytes"].as_u64().unwrap() > LIMIT / 2,
        "{after}"
    );

    // A command killed by its time-out is not an OOM kill, nor one killed by someone else.
    let out = agent
        .exec(json!({"argv": ["sleep", "30"], "timeoutSeconds": 0.3}))
        .await;
    assert_eq!(
        (out["timedOut"].as_bool(), out["oomKilled"].as_bool()),
        (Some(true), Some(false)),
        "{out}"
    );
    let out = agent.exec(json!({"command": "kill -9 $$"})).await;
    assert_eq!(
        (out["signal"].as_i64(), out["oomKilled"].as_bool()),
        (Some(9), Some(false)),
        "{out}"
    );
    drop(agent);
}
