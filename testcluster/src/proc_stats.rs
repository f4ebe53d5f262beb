//! CPU time and memory of processes, read from `/proc` (for benchmarks: where the time goes).

/// CPU ticks in a `/proc/<pid>/stat` line: the process's own (user + system) and those of its children
/// it has reaped (`cutime` + `cstime`: every child that exited and was waited for, with its own
/// reaped children in turn), or `None` when the line is not one (pure).
pub fn parse_stat_ticks(stat: &str) -> Option<(u64, u64)> {
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command name: state is field 3, utime 14, stime 15, cutime 16, cstime 17 (1-based
    // in proc(5)).
    let field = |i: usize| -> Option<u64> { fields.get(i)?.parse().ok() };
    Some((field(11)? + field(12)?, field(13)? + field(14)?))
}

fn stat_ticks(pid: u32) -> Option<(u64, u64)> {
    parse_stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds (user + system) a process has used, or `None` if it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    stat_ticks(pid).map(|(own, _)| own as f64 / clock_ticks_per_second())
}

/// CPU seconds of the children a process has reaped, and of their reaped children in turn (the
/// short-lived processes a supervisor starts and waits for), or `None` if it is gone. A child counts
/// once it has exited and been waited for, not while it runs.
pub fn reaped_children_cpu_seconds(pid: u32) -> Option<f64> {
    stat_ticks(pid).map(|(_, children)| children as f64 / clock_ticks_per_second())
}

/// CPU seconds the whole machine has spent busy since boot, summed over its CPUs: every process,
/// those that already exited included, and the kernel's own threads and interrupts (`/proc/stat`).
pub fn machine_busy_seconds() -> Option<f64> {
    let ticks =
        orchard_bench_support::parse_busy_jiffies(&std::fs::read_to_string("/proc/stat").ok()?)?;
    Some(ticks as f64 / clock_ticks_per_second())
}

/// CPU seconds a cgroup has used, from its cgroup v1 `cpuacct.usage` file (nanoseconds, every process
/// that ever ran in it or its sub-cgroups), or `None` if it is unreadable.
pub fn cgroup_cpu_seconds(usage_file: &std::path::Path) -> Option<f64> {
    let nanoseconds: u64 = std::fs::read_to_string(usage_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(nanoseconds as f64 / 1e9)
}

fn clock_ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => ticks as f64,
        _ => 100.0,
    }
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resident memory in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:").map(|k| k * 1024)
}

/// Peak resident memory in bytes (high-water mark).
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:").map(|k| k * 1024)
}

/// Percentile `p` (0..=100) of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_and_memory() {
        let me = std::process::id();
        assert!(cpu_seconds(me).is_some());
        assert!(rss_bytes(me).unwrap() > 0);
        assert!(peak_rss_bytes(me).unwrap() >= rss_bytes(me).unwrap() / 2);
    }

    #[test]
    fn stat_lines_give_own_and_reaped_children_ticks() {
        // A command name with a space and a parenthesis, as proc(5) allows.
        let line = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    150 30 7 5 20 0 3 0 100 1000 200 18446744073709551615";
        assert_eq!(parse_stat_ticks(line), Some((180, 12)));
        assert_eq!(parse_stat_ticks("4242 (short) S 1 2 3"), None);
        assert_eq!(parse_stat_ticks("no command name here"), None);
        let me = std::process::id();
        assert!(reaped_children_cpu_seconds(me).is_some());
    }

    #[test]
    fn the_machine_has_been_busy() {
        assert!(machine_busy_seconds().is_some_and(|s| s > 0.0));
    }

    #[test]
    fn cgroup_usage_is_read_in_nanoseconds() {
        let file = std::env::temp_dir().join(format!("cpuacct-{}", std::process::id()));
        std::fs::write(&file, "2500000000\n").unwrap();
        let seconds = cgroup_cpu_seconds(&file);
        std::fs::write(&file, "not a number\n").unwrap();
        let garbage = cgroup_cpu_seconds(&file);
        std::fs::remove_file(&file).unwrap();
        assert_eq!(seconds, Some(2.5));
        assert_eq!(garbage, None);
        assert_eq!(cgroup_cpu_seconds(&file), None, "gone");
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), 51.0);
        assert_eq!(percentile(&values, 99.0), 99.0);
        assert_eq!(percentile(&values, 100.0), 100.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
