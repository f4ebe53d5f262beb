//! Every route the gateway proxies to a sandbox's agent, one row each ([`ROUTES`]): adding an agent
//! route to the gateway is adding a row here. The row of a request is found from its method and path
//! ([`recognise`]), so the gateway sends agent calls, its busiest (an exec above all), to their proxy
//! before the router.

use orchard_api::agent::{
    AgentMetrics, DirectoryCreated, ExecEvent, ExecRequest, ExecResponse, FileDeleted, FileList,
    FileStat, FileWritten, MkdirRequest, PatchRequest, PatchResult, ProcessList, ProcessStatus,
    ProcessStdinRequest, RenameRequest, Renamed, SessionInputRequest, SessionList,
    SessionReadRequest, SessionReadResponse, SessionRequest, SessionRunRequest, SessionRunResponse,
    SessionSignalRequest, SessionSignalResponse, SessionStatus, SignalRequest, TarExtracted,
    TerminalSize,
};

use crate::gateway::auth::access::Operation;

/// How long an exec may run by default before the gateway gives up waiting (the agent's default
use utoipa_axum::router::OpenApiRouter;

use axum::http::Method;

use crate::gateway::agent::paths::{SandboxPath, fits, split};
use crate::gateway::agent::routes::*;
use crate::gateway::state::State;

/// A gateway path under one sandbox.
macro_rules! sandbox_path {
    ($rest:literal) => {
        concat!("/v1/namespaces/{namespace}/sandboxes/{name}", $rest)
    };
}
#[cfg(test)]
pub(crate) use sandbox_path;

/// `X-Orchard-Timeout` of an exec.
const EXEC_TIMEOUT_HEADER: Param = Param {
    name: "x-orchard-timeout",
    location: ParamIn::Header,
    required: false,
    schema: optional_seconds,
    description: "Seconds to wait for the answer (default 660; set it above the command's timeoutSeconds)",
};

