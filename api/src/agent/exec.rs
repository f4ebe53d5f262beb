//! Commands: exec requests and answers, streamed exec events, background processes, their input,
//! terminals and signals.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How output bytes are put into JSON strings: `text` (default) or `base64`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum OutputEncoding {
    /// UTF-8; invalid sequences become U+FFFD and the `*Lossy` flag is set.
    #[default]
    Text,
    /// Exact bytes, standard base64 with padding.
    Base64,
}

/// Agent request of `exec`, `exec/stream` and `processes` (see docs/AGENT.md). Give exactly one of
/// `argv` and `command`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"argv": ["python3", "-c", "print(1)"], "cwd": "repo", "env": {"PYTHONHASHSEED": "0"}, "timeoutSeconds": 30})))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecRequest {
    /// Background processes only: the id to give the process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Program and arguments, executed directly (no shell needed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub argv: Option<Vec<String>>,
    /// Shell string run as `<shell> -c <command>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Shell for `command` (default `/bin/sh`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Working directory (absolute or relative to the agent's root).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Standard input as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Standard input as base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdin_base64: Option<String>,
    /// Kill the process group after this many seconds (exec default 600).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// Output cap per stream in bytes (default 4 MiB).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// `text` (default) or `base64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_encoding: Option<OutputEncoding>,
    /// Background processes only: keep the process' stdin open as a pipe, written with
    /// `POST /v1/processes/{id}/stdin` (instead of a closed or prefilled stdin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_stdin: Option<bool>,
    /// Background processes only: run the process on a pseudo-terminal of this size (stdin, stdout and
    /// stderr are the terminal; its output is `stdout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<TerminalSize>,
    /// Run as this user instead of the agent's: a name from the image's `/etc/passwd`, a uid, or
    /// `user:group` / `uid:gid` (see docs/AGENT.md, "Running as another user").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Background processes only: `true` keeps the process in the agent's process table until it is
    /// deleted explicitly (`DELETE /v1/processes/{id}`); otherwise (default `false`) an exited process may
    /// be forgotten, oldest first, once the table is full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep: Option<bool>,
}

/// Size of a pseudo-terminal: `{"rows": 24, "cols": 80}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TerminalSize {
    /// Rows (1 to 1000).
    pub rows: u16,
    /// Columns (1 to 1000).
    pub cols: u16,
}

/// Body of `POST /v1/processes/{id}/stdin`: bytes for the process' stdin (`data` or `dataBase64`), and
/// whether to close it after them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProcessStdinRequest {
    /// Input as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Input as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
    /// Close stdin after the data (a pipe: the process reads end of input; a terminal: end-of-file,
    /// Ctrl-D, is typed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub close: Option<bool>,
}

/// Agent answer of `exec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ExecResponse {
    /// Exit code; null when killed by a signal.
    pub exit_code: Option<i32>,
    /// Signal number that killed the process.
    pub signal: Option<i32>,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Whether the out-of-memory killer killed it (the sandbox's memory limit was reached).
    pub oom_killed: bool,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// Whether stdout exceeded `maxOutputBytes` (or the agent's total output budget).
    pub stdout_truncated: bool,
    /// Whether stderr exceeded `maxOutputBytes` (or the agent's total output budget).
    pub stderr_truncated: bool,
    /// Whether stdout was not valid UTF-8 (`text` encoding replaced invalid sequences).
    pub stdout_lossy: bool,
    /// Whether stderr was not valid UTF-8 (`text` encoding replaced invalid sequences).
    pub stderr_lossy: bool,
    /// Run time in milliseconds.
    pub duration_ms: u64,
    /// Encoding of `stdout` and `stderr`.
    pub output_encoding: OutputEncoding,
    /// Why the command could not start (it then exits 126 or 127 with this on stderr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a background process runs, as its status echoes it: `argv`, or `command` with its `shell`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum CommandLine {
    /// Program and arguments.
    Argv {
        /// Program and arguments.
        argv: Vec<String>,
    },
    /// A shell string.
    Shell {
        /// Shell string.
        command: String,
        /// Shell that runs it (`<shell> -c <command>`).
        shell: String,
    },
}

