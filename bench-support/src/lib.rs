//! Benchmark discipline shared by `make bench-agent` (`agent/benches/agent.rs`) and `make
//! bench-gateway` (`bench/examples/bench_gateway.rs`): wait (bounded) for a quiet machine or say loudly
//! that it was not, record the load average and the CPU steal around the run, and report each figure
//! as the median over alternating rounds with its spread. No dependencies, so the agent's benchmark
//! can use it without pulling the operator's.

use std::time::{Duration, Instant};

/// The 1-minute load average (`NaN` when `/proc/loadavg` cannot be read).
pub fn load_1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The counters of the first line of `/proc/stat` (`cpu  user nice system idle iowait irq softirq
/// steal guest guest_nice`, in jiffies of all CPUs together), or `None` when that line is not the
/// all-CPU line or a counter does not parse (pure).
fn all_cpu_jiffies(stat: &str) -> Option<Vec<u64>> {
    let mut fields = stat.lines().next()?.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    fields.map(|field| field.parse().ok()).collect()
}

/// Total and steal jiffies of all CPUs from the first line of `/proc/stat`, `(0, 0)` when it cannot
/// be read (pure).
pub fn parse_cpu_jiffies(stat: &str) -> (u64, u64) {
    let fields = all_cpu_jiffies(stat).unwrap_or_default();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    (
        fields.iter().take(8).sum(),
        fields.get(7).copied().unwrap_or(0),
    )
}

/// Busy jiffies of all CPUs from the first line of `/proc/stat`: user, nice, system, irq and softirq
/// (guest time is already in user), so everything but idle, I/O wait and steal (pure).
pub fn parse_busy_jiffies(stat: &str) -> Option<u64> {
    let fields = all_cpu_jiffies(stat)?;
    let [user, nice, system, _idle, _iowait, irq, softirq, ..] = fields.as_slice() else {
        return None;
    };
    Some(user + nice + system + irq + softirq)
}

/// Iterations of [`cpu_probe`]'s loop: about 40 ms on this project's machines.
const PROBE_ITERATIONS: u64 = 20_000_000;

/// Milliseconds one CPU takes for a fixed integer workload (the best of 3 tries, so a preemption does
/// not count): the machine's speed at that moment, lower is faster. On a shared host the same
/// machine has been seen to do the same work in half again the CPU time at times, with no steal
/// reported; this tells such phases apart.
pub fn cpu_probe() -> f64 {
    (0..3)
        .map(|_| {
            let started = Instant::now();
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            for i in 0..PROBE_ITERATIONS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x = x.wrapping_add(std::hint::black_box(i));
            }
            std::hint::black_box(x);
            started.elapsed().as_secs_f64() * 1000.0
        })
        .fold(f64::INFINITY, f64::min)
}

/// The machine as a benchmark found it, and the meter of CPU steal from then on.
pub struct Machine {
    /// CPUs available to this process.
    pub cpus: usize,
    /// 1-minute load average when the benchmark started measuring.
    pub load_before: f64,
    /// Whether the load fell below half the CPUs within the wait.
    pub quiet: bool,
    /// How long the benchmark waited.
    pub waited: Duration,
    /// [`cpu_probe`] when the benchmark started measuring.
    pub probe_before_ms: f64,
    jiffies: (u64, u64),
}

impl Machine {
    /// Waits at most `max_wait` until the 1-minute load average is below half the CPUs (printing a
    /// warning on stderr when it never is), then starts the steal meter.
    pub fn settle(max_wait: Duration) -> Machine {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threshold = cpus as f64 / 2.0;
        let started = Instant::now();
        let (load, quiet) = loop {
            let load = load_1();
            if load < threshold {
                break (load, true);
            }
            if started.elapsed() >= max_wait {
                eprintln!(
                    "benchmark: the machine is NOT quiet (load {load:.2} >= {threshold:.1} after {} s): figures are noisy",
                    max_wait.as_secs()
                );
                break (load, false);
            }
            std::thread::sleep(Duration::from_secs(5));
        };
        Machine {
            cpus,
            load_before: load,
            quiet,
            waited: started.elapsed(),
            probe_before_ms: cpu_probe(),
            jiffies: parse_cpu_jiffies(&std::fs::read_to_string("/proc/stat").unwrap_or_default()),
        }
    }

