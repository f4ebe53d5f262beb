//! The command request shared by `/v1/exec`, `/v1/exec/stream` and `/v1/processes`, and its validation
//! into a `CommandSpec` (what to run, where, with which limits).

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;

use super::pty::TerminalSize;
use crate::error::AgentError;
use crate::users::{Account, add_account_env, resolve_user};

/// Default `timeoutSeconds` of `/v1/exec`.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(600);
/// Default per-stream output cap.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 4 * 1024 * 1024;
/// Hard upper bound of `maxOutputBytes` for buffered output (a response carries it in memory).
pub const MAX_BUFFERED_OUTPUT_BYTES: u64 = 1024 * 1024 * 1024;
/// Shell used with `command` when `shell` is not given.
pub const DEFAULT_SHELL: &str = "/bin/sh";

pub use orchard_api::agent::{CommandLine, OutputEncoding};

/// Body of `POST /v1/exec`, `/v1/exec/stream` and `/v1/processes` (`id` only for the latter): the
/// shared wire type, validated into a [`CommandSpec`] by [`IntoSpec`].
pub use orchard_api::agent::ExecRequest as CommandRequest;

/// A validated command, ready to spawn.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub line: CommandLine,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
    pub max_output_bytes: usize,
    pub encoding: OutputEncoding,
    /// Background processes: never forgotten to make room in the table, only deleted explicitly.
    pub keep: bool,
    /// The user to run as (`user`), when it is not the agent's own.
    pub user: Option<Account>,
    /// Background processes: stdin stays an open pipe (`keepStdin`).
    pub keep_stdin: bool,
    /// Background processes: run on a pseudo-terminal of this size (`pty`).
    pub pty: Option<TerminalSize>,
}

impl CommandSpec {
    /// The program and its arguments as passed to `execvp`.
    pub fn argv(&self) -> Vec<&str> {
        match &self.line {
            CommandLine::Argv { argv } => argv.iter().map(String::as_str).collect(),
            CommandLine::Shell { command, shell } => vec![shell.as_str(), "-c", command.as_str()],
        }
    }
}

/// Where a request is served: decides defaults that differ between exec and background processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    Exec,
    Process,
}

/// Validation of a [`CommandRequest`] into what to spawn (the wire type lives in `orchard-api`).
pub trait IntoSpec {
    /// Validates the request; relative `cwd` is resolved against `root`.
    fn into_spec(self, root: &Path, kind: RequestKind) -> Result<CommandSpec, AgentError>;
}

