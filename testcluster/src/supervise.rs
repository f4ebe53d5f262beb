//! Child processes of the test harness (etcd, kube-apiserver, kube-controller-manager, the operator,
//! every sandbox's agent) with no orphans, even when a test panics or the harness is killed:
//!
//! - every child is forked by one long-lived spawner thread with `PR_SET_PDEATHSIG=SIGKILL`, so it dies
//!   with the harness process (the signal fires when the *forking thread* exits, hence the dedicated
//!   thread), and gets its own process group;
//! - every child carries the environment marker [`RUN_MARKER`]`=<harness pid>.<harness start time>`,
//!   which its descendants inherit (agents pass their environment to the commands they run, which live
//!   in sessions of their own). [`sweep_orphans`] kills every marked process whose harness is gone, and
//!   [`kill_marked`] kills every process of a given marker value;
//! - exits are awaited through pidfds, so thousands of children need no thread each.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::prctl;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{self, Pid};
use tokio::io::unix::AsyncFd;

/// SIGKILL as the signal number [`Exit`] and [`Child::signal`] use.
pub const SIGKILL: i32 = Signal::SIGKILL as i32;

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

/// Environment variable marking every process started by a harness run.
pub const RUN_MARKER: &str = "ORCHARD_E2E_RUN";

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// Short name for logs and errors.
    pub name: String,
    /// Program to run.
    pub program: PathBuf,
    /// Arguments.
    pub args: Vec<OsString>,
    /// Extra environment variables (added to the harness' own environment unless `clear_env`).
    pub env: Vec<(OsString, OsString)>,
    /// Start from an empty environment (plus the run marker and `env`).
    pub clear_env: bool,
    /// Working directory.
    pub cwd: Option<PathBuf>,
    /// File receiving stdout and stderr (appended); `/dev/null` when unset.
    pub log: Option<PathBuf>,
    /// Start through `posix_spawn` (no fork of this large process: ~20x cheaper, for the thousands of
    /// pod processes) instead of fork with a `PR_SET_PDEATHSIG` pre-exec hook. Such a child must arm its
    /// parent-death signal itself: it gets `ORCHARD_AGENT_DIE_WITH_PARENT=<our pid>` (the agent does).
    pub fast: bool,
}

impl Spec {
    /// A spec running `program` with `args`.
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            ..Self::default()
        }
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sends stdout and stderr to `path`.
    pub fn log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }
}

type SpawnRequest = (Spec, mpsc::Sender<io::Result<u32>>);

/// Spawns performed and nanoseconds the spawner thread spent forking (for benchmarks).
static SPAWNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static SPAWN_NANOS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// (spawns, seconds spent in the spawner thread) since the process started.
pub fn spawn_stats() -> (u64, f64) {
    use std::sync::atomic::Ordering;
    (
        SPAWNS.load(Ordering::Relaxed),
        SPAWN_NANOS.load(Ordering::Relaxed) as f64 / 1e9,
    )
}

/// The marker value of this harness process: its pid and start time (so a reused pid does not match).
pub fn run_marker() -> &'static str {
    static MARKER: OnceLock<String> = OnceLock::new();
    MARKER.get_or_init(|| {
        let pid = std::process::id();
        format!("{pid}.{}", process_start_time(pid).unwrap_or(0))
    })
}

/// Start time (clock ticks since boot) of `pid`, from `/proc/<pid>/stat`.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: parse after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("e2e-spawner".into())
            .spawn(move || {
                // Lives as long as the process: the sender is in a static and never dropped.
                for (spec, reply) in rx {
                    let started = std::time::Instant::now();
                    let result = spawn_here(&spec);
                    SPAWNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    SPAWN_NANOS.fetch_add(
                        started.elapsed().as_nanos() as u64,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    let _ = reply.send(result);
                }
            })
            .expect("cannot start the e2e spawner thread");
        tx
    })
}