    /// The sentence a benchmark's doc section carries about the machine: CPUs, quiet or not, the load
    /// average before and now, the CPU steal since [`Machine::settle`], and [`cpu_probe`] then and now.
    pub fn report(&self) -> String {
        let now = parse_cpu_jiffies(&std::fs::read_to_string("/proc/stat").unwrap_or_default());
        let total = now.0.saturating_sub(self.jiffies.0).max(1);
        let steal = 100.0 * now.1.saturating_sub(self.jiffies.1) as f64 / total as f64;
        let threshold = self.cpus as f64 / 2.0;
        let state = if self.quiet {
            format!(
                "quiet machine (load average below {threshold:.1} after waiting {} s)",
                self.waited.as_secs()
            )
        } else {
            format!(
                "**not a quiet machine** (the load average did not fall below {threshold:.1} within {} s)",
                self.waited.as_secs()
            )
        };
        format!(
            "{} CPUs; {state}; load average {:.2} at the start, {:.2} at the end; CPU steal during the run {steal:.1} %; \
             CPU probe {:.0} ms at the start, {:.0} ms at the end (a fixed single-thread workload, lower is faster)",
            self.cpus,
            self.load_before,
            load_1(),
            self.probe_before_ms,
            cpu_probe()
        )
    }
}

/// The median of `values` (the upper one of an even count), `None` when empty (pure).
pub fn median<T: Copy + PartialOrd>(values: &[T]) -> Option<T> {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    sorted.get(sorted.len() / 2).copied()
}

/// `median (min–max)` of `values`, each shown with `show`; one value alone, or `n/a` (pure).
pub fn median_spread<T: Copy + PartialOrd>(values: &[T], show: impl Fn(T) -> String) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    match sorted.as_slice() {
        [] => "n/a".into(),
        [only] => show(*only),
        all => format!(
            "{} ({}–{})",
            show(all[all.len() / 2]),
            show(all[0]),
            show(all[all.len() - 1])
        ),
    }
}

/// The path after `--write-doc` in `args` (the program's arguments), if given (pure).
pub fn write_doc_arg(args: &[String]) -> Option<std::path::PathBuf> {
    args.iter()
        .position(|arg| arg == "--write-doc")
        .and_then(|index| args.get(index + 1))
        .map(std::path::PathBuf::from)
}

/// The address in an agent's start-up log line (`... listen=127.0.0.1:40321 ...`), if it is that
/// line (pure).
pub fn listen_address_in(line: &str) -> Option<&str> {
    let rest = line.split("listen=").nth(1)?;
    rest.split_whitespace()
        .next()
        .filter(|address| !address.is_empty())
}

/// Reads an agent's `stderr` in a thread of its own until the start-up line says where it listens;
/// `None` when no such line came within `timeout`. The rest of the log is read and dropped, so the
/// agent never blocks on a full pipe.
pub fn listen_address(stderr: std::process::ChildStderr, timeout: Duration) -> Option<String> {
    use std::io::{BufRead, BufReader};
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(address) = listen_address_in(&line) {
                let _ = sender.send(address.to_string());
            }
        }
    });
    receiver.recv_timeout(timeout).ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn write_doc_and_listen_arguments_are_found() {
        let args: Vec<String> = ["bench", "--rows", "--write-doc", "docs/B.md"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            write_doc_arg(&args),
            Some(std::path::PathBuf::from("docs/B.md"))
        );
        assert_eq!(write_doc_arg(&args[..3]), None, "a flag without its path");
        assert_eq!(
            listen_address_in(
                "INFO orchard-agent serving version=\"0.1.0\" listen=127.0.0.1:4032 root=/r"
            ),
            Some("127.0.0.1:4032")
        );
        assert_eq!(listen_address_in("INFO something else"), None);
        assert_eq!(listen_address_in("listen="), None);
    }

    use super::*;

    #[test]
    fn steal_is_the_eighth_field_and_the_total_sums_the_first_eight() {
        let stat = "cpu  100 5 50 800 10 1 2 30 7 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_cpu_jiffies(stat), (998, 30));
        assert_eq!(parse_cpu_jiffies(""), (0, 0));
    }

    #[test]
    fn busy_jiffies_leave_out_idle_iowait_and_steal() {
        let stat = "cpu  100 5 50 9000 40 3 7 11 0 0\ncpu0 50 2 25 4500 20 1 3 5 0 0\n";
        assert_eq!(parse_busy_jiffies(stat), Some(165));
        assert_eq!(
            parse_busy_jiffies("cpu0 1 2 3 4 5 6 7\n"),
            None,
            "not the total line"
        );
        assert_eq!(parse_busy_jiffies("cpu 1 2 x 4 5 6 7\n"), None);
        assert_eq!(parse_busy_jiffies("cpu 1 2 3\n"), None);
    }

    #[test]
    fn medians_and_spreads() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median::<f64>(&[]), None);
        let show = |v: f64| format!("{v:.1}");
        assert_eq!(median_spread(&[3.0, 1.0, 2.0], show), "2.0 (1.0–3.0)");
        assert_eq!(median_spread(&[4.0], show), "4.0");
        assert_eq!(median_spread::<f64>(&[], show), "n/a");
    }
}
