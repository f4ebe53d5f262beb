//! Whether a command was killed by the kernel's out-of-memory killer, and keeping the agent out of its
//! way: every command's OOM score is raised so that, when the sandbox's memory limit is hit, the kernel
//! kills the command, not the agent (PID 1: the sandbox would be lost).
//!
//! Detection: the memory cgroup counts OOM kills (`oom_kill` in `memory.events` on cgroup v2,
//! `memory.oom_control` on v1). A command that died of SIGKILL (not by its time-out) while that count
//! grew was OOM-killed. With several commands running at once, one of them may be credited with
//! another's kill; the signal is exact, the attribution is best effort.

use std::path::Path;

/// Where the container's memory cgroup reports OOM kills: (file, cgroup v2 format).
const COUNTERS: &[(&str, bool)] = &[
    ("/sys/fs/cgroup/memory.events", true),
    ("/sys/fs/cgroup/memory/memory.oom_control", false),
];

/// OOM score given to commands (the maximum: killed first). Raising a score needs no privilege.
const COMMAND_OOM_SCORE_ADJ: &str = "1000";

/// The `oom_kill` count in a `memory.events` (v2) or `memory.oom_control` (v1) file (pure).
pub fn parse_oom_kills(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// The OOM kills the sandbox's memory cgroup has counted so far, if this kernel reports them.
pub fn oom_kills() -> Option<u64> {
    COUNTERS.iter().find_map(|(path, _)| {
        std::fs::read_to_string(Path::new(path))
            .ok()
            .and_then(|text| parse_oom_kills(&text))
    })
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
    fn counts_are_read_from_both_cgroup_versions() {
        let v2 = "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(parse_oom_kills(v2), Some(2));
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n";
        assert_eq!(parse_oom_kills(v1), Some(5));
        assert_eq!(parse_oom_kills("under_oom 0\n"), None);
    }

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
