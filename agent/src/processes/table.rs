//! The table of background processes: starting one under a unique id, its status (with output so far),
//! waiting for its exit, signalling its group, and forgetting it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::clock::rfc3339;
use crate::entropy::random_hex;
use crate::error::AgentError;
use crate::exec::budget::OutputBudget;
use crate::exec::output::{CapturedOutput, OutputSink};
use crate::exec::pty::{PtyMaster, TerminalSize};
use crate::exec::request::{CommandLine, CommandSpec, OutputEncoding};
use crate::exec::spawn::{ProcessInput, Spawned, spawn};
use crate::exec::supervise::{DRAIN_GRACE, Finished, supervise};
use crate::process_group::{ProcessGroups, signal_group};
use orchard_api::agent::ProcessState as ProcessStateName;
/// What `GET /v1/processes/{id}` returns (the shared wire type).
pub use orchard_api::agent::ProcessStatus;

/// Longest wait for a process to take stdin written to it (its pipe or terminal buffer full).
const STDIN_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// What a terminal's line discipline takes as end-of-file (VEOF, Ctrl-D).
const END_OF_FILE: u8 = 0x04;

/// At most this many processes are kept; the oldest exited ones not started with `keep` are forgotten
/// first.
pub const MAX_PROCESSES: usize = 1024;

/// Whether `id` is a valid client-chosen id: `[A-Za-z0-9][A-Za-z0-9._-]{0,62}`.
pub fn valid_id(id: &str) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
}

/// The id of a new process: the client's, if valid (400 otherwise), or a generated `p-<hex>`.
pub fn process_id(requested: Option<String>) -> Result<String, AgentError> {
    match requested {
        Some(id) if valid_id(&id) => Ok(id),
        Some(id) => Err(AgentError::BadRequest(format!(
            "invalid process id `{id}`: use 1-63 characters [A-Za-z0-9._-] starting with a letter or digit"
        ))),
        None => Ok(format!("p-{}", random_hex())),
    }
}

#[derive(Debug, Clone)]
enum ProcessState {
    Running {
        pgid: i32,
    },
    Exited {
        finished: Finished,
        finished_at: SystemTime,
        duration: Duration,
    },
}

