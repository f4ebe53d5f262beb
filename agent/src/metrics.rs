//! `GET /v1/metrics`: the container's CPU time, memory (now, peak, limit), processes and OOM kills
//! from its cgroup (`cgroup`), and the use of the file system holding `--root` (`statvfs`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use orchard_api::agent::AgentMetrics;

use crate::cgroup::read::sample;
use crate::error::{AgentError, json_response};
use crate::state::AppState;

/// Bytes used, total and available on a file system, from `statvfs` fields (pure).
pub fn disk_usage(blocks: u64, free: u64, available: u64, fragment_size: u64) -> (u64, u64, u64) {
    (
        blocks.saturating_sub(free).saturating_mul(fragment_size),
        blocks.saturating_mul(fragment_size),
        available.saturating_mul(fragment_size),
    )
}

/// `(used, total, available)` bytes of the file system holding `path`.
fn file_system_usage(path: &Path) -> Option<(u64, u64, u64)> {
    let path = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: a NUL-terminated path and writable memory for the result.
    if unsafe { libc::statvfs(path.as_ptr(), stats.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded, so it filled in `stats`.
    let stats = unsafe { stats.assume_init() };
    Some(disk_usage(
        stats.f_blocks,
        stats.f_bfree,
        stats.f_bavail,
        stats.f_frsize,
    ))
}

/// Processes visible in `/proc` (the container's, in its PID namespace): the count when the cgroup
/// has no `pids.current` (a v1 root cgroup, no pids controller).
fn processes_in_proc() -> Option<u64> {
    let entries = std::fs::read_dir("/proc").ok()?;
    Some(
        entries
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_str()
                    .is_some_and(|name| name.bytes().all(|byte| byte.is_ascii_digit()))
            })
            .count() as u64,
    )
}

pub async fn metrics(State(state): State<AppState>) -> Result<Response, AgentError> {
    let root = state.config.root.clone();
    let metrics = tokio::task::spawn_blocking(move || {
        let cgroup = sample();
        let disk = file_system_usage(&root);
        AgentMetrics {
            cgroup: cgroup.version.map(|version| version.name().to_string()),
            cpu_seconds: cgroup.cpu_seconds,
            memory_bytes: cgroup.memory_bytes,
            memory_peak_bytes: cgroup.memory_peak_bytes,
            memory_limit_bytes: cgroup.memory_limit_bytes,
            pids: cgroup.pids.or_else(processes_in_proc),
            oom_kills: cgroup.oom_kills,
            disk_path: root.display().to_string(),
            disk_used_bytes: disk.map(|(used, _, _)| used),
            disk_total_bytes: disk.map(|(_, total, _)| total),
            disk_available_bytes: disk.map(|(_, _, available)| available),
        }
    })
    .await
    .map_err(|error| AgentError::Internal(format!("metrics task failed: {error}")))?;
    Ok(json_response(StatusCode::OK, &metrics))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_usage_in_bytes() {
        assert_eq!(
            disk_usage(100, 40, 30, 4096),
            (60 * 4096, 100 * 4096, 30 * 4096)
        );
        assert_eq!(disk_usage(10, 20, 0, 512), (0, 5120, 0), "never negative");
    }

    #[test]
    fn the_root_file_system_has_a_size() {
        let (used, total, available) = file_system_usage(Path::new("/")).unwrap();
        assert!(total > 0 && used <= total && available <= total);
        assert!(processes_in_proc().unwrap() >= 1);
    }
}
