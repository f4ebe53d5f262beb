//! One shell session: running a command to its end marker (one run at a time), interrupting it at its
//! time-out and getting the shell back in step, signalling the running command on request, writing
//! input, reading output as it comes, ending.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use orchard_api::agent::{ProcessState, SessionStatus};

use super::marker::EndMarker;
use super::output::{FinishedRun, ReadOutput};
use super::process::{ShellLaunch, ShellProcess};
use crate::clock::rfc3339;
use crate::entropy::random_hex;
use crate::error::AgentError;
use crate::exec::budget::OutputBudget;
use crate::exec::output::CapturedOutput;
use crate::process_group::ProcessGroups;

/// How long an interrupted command gets to end after SIGINT, and again after SIGKILL.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// Where a session's shells are accounted: the groups shutdown stops, the output budget.
#[derive(Debug, Clone)]
pub struct SessionContext {
    pub groups: Arc<ProcessGroups>,
    pub budget: Option<Arc<OutputBudget>>,
}

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    pub output: CapturedOutput,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub shell_exited: bool,
    pub shell_restarted: bool,
    pub duration: Duration,
}

/// The run in progress, as the status and signal routes see it (they never wait for the run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ActiveRun {
    /// The shell's children when the run started: its `&` jobs from before, which a signal for the
    /// run's command leaves alone. `None` when the kernel does not list children.
    earlier: Option<Vec<i32>>,
}

/// Where a signal for the running command goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalTarget {
    /// The shell's whole process group, the shell included: SIGINT, which the shell traps to abandon
    /// the whole command (the rest of a `;` list, a loop) while its processes die of it; the shell's
    /// `&` jobs ignore it. What the time-out sends first.
    Group,
    /// The processes below the shell that the run started, never the shell: every other signal (the
    /// command runs in the shell's own process group, job control being off, so SIGKILL, SIGTERM or
    /// SIGSTOP to the group would reach the shell too).
    Command,
}

/// Where `signal` goes (see [`SignalTarget`]).
pub fn signal_target(signal: i32) -> SignalTarget {
    if signal == libc::SIGINT {
        SignalTarget::Group
    } else {
        SignalTarget::Command
    }
}

/// Marks a run in progress while it lives (also when the run's future is dropped).
struct RunClaim<'a> {
    active: &'a Mutex<Option<ActiveRun>>,
}

