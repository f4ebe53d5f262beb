//! Request bodies through the agent's own JSON extractor (`JsonBody`: size limit, syntax and schema
//! errors, `deny_unknown_fields`) and the checks every outcome must pass: a valid `CommandSpec`, or one
//! of the agent's JSON errors with a 4xx status.

use std::fs;
use std::path::PathBuf;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{Method, header};
use axum::response::IntoResponse;
use orchard_agent::error::AgentError;
use orchard_agent::exec::request::{
    CommandLine, CommandRequest, CommandSpec, MAX_BUFFERED_OUTPUT_BYTES, RequestKind,
};
use orchard_agent::files::paths::ProtectedFiles;
use orchard_agent::json_body::JsonBody;
use orchard_agent::state::{AgentConfig, AppState};
use tokio::runtime::Runtime;

use crate::scratch::{scratch_dir, symlink, write_file};

/// `--max-body-bytes` of the harness: small, so libFuzzer's longer inputs reach the 413 path.
pub const BODY_LIMIT: u64 = 2048;

/// One agent state and runtime, reused by every input of a fuzzing process.
pub struct RequestHarness {
    runtime: Runtime,
    state: AppState,
    pub root: PathBuf,
}

impl RequestHarness {
    /// A root holding directories, a file and symlinks for `cwd` to find.
    pub fn new(name: &str) -> Self {
        let root = scratch_dir(name);
        fs::create_dir_all(root.join("work/sub")).expect("create work/sub");
        write_file(&root, "file.txt", b"x\n");
        symlink(&root, "work-link", "work");
        symlink(&root, "file-link", "file.txt");
        symlink(&root, "dangling", "missing/target");
        let config = AgentConfig {
            root: root.clone(),
            token: None,
            max_concurrent: 4,
            max_body_bytes: BODY_LIMIT,
            max_upload_bytes: 1 << 20,
            max_output_bytes_total: 1 << 20,
            scrubbed_env: Vec::new(),
            protected: ProtectedFiles::default(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("tokio runtime");
        RequestHarness {
            runtime,
            state: AppState::new(config),
            root,
        }
    }

    /// `body` as `POST path` with `Content-Type: application/json`, through `JsonBody<CommandRequest>`.
    pub fn extract(&self, path: &str, body: &[u8]) -> Result<CommandRequest, AgentError> {
        let request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body.to_vec()))
            .expect("a valid request");
        self.runtime
            .block_on(JsonBody::<CommandRequest>::from_request(
                request,
                &self.state,
            ))
            .map(|JsonBody(request)| request)
    }

    /// The error is one of `allowed` codes, a 4xx, and renders as the agent's JSON error body.
    pub fn check_error(&self, error: AgentError, allowed: &[&str]) {
        let code = error.code();
        assert!(
            allowed.contains(&code),
            "unexpected error code {code}: {error}"
        );
        assert!(error.status().is_client_error(), "{code} is not a 4xx");
        let message = error.to_string();
        let response = error.into_response();
        assert_eq!(
            response
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|value| value.to_str().ok()),
            Some("application/json")
        );
        let bytes = self
            .runtime
            .block_on(axum::body::to_bytes(response.into_body(), usize::MAX))
            .expect("error body");
        let body: serde_json::Value = serde_json::from_slice(&bytes).expect("error body is JSON");
        assert_eq!(body["code"], code);
        assert_eq!(body["message"].as_str(), Some(message.as_str()));
        assert!(!message.is_empty(), "{code} has an empty message");
    }
}

/// Every validated command can be spawned as it is: a non-empty program, no NUL anywhere, env names
/// without `=`, an existing directory as cwd, bounded output, and the timeout rule of its kind
/// (`asked_timeout`: whether the request had `timeoutSeconds`, if known).
pub fn check_spec(spec: &CommandSpec, kind: RequestKind, asked_timeout: Option<bool>) {
    let argv = spec.argv();
    assert!(!argv.is_empty() && !argv[0].is_empty(), "empty program");
    assert!(argv.iter().all(|arg| !arg.contains('\0')), "NUL in argv");
    if let CommandLine::Shell { command, shell } = &spec.line {
        assert_eq!(argv, vec![shell.as_str(), "-c", command.as_str()]);
    }
    for (key, value) in &spec.env {
        assert!(!key.is_empty() && !key.contains('=') && !key.contains('\0'));
        assert!(!value.contains('\0'));
    }
    // Absolute `cwd`s are allowed (the sandbox is the boundary); relative ones are joined to the root.
    assert!(spec.cwd.is_absolute(), "relative cwd {:?}", spec.cwd);
    assert!(!spec.cwd.as_os_str().as_encoded_bytes().contains(&0));
    assert!(fs::metadata(&spec.cwd).is_ok_and(|metadata| metadata.is_dir()));
    assert!(spec.max_output_bytes as u64 <= MAX_BUFFERED_OUTPUT_BYTES);
    match (kind, spec.timeout) {
        (RequestKind::Exec, None) => panic!("exec without a timeout"),
        (RequestKind::Process, None) => assert_ne!(asked_timeout, Some(true)),
        (_, Some(timeout)) => assert!(!timeout.is_zero() || asked_timeout != Some(false)),
    }
}