impl IntoSpec for CommandRequest {
    fn into_spec(self, root: &Path, kind: RequestKind) -> Result<CommandSpec, AgentError> {
        if kind == RequestKind::Exec && self.id.is_some() {
            return Err(AgentError::InvalidRequest(
                "unknown field `id`: ids exist only for background processes (POST /v1/processes)"
                    .into(),
            ));
        }
        if kind == RequestKind::Exec && self.keep.is_some() {
            return Err(AgentError::InvalidRequest(
                "unknown field `keep`: it exists only for background processes (POST /v1/processes)"
                    .into(),
            ));
        }
        if kind == RequestKind::Exec && (self.keep_stdin.is_some() || self.pty.is_some()) {
            return Err(AgentError::InvalidRequest(
                "`keepStdin` and `pty` exist only for background processes (POST /v1/processes)"
                    .into(),
            ));
        }
        let interactive = self.keep_stdin == Some(true) || self.pty.is_some();
        if interactive && (self.stdin.is_some() || self.stdin_base64.is_some()) {
            return Err(AgentError::InvalidRequest(
                "give either `stdin`/`stdinBase64` or `keepStdin`/`pty`: with an open stdin, write to it with POST /v1/processes/{id}/stdin".into(),
            ));
        }
        let pty = match self.pty {
            Some(size) if (1..=1000).contains(&size.rows) && (1..=1000).contains(&size.cols) => {
                Some(size)
            }
            Some(size) => {
                return Err(AgentError::BadRequest(format!(
                    "`pty` rows and cols must be 1 to 1000, got {}x{}",
                    size.rows, size.cols
                )));
            }
            None => None,
        };
        if self.argv.is_some() && self.shell.is_some() {
            return Err(AgentError::InvalidRequest(
                "`shell` is used only with `command`, not with `argv`".into(),
            ));
        }
        let line = match (self.argv, self.command) {
            (Some(_), Some(_)) => {
                return Err(AgentError::InvalidRequest(
                    "give exactly one of `argv` or `command`, not both".into(),
                ));
            }
            (None, None) => {
                return Err(AgentError::InvalidRequest(
                    "missing field: give `argv` (e.g. [\"ls\", \"-l\"]) or `command` (a shell string)".into(),
                ));
            }
            (Some(argv), None) => {
                if argv.is_empty() || argv[0].is_empty() {
                    return Err(AgentError::InvalidRequest(
                        "`argv` must start with a non-empty program name".into(),
                    ));
                }
                if argv.iter().any(|arg| arg.contains('\0')) {
                    return Err(AgentError::BadRequest(
                        "`argv` entries must not contain NUL bytes".into(),
                    ));
                }
                CommandLine::Argv { argv }
            }
            (None, Some(command)) => {
                let shell = self.shell.unwrap_or_else(|| DEFAULT_SHELL.to_string());
                if shell.is_empty() || command.contains('\0') || shell.contains('\0') {
                    return Err(AgentError::BadRequest(
                        "`command` and `shell` must be non-empty and free of NUL bytes".into(),
                    ));
                }
                CommandLine::Shell { command, shell }
            }
        };
        let cwd = resolve_cwd(root, self.cwd.as_deref())?;
        let mut env = self.env.unwrap_or_default().into_iter().collect::<Vec<_>>();
        validate_env(&env)?;
        let user = self
            .user
            .as_deref()
            .map(resolve_user)
            .transpose()?
            .flatten();
        if let Some(account) = &user {
            add_account_env(&mut env, account);
        }
        let stdin = match (self.stdin, self.stdin_base64) {
            (Some(_), Some(_)) => {
                return Err(AgentError::InvalidRequest(
                    "give at most one of `stdin` and `stdinBase64`".into(),
                ));
            }
            (Some(text), None) => Some(text.into_bytes()),
            (None, Some(encoded)) => Some(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded.as_bytes())
                    .map_err(|error| {
                        AgentError::BadRequest(format!(
                            "`stdinBase64` is not valid base64: {error}"
                        ))
                    })?,
            ),
            (None, None) => None,
        };
        let timeout = match self.timeout_seconds {
            Some(seconds) if seconds.is_finite() && seconds > 0.0 && seconds <= 1e9 => {
                Some(Duration::from_secs_f64(seconds))
            }
            Some(seconds) => {
                return Err(AgentError::BadRequest(format!(
                    "`timeoutSeconds` must be a positive number, got {seconds}"
                )));
            }
            None if kind == RequestKind::Exec => Some(DEFAULT_EXEC_TIMEOUT),
            None => None,
        };
        let max_output_bytes = output_cap(self.max_output_bytes)?;
        Ok(CommandSpec {
            line,
            cwd,
            env,
            stdin,
            timeout,
            max_output_bytes,
            encoding: self.output_encoding.unwrap_or_default(),
            keep: self.keep.unwrap_or(false),
            user,
            keep_stdin: self.keep_stdin.unwrap_or(false),
            pty,
        })
    }
}

/// Checks environment variables of a request: names non-empty without `=`, no NUL bytes (400).
pub fn validate_env(env: &[(String, String)]) -> Result<(), AgentError> {
    for (key, value) in env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(AgentError::BadRequest(format!(
                "invalid environment variable `{key}`: names must be non-empty without `=`, and no NUL bytes"
            )));
        }
    }
    Ok(())
}

/// The per-stream output cap of a request's `maxOutputBytes` (default 4 MiB, at most 1 GiB).
pub fn output_cap(requested: Option<u64>) -> Result<usize, AgentError> {
    match requested {
        Some(bytes) if bytes > MAX_BUFFERED_OUTPUT_BYTES => Err(AgentError::BadRequest(format!(
            "`maxOutputBytes` {bytes} exceeds the {MAX_BUFFERED_OUTPUT_BYTES}-byte maximum; stream large output to a file instead"
        ))),
        Some(bytes) => Ok(bytes as usize),
        None => Ok(DEFAULT_MAX_OUTPUT_BYTES),
    }
}

