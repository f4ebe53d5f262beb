//! The agent's one error type and its mapping to JSON responses `{"code", "message", ...extra}` (the
//! shared `AgentErrorBody`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use orchard_api::agent::{AgentErrorBody, ProcessStatus};
use serde::Serialize;
use serde_json::Value;

/// One hunk of a patch that did not apply (part of a `PatchConflict` response; the shared wire type).
pub use orchard_api::agent::FailedHunk;

/// Everything a request can fail with. Messages are written for the caller: they say what to change.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{0}")]
    BadRequest(String),
    /// Unknown, missing or ill-typed fields (422).
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidCwd(String),
    #[error("{0}")]
    InvalidPath(String),
    #[error("missing or wrong bearer token: send `Authorization: Bearer <token>`")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{message}")]
    Conflict {
        message: String,
        /// The process the conflict is about (`process` in the body).
        process: Option<Box<ProcessStatus>>,
    },
    #[error("{message}")]
    PatchConflict {
        message: String,
        failed_hunks: Vec<FailedHunk>,
    },
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    TooManyRequests(String),
    /// The agent cannot serve yet; retrying later succeeds (503).
    #[error("{0}")]
    Unavailable(String),
    /// Something the agent connects to on the caller's behalf refused (502).
    #[error("{0}")]
    BadGateway(String),
    #[error("{0}")]
    Internal(String),
}

impl AgentError {
    pub fn conflict(message: impl Into<String>) -> Self {
        AgentError::Conflict {
            message: message.into(),
            process: None,
        }
    }

    /// Maps an I/O error on `path` to the closest HTTP error.
    pub fn io(action: &str, path: &std::path::Path, error: std::io::Error) -> Self {
        use std::io::ErrorKind;
        let message = format!("{action} `{}`: {error}", path.display());
        match error.kind() {
            ErrorKind::NotFound => AgentError::NotFound(message),
            ErrorKind::PermissionDenied => AgentError::Forbidden(message),
            ErrorKind::NotADirectory | ErrorKind::IsADirectory | ErrorKind::InvalidInput => {
                AgentError::InvalidPath(message)
            }
            ErrorKind::DirectoryNotEmpty | ErrorKind::AlreadyExists => {
                AgentError::conflict(message)
            }
            ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge => {
                AgentError::PayloadTooLarge(message)
            }
            _ => AgentError::Internal(message),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            AgentError::BadRequest(_) | AgentError::InvalidCwd(_) | AgentError::InvalidPath(_) => {
                StatusCode::BAD_REQUEST
            }
            AgentError::InvalidRequest(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AgentError::Unauthorized => StatusCode::UNAUTHORIZED,
            AgentError::Forbidden(_) => StatusCode::FORBIDDEN,
            AgentError::NotFound(_) => StatusCode::NOT_FOUND,
            AgentError::Conflict { .. } | AgentError::PatchConflict { .. } => StatusCode::CONFLICT,
            AgentError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            AgentError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            AgentError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            AgentError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            AgentError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AgentError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            AgentError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable `code` of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            AgentError::BadRequest(_) => "BadRequest",
            AgentError::InvalidRequest(_) => "InvalidRequest",
            AgentError::InvalidCwd(_) => "InvalidCwd",
            AgentError::InvalidPath(_) => "InvalidPath",
            AgentError::Unauthorized => "Unauthorized",
            AgentError::Forbidden(_) => "Forbidden",
            AgentError::NotFound(_) => "NotFound",
            AgentError::Conflict { .. } => "Conflict",
            AgentError::PatchConflict { .. } => "PatchConflict",
            AgentError::PayloadTooLarge(_) => "PayloadTooLarge",
            AgentError::UnsupportedMediaType(_) => "UnsupportedMediaType",
            AgentError::MethodNotAllowed(_) => "MethodNotAllowed",
            AgentError::TooManyRequests(_) => "TooManyRequests",
            AgentError::Unavailable(_) => "Unavailable",
            AgentError::BadGateway(_) => "BadGateway",
            AgentError::Internal(_) => "Internal",
        }
    }

    /// The JSON body, as a value: its keys (nested ones too) are written sorted by name.
    fn body(&self) -> Value {
        let body = AgentErrorBody {
            code: self.code().to_string(),
            message: self.to_string(),
            failed_hunks: match self {
                AgentError::PatchConflict { failed_hunks, .. } => Some(failed_hunks.clone()),
                _ => None,
            },
            process: match self {
                AgentError::Conflict { process, .. } => process.clone(),
                _ => None,
            },
        };
        serde_json::to_value(&body).unwrap_or(Value::Null)
    }
}

impl IntoResponse for AgentError {
    fn into_response(self) -> Response {
        if matches!(self, AgentError::Internal(_)) {
            tracing::warn!(error = %self, "request failed");
        }
        let mut response = json_response(self.status(), &self.body());
        if matches!(self, AgentError::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Serialises `value` as a JSON response with `status`.
pub fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => {
            let mut response = (status, bytes).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(error) => {
            let fallback = format!(
                "{{\"code\":\"Internal\",\"message\":\"cannot encode response: {error}\"}}"
            );
            let mut response = (StatusCode::INTERNAL_SERVER_ERROR, fallback).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_carry_code_message_and_extras() {
        let process = ProcessStatus {
            id: "a".into(),
            pid: None,
            line: orchard_api::agent::CommandLine::Argv {
                argv: vec!["true".into()],
            },
            state: orchard_api::agent::ProcessState::Running,
            exit_code: None,
            signal: None,
            timed_out: false,
            oom_killed: false,
            started_at: "t".into(),
            finished_at: None,
            duration_ms: 0,
            stdout: None,
            stderr: None,
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_lossy: false,
            stderr_lossy: false,
            output_encoding: Default::default(),
            error: None,
            stdin_open: false,
            pty: false,
        };
        let error = AgentError::Conflict {
            message: "exists".into(),
            process: Some(Box::new(process.clone())),
        };
        assert_eq!(error.status(), StatusCode::CONFLICT);
        assert_eq!(
            error.body(),
            serde_json::json!({"code": "Conflict", "message": "exists", "process": process})
        );
        // Keys are sorted, as the map-built body had them.
        let bytes = serde_json::to_vec(&error.body()).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.starts_with(
                r#"{"code":"Conflict","message":"exists","process":{"argv":["true"],"durationMs":0,"exitCode""#
            ),
            "{text}"
        );
        let error = AgentError::PatchConflict {
            message: "1 hunk failed".into(),
            failed_hunks: vec![FailedHunk {
                path: "a".into(),
                hunk: 1,
                header: "@@ -1 +1 @@".into(),
                reason: "x".into(),
            }],
        };
        assert_eq!(error.body()["failedHunks"][0]["hunk"], 1);
        assert_eq!(AgentError::Unauthorized.code(), "Unauthorized");
    }

    #[test]
    fn io_errors_map_to_statuses() {
        let path = std::path::Path::new("/x");
        let not_found = AgentError::io(
            "open",
            path,
            std::io::Error::from(std::io::ErrorKind::NotFound),
        );
        assert_eq!(not_found.status(), StatusCode::NOT_FOUND);
        assert!(not_found.to_string().contains("`/x`"));
        let busy = AgentError::io("open", path, std::io::Error::other("boom"));
        assert_eq!(busy.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
