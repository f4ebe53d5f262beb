//! The wire protocol of the in-pod agent (`orchard-agent`, docs/AGENT.md): the JSON request bodies it
//! accepts and the JSON answers it sends. One definition for the agent (serialises answers,
//! deserialises requests), the operator's agent client and the gateway's OpenAPI document (utoipa
//! schemas behind the `openapi` feature). Serde only: the static agent links this without kube.
//!
//! Requests reject unknown fields (`deny_unknown_fields`). Field order is the order on the wire.
//! Validation beyond the JSON shape (exactly one of `argv` and `command`, signal names, paths, ...)
//! is the agent's.

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

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (socket, device, fifo).
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    /// File name.
    pub name: String,
    /// `file`, `directory`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    /// Modification time (RFC 3339).
    pub modified: Option<String>,
}

/// A directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileList {
    /// Absolute path listed.
    pub path: String,
    /// Entries sorted by name.
    pub entries: Vec<FileEntry>,
}

/// Answer of an upload: `{"path": "/abs/P", "size": N}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileWritten {
    /// Absolute path written.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// Answer of a file delete: `{"path": "/abs/P", "deleted": true}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileDeleted {
    /// Absolute path.
    pub path: String,
    /// Always true (a missing path is a 404).
    pub deleted: bool,
}

/// Answer of `GET /v1/files/stat?path=P`: what is at `P`, without following a final symlink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileStat {
    /// Absolute path asked about.
    pub path: String,
    /// Whether anything is there (the other fields are null when not).
    pub exists: bool,
    /// `file`, `directory`, `symlink` (not followed) or `other`.
    #[serde(rename = "type")]
    pub kind: Option<FileKind>,
    /// Size in bytes (of the symlink itself for a symlink).
    pub size: Option<u64>,
    /// Permission bits (`mode & 0o7777`).
    pub mode: Option<u32>,
    /// Modification time (RFC 3339).
    pub modified: Option<String>,
    /// Owner's uid.
    pub uid: Option<u32>,
    /// Owner's gid.
    pub gid: Option<u32>,
    /// A symlink's target, as stored in the link.
    pub target: Option<String>,
}

/// Body of `POST /v1/files/mkdir`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// Directory to create (absolute or relative to the agent's root).
    pub path: String,
    /// Create missing parents too, and accept an existing directory (`mkdir -p`); default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parents: Option<bool>,
    /// Octal permission bits of the new directories (default `0755`, less the umask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// Answer of `POST /v1/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DirectoryCreated {
    /// Absolute path of the directory.
    pub path: String,
    /// False when it existed already (`parents: true`).
    pub created: bool,
}

/// Body of `POST /v1/files/rename`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// Entry to move (a symlink itself, never its target).
    pub from: String,
    /// New path (same file system as `from`).
    pub to: String,
    /// Replace an existing file (or empty directory) at `to`; default false (409 instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
}

/// Answer of `POST /v1/files/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Renamed {
    /// Absolute old path.
    pub from: String,
    /// Absolute new path.
    pub to: String,
}

/// Answer of `PUT /v1/files/tar?path=DIR`: what the archive put into `DIR`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TarExtracted {
    /// Absolute path of the directory extracted into.
    pub path: String,
    /// Regular files written.
    pub files: u64,
    /// Directories created or updated.
    pub directories: u64,
    /// Symlinks created.
    pub symlinks: u64,
    /// Bytes of file content written.
    pub size: u64,
}

/// `{"patch": "<git diff>", "cwd": "repo", "strip": 1}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    /// Unified diff.
    pub patch: String,
    /// Directory the paths are relative to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Leading path components to strip (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strip: Option<usize>,
}

/// What a patch did to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PatchAction {
    /// The file is new.
    Created,
    /// The file existed and changed.
    Modified,
    /// The file was removed.
    Deleted,
}

/// One file a patch changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PatchedFile {
    /// Path as written in the patch (after `strip`).
    pub path: String,
    /// `created`, `modified` or `deleted`.
    pub action: PatchAction,
}

/// `{"applied": true, "files": [{"path", "action"}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PatchResult {
    /// Always true on 200.
    pub applied: bool,
    /// Changed files with `created`, `modified` or `deleted`.
    pub files: Vec<PatchedFile>,
}

/// One hunk of a patch that did not apply (part of a `PatchConflict` error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FailedHunk {
    /// Path of the file.
    pub path: String,
    /// 1-based index of the hunk within its file; 0 when the whole file failed (e.g. missing).
    pub hunk: usize,
    /// The hunk's `@@` header.
    pub header: String,
    /// Why it did not apply.
    pub reason: String,
}

