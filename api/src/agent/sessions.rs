//! Shell sessions: a persistent shell, runs in it, input and expect-style reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::exec::{OutputEncoding, ProcessState, SignalSpec};

/// Body of `POST /v1/sessions`: starts a persistent shell (see docs/AGENT.md, "Shell sessions").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionRequest {
    /// Shell to run (path or name on `PATH`); default bash when the image has it, else `sh`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Working directory the shell starts in (absolute or relative to the agent's root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment of the shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Cap in bytes of the output one run (or the output between runs) keeps (default 4 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Run the shell as this user: a name, a uid, `user:group` or `uid:gid` (as on exec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// Status of a shell session: the answer of `POST /v1/sessions`, `GET` and `DELETE /v1/sessions/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionStatus {
    /// Session id (`s-<hex>`), used in the session's routes.
    pub id: String,
    /// The shell the session runs.
    pub shell: String,
    /// OS process id of the shell (it leads its own process group).
    pub pid: Option<u32>,
    /// `running`, or `exited` once the shell has ended (it ran `exit`, or was killed).
    pub state: ProcessState,
    /// The shell's exit code once it has exited (null while running, or when killed by a signal).
    pub exit_code: Option<i32>,
    /// Whether a run is in progress.
    pub busy: bool,
    /// Start time (RFC 3339).
    pub started_at: String,
}

/// Answer of `GET /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionList {
    /// Every session, oldest first.
    pub sessions: Vec<SessionStatus>,
}

/// Body of `POST /v1/sessions/{id}/run`: a command for the session's shell.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionRunRequest {
    /// Shell code, run in the session's shell (its `cd`, variables and functions carry over).
    pub command: String,
    /// Interrupt the command after this many milliseconds (default 600000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `text` (default) or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_encoding: Option<OutputEncoding>,
}

/// Answer of `POST /v1/sessions/{id}/run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionRunResponse {
    /// Standard output and standard error of the command, interleaved as written.
    pub output: String,
    /// The command's exit status (`$?`; 130 when interrupted); the shell's exit code when the command
    /// ended the shell; null when the shell was killed by a signal.
    pub exit_code: Option<i32>,
    /// Whether the time-out interrupted the command.
    pub timed_out: bool,
    /// Whether the output exceeded the session's `maxOutputBytes` (or the agent's total output budget).
    pub output_truncated: bool,
    /// Whether the output was not valid UTF-8 (`text` encoding replaced invalid sequences).
    pub output_lossy: bool,
    /// Encoding of `output`.
    pub output_encoding: OutputEncoding,
    /// Run time in milliseconds.
    pub duration_ms: u64,
    /// The command ended the shell (`exit`, or a signal): the session has ended.
    pub shell_exited: bool,
    /// The interrupted command could not be stopped without ending the shell, so a fresh shell was
    /// started in the session (state such as `cd` and variables is lost).
    pub shell_restarted: bool,
}

/// Body of `POST /v1/sessions/{id}/input`: text written to the shell's standard input.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionInputRequest {
    /// The text, written as given (add `\n` to end a line).
    pub text: String,
}

/// Body of `POST /v1/sessions/{id}/read`: wait for output.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionReadRequest {
    /// Literal text (not a pattern) to wait for; without it the output so far is returned at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// Longest wait for `until` in milliseconds (default 10000, at most 300000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `text` (default) or `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_encoding: Option<OutputEncoding>,
}

/// Answer of `POST /v1/sessions/{id}/read`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionReadResponse {
    /// Output not read before, up to and including `until` when it matched, else all of it.
    pub output: String,
    /// Whether `until` was seen (always false without `until`).
    pub matched: bool,
    /// Whether output was dropped at the session's cap (or the agent's total output budget).
    pub output_truncated: bool,
    /// Whether the output was not valid UTF-8 (`text` encoding replaced invalid sequences).
    pub output_lossy: bool,
    /// Encoding of `output`.
    pub output_encoding: OutputEncoding,
    /// Whether the shell has exited (no more output will come).
    pub shell_exited: bool,
}

/// Body of `POST /v1/sessions/{id}/signal`: a signal for the command the session runs (`{}` sends SIGINT,
/// as Ctrl-C does).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SessionSignalRequest {
    /// Signal name (`INT`, `SIGKILL`, ...) or number; default `INT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<SignalSpec>,
}

/// Answer of `POST /v1/sessions/{id}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionSignalResponse {
    /// Whether a run was in progress: its command got the signal. False: nothing was signalled.
    pub running: bool,
    /// The session's status just after the signal (what `GET /v1/sessions/{id}` answers); `busy` stays
    /// true until the run has answered.
    pub session: SessionStatus,
}
