//! What the bench measures without the agent: the floors under its figures (spawning `true` directly,
//! writing straight to disk) and processes' resident memory from `/proc`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Resident memory of process `pid` in KiB (`VmRSS`), 0 when it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = |field: &str| -> u64 {
        status
            .lines()
            .find(|line| line.starts_with(field))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    };
    rss("VmRSS:")
}

/// RSS of a process and all its descendants (uvicorn runs in one process, but be fair).
pub fn tree_rss_kib(pid: u32) -> u64 {
    let mut total = rss_kib(pid);
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children
                .split_whitespace()
                .filter_map(|child| child.parse().ok())
            {
                total += tree_rss_kib(child);
            }
        }
    }
    total
}

/// p50 of spawning `true` directly, no HTTP: the floor under any agent's exec latency on this machine.
/// `like_the_agent`: as the agent starts commands (`posix_spawn` into a new process group, working
/// directory `cwd`, three pipes, then wait); otherwise fork + setsid + exec + wait (a `pre_exec` hook
/// forces std to fork), how the agent started them before, for comparison.
pub fn direct_spawn_p50(cwd: &Path, like_the_agent: bool) -> Duration {
    use std::os::unix::process::CommandExt;
    let mut samples: Vec<Duration> = (0..500)
        .map(|_| {
            let started = Instant::now();
            let mut command = Command::new("true");
            command.current_dir(cwd);
            if like_the_agent {
                command.process_group(0);
            } else {
                // SAFETY: only the async-signal-safe setsid runs between fork and exec.
                unsafe {
                    command.pre_exec(|| {
                        libc::setsid();
                        Ok(())
                    });
                }
            }
            let status = command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .status()
                .expect("spawn true");
            assert!(status.success());
            started.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

/// MiB/s of writing `mib` MiB straight to a file in `dir` (no HTTP): the floor under uploads.
pub fn direct_write_mib_per_second(dir: &Path, mib: usize) -> f64 {
    use std::io::Write;
    let path = dir.join("direct-write.bin");
    let chunk = vec![0xA5u8; 1024 * 1024];
    let started = Instant::now();
    let mut file = std::fs::File::create(&path).expect("create the direct-write file");
    for _ in 0..mib {
        file.write_all(&chunk).expect("write");
    }
    drop(file);
    let speed = mib as f64 / started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    speed
}