/// Body of every agent error: `{"code", "message"}`, plus `process` on a `Conflict` about a process
/// and `failedHunks` on a `PatchConflict`. The agent writes its keys sorted by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentErrorBody {
    /// Machine-readable code (`BadRequest`, `InvalidRequest`, `NotFound`, `Conflict`, ...).
    pub code: String,
    /// What went wrong and what to change.
    pub message: String,
    /// The hunks that did not apply (`PatchConflict`; nothing was written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_hunks: Option<Vec<FailedHunk>>,
    /// The process the conflict is about (a taken id, or one that already exited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Box<ProcessStatus>>,
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

/// Answer of `GET /v1/metrics`: what the sandbox's container uses, from its cgroup, and its disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentMetrics {
    /// `v2` or `v1`: the cgroup version read; null when the agent found no cgroup of its own.
    pub cgroup: Option<String>,
    /// CPU time used by the container, in seconds (user and system).
    pub cpu_seconds: Option<f64>,
    /// Memory the container uses now, in bytes (page cache included, as the limit counts it).
    pub memory_bytes: Option<u64>,
    /// Most memory the container has used, in bytes (cgroup v2 needs Linux 5.19 for it).
    pub memory_peak_bytes: Option<u64>,
    /// The container's memory limit in bytes; null when it has none.
    pub memory_limit_bytes: Option<u64>,
    /// Processes (tasks) in the container.
    pub pids: Option<u64>,
    /// Processes the out-of-memory killer has killed in the container so far.
    pub oom_kills: Option<u64>,
    /// The agent's root directory, whose file system the disk figures are about.
    pub disk_path: String,
    /// Bytes used on that file system (`statvfs`: size less free blocks; the whole file system, not
    /// only what the sandbox wrote).
    pub disk_used_bytes: Option<u64>,
    /// Size of that file system in bytes.
    pub disk_total_bytes: Option<u64>,
    /// Bytes still available to unprivileged users on it.
    pub disk_available_bytes: Option<u64>,
}

/// Body and answer of `PUT /v1/identity`: the Sandbox this agent serves. Every later command gets
/// `ORCHARD_SANDBOX=<sandbox>` unless its own `env` sets it (the operator sets it when a Sandbox
/// claims a warm pool member, whose Pod was started under the member's name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentIdentity {
    /// Name of the Sandbox (1 to 253 characters).
    pub sandbox: String,
}

