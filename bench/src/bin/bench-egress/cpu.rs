//! CPU time of the process (`getrusage`) and of its threads by name (`/proc/self/task/*/schedstat`):
//! the proxy's runtime threads are named `egress-proxy`, the relay's `tcp-relay`, the origin's
//! `origin`; the client runs on the main thread.

use std::ops::Sub;

/// Thread name of the proxy's runtime.
pub const PROXY_THREADS: &str = "egress-proxy";

/// Thread name of the relay's runtime.
pub const RELAY_THREADS: &str = "tcp-relay";

/// Thread name of the origin's runtime.
pub const ORIGIN_THREADS: &str = "origin";

/// CPU seconds so far (or between two readings).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cpu {
    /// The whole process, user + system (`getrusage(RUSAGE_SELF)`).
    pub process: f64,
    /// The proxy's threads (time on a CPU, user and kernel).
    pub proxy: f64,
    /// The relay's threads.
    pub relay: f64,
    /// The origin's threads.
    pub origin: f64,
    /// Every other thread: the client.
    pub client: f64,
}

impl Sub for Cpu {
    type Output = Cpu;

    fn sub(self, earlier: Cpu) -> Cpu {
        Cpu {
            process: self.process - earlier.process,
            proxy: self.proxy - earlier.proxy,
            relay: self.relay - earlier.relay,
            origin: self.origin - earlier.origin,
            client: self.client - earlier.client,
        }
    }
}

fn seconds(time: libc::timeval) -> f64 {
    time.tv_sec as f64 + time.tv_usec as f64 / 1e6
}

/// The CPU time used so far.
pub fn now() -> Cpu {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let mut cpu = Cpu {
        process: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        ..Cpu::default()
    };
    for (name, seconds) in orchard_bench::thread_cpu::by_name() {
        match name.as_str() {
            PROXY_THREADS => cpu.proxy += seconds,
            RELAY_THREADS => cpu.relay += seconds,
            ORIGIN_THREADS => cpu.origin += seconds,
            _ => cpu.client += seconds,
        }
    }
    cpu
}
