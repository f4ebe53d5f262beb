//! Starting a command: its own process group, piped output, scrubbed environment, and the mapping of
//! exec failures to shell-style exit codes (127 not found, 126 not executable).
//!
//! Nothing here may force std off its `posix_spawn` path (no `pre_exec`, `uid`/`gid`, `groups` or
//! `chroot`) except a request's `user`, whose switch needs a `pre_exec` hook (`users`): `posix_spawn`
//! is about 0.1 ms cheaper per command than `fork` + `exec` (see `process_group`). std
//! still forks by itself when the request's `env` sets `PATH` and the program is a bare name
//! (`posix_spawnp` would search the agent's `PATH`), and the one retry below forks on purpose.

use std::process::Stdio;
use std::sync::Arc;

use tokio::io::AsyncRead;
use tokio::process::{Child, ChildStdin, Command};

use super::oom;
use super::pty::{PtyMaster, PtyReader, make_controlling_terminal, open_pty};
use super::request::CommandSpec;
use crate::error::AgentError;
use crate::process_group::{ProcessGroup, ProcessGroups, start_in_new_group, use_fork_exec};
use crate::users::switch_on_exec;

/// A stream of a command's output.
pub type OutputStream = Box<dyn AsyncRead + Send + Unpin>;

/// Where a background process started with `keepStdin` or `pty` takes its input from.
#[derive(Debug)]
pub enum ProcessInput {
    Pipe(ChildStdin),
    Terminal(Arc<PtyMaster>),
}

/// A started command. Dropping it SIGKILLs its whole process group.
pub struct RunningCommand {
    pub child: Child,
    pub pid: u32,
    pub group: ProcessGroup,
    /// The pipe `stdin` data is fed through (closed once fed).
    pub stdin: Option<ChildStdin>,
    /// Stdin kept open (`keepStdin`), or the terminal (`pty`).
    pub input: Option<ProcessInput>,
    pub stdout: OutputStream,
    /// Empty for a command on a terminal (its stderr is the terminal too).
    pub stderr: OutputStream,
    /// The memory cgroup's OOM kill count just before the command started.
    pub oom_kills_before: Option<u64>,
}

impl std::fmt::Debug for RunningCommand {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("RunningCommand")
            .field("pid", &self.pid)
            .field("group", &self.group)
            .field("input", &self.input)
            .finish_non_exhaustive()
    }
}

/// A command that could not be started, reported like a shell would (`exitCode` 126/127).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnFailure {
    pub exit_code: i32,
    pub message: String,
}

#[derive(Debug)]
pub enum Spawned {
    Running(Box<RunningCommand>),
    Failed(SpawnFailure),
}