fn spawn_here(spec: &Spec) -> io::Result<u32> {
    let mut command = Command::new(&spec.program);
    command.args(&spec.args);
    if spec.clear_env {
        command.env_clear();
    }
    command.env(RUN_MARKER, run_marker());
    for (key, value) in &spec.env {
        command.env(key, value);
    }
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    let (stdout, stderr) = match &spec.log {
        Some(path) => {
            let file = File::options().create(true).append(true).open(path)?;
            (Stdio::from(file.try_clone()?), Stdio::from(file))
        }
        None => (Stdio::null(), Stdio::null()),
    };
    command.stdin(Stdio::null()).stdout(stdout).stderr(stderr);
    let cannot_start = |e: io::Error| {
        let what = format!(
            "cannot start {} ({}): {e}",
            spec.name,
            spec.program.display()
        );
        io::Error::new(e.kind(), what)
    };
    if spec.fast {
        command.process_group(0);
        command.env(
            "ORCHARD_AGENT_DIE_WITH_PARENT",
            std::process::id().to_string(),
        );
        let child = command.spawn().map_err(cannot_start)?;
        return Ok(child.id());
    }
    let parent = Pid::this();
    // SAFETY: only async-signal-safe calls (prctl, getppid, setpgid, _exit) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The harness may have died between fork and prctl: then nobody would ever kill us.
            if unistd::getppid() != parent {
                // nix has no _exit(2); std's exit would run atexit handlers in the forked child.
                libc::_exit(1);
            }
            unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0))?;
            Ok(())
        });
    }
    let child = command.spawn().map_err(cannot_start)?;
    Ok(child.id())
}

