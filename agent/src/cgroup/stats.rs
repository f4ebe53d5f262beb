//! What the cgroup files say, parsed from their text. Pure.

/// A v1 limit this large means "no limit" (the kernel's `PAGE_COUNTER_MAX` in bytes, rounded down to
/// a page, is just below 2^63).
const UNLIMITED_V1: u64 = 1 << 62;

/// CPU seconds from v2 `cpu.stat` (`usage_usec <microseconds>`).
pub fn cpu_seconds_v2(cpu_stat: &str) -> Option<f64> {
    cpu_stat.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "usage_usec")
            .then(|| value.trim().parse::<u64>().ok())
            .flatten()
            .map(|micros| micros as f64 / 1e6)
    })
}

/// CPU seconds from v1 `cpuacct.usage` (nanoseconds).
pub fn cpu_seconds_v1(usage: &str) -> Option<f64> {
    usage
        .trim()
        .parse::<u64>()
        .ok()
        .map(|nanos| nanos as f64 / 1e9)
}

/// A file holding one number (`memory.current`, `pids.current`, ...).
pub fn number(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// A memory limit: v2 `memory.max` (`max` for none), v1 `memory.limit_in_bytes` (a huge number for
/// none).
pub fn memory_limit(text: &str) -> Option<u64> {
    number(text).filter(|limit| *limit < UNLIMITED_V1)
}

/// The `oom_kill` count in a `memory.events` (v2) or `memory.oom_control` (v1) file.
pub fn parse_oom_kills(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(' ')?;
        (key == "oom_kill")
            .then(|| value.trim().parse().ok())
            .flatten()
    })
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
    fn cpu_time_in_both_versions() {
        let stat = "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\nnr_periods 0\n";
        assert_eq!(cpu_seconds_v2(stat), Some(2.5));
        assert_eq!(cpu_seconds_v2("user_usec 1\n"), None);
        assert_eq!(cpu_seconds_v2("usage_usec x\n"), None);
        assert_eq!(cpu_seconds_v1("1500000000\n"), Some(1.5));
        assert_eq!(cpu_seconds_v1(""), None);
    }

    #[test]
    fn numbers_and_limits() {
        for (text, expected) in [
            ("4096\n", Some(4096)),
            ("  12 ", Some(12)),
            ("", None),
            ("x", None),
        ] {
            assert_eq!(number(text), expected, "{text:?}");
        }
        for (text, expected) in [
            ("max\n", None),
            ("536870912\n", Some(536_870_912)),
            ("9223372036854771712\n", None),
            ("", None),
        ] {
            assert_eq!(memory_limit(text), expected, "{text:?}");
        }
    }
}