/// `running` or `exited`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ProcessState {
    /// Still running.
    Running,
    /// Ended (see `exitCode`, `signal`, `timedOut`).
    Exited,
}

impl ProcessState {
    /// The wire name (`running`, `exited`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Exited => "exited",
        }
    }
}

/// Status of a background process (see docs/AGENT.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct ProcessStatus {
    /// Process id given at start.
    pub id: String,
    /// OS process id.
    pub pid: Option<u32>,
    /// The command line (`argv`, or `command` and `shell`), at the top level.
    #[serde(flatten)]
    pub line: CommandLine,
    /// `running` or `exited`.
    pub state: ProcessState,
    /// Exit code once exited.
    pub exit_code: Option<i32>,
    /// Signal number that ended it.
    pub signal: Option<i32>,
    /// Whether its timeout killed it.
    pub timed_out: bool,
    /// Whether the out-of-memory killer killed it.
    pub oom_killed: bool,
    /// Start time (RFC 3339).
    pub started_at: String,
    /// End time (RFC 3339) once exited.
    pub finished_at: Option<String>,
    /// Run time so far in milliseconds.
    pub duration_ms: u64,
    /// Output so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// Error output so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// Whether stdout exceeded `maxOutputBytes` (or the agent's total output budget).
    pub stdout_truncated: bool,
    /// Whether stderr exceeded `maxOutputBytes` (or the agent's total output budget).
    pub stderr_truncated: bool,
    /// Whether stdout was not valid UTF-8.
    pub stdout_lossy: bool,
    /// Whether stderr was not valid UTF-8.
    pub stderr_lossy: bool,
    /// Encoding of `stdout` and `stderr`.
    pub output_encoding: OutputEncoding,
    /// Why the command could not start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether stdin is open for `POST /v1/processes/{id}/stdin` (started with `keepStdin` or `pty`,
    /// not closed yet); left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin_open: bool,
    /// Whether the process runs on a pseudo-terminal (`pty`); left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
}

impl ProcessStatus {
    /// Whether the process has ended.
    pub fn exited(&self) -> bool {
        self.state == ProcessState::Exited
    }
}

/// Answer of `GET /v1/processes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessList {
    /// Every known process, oldest first.
    pub processes: Vec<ProcessStatus>,
}

/// A signal name (`TERM`, `SIGTERM`, ...) or number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum SignalSpec {
    /// Signal number (1-64).
    Number(i64),
    /// Signal name, with or without `SIG`.
    Name(String),
}

/// `{"signal": "TERM"}`: a signal name (`HUP INT QUIT KILL USR1 USR2 TERM CONT STOP ALRM WINCH`) or number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal name or number.
    pub signal: SignalSpec,
}

/// One line of the NDJSON answer of `POST /v1/exec/stream`: `started`, then `stdout` and `stderr`
/// chunks as they come, then `exit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ExecEvent {
    /// The command started.
    Started {
        /// OS process id.
        pid: u32,
    },
    /// A chunk of standard output (text, or base64 with `outputEncoding: base64`).
    Stdout {
        /// The chunk.
        data: String,
    },
    /// A chunk of standard error.
    Stderr {
        /// The chunk.
        data: String,
    },
    /// The command ended.
    #[serde(rename_all = "camelCase")]
    Exit {
        /// Exit code; null when killed by a signal.
        exit_code: Option<i32>,
        /// Signal number that killed the process.
        signal: Option<i32>,
        /// Whether the timeout killed it.
        timed_out: bool,
        /// Whether the out-of-memory killer killed it.
        oom_killed: bool,
        /// Run time in milliseconds.
        duration_ms: u64,
        /// Whether stdout exceeded `maxOutputBytes`.
        stdout_truncated: bool,
        /// Whether stderr exceeded `maxOutputBytes`.
        stderr_truncated: bool,
        /// Whether stdout was not valid UTF-8.
        stdout_lossy: bool,
        /// Whether stderr was not valid UTF-8.
        stderr_lossy: bool,
        /// Why the command could not start.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}