/// One background process.
#[derive(Debug)]
pub struct ManagedProcess {
    id: String,
    pid: Option<u32>,
    line: CommandLine,
    encoding: OutputEncoding,
    started_at: SystemTime,
    started: Instant,
    sequence: u64,
    stdout: Arc<Mutex<CapturedOutput>>,
    stderr: Arc<Mutex<CapturedOutput>>,
    state: Mutex<ProcessState>,
    exited: watch::Sender<bool>,
    error: Option<String>,
    /// Started with `keep`: never forgotten to make room, only deleted explicitly.
    keep: bool,
    /// Stdin kept open (`keepStdin`) or the terminal (`pty`), until closed or the process exits.
    input: tokio::sync::Mutex<Option<ProcessInput>>,
    /// The terminal of a process started with `pty`.
    terminal: Option<Arc<PtyMaster>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl ManagedProcess {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn is_running(&self) -> bool {
        matches!(*lock(&self.state), ProcessState::Running { .. })
    }

    /// Whether the process was started with `keep`.
    pub fn kept(&self) -> bool {
        self.keep
    }

    /// Whether the table may forget this process to make room: it exited and was not kept.
    fn evictable(&self) -> bool {
        !self.keep && !self.is_running()
    }

    /// The current status; `with_output` false leaves out `stdout`/`stderr`.
    pub fn status(&self, with_output: bool) -> ProcessStatus {
        let state = lock(&self.state).clone();
        let (stdout, stdout_truncated, stdout_lossy) = self.output(&self.stdout, with_output);
        let (stderr, stderr_truncated, stderr_lossy) = self.output(&self.stderr, with_output);
        let (state_name, finished, finished_at, duration) = match state {
            ProcessState::Running { .. } => (
                ProcessStateName::Running,
                Finished::default(),
                None,
                self.started.elapsed(),
            ),
            ProcessState::Exited {
                finished,
                finished_at,
                duration,
            } => (
                ProcessStateName::Exited,
                finished,
                Some(rfc3339(finished_at)),
                duration,
            ),
        };
        ProcessStatus {
            id: self.id.clone(),
            pid: self.pid,
            line: self.line.clone(),
            state: state_name,
            exit_code: finished.exit_code,
            signal: finished.signal,
            timed_out: finished.timed_out,
            oom_killed: finished.oom_killed,
            started_at: rfc3339(self.started_at),
            finished_at,
            duration_ms: duration.as_millis() as u64,
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
            stdout_lossy,
            stderr_lossy,
            output_encoding: self.encoding,
            error: self.error.clone(),
            // A write in progress holds the lock: stdin is open then.
            stdin_open: self.input.try_lock().map_or(true, |input| input.is_some()),
            pty: self.terminal.is_some(),
        }
    }

    fn output(
        &self,
        buffer: &Mutex<CapturedOutput>,
        with_output: bool,
    ) -> (Option<String>, bool, bool) {
        let buffer = lock(buffer);
        if !with_output {
            return (None, buffer.truncated(), false);
        }
        let encoded = buffer.encoded(self.encoding);
        (Some(encoded.data), encoded.truncated, encoded.lossy)
    }

    /// Waits up to `timeout` for the process to exit; returns whether it has.
    pub async fn wait_exit(&self, timeout: Duration) -> bool {
        let mut exited = self.exited.subscribe();
        let wait = exited.wait_for(|exited| *exited);
        matches!(tokio::time::timeout(timeout, wait).await, Ok(Ok(_)))
    }

    /// Signals the process group; `Ok(false)` if the process has already exited.
    pub fn signal(&self, signal: i32) -> Result<bool, AgentError> {
        let state = lock(&self.state);
        match *state {
            ProcessState::Running { pgid } => match signal_group(pgid, signal) {
                Ok(()) => Ok(true),
                // The leader just exited and the group is gone: same as exited.
                Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(false),
                Err(error) => Err(AgentError::Internal(format!(
                    "cannot signal process `{}`: {error}",
                    self.id
                ))),
            },
            ProcessState::Exited { .. } => Ok(false),
        }
    }

    /// Writes `data` to the process' open stdin (pipe or terminal), then closes it when `close` (a
    /// terminal gets end-of-file, Ctrl-D, typed instead).
    pub async fn write_stdin(&self, data: &[u8], close: bool) -> Result<(), AgentError> {
        let mut input = self.input.lock().await;
        let Some(open) = input.as_mut() else {
            return Err(AgentError::conflict(format!(
                "process `{}` has no open stdin: start it with `keepStdin` or `pty`; stdin closes when it is closed or the process exits",
                self.id
            )));
        };
        let written = tokio::time::timeout(STDIN_WRITE_TIMEOUT, async {
            match open {
                ProcessInput::Pipe(pipe) => {
                    pipe.write_all(data).await?;
                    pipe.flush().await
                }
                ProcessInput::Terminal(master) => {
                    master.write_all(data).await?;
                    if close {
                        master.write_all(&[END_OF_FILE]).await?;
                    }
                    Ok(())
                }
            }
        })
        .await;
        match written {
            Err(_) => Err(AgentError::conflict(format!(
                "process `{}` has not read its stdin for {} s; nothing more was written",
                self.id,
                STDIN_WRITE_TIMEOUT.as_secs()
            ))),
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::BrokenPipe => {
                *input = None;
                Err(AgentError::conflict(format!(
                    "process `{}` closed its stdin (or exited)",
                    self.id
                )))
            }
            Ok(Err(error)) => Err(AgentError::Internal(format!(
                "cannot write to the stdin of process `{}`: {error}",
                self.id
            ))),
            Ok(Ok(())) => {
                if close && matches!(open, ProcessInput::Pipe(_)) {
                    *input = None;
                }
                Ok(())
            }
        }
    }

    /// Sets the size of the process' terminal; 409 without one.
    pub fn resize(&self, size: TerminalSize) -> Result<(), AgentError> {
        let Some(terminal) = &self.terminal else {
            return Err(AgentError::conflict(format!(
                "process `{}` has no terminal: start it with `pty` to resize one",
                self.id
            )));
        };
        terminal.resize(size).map_err(|error| {
            AgentError::Internal(format!(
                "cannot resize the terminal of process `{}`: {error}",
                self.id
            ))
        })
    }

    fn mark_exited(&self, finished: Finished) {
        *lock(&self.state) = ProcessState::Exited {
            finished,
            finished_at: SystemTime::now(),
            duration: self.started.elapsed(),
        };
        self.exited.send_replace(true);
    }
}

/// All background processes, by id.
#[derive(Debug)]
pub struct ProcessTable {
    entries: Mutex<HashMap<String, Arc<ManagedProcess>>>,
    sequence: AtomicU64,
    /// Most processes kept at once.
    capacity: usize,
    /// The agent-wide output budget their buffers are charged to (none: unlimited but for the caps).
    budget: Option<Arc<OutputBudget>>,
}

impl Default for ProcessTable {
    fn default() -> Self {
        ProcessTable::new(MAX_PROCESSES, None)
    }
}

/// Outcome of `ProcessTable::start`.
pub enum Started {
    New(Arc<ManagedProcess>),
    /// The id is taken; here is the process holding it.
    Exists(Arc<ManagedProcess>),
}

impl ProcessTable {
    /// A table of at most `capacity` processes whose output is charged to `budget`.
    pub fn new(capacity: usize, budget: Option<Arc<OutputBudget>>) -> Self {
        ProcessTable {
            entries: Mutex::default(),
            sequence: AtomicU64::new(0),
            capacity: capacity.max(1),
            budget,
        }
    }