/// Starts `spec` as the leader of a new process group. `scrubbed_env` names inherited variables
/// children must not see (the agent's own `ORCHARD_AGENT_*` settings, the token among them).
pub fn spawn(
    spec: &CommandSpec,
    scrubbed_env: &[String],
    groups: &Arc<ProcessGroups>,
) -> Result<Spawned, AgentError> {
    let argv = spec.argv();
    let mut command = Command::new(argv[0]);
    command.args(&argv[1..]).current_dir(&spec.cwd);
    let terminal = match spec.pty {
        Some(size) => {
            let (master, child_side) = open_pty(size).map_err(|error| {
                AgentError::Internal(format!("cannot open a pseudo-terminal: {error}"))
            })?;
            let copy = |file: &std::fs::File| {
                file.try_clone().map_err(|error| {
                    AgentError::Internal(format!("cannot open a pseudo-terminal: {error}"))
                })
            };
            command
                .stdin(copy(&child_side)?)
                .stdout(copy(&child_side)?)
                .stderr(child_side);
            Some(Arc::new(master))
        }
        None => {
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
            // Always a pipe: `/dev/null` may not exist in an empty root, and a pipe whose write end
            // is closed reads as EOF just the same. Without stdin data (or `keepStdin`) that write end
            // is closed before the command starts, so it never has to be registered with the runtime.
            let feeds_stdin = spec.stdin.as_ref().is_some_and(|data| !data.is_empty());
            if feeds_stdin || spec.keep_stdin {
                command.stdin(Stdio::piped());
            } else {
                let (reader, writer) = std::io::pipe().map_err(|error| {
                    AgentError::Internal(format!("cannot create the stdin pipe: {error}"))
                })?;
                drop(writer);
                command.stdin(reader);
            }
            None
        }
    };
    for key in scrubbed_env {
        command.env_remove(key);
    }
    for (key, value) in &spec.env {
        command.env(key, value);
    }
    if terminal.is_some() {
        // A session of its own (its group is the command's own as well), the terminal controlling it.
        make_controlling_terminal(&mut command);
    } else {
        start_in_new_group(&mut command);
    }
    if let Some(account) = &spec.user {
        switch_on_exec(&mut command, account);
    }
    let oom_kills_before = oom::oom_kills();
    let spawned = match command.spawn() {
        // glibc's `posix_spawnp` refuses an executable without a `#!` line (ENOEXEC) that its `execvp`
        // runs with `/bin/sh`, as shells do. Nothing ran, so start it again the `execvp` way.
        Err(error) if error.raw_os_error() == Some(libc::ENOEXEC) => {
            use_fork_exec(&mut command);
            command.spawn()
        }
        spawned => spawned,
    };
    match spawned {
        Ok(mut child) => {
            let Some(pid) = child.id() else {
                return Err(AgentError::Internal("spawned command has no pid".into()));
            };
            oom::prefer_for_oom_kill(pid);
            // From here on the guard owns the group: it is killed however this request ends.
            let group = groups.track(pid as i32);
            let (stdout, stderr, stdin, input): (OutputStream, OutputStream, _, _) = match terminal
            {
                Some(master) => (
                    Box::new(PtyReader(Arc::clone(&master))),
                    Box::new(tokio::io::empty()),
                    None,
                    Some(ProcessInput::Terminal(master)),
                ),
                None => {
                    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take())
                    else {
                        return Err(AgentError::Internal(
                            "spawned command has no output pipes".into(),
                        ));
                    };
                    let stdin = child.stdin.take();
                    if spec.keep_stdin {
                        (
                            Box::new(stdout),
                            Box::new(stderr),
                            None,
                            stdin.map(ProcessInput::Pipe),
                        )
                    } else {
                        (Box::new(stdout), Box::new(stderr), stdin, None)
                    }
                }
            };
            Ok(Spawned::Running(Box::new(RunningCommand {
                child,
                pid,
                group,
                stdin,
                input,
                stdout,
                stderr,
                oom_kills_before,
            })))
        }
        Err(error) => classify_spawn_error(argv[0], &error).map(Spawned::Failed),
    }
}

fn classify_spawn_error(program: &str, error: &std::io::Error) -> Result<SpawnFailure, AgentError> {
    let errno = error.raw_os_error().unwrap_or(0);
    let exit_code = match errno {
        libc::ENOENT | libc::ENOTDIR => 127,
        libc::EACCES | libc::EPERM | libc::ENOEXEC | libc::EISDIR | libc::ETXTBSY => 126,
        _ => {
            return Err(AgentError::Internal(format!(
                "cannot start `{program}`: {error}"
            )));
        }
    };
    let hint = if exit_code == 127 {
        if program.contains('/') {
            "the file does not exist, or it is a script or dynamically linked program whose interpreter is missing"
                .to_string()
        } else {
            let path = std::env::var("PATH").unwrap_or_else(|_| "/bin:/usr/bin (default)".into());
            format!("it is not in PATH ({path}); pass an absolute path or set `env.PATH`")
        }
    } else {
        "it is not an executable file (check its mode and that it is a binary or a script with a #! line)".to_string()
    };
    Ok(SpawnFailure {
        exit_code,
        message: format!("orchard-agent: cannot run `{program}`: {error}; {hint}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_errors_use_shell_exit_codes() {
        let not_found =
            classify_spawn_error("nope", &std::io::Error::from_raw_os_error(libc::ENOENT)).unwrap();
        assert_eq!(not_found.exit_code, 127);
        assert!(not_found.message.contains("PATH"));
        let denied = classify_spawn_error(
            "/etc/passwd",
            &std::io::Error::from_raw_os_error(libc::EACCES),
        )
        .unwrap();
        assert_eq!(denied.exit_code, 126);
        assert!(
            classify_spawn_error("x", &std::io::Error::from_raw_os_error(libc::ENOMEM)).is_err()
        );
    }
}