/// Resolves and checks a working directory: it must exist and be a directory (400 `InvalidCwd` otherwise).
pub fn resolve_cwd(root: &Path, cwd: Option<&str>) -> Result<PathBuf, AgentError> {
    let Some(cwd) = cwd else {
        return Ok(root.to_path_buf());
    };
    if cwd.is_empty() || cwd.contains('\0') {
        return Err(AgentError::InvalidCwd(
            "`cwd` must be a non-empty path without NUL bytes".into(),
        ));
    }
    let path = root.join(cwd);
    match std::fs::metadata(&path) {
        Ok(metadata) if metadata.is_dir() => Ok(path),
        Ok(_) => Err(AgentError::InvalidCwd(format!(
            "cwd `{}` is not a directory",
            path.display()
        ))),
        Err(error) => Err(AgentError::InvalidCwd(format!(
            "cwd `{}` is not usable: {error}",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> CommandRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn argv_and_shell_forms() {
        let spec = request(r#"{"argv":["echo","hi"]}"#)
            .into_spec(Path::new("/"), RequestKind::Exec)
            .unwrap();
        assert_eq!(spec.argv(), vec!["echo", "hi"]);
        assert_eq!(spec.timeout, Some(DEFAULT_EXEC_TIMEOUT));
        assert_eq!(spec.max_output_bytes, DEFAULT_MAX_OUTPUT_BYTES);
        let spec = request(r#"{"command":"echo $X"}"#)
            .into_spec(Path::new("/"), RequestKind::Process)
            .unwrap();
        assert_eq!(spec.argv(), vec!["/bin/sh", "-c", "echo $X"]);
        assert_eq!(spec.timeout, None);
        assert!(!spec.keep);
        let spec = request(r#"{"argv":["true"],"keep":true}"#)
            .into_spec(Path::new("/"), RequestKind::Process)
            .unwrap();
        assert!(spec.keep);
    }

    #[test]
    fn rejects_bad_combinations() {
        let root = Path::new("/");
        for body in [
            r#"{}"#,
            r#"{"argv":[]}"#,
            r#"{"argv":["a"],"command":"b"}"#,
            r#"{"argv":["a"],"shell":"/bin/bash"}"#,
            r#"{"argv":["a"],"stdin":"x","stdinBase64":"eA=="}"#,
            r#"{"argv":["a"],"id":"x"}"#,
            r#"{"argv":["a"],"keep":true}"#,
        ] {
            assert!(
                matches!(
                    request(body).into_spec(root, RequestKind::Exec),
                    Err(AgentError::InvalidRequest(_))
                ),
                "{body}"
            );
        }
        for body in [
            r#"{"argv":["a"],"timeoutSeconds":0}"#,
            r#"{"argv":["a"],"timeoutSeconds":-1}"#,
            r#"{"argv":["a"],"stdinBase64":"***"}"#,
            r#"{"argv":["a"],"env":{"A=B":"c"}}"#,
            r#"{"argv":["a\u0000"]}"#,
        ] {
            assert!(
                matches!(
                    request(body).into_spec(root, RequestKind::Exec),
                    Err(AgentError::BadRequest(_))
                ),
                "{body}"
            );
        }
        assert!(serde_json::from_str::<CommandRequest>(r#"{"argv":["a"],"bogus":1}"#).is_err());
    }

    #[test]
    fn cwd_must_be_an_existing_directory() {
        assert!(matches!(
            resolve_cwd(Path::new("/"), Some("/definitely/not/here")),
            Err(AgentError::InvalidCwd(_))
        ));
        assert!(matches!(
            resolve_cwd(Path::new("/"), Some("/proc/self/status")),
            Err(AgentError::InvalidCwd(_))
        ));
        assert_eq!(
            resolve_cwd(Path::new("/"), Some("tmp")).unwrap(),
            PathBuf::from("/tmp")
        );
        assert_eq!(
            resolve_cwd(Path::new("/tmp"), None).unwrap(),
            PathBuf::from("/tmp")
        );
    }

    #[test]
    fn stdin_forms() {
        let spec = request(r#"{"argv":["cat"],"stdinBase64":"AP8="}"#)
            .into_spec(Path::new("/"), RequestKind::Exec)
            .unwrap();
        assert_eq!(spec.stdin, Some(vec![0, 255]));
        let spec = request(r#"{"argv":["cat"],"stdin":"hi"}"#)
            .into_spec(Path::new("/"), RequestKind::Exec)
            .unwrap();
        assert_eq!(spec.stdin, Some(b"hi".to_vec()));
    }
}
