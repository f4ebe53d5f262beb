//! Whether a command was killed by the kernel's out-of-memory killer, and keeping the agent out of its
//! way: every command's OOM score is raised so that, when the sandbox's memory limit is hit, the kernel
//! kills the command, not the agent (PID 1: the sandbox would be lost).
//!
//! Detection: the memory cgroup counts OOM kills (`oom_kill` in `memory.events` on cgroup v2,
//! `memory.oom_control` on v1), in the agent's own cgroup as `/proc/self/cgroup` names it (`cgroup`). A command that died of SIGKILL (not by its time-out) while that count
//! grew was OOM-killed. With several commands running at once, one of them may be credited with
//! another's kill; the signal is exact, the attribution is best effort.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::cgroup::read::cgroup_files;

/// Where the container's memory cgroup reports OOM kills when `/proc/self/cgroup` does not lead to
/// it: the v2 and v1 files at the top of a cgroup namespace.
const FALLBACK_COUNTERS: &[&str] = &[
    "/sys/fs/cgroup/memory.events",
    "/sys/fs/cgroup/memory/memory.oom_control",
];

/// OOM score given to commands (the maximum: killed first). Raising a score needs no privilege.
const COMMAND_OOM_SCORE_ADJ: &str = "1000";

/// The `oom_kill` count in a `memory.events` (v2) or `memory.oom_control` (v1) file (pure).
pub use crate::cgroup::stats::parse_oom_kills;

/// The OOM kills the sandbox's memory cgroup has counted so far, if this kernel reports them.
///
/// Read before every command (and after one that died of SIGKILL), so the counter file is found and
/// opened once (cgroup files do not come and go while the agent runs; the descriptor is close-on-exec)
/// and each read is one `pread` at offset 0, which makes the kernel generate the file afresh: one
/// system call instead of open, two reads, close and a failed open of the other cgroup version's file.
pub fn oom_kills() -> Option<u64> {
    static COUNTER: OnceLock<Option<(File, PathBuf)>> = OnceLock::new();
    let (file, path) = COUNTER
        .get_or_init(|| {
            let located = cgroup_files().and_then(|files| files.oom_kills.clone());
            located
                .into_iter()
                .chain(FALLBACK_COUNTERS.iter().map(PathBuf::from))
                .find_map(|path| {
                    let file = File::open(&path).ok()?;
                    read_oom_kills(&file, &path)?;
                    Some((file, path))
                })
        })
        .as_ref()?;
    read_oom_kills(file, path)
}

/// The `oom_kill` count of the open counter `file`. Both counter files are a few lines, far below the
/// buffer; one that filled it is read again whole from `path`.
fn read_oom_kills(file: &File, path: &Path) -> Option<u64> {
    let mut buffer = [0u8; 1024];
    let length = file.read_at(&mut buffer, 0).ok()?;
    if length == buffer.len() {
        return parse_oom_kills(&std::fs::read_to_string(path).ok()?);
    }
    parse_oom_kills(std::str::from_utf8(&buffer[..length]).ok()?)
}

/// Whether a command that ended with `signal` (not by its time-out) was OOM-killed, given the counts
/// before it started and now (pure).
pub fn was_oom_killed(
    signal: Option<i32>,
    timed_out: bool,
    before: Option<u64>,
    after: Option<u64>,
) -> bool {
    signal == Some(libc::SIGKILL)
        && !timed_out
        && matches!((before, after), (Some(b), Some(a)) if a > b)
}

/// Makes `pid` the OOM killer's first choice (best effort: the process may already be gone).
pub fn prefer_for_oom_kill(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/oom_score_adj"), COMMAND_OOM_SCORE_ADJ);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sigkill_while_the_count_grew_is_an_oom_kill() {
        assert!(was_oom_killed(Some(9), false, Some(0), Some(1)));
        assert!(
            !was_oom_killed(Some(9), true, Some(0), Some(1)),
            "its own time-out"
        );
        assert!(
            !was_oom_killed(Some(9), false, Some(1), Some(1)),
            "killed by someone"
        );
        assert!(!was_oom_killed(Some(15), false, Some(0), Some(1)));
        assert!(!was_oom_killed(None, false, Some(0), Some(1)));
        assert!(
            !was_oom_killed(Some(9), false, None, None),
            "no cgroup counters"
        );
    }
}
