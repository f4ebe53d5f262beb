//! CPU time of this process's threads by name (`/proc/self/task/*/schedstat`): a benchmark names
//! the runtime of each hop it runs in-process (`tokio::runtime::Builder::thread_name`), so what each
//! hop costs can be read apart from the client's and the others'.

use std::collections::HashMap;

/// Nanoseconds a thread has run on a CPU, user and kernel: the first field of
/// `/proc/self/task/<tid>/schedstat` (pure).
pub fn schedstat_ns(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

/// CPU seconds so far of every thread of this process, summed by thread name (`comm`). Threads that
/// ended are not counted, nor are threads whose files cannot be read (they ended meanwhile).
pub fn by_name() -> HashMap<String, f64> {
    let mut seconds: HashMap<String, f64> = HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return seconds;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let Some(ns) = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|text| schedstat_ns(&text))
        else {
            continue;
        };
        *seconds.entry(name.trim_end().to_string()).or_default() += ns as f64 / 1e9;
    }
    seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_the_run_time_in_ns() {
        assert_eq!(schedstat_ns("44413634 24325633 138\n"), Some(44_413_634));
        assert_eq!(schedstat_ns(""), None);
        assert_eq!(schedstat_ns("x 1 2"), None);
    }

    #[test]
    fn a_named_thread_that_spins_is_counted_under_its_name() {
        let spinner = std::thread::Builder::new()
            .name("cpu-test-spin".into())
            .spawn(|| {
                let started = std::time::Instant::now();
                let mut x = 0u64;
                while started.elapsed() < std::time::Duration::from_millis(50) {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                by_name().get("cpu-test-spin").copied().unwrap_or_default()
            })
            .expect("spawn");
        let seen = spinner.join().expect("join");
        assert!(seen >= 0.02, "at least 20 ms of the 50 ms spin: {seen}");
    }
}