/// pidfd_open(2). nix has no pidfd calls, hence the raw syscall (here and in [`Child::signal`]).
fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success it returns a new file descriptor we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor returned by the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A running child process.
#[derive(Debug)]
pub struct Child {
    name: String,
    pid: u32,
    pidfd: OwnedFd,
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Child {
    /// Starts `spec` (from the spawner thread).
    pub fn spawn(spec: Spec) -> io::Result<Self> {
        let name = spec.name.clone();
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .send((spec, reply_tx))
            .map_err(|_| io::Error::other("the e2e spawner thread is gone"))?;
        let pid = reply_rx
            .recv()
            .map_err(|_| io::Error::other("the e2e spawner thread did not answer"))??;
        let pidfd = pidfd_open(pid)?;
        Ok(Self { name, pid, pidfd })
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends `signal` to the child's whole process group.
    pub fn signal_group(&self, signal: i32) {
        // Errors (already gone, or not a signal number) are ignored.
        if let Ok(signal) = Signal::try_from(signal) {
            let _ = killpg(pid_of(self.pid), signal);
        }
    }

    /// Sends `signal` to the child itself (through its pidfd, immune to pid reuse).
    pub fn signal(&self, signal: i32) {
        // SAFETY: plain syscall on a pidfd we own.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }

    /// Whether the child has exited (not yet reaped counts as exited).
    pub fn has_exited(&self) -> bool {
        let mut fds = [PollFd::new(self.pidfd.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).is_ok_and(|ready| ready > 0)
    }

    /// Waits for the child to exit and reaps it.
    pub async fn wait(&self) -> io::Result<Exit> {
        // SAFETY: the pidfd is owned by `self` and outlives this registration, which ends when `fd`
        // drops at the end of this call; no other registration of it runs concurrently.
        let fd = unsafe {
            AsyncFd::register_with_interest(self.pidfd.as_raw_fd(), tokio::io::Interest::READABLE)
        }
        .map_err(|e| io::Error::other(e.to_string()))?;
        let _ready = fd.readable().await?;
        Ok(self.reap().unwrap_or(Exit::Signal(SIGKILL)))
    }

    /// Reaps the child if it exited (`None` if it runs or was already reaped).
    pub fn reap(&self) -> Option<Exit> {
        match waitpid(pid_of(self.pid), Some(WaitPidFlag::WNOHANG)).ok()? {
            WaitStatus::Exited(_, code) => Some(Exit::Code(code)),
            WaitStatus::Signaled(_, signal, _) => Some(Exit::Signal(signal as i32)),
            _ => None,
        }
    }

    /// SIGTERM to the process group, then SIGKILL after `grace` if still running; reaps it.
    pub async fn stop(&self, grace: Duration) {
        if self.has_exited() {
            self.reap();
            return;
        }
        self.signal_group(Signal::SIGTERM as i32);
        if tokio::time::timeout(grace, self.wait()).await.is_err() {
            self.signal_group(SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), self.wait()).await;
        }
    }

    /// SIGKILL to the process group and reap, without waiting on a runtime (for `Drop` paths).
    pub fn kill_now(&self) {
        self.signal_group(SIGKILL);
        self.signal(SIGKILL);
        for _ in 0..200 {
            if self.reap().is_some() || !Path::new(&format!("/proc/{}", self.pid)).exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Processes carrying `key=value` in their environment (read from `/proc/<pid>/environ`).
pub fn processes_with_env(key: &str, value: Option<&str>) -> Vec<u32> {
    let needle_prefix = format!("{key}=");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id())
        .filter(|pid| {
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                return false;
            };
            environ.split(|b| *b == 0).any(|entry| {
                let Ok(text) = std::str::from_utf8(entry) else {
                    return false;
                };
                match text.strip_prefix(&needle_prefix) {
                    Some(found) => value.is_none_or(|v| v == found),
                    None => false,
                }
            })
        })
        .collect()
}

/// SIGKILLs every process carrying `key=value`; returns how many it signalled.
pub fn kill_marked(key: &str, value: &str) -> usize {
    let pids = processes_with_env(key, Some(value));
    for pid in &pids {
        // A process that is already gone is fine.
        let _ = kill(pid_of(*pid), Signal::SIGKILL);
    }
    pids.len()
}

/// SIGKILLs every process whose `key` has one of `values`, reading each environment once (one pass
/// over `/proc` for any number of values). Returns how many it signalled.
pub fn kill_marked_any(key: &str, values: &std::collections::HashSet<String>) -> usize {
    if values.is_empty() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        if pid == std::process::id() {
            continue;
        }
        if env_of(pid, key).is_some_and(|v| values.contains(&v)) {
            let _ = kill(pid_of(pid), Signal::SIGKILL);
            killed += 1;
        }
    }
    killed
}

/// Kills processes left behind by earlier harness runs that are gone (their marker's pid no longer
/// runs with the same start time). Returns how many it killed.
pub fn sweep_orphans() -> usize {
    let mut killed = 0;
    for pid in processes_with_env(RUN_MARKER, None) {
        let Some(marker) = env_of(pid, RUN_MARKER) else {
            continue;
        };
        let owner_alive = marker
            .split_once('.')
            .and_then(|(owner, start)| {
                Some((owner.parse::<u32>().ok()?, start.parse::<u64>().ok()?))
            })
            .is_some_and(|(owner, start)| process_start_time(owner) == Some(start));
        if !owner_alive {
            // Left over from a dead harness run.
            let _ = kill(pid_of(pid), Signal::SIGKILL);
            killed += 1;
        }
    }
    killed
}

/// The value of `key` in the environment of `pid`.
pub fn env_of(pid: u32, key: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{key}=");
    environ
        .split(|b| *b == 0)
        .filter_map(|e| std::str::from_utf8(e).ok())
        .find_map(|e| e.strip_prefix(&prefix).map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn children_carry_the_marker_and_are_reaped() {
        let child = Child::spawn(Spec::new("sleep", "/bin/sleep").args(["30"])).unwrap();
        assert_eq!(
            env_of(child.pid(), RUN_MARKER).as_deref(),
            Some(run_marker())
        );
        assert!(!child.has_exited());
        child.stop(Duration::from_secs(2)).await;
        assert!(
            !Path::new(&format!("/proc/{}", child.pid())).exists(),
            "reaped"
        );
    }

    #[tokio::test]
    async fn exit_codes_are_reported() {
        let child = Child::spawn(Spec::new("false", "/bin/false")).unwrap();
        assert_eq!(child.wait().await.unwrap(), Exit::Code(1));
    }

    #[test]
    fn orphans_of_dead_runs_are_swept() {
        // A process marked with a run whose owner does not exist (pid 1 never has this start time).
        let child = Command::new("/bin/sleep")
            .arg("30")
            .env(RUN_MARKER, "1.999999999")
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(sweep_orphans() >= 1);
        let mut child = child;
        let status = child.wait().unwrap();
        assert!(!status.success());
    }
}