/// Every route proxied to the agent.
pub static ROUTES: &[AgentRoute] = &[
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/exec"),
        operation: Operation::Exec,
        timeout: AnswerTimeout::Exec,
        operation_id: "exec",
        summary: "Runs one command in the sandbox and answers when it ends (agent `POST /v1/exec`).",
        params: &[EXEC_TIMEOUT_HEADER],
        request: Some(json(named::<ExecRequest>)),
        answers: &[
            answer(
                200,
                "The command ran (any exit code)",
                json(named::<ExecResponse>),
            ),
            error(401, ""),
            error(403, "RBAC denies `create sandboxes/exec`"),
            error(404, "No such sandbox"),
            error(409, "`NotReady` with the sandbox's phase"),
            error(
                502,
                "`AgentUnreachable` / `AgentConnectionLost` (retryable when marked)",
            ),
            error(503, "`AgentUnavailable` (retryable)"),
            error(504, "`AgentTimeout`: no answer within X-Orchard-Timeout"),
        ],
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/exec/stream"),
        operation: Operation::Exec,
        operation_id: "exec_stream",
        summary: "Runs one command and streams its output as NDJSON events (`started`, `stdout`, `stderr`, `exit`).",
        request: Some(json(named::<ExecRequest>)),
        answers: &[
            answer(
                200,
                "One JSON event per line as output arrives",
                Content {
                    media_type: "application/x-ndjson",
                    schema: named::<ExecEvent>,
                },
            ),
            error(403, "RBAC denies `create sandboxes/exec`"),
            error(409, ""),
            error(502, ""),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/processes"),
        operation: Operation::Exec,
        operation_id: "start_process",
        summary: "Starts a background process (agent `POST /v1/processes`).",
        request: Some(json(named::<ExecRequest>)),
        answers: &[
            answer(201, "Started", json(named::<ProcessStatus>)),
            error(
                409,
                "The id is taken (`process` holds its status), or the sandbox is not ready",
            ),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/processes"),
        operation: Operation::Exec,
        operation_id: "list_processes",
        summary: "Lists background processes (`?output=false` leaves out their output).",
        answers: &[answer(
            200,
            "`{\"processes\": [status, ...]}`",
            json(named::<ProcessList>),
        )],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/processes/{id}"),
        operation: Operation::Exec,
        timeout: AnswerTimeout::LongPoll,
        operation_id: "get_process",
        summary: "Reads a process's status; `?wait=SECONDS` long-polls until it exits (at most 300).",
        answers: &[
            answer(200, "", json(named::<ProcessStatus>)),
            error(404, "Unknown process id"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Delete,
        path: sandbox_path!("/processes/{id}"),
        operation: Operation::Exec,
        operation_id: "delete_process",
        summary: "Kills a process's group if it runs and forgets it (agent `DELETE /v1/processes/{id}`).",
        answers: &[answer(
            200,
            "The final status",
            json(named::<ProcessStatus>),
        )],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/processes/{id}/signal"),
        operation: Operation::Exec,
        operation_id: "signal_process",
        summary: "Signals a process's whole group.",
        request: Some(json(named::<SignalRequest>)),
        answers: &[
            answer(200, "", json(named::<ProcessStatus>)),
            error(409, "The process already exited"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/files"),
        operation: Operation::ReadFiles,
        operation_id: "download",
        summary: "Downloads a file as raw bytes (`?path=`), streamed.",
        params: &[query(
            "path",
            true,
            inline::<String>,
            "File path (absolute or relative to the agent's root)",
        )],
        answers: &[
            answer(200, "The file's bytes", bytes()),
            error(403, "RBAC denies `get sandboxes/files`"),
            error(404, "No such file (agent) or sandbox"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Put,
        path: sandbox_path!("/files"),
        operation: Operation::WriteFiles,
        operation_id: "upload",
        summary: "Uploads a file from the raw request body (`?path=&mode=`), streamed; atomic on the agent.",
        params: &[
            query("path", true, inline::<String>, "Destination path"),
            query("mode", false, inline::<String>, "Octal mode, e.g. 0755"),
        ],
        request: Some(bytes()),
        answers: &[
            answer(
                201,
                "`{\"path\": \"/abs/P\", \"size\": N}`",
                json(named::<FileWritten>),
            ),
            error(403, "RBAC denies `create sandboxes/files`"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Delete,
        path: sandbox_path!("/files"),
        operation: Operation::WriteFiles,
        operation_id: "delete_file",
        summary: "Deletes a file or directory (`?path=&recursive=true`).",
        params: &[
            query("path", true, inline::<String>, "Path to delete"),
            query(
                "recursive",
                false,
                inline::<bool>,
                "Delete a non-empty directory",
            ),
        ],
        answers: &[
            answer(
                200,
                "`{\"path\": \"/abs/P\", \"deleted\": true}`",
                json(named::<FileDeleted>),
            ),
            error(403, "RBAC denies `create sandboxes/files`"),
            error(404, ""),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/files/list"),
        operation: Operation::ReadFiles,
        operation_id: "list_files",
        summary: "Lists a directory (`?path=`).",
        params: &[query("path", true, inline::<String>, "Directory to list")],
        answers: &[
            answer(200, "", json(named::<FileList>)),
            error(403, "RBAC denies `get sandboxes/files`"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/processes/{id}/stdin"),
        operation: Operation::Exec,
        operation_id: "write_process_stdin",
        summary: "Writes to a background process's stdin (started with `keepStdin` or `pty`); `close` ends it.",
        request: Some(json(named::<ProcessStdinRequest>)),
        answers: &[
            answer(200, "", json(named::<ProcessStatus>)),
            error(404, "Unknown process id"),
            error(409, "Its stdin is closed or was never kept open"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/processes/{id}/resize"),
        operation: Operation::Exec,
        operation_id: "resize_process_terminal",
        summary: "Resizes the terminal of a process started with `pty`.",
        request: Some(json(named::<TerminalSize>)),
        answers: &[
            answer(200, "", json(named::<ProcessStatus>)),
            error(404, "Unknown process id"),
            error(409, "The process has no terminal"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/sessions"),
        operation: Operation::Exec,
        operation_id: "start_session",
        summary: "Starts a persistent shell session (bash if the image has it, else sh); cwd, variables and functions carry over between its runs.",
        request: Some(json(named::<SessionRequest>)),
        answers: &[
            answer(201, "Started", json(named::<SessionStatus>)),
            error(429, "Too many sessions in this sandbox"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/sessions"),
        operation: Operation::Exec,
        operation_id: "list_sessions",
        summary: "Lists the sandbox's shell sessions.",
        answers: &[answer(200, "", json(named::<SessionList>))],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/sessions/{id}"),
        operation: Operation::Exec,
        operation_id: "get_session",
        summary: "Reads a session's status.",
        answers: &[
            answer(200, "", json(named::<SessionStatus>)),
            error(404, "Unknown session id"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Delete,
        path: sandbox_path!("/sessions/{id}"),
        operation: Operation::Exec,
        operation_id: "delete_session",
        summary: "Ends a session (its shell's whole process group).",
        answers: &[
            answer(200, "The final status", json(named::<SessionStatus>)),
            error(404, "Unknown session id"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/sessions/{id}/run"),
        operation: Operation::Exec,
        timeout: AnswerTimeout::Exec,
        operation_id: "run_in_session",
        summary: "Runs a command in the session's shell and answers its output and exit code; at its time-out the foreground job is interrupted and the session stays usable.",
        params: &[EXEC_TIMEOUT_HEADER],
        request: Some(json(named::<SessionRunRequest>)),
        answers: &[
            answer(
                200,
                "The command ran (any exit code)",
                json(named::<SessionRunResponse>),
            ),
            error(404, "Unknown session id"),
            error(409, "Another run is in progress in this session"),
        ],
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/sessions/{id}/signal"),
        operation: Operation::Exec,
        operation_id: "signal_session",
        summary: "Signals the command of the session's run in progress (`{}`: SIGINT, as Ctrl-C) and answers at once; the shell survives and the run answers when its command has ended.",
        request: Some(json(named::<SessionSignalRequest>)),
        answers: &[
            answer(
                200,
                "`running`: whether a run was in progress (false: nothing was signalled); `session`: the status",
                json(named::<SessionSignalResponse>),
            ),
            error(400, "Unknown signal"),
            error(404, "Unknown session id"),
            error(
                409,
                "The session's shell has exited, or the sandbox is not ready",
            ),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/sessions/{id}/input"),
        operation: Operation::Exec,
        operation_id: "write_session_input",
        summary: "Writes text to the session's stdin (answers a prompt of the running command).",
        request: Some(json(named::<SessionInputRequest>)),
        answers: &[
            answer(200, "", json(named::<SessionStatus>)),
            error(404, "Unknown session id"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/sessions/{id}/read"),
        operation: Operation::Exec,
        timeout: AnswerTimeout::Exec,
        operation_id: "read_session",
        summary: "Reads the session's output until a literal text appears or a time-out (expect-style).",
        params: &[EXEC_TIMEOUT_HEADER],
        request: Some(json(named::<SessionReadRequest>)),
        answers: &[
            answer(200, "", json(named::<SessionReadResponse>)),
            error(404, "Unknown session id"),
        ],
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/files/stat"),
        operation: Operation::ReadFiles,
        operation_id: "stat_file",
        summary: "Whether a path exists, and its type, size, mode, modification time and link target (`?path=`).",
        params: &[query("path", true, inline::<String>, "Path to look at")],
        answers: &[
            answer(
                200,
                "`exists: false` for a missing path",
                json(named::<FileStat>),
            ),
            error(403, "RBAC denies `get sandboxes/files`"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/files/mkdir"),
        operation: Operation::WriteFiles,
        operation_id: "make_directory",
        summary: "Creates a directory (`parents: true` as `mkdir -p`).",
        request: Some(json(named::<MkdirRequest>)),
        answers: &[
            answer(
                201,
                "Created (200: it existed, with `parents`)",
                json(named::<DirectoryCreated>),
            ),
            error(403, "RBAC denies `create sandboxes/files`"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/files/rename"),
        operation: Operation::WriteFiles,
        operation_id: "rename_file",
        summary: "Renames or moves a file or directory (an existing `to` only with `overwrite: true`).",
        request: Some(json(named::<RenameRequest>)),
        answers: &[
            answer(200, "", json(named::<Renamed>)),
            error(
                403,
                "RBAC denies `create sandboxes/files`, or a protected file",
            ),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/files/tar"),
        operation: Operation::ReadFiles,
        operation_id: "download_directory",
        summary: "Downloads a directory as a tar stream (`?path=`; symlinks kept as symlinks, never followed).",
        params: &[query(
            "path",
            true,
            inline::<String>,
            "Directory to download",
        )],
        answers: &[
            answer(200, "A tar stream", bytes()),
            error(403, "RBAC denies `get sandboxes/files`"),
            error(404, "No such directory"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Put,
        path: sandbox_path!("/files/tar"),
        operation: Operation::WriteFiles,
        operation_id: "upload_directory",
        summary: "Extracts a tar stream into a directory (`?path=`, created); the whole archive is checked first (no `..`, absolute paths or paths through symlinks: 400, nothing written).",
        params: &[query(
            "path",
            true,
            inline::<String>,
            "Destination directory",
        )],
        request: Some(bytes()),
        answers: &[
            answer(201, "Extracted", json(named::<TarExtracted>)),
            error(
                400,
                "An entry that would leave the directory, or a malformed archive",
            ),
            error(403, "RBAC denies `create sandboxes/files`"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Get,
        path: sandbox_path!("/metrics"),
        operation: Operation::GetSandbox,
        operation_id: "sandbox_metrics",
        summary: "The task container's CPU seconds, memory (now, peak, limit), PIDs, OOM kills and disk use, from its cgroup.",
        answers: &[
            answer(200, "", json(named::<AgentMetrics>)),
            error(403, "RBAC denies `get sandboxes`"),
        ],
        ..DEFAULTS
    },
    AgentRoute {
        method: Verb::Post,
        path: sandbox_path!("/patch"),
        operation: Operation::Exec,
        operation_id: "apply_patch",
        summary: "Applies a unified diff natively (all hunks or nothing).",
        request: Some(json(named::<PatchRequest>)),
        answers: &[
            answer(200, "", json(named::<PatchResult>)),
            error(403, "RBAC denies `create sandboxes/exec`"),
            error(
                409,
                "`PatchConflict` with `failedHunks` (nothing written), or the sandbox is not ready",
            ),
        ],
        ..DEFAULTS
    },
];

/// Every agent route, mounted and documented (see [`ROUTES`]).
pub fn router() -> OpenApiRouter<State> {
    ROUTES.iter().fold(OpenApiRouter::new(), |router, route| {
        router.routes(route.method_router())
    })
}

/// The agent route of a request `method path` (pure). `None` for any other path, and for a path
/// whose namespace or name is empty or percent-encoded: the router takes those (and decodes).
pub fn recognise<'a>(
    method: &Method,
    path: &'a str,
) -> Option<(&'static AgentRoute, SandboxPath<'a>)> {
    let parts = split(path)?;
    let plain = |segment: &str| !segment.is_empty() && !segment.contains('%');
    if !plain(parts.namespace) || !plain(parts.name) {
        return None;
    }
    let route = ROUTES
        .iter()
        .find(|route| route.method.is(method) && fits(route.suffix(), parts.suffix))?;
    Some((route, parts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(method: Method, path: &str) -> Option<&'static str> {
        recognise(&method, path).map(|(route, _)| route.path)
    }

    #[test]
    fn every_row_is_recognised_from_a_path_of_its_template() {
        for route in ROUTES {
            let path = route
                .path
                .replace("{namespace}", "team-a")
                .replace("{name}", "sb-1")
                .replace("{id}", "p-7");
            let method = match route.method {
                Verb::Get => Method::GET,
                Verb::Post => Method::POST,
                Verb::Put => Method::PUT,
                Verb::Delete => Method::DELETE,
            };
            let (recognised, parts) = recognise(&method, &path).expect(route.path);
            assert!(
                std::ptr::eq(recognised, route),
                "{path} took {}",
                recognised.path
            );
            assert_eq!((parts.namespace, parts.name), ("team-a", "sb-1"));
        }
    }

    #[test]
    fn other_paths_are_left_to_the_router() {
        let exec = "/v1/namespaces/ns/sandboxes/s/exec";
        assert_eq!(found(Method::POST, exec), Some(ROUTES[0].path));
        assert_eq!(
            found(Method::GET, exec),
            None,
            "no such method: the router's 405"
        );
        for path in [
            "/v1/namespaces/ns/sandboxes/s",
            "/v1/namespaces/ns/sandboxes/s/wait",
            "/v1/namespaces/ns/sandboxes/s/exec/",
            "/v1/namespaces/ns/sandboxes/s/exec/more",
            "/v1/namespaces/ns/sandboxes/s/ex%65c",
            "/v1/namespaces/ns/sandboxes/s%2Dx/exec",
            "/v1/namespaces/n%73/sandboxes/s/exec",
            "/v1/namespaces//sandboxes/s/exec",
            "/v1/namespaces/ns/sandboxes//exec",
            "/v1/namespaces/ns/rolloutgroups/s/exec",
            "/healthz",
        ] {
            assert_eq!(found(Method::POST, path), None, "{path}");
        }
        assert_eq!(
            found(
                Method::POST,
                "/v1/namespaces/ns/sandboxes/s/processes//signal"
            ),
            None,
            "an empty id"
        );
        assert_eq!(
            found(
                Method::GET,
                "/v1/namespaces/ns/sandboxes/s/ports/8080/tunnel"
            ),
            None,
            "tunnels upgrade their connection: the router's"
        );
    }
}