/// Answer of `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentHealth {
    /// Always `ok` when the agent answers.
    pub status: String,
    /// The agent's version.
    pub version: String,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn exec_events_keep_their_wire_shape() {
        let chunk = ExecEvent::Stdout {
            data: "hi\n".into(),
        };
        assert_eq!(
            serde_json::to_string(&chunk).unwrap(),
            r#"{"type":"stdout","data":"hi\n"}"#
        );
        let started = ExecEvent::Started { pid: 7 };
        assert_eq!(
            serde_json::to_string(&started).unwrap(),
            r#"{"type":"started","pid":7}"#
        );
        let exit: ExecEvent =
            serde_json::from_value(json!({"type": "exit", "exitCode": 0, "signal": null,
            "timedOut": false, "oomKilled": false, "durationMs": 3, "stdoutTruncated": false,
            "stderrTruncated": false, "stdoutLossy": false, "stderrLossy": false}))
            .unwrap();
        assert!(matches!(
            exit,
            ExecEvent::Exit {
                exit_code: Some(0),
                error: None,
                ..
            }
        ));
        assert_eq!(
            serde_json::to_value(&exit).unwrap()["type"],
            json!("exit"),
            "{exit:?}"
        );
    }

    fn status() -> ProcessStatus {
        ProcessStatus {
            id: "p-1".into(),
            pid: Some(7),
            line: CommandLine::Shell {
                command: "echo hi".into(),
                shell: "/bin/sh".into(),
            },
            state: ProcessState::Exited,
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            oom_killed: false,
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: Some("2026-01-01T00:00:01Z".into()),
            duration_ms: 1000,
            stdout: None,
            stderr: Some("".into()),
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_lossy: false,
            stderr_lossy: false,
            output_encoding: OutputEncoding::Text,
            error: None,
            stdin_open: false,
            pty: false,
        }
    }

    #[test]
    fn process_status_flattens_its_command_line_and_skips_absent_output() {
        let text = serde_json::to_string(&status()).unwrap();
        assert_eq!(
            text,
            r#"{"id":"p-1","pid":7,"command":"echo hi","shell":"/bin/sh","state":"exited","exitCode":0,"signal":null,"timedOut":false,"oomKilled":false,"startedAt":"2026-01-01T00:00:00Z","finishedAt":"2026-01-01T00:00:01Z","durationMs":1000,"stderr":"","stdoutTruncated":false,"stderrTruncated":false,"stdoutLossy":false,"stderrLossy":false,"outputEncoding":"text"}"#
        );
        let back: ProcessStatus = serde_json::from_str(&text).unwrap();
        assert_eq!(back, status());
        assert!(back.exited());
        let argv = json!({"id": "a", "pid": null, "argv": ["true"], "state": "running", "exitCode": null,
            "signal": null, "timedOut": false, "oomKilled": false, "startedAt": "x", "finishedAt": null,
            "durationMs": 0, "stdoutTruncated": false, "stderrTruncated": false, "stdoutLossy": false,
            "stderrLossy": false, "outputEncoding": "base64"});
        let parsed: ProcessStatus = serde_json::from_value(argv).unwrap();
        assert_eq!(
            parsed.line,
            CommandLine::Argv {
                argv: vec!["true".into()]
            }
        );
        assert_eq!(parsed.state.as_str(), "running");
    }

    #[test]
    fn terminal_and_stdin_flags_appear_only_when_set() {
        let mut status = status();
        status.stdin_open = true;
        status.pty = true;
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(
            (&value["stdinOpen"], &value["pty"]),
            (&json!(true), &json!(true))
        );
        let request: ExecRequest =
            serde_json::from_str(r#"{"argv":["sh"],"keepStdin":true,"pty":{"rows":24,"cols":80}}"#)
                .unwrap();
        assert_eq!(request.pty, Some(TerminalSize { rows: 24, cols: 80 }));
        assert_eq!(request.keep_stdin, Some(true));
        assert!(serde_json::from_str::<ProcessStdinRequest>(r#"{"data":"x","bogus":1}"#).is_err());
    }

    #[test]
    fn requests_reject_unknown_fields() {
        assert!(serde_json::from_str::<ExecRequest>(r#"{"argv":["a"],"bogus":1}"#).is_err());
        assert!(serde_json::from_str::<SignalRequest>(r#"{"signal":1,"x":2}"#).is_err());
        assert!(serde_json::from_str::<PatchRequest>(r#"{"patch":"","x":2}"#).is_err());
        let signal: SignalRequest = serde_json::from_str(r#"{"signal":"TERM"}"#).unwrap();
        assert_eq!(signal.signal, SignalSpec::Name("TERM".into()));
        let signal: SignalRequest = serde_json::from_str(r#"{"signal":15}"#).unwrap();
        assert_eq!(signal.signal, SignalSpec::Number(15));
    }

    #[test]
    fn keep_is_optional_on_the_wire() {
        let request: ExecRequest =
            serde_json::from_str(r#"{"id":"svc","argv":["sleep","1"],"keep":true}"#).unwrap();
        assert_eq!(request.keep, Some(true));
        let request: ExecRequest = serde_json::from_str(r#"{"argv":["true"]}"#).unwrap();
        assert_eq!(request.keep, None);
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"argv": ["true"]}),
            "absent unless given"
        );
    }

    #[test]
    fn requests_serialise_only_given_fields() {
        let request = ExecRequest {
            id: Some("run".into()),
            argv: Some(vec!["true".into()]),
            timeout_seconds: Some(5.0),
            output_encoding: Some(OutputEncoding::Base64),
            ..ExecRequest::default()
        };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"id": "run", "argv": ["true"], "timeoutSeconds": 5.0, "outputEncoding": "base64"})
        );
    }

    #[test]
    fn answers_keep_their_wire_names() {
        let entry = FileEntry {
            name: "a".into(),
            kind: FileKind::Directory,
            size: 1,
            mode: 0o755,
            modified: None,
        };
        assert_eq!(
            serde_json::to_string(&entry).unwrap(),
            r#"{"name":"a","type":"directory","size":1,"mode":493,"modified":null}"#
        );
        let result = PatchResult {
            applied: true,
            files: vec![PatchedFile {
                path: "x".into(),
                action: PatchAction::Created,
            }],
        };
        assert_eq!(
            serde_json::to_string(&result).unwrap(),
            r#"{"applied":true,"files":[{"path":"x","action":"created"}]}"#
        );
        let error = AgentErrorBody {
            code: "PatchConflict".into(),
            message: "m".into(),
            failed_hunks: Some(vec![FailedHunk {
                path: "p".into(),
                hunk: 1,
                header: "@@".into(),
                reason: "r".into(),
            }]),
            process: None,
        };
        assert_eq!(
            serde_json::to_value(&error).unwrap(),
            json!({"code": "PatchConflict", "message": "m", "failedHunks": [{"path": "p", "hunk": 1, "header": "@@", "reason": "r"}]})
        );
    }
}
