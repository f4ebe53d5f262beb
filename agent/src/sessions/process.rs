//! One running shell of a session: started as the leader of its own process group with its stdin a
//! pipe and stdout and stderr one shared pipe; a task reads that pipe into the session's
//! [`ShellOutput`], another waits for the shell's exit. Dropping a [`ShellProcess`] SIGKILLs its group.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{ChildStdin, Command};
use tokio::sync::watch;

use super::output::ShellOutput;
use super::process_tree::{children_of, command_processes};
use super::shell::PRELUDE;
use crate::error::AgentError;
use crate::exec::budget::OutputBudget;
use crate::exec::oom;
use crate::process_group::{ProcessGroup, ProcessGroups, signal_group, start_in_new_group};
use crate::users::{Account, switch_on_exec};

/// How long output is still read after the shell exited and its group was killed (only processes that
/// left the group can hold the pipe open that long).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);
/// Largest single read of the output pipe.
const READ_SIZE: usize = 64 * 1024;
/// Longest wait for the shell to take input (its stdin pipe full: it is not reading).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What is needed to start (and restart) a session's shell.
#[derive(Debug, Clone)]
pub struct ShellLaunch {
    pub shell: PathBuf,
    pub cwd: PathBuf,
    /// Variables set for the shell (after the scrubbed ones were removed).
    pub env: Vec<(String, String)>,
    /// Inherited variables the shell must not see (`ORCHARD_AGENT_*`).
    pub scrubbed_env: Vec<String>,
    /// Cap of each output segment.
    pub max_output_bytes: usize,
    /// The user the shell runs as, when it is not the agent's own.
    pub user: Option<Account>,
}

/// A running (or exited) shell.
#[derive(Debug)]
pub struct ShellProcess {
    pid: u32,
    group: ProcessGroup,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    output: Arc<ShellOutput>,
    exit: watch::Receiver<Option<ExitStatus>>,
}

impl ShellProcess {
    /// Starts the shell and gives it the session prelude.
    pub async fn start(
        launch: &ShellLaunch,
        groups: &Arc<ProcessGroups>,
        budget: Option<Arc<OutputBudget>>,
    ) -> Result<ShellProcess, AgentError> {
        let (reader, writer) = std::io::pipe().map_err(|error| {
            AgentError::Internal(format!("cannot create the session's output pipe: {error}"))
        })?;
        let error_writer = writer.try_clone().map_err(|error| {
            AgentError::Internal(format!("cannot create the session's output pipe: {error}"))
        })?;
        let mut command = Command::new(&launch.shell);
        command
            .current_dir(&launch.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(writer))
            .stderr(Stdio::from(error_writer));
        for key in &launch.scrubbed_env {
            command.env_remove(key);
        }
        for (key, value) in &launch.env {
            command.env(key, value);
        }
        start_in_new_group(&mut command);
        if let Some(account) = &launch.user {
            switch_on_exec(&mut command, account);
        }
        let mut child = command.spawn().map_err(|error| {
            AgentError::BadRequest(format!(
                "cannot start the shell `{}`: {error}",
                launch.shell.display()
            ))
        })?;
        // The parent's copies of the write ends go with `command`: the pipe closes when the shell
        // and everything it started have closed theirs.
        drop(command);
        let Some(pid) = child.id() else {
            return Err(AgentError::Internal("the started shell has no pid".into()));
        };
        oom::prefer_for_oom_kill(pid);
        let group = groups.track(pid as i32);
        let stdin = child.stdin.take();
        let output = ShellOutput::new(launch.max_output_bytes, budget);
        let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))
            .map_err(|error| {
                AgentError::Internal(format!("cannot read the session's output pipe: {error}"))
            })?;
        tokio::spawn(read_output(receiver, Arc::clone(&output)));
        let (exit_sender, exit) = watch::channel(None);
        let exit_output = Arc::clone(&output);
        tokio::spawn(async move {
            let status = child.wait().await.ok();
            // Like exec: the leader is gone, so its `&` jobs go too (and release the pipe).
            let _ = signal_group(pid as i32, libc::SIGKILL);
            exit_sender.send_replace(status);
            exit_output.notify();
            let deadline = tokio::time::Instant::now() + DRAIN_AFTER_EXIT;
            while !exit_output.is_closed() {
                let changed = exit_output.changed();
                if tokio::time::timeout_at(deadline, changed).await.is_err() {
                    exit_output.close();
                }
            }
        });
        let shell = ShellProcess {
            pid,
            group,
            stdin: tokio::sync::Mutex::new(stdin),
            output,
            exit,
        };
        shell
            .write(PRELUDE.as_bytes())
            .await
            .map_err(|error| AgentError::Internal(format!("cannot set up the shell: {error}")))?;
        Ok(shell)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn output(&self) -> &Arc<ShellOutput> {
        &self.output
    }

    /// Writes `bytes` to the shell's stdin.
    pub async fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        let mut stdin = self.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        };
        let written = tokio::time::timeout(WRITE_TIMEOUT, async {
            pipe.write_all(bytes).await?;
            pipe.flush().await
        })
        .await;
        match written {
            Ok(result) => result,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the shell has not read its input for 10 s",
            )),
        }
    }

    /// The shell's exit status once it has exited.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    pub fn exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// The shell's exit code (`None` while it runs or when a signal ended it).
    pub fn exit_code(&self) -> Option<i32> {
        self.exit_status().and_then(|status| status.code())
    }

    /// The signal that ended the shell.
    pub fn exit_signal(&self) -> Option<i32> {
        self.exit_status().and_then(|status| status.signal())
    }

    /// Waits up to `timeout` for the shell to exit.
    pub async fn wait_exit(&self, timeout: Duration) -> Option<ExitStatus> {
        let mut exit = self.exit.clone();
        let _ = tokio::time::timeout(timeout, exit.wait_for(Option::is_some)).await;
        self.exit_status()
    }

    /// Sends `signal` to the shell's whole process group (the shell and its commands).
    pub fn signal_group(&self, signal: i32) {
        let _ = self.group.signal(signal);
    }

    /// SIGKILLs every process below the shell, not the shell.
    pub fn kill_descendants(&self) {
        self.signal_command(libc::SIGKILL, None);
    }

    /// The shell's children now (`None` when the kernel does not list them): taken when a run starts,
    /// these are its `&` jobs from before, not the run's.
    pub fn children(&self) -> Option<Vec<i32>> {
        children_of(self.pid as i32)
    }

    /// Sends `signal` to every process below the shell except the `earlier` children (see
    /// [`ShellProcess::children`]) and theirs; never to the shell. Answers how many were signalled.
    pub fn signal_command(&self, signal: i32, earlier: Option<&[i32]>) -> usize {
        let targets = command_processes(self.pid as i32, earlier);
        for pid in &targets {
            // SAFETY: plain syscall on a pid found below the shell.
            unsafe { libc::kill(*pid, signal) };
        }
        targets.len()
    }
}

async fn read_output(mut pipe: tokio::net::unix::pipe::Receiver, output: Arc<ShellOutput>) {
    let mut buffer = vec![0u8; READ_SIZE];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) => break,
            Ok(read) => output.accept(&buffer[..read]),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    output.close();
}