    fn output_buffer(&self, cap: usize) -> Arc<Mutex<CapturedOutput>> {
        Arc::new(Mutex::new(match &self.budget {
            Some(budget) => CapturedOutput::with_budget(cap, budget),
            None => CapturedOutput::new(cap),
        }))
    }

    pub fn get(&self, id: &str) -> Option<Arc<ManagedProcess>> {
        lock(&self.entries).get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> Option<Arc<ManagedProcess>> {
        lock(&self.entries).remove(id)
    }

    /// Every process, oldest first.
    pub fn list(&self) -> Vec<Arc<ManagedProcess>> {
        let mut all: Vec<_> = lock(&self.entries).values().cloned().collect();
        all.sort_by_key(|process| process.sequence);
        all
    }

    /// Starts `spec` in the background under `id` (generated when `None`).
    pub fn start(
        &self,
        id: Option<String>,
        mut spec: CommandSpec,
        scrubbed_env: &[String],
        groups: &Arc<ProcessGroups>,
    ) -> Result<Started, AgentError> {
        let id = process_id(id)?;
        let mut entries = lock(&self.entries);
        if let Some(existing) = entries.get(&id) {
            return Ok(Started::Exists(Arc::clone(existing)));
        }
        if entries.len() >= self.capacity {
            let oldest_exited = entries
                .values()
                .filter(|process| process.evictable())
                .min_by_key(|process| process.sequence)
                .map(|process| process.id.clone());
            match oldest_exited {
                Some(oldest) => {
                    entries.remove(&oldest);
                }
                None => {
                    return Err(AgentError::TooManyRequests(format!(
                        "{} background processes are running or kept; stop or delete some (DELETE /v1/processes/{{id}})",
                        self.capacity
                    )));
                }
            }
        }
        let spawned = spawn(&spec, scrubbed_env, groups)?;
        let stdout = self.output_buffer(spec.max_output_bytes);
        let stderr = self.output_buffer(spec.max_output_bytes);
        let (pid, state, error, mut running) = match spawned {
            Spawned::Running(running) => (
                Some(running.pid),
                ProcessState::Running {
                    pgid: running.group.pgid(),
                },
                None,
                Some(running),
            ),
            Spawned::Failed(failure) => {
                lock(&stderr).push(format!("{}\n", failure.message).as_bytes());
                let finished = Finished {
                    exit_code: Some(failure.exit_code),
                    ..Finished::default()
                };
                let state = ProcessState::Exited {
                    finished,
                    finished_at: SystemTime::now(),
                    duration: Duration::ZERO,
                };
                (None, state, Some(failure.message), None)
            }
        };
        let input = running.as_mut().and_then(|running| running.input.take());
        let terminal = match &input {
            Some(ProcessInput::Terminal(master)) => Some(Arc::clone(master)),
            _ => None,
        };
        let process = Arc::new(ManagedProcess {
            id: id.clone(),
            pid,
            line: spec.line.clone(),
            encoding: spec.encoding,
            started_at: SystemTime::now(),
            started: Instant::now(),
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed),
            stdout: Arc::clone(&stdout),
            stderr: Arc::clone(&stderr),
            exited: watch::Sender::new(running.is_none()),
            state: Mutex::new(state),
            error,
            keep: spec.keep,
            input: tokio::sync::Mutex::new(input),
            terminal,
        });
        entries.insert(id, Arc::clone(&process));
        drop(entries);
        if let Some(running) = running {
            let supervised = Arc::clone(&process);
            let stdin = spec.stdin.take();
            tokio::spawn(async move {
                let mut stdout = OutputSink::Shared(stdout);
                let mut stderr = OutputSink::Shared(stderr);
                let finished = supervise(
                    running,
                    stdin,
                    &mut stdout,
                    &mut stderr,
                    spec.timeout,
                    DRAIN_GRACE,
                )
                .await;
                // Nothing reads the input any more.
                *supervised.input.lock().await = None;
                supervised.mark_exited(finished);
                tracing::debug!(id = %supervised.id, ?finished, "background process exited");
            });
        }
        Ok(Started::New(process))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::request::{CommandRequest, IntoSpec, RequestKind};

    fn spec(json: &str) -> CommandSpec {
        serde_json::from_str::<CommandRequest>(json)
            .unwrap()
            .into_spec(std::path::Path::new("/"), RequestKind::Process)
            .unwrap()
    }

    async fn start_and_wait(
        table: &ProcessTable,
        groups: &Arc<ProcessGroups>,
        id: &str,
        json: &str,
    ) {
        let Ok(Started::New(process)) = table.start(Some(id.into()), spec(json), &[], groups)
        else {
            panic!("{id} did not start");
        };
        assert!(
            process.wait_exit(Duration::from_secs(10)).await,
            "{id} did not exit"
        );
    }

    #[tokio::test]
    async fn kept_processes_are_never_evicted() {
        let table = ProcessTable::new(3, None);
        let groups = Arc::new(ProcessGroups::default());
        start_and_wait(&table, &groups, "kept", r#"{"argv":["true"],"keep":true}"#).await;
        for index in 0..6 {
            start_and_wait(
                &table,
                &groups,
                &format!("p{index}"),
                r#"{"argv":["true"]}"#,
            )
            .await;
        }
        assert!(table.get("kept").is_some_and(|kept| kept.kept()));
        let ids: Vec<String> = table.list().iter().map(|p| p.id().to_string()).collect();
        assert_eq!(
            ids,
            ["kept", "p4", "p5"],
            "the oldest unkept exited ones go first"
        );
        // Explicit deletion still forgets it.
        assert!(table.remove("kept").is_some());
        assert!(table.get("kept").is_none());
    }

    #[tokio::test]
    async fn a_table_full_of_running_and_kept_processes_refuses_new_ones() {
        let table = ProcessTable::new(2, None);
        let groups = Arc::new(ProcessGroups::default());
        start_and_wait(&table, &groups, "kept", r#"{"argv":["true"],"keep":true}"#).await;
        let Ok(Started::New(running)) = table.start(
            Some("sleeper".into()),
            spec(r#"{"argv":["sleep","30"]}"#),
            &[],
            &groups,
        ) else {
            panic!("sleeper did not start");
        };
        let refused = table.start(
            Some("third".into()),
            spec(r#"{"argv":["true"]}"#),
            &[],
            &groups,
        );
        assert!(matches!(refused, Err(AgentError::TooManyRequests(_))));
        assert!(table.get("kept").is_some() && table.get("sleeper").is_some());
        running.signal(libc::SIGKILL).unwrap();
        assert!(running.wait_exit(Duration::from_secs(10)).await);
        // Now the exited unkept process makes room.
        assert!(matches!(
            table.start(
                Some("third".into()),
                spec(r#"{"argv":["true"]}"#),
                &[],
                &groups
            ),
            Ok(Started::New(_))
        ));
        assert!(table.get("sleeper").is_none() && table.get("kept").is_some());
    }

    #[test]
    fn id_rules() {
        assert!(valid_id("startup"));
        assert!(valid_id("run-1.2_3"));
        assert!(valid_id(&"a".repeat(63)));
        assert!(!valid_id(&"a".repeat(64)));
        assert!(!valid_id(""));
        assert!(!valid_id("-x"));
        assert!(!valid_id("a/b"));
        assert!(!valid_id("a b"));
    }
}