impl Drop for RunClaim<'_> {
    fn drop(&mut self) {
        *lock(self.active) = None;
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What waiting for a run's end gave.
enum RunEnd {
    Marker(FinishedRun),
    /// The shell's output closed: it has exited.
    Closed,
    Deadline,
}

#[derive(Debug)]
pub struct Session {
    id: String,
    launch: ShellLaunch,
    context: SessionContext,
    started_at: SystemTime,
    pub(super) sequence: u64,
    shell: Mutex<Arc<ShellProcess>>,
    /// The run in progress. A plain flag under a lock held only to read or swap it, never for a run's
    /// length: status and signal only look at it, so they neither wait for a run nor make one fail.
    active: Mutex<Option<ActiveRun>>,
}

impl Session {
    /// Starts a session's shell.
    pub async fn start(
        id: String,
        sequence: u64,
        launch: ShellLaunch,
        context: SessionContext,
    ) -> Result<Session, AgentError> {
        let shell = ShellProcess::start(&launch, &context.groups, context.budget.clone()).await?;
        Ok(Session {
            id,
            launch,
            context,
            started_at: SystemTime::now(),
            sequence,
            shell: Mutex::new(Arc::new(shell)),
            active: Mutex::new(None),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    fn shell(&self) -> Arc<ShellProcess> {
        Arc::clone(&lock(&self.shell))
    }

    /// Whether a run is in progress.
    pub fn busy(&self) -> bool {
        lock(&self.active).is_some()
    }

    /// Marks a run in progress (`earlier`: the shell's children now); `None` when one already is.
    fn claim(&self, earlier: Option<Vec<i32>>) -> Option<RunClaim<'_>> {
        let mut active = lock(&self.active);
        if active.is_some() {
            return None;
        }
        *active = Some(ActiveRun { earlier });
        Some(RunClaim {
            active: &self.active,
        })
    }

    pub fn status(&self) -> SessionStatus {
        let shell = self.shell();
        SessionStatus {
            id: self.id.clone(),
            shell: self.launch.shell.display().to_string(),
            pid: Some(shell.pid()),
            state: if shell.exited() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            exit_code: shell.exit_code(),
            busy: self.busy(),
            started_at: rfc3339(self.started_at),
        }
    }

    fn ended(&self, shell: &ShellProcess) -> AgentError {
        let how = match (shell.exit_code(), shell.exit_signal()) {
            (Some(code), _) => format!("with code {code}"),
            (None, Some(signal)) => format!("by signal {signal}"),
            (None, None) => "".into(),
        };
        AgentError::conflict(format!(
            "the shell of session `{}` has exited {how}; DELETE /v1/sessions/{} and start a new one",
            self.id, self.id
        ))
    }

    /// Runs `command` in the shell and waits for its end marker; at `timeout` it is interrupted.
    pub async fn run(&self, command: &str, timeout: Duration) -> Result<RunOutcome, AgentError> {
        let started = Instant::now();
        let shell = self.shell();
        let Some(_claim) = self.claim(shell.children()) else {
            return Err(AgentError::conflict(format!(
                "a run is already in progress in session `{}`; wait for it to end (runs of one shell cannot overlap), or use another session",
                self.id
            )));
        };
        if shell.exited() {
            return Err(self.ended(&shell));
        }
        let marker = EndMarker::new(&format!("{}{}", random_hex(), random_hex()));
        shell.output().begin_run(&marker);
        let deadline = tokio::time::Instant::now() + timeout;
        let end = match shell.write(marker.run_line(command).as_bytes()).await {
            Ok(()) => wait_for_end(&shell, deadline).await,
            Err(_) if shell.output().is_closed() || shell.exited() => RunEnd::Closed,
            Err(_) => RunEnd::Deadline,
        };
        let mut outcome = RunOutcome {
            output: CapturedOutput::default(),
            exit_code: None,
            timed_out: false,
            shell_exited: false,
            shell_restarted: false,
            duration: Duration::ZERO,
        };
        match end {
            RunEnd::Marker(finished) => {
                outcome.output = finished.output;
                outcome.exit_code = Some(finished.status);
            }
            RunEnd::Closed => {
                outcome.output = shell.output().take_segment();
                shell.wait_exit(INTERRUPT_GRACE).await;
                outcome.exit_code = shell.exit_code();
                outcome.shell_exited = true;
            }
            RunEnd::Deadline => {
                outcome.timed_out = true;
                match self.interrupt(&shell).await {
                    Some(finished) => {
                        outcome.output = finished.output;
                        outcome.exit_code = Some(finished.status);
                    }
                    None => {
                        outcome.output = shell.output().take_segment();
                        outcome.exit_code = None;
                        self.restart().await?;
                        outcome.shell_restarted = true;
                    }
                }
            }
        }
        outcome.duration = started.elapsed();
        Ok(outcome)
    }

    /// Stops the command running in `shell`: SIGINT to the group (the shell's trap aborts the command,
    /// its children die of it), then SIGKILL to everything below the shell. The run's marker, once it
    /// comes, means the shell is back in step; `None` when it did not come (or the shell died).
    async fn interrupt(&self, shell: &ShellProcess) -> Option<FinishedRun> {
        shell.signal_group(libc::SIGINT);
        match wait_for_end(shell, tokio::time::Instant::now() + INTERRUPT_GRACE).await {
            RunEnd::Marker(finished) => return Some(finished),
            RunEnd::Closed => return None,
            RunEnd::Deadline => {}
        }
        tracing::debug!(session = %self.id, "command ignored SIGINT; killing the shell's children");
        shell.kill_descendants();
        match wait_for_end(shell, tokio::time::Instant::now() + INTERRUPT_GRACE).await {
            RunEnd::Marker(finished) => Some(finished),
            RunEnd::Closed | RunEnd::Deadline => None,
        }
    }

    /// Sends `signal` to the command of the run in progress (see [`signal_target`]) without waiting for
    /// the run; the run answers once its command has ended. Answers whether a run was in progress:
    /// without one nothing is signalled (a SIGINT would reach the idle shell's trap). 409 when the shell
    /// has exited.
    pub fn signal(&self, signal: i32) -> Result<bool, AgentError> {
        let shell = self.shell();
        if shell.exited() {
            return Err(self.ended(&shell));
        }
        let Some(run) = lock(&self.active).clone() else {
            return Ok(false);
        };
        match signal_target(signal) {
            SignalTarget::Group => shell.signal_group(signal),
            SignalTarget::Command => {
                let signalled = shell.signal_command(signal, run.earlier.as_deref());
                tracing::debug!(session = %self.id, signal, signalled, "signalled the running command");
            }
        }
        Ok(true)
    }

    /// Replaces the shell with a fresh one (the old one's group is SIGKILLed when it is dropped).
    async fn restart(&self) -> Result<(), AgentError> {
        tracing::info!(session = %self.id, "the interrupted command did not stop; restarting the session's shell");
        let fresh = ShellProcess::start(
            &self.launch,
            &self.context.groups,
            self.context.budget.clone(),
        )
        .await?;
        let old = std::mem::replace(&mut *lock(&self.shell), Arc::new(fresh));
        old.signal_group(libc::SIGKILL);
        Ok(())
    }

    /// Writes `text` to the shell's stdin.
    pub async fn input(&self, text: &[u8]) -> Result<(), AgentError> {
        let shell = self.shell();
        if shell.exited() {
            return Err(self.ended(&shell));
        }
        shell.write(text).await.map_err(|error| {
            AgentError::conflict(format!(
                "cannot write to the shell of session `{}`: {error}",
                self.id
            ))
        })
    }

    /// Output not read yet, up to and including `until` (waiting up to `timeout` for it); all of it
    /// when `until` is not given, or did not come in time. The flag: whether the shell has exited.
    pub async fn read(&self, until: Option<&[u8]>, timeout: Duration) -> (ReadOutput, bool) {
        let shell = self.shell();
        let output = shell.output();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = output.changed();
            if let Some(read) = output.read(until) {
                return (read, output.is_closed());
            }
            if output.is_closed() {
                break;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                break;
            }
        }
        (output.read_all(), output.is_closed())
    }

    /// Ends the session: SIGKILLs the shell's group and waits (up to `timeout`) for the shell's exit.
    pub async fn end(&self, timeout: Duration) {
        let shell = self.shell();
        shell.signal_group(libc::SIGKILL);
        shell.wait_exit(timeout).await;
    }

    /// SIGKILLs the shell's group now (shutdown).
    pub fn kill(&self) {
        self.shell().signal_group(libc::SIGKILL);
    }
}

async fn wait_for_end(shell: &ShellProcess, deadline: tokio::time::Instant) -> RunEnd {
    let output = shell.output();
    loop {
        let changed = output.changed();
        if let Some(finished) = output.take_finished() {
            return RunEnd::Marker(finished);
        }
        if output.is_closed() {
            return RunEnd::Closed;
        }
        if tokio::time::timeout_at(deadline, changed).await.is_err() {
            return output
                .take_finished()
                .map_or(RunEnd::Deadline, RunEnd::Marker);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    async fn bash() -> Arc<Session> {
        let launch = ShellLaunch {
            shell: PathBuf::from("/bin/bash"),
            cwd: std::env::temp_dir(),
            env: Vec::new(),
            scrubbed_env: Vec::new(),
            max_output_bytes: 1 << 20,
            user: None,
        };
        let context = SessionContext {
            groups: Arc::new(ProcessGroups::default()),
            budget: None,
        };
        Arc::new(
            Session::start("s-test".into(), 0, launch, context)
                .await
                .expect("bash starts"),
        )
    }

    #[test]
    fn sigint_goes_to_the_group_and_every_other_signal_below_the_shell() {
        assert_eq!(signal_target(libc::SIGINT), SignalTarget::Group);
        for signal in [
            libc::SIGKILL,
            libc::SIGTERM,
            libc::SIGQUIT,
            libc::SIGSTOP,
            libc::SIGHUP,
        ] {
            assert_eq!(signal_target(signal), SignalTarget::Command, "{signal}");
        }
    }

    /// Status polls never make a run fail: status only looks at the run flag. (It used to `try_lock`
    /// the run's lock, holding it for a moment, so a run starting then was refused with 409.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_polls_never_make_a_run_fail_and_see_it_busy() {
        let session = bash().await;
        let stop = Arc::new(AtomicBool::new(false));
        let poller = std::thread::spawn({
            let session = Arc::clone(&session);
            let stop = Arc::clone(&stop);
            move || {
                let mut polls = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = session.status();
                    polls += 1;
                }
                polls
            }
        });
        for round in 0..300 {
            let outcome = session.run("true", Duration::from_secs(10)).await;
            assert!(
                outcome.is_ok(),
                "run {round} failed while status was polled: {:?}",
                outcome.err()
            );
        }
        stop.store(true, Ordering::Relaxed);
        assert!(poller.join().expect("the poller ends") > 0);

        let running = tokio::spawn({
            let session = Arc::clone(&session);
            async move { session.run("sleep 1", Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        for _ in 0..20 {
            assert!(session.status().busy, "a run is in progress");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let outcome = running.await.expect("the run's task").expect("the run");
        assert_eq!(outcome.exit_code, Some(0));
        assert!(!session.status().busy);
        session.end(Duration::from_secs(5)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_signal_without_a_run_is_a_no_op_and_one_to_an_ended_shell_is_a_conflict() {
        let session = bash().await;
        assert_eq!(session.signal(libc::SIGINT).ok(), Some(false));
        assert_eq!(session.signal(libc::SIGKILL).ok(), Some(false));
        let outcome = session
            .run("echo still here", Duration::from_secs(10))
            .await
            .expect("the run");
        assert_eq!(
            outcome.output.bytes(),
            b"still here\n",
            "nothing reached the shell"
        );
        let outcome = session
            .run("exit 4", Duration::from_secs(10))
            .await
            .expect("the run");
        assert!(outcome.shell_exited);
        assert!(matches!(
            session.signal(libc::SIGINT),
            Err(AgentError::Conflict { .. })
        ));
    }
}
