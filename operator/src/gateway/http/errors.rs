//! Errors the gateway answers with: JSON `{"code", "message", "retryable", ...}` and a status a client
//! can act on. Agent error responses are not wrapped here: the proxy passes them through unchanged.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

/// The body of every error the gateway itself produces.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Machine-readable code, e.g. `NotFound`, `NotReady`, `Forbidden`, `AgentUnreachable`.
    pub code: String,
    /// What happened and what to change.
    pub message: String,
    /// Whether sending the same request again later may succeed.
    pub retryable: bool,
    /// Phase of the sandbox or group, on `NotReady` and `WaitTimeout`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why it is not settled, on `WaitTimeout`: the `Stalled` condition's reason when it is true,
    /// else the `Ready` (groups: `Complete`) condition's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// That condition's message.
    #[serde(rename = "conditionMessage", skip_serializing_if = "Option::is_none")]
    pub condition_message: Option<String>,
}

/// An error answer of the gateway.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// JSON body (boxed: errors travel in `Result`s on every request path, and should stay small).
    pub body: Box<ErrorBody>,
    /// `Retry-After` seconds, sent as that header when set.
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with `status`, `code` and `message`, not retryable.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: Box::new(ErrorBody {
                code: code.to_string(),
                message: message.into(),
                retryable: false,
                phase: None,
                reason: None,
                condition_message: None,
            }),
            retry_after: None,
        }
    }

    /// Marks the error retryable (or not).
    pub fn retryable(mut self, retryable: bool) -> Self {
        self.body.retryable = retryable;
        self
    }

    /// Sets the `Retry-After` header (seconds).
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// 503 `Overloaded` (retryable, `Retry-After: 1`): the gateway already handles its most requests.
    pub fn overloaded(limit: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Overloaded",
            format!(
                "the gateway is handling its maximum of {limit} requests at once; retry after the Retry-After delay"
            ),
        )
        .retryable(true)
        .retry_after(1)
    }

    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    /// 401 `Unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", message)
    }

    /// 403 `Forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Forbidden", message)
    }

    /// 404 `NotFound` for an object of `kind` (`sandbox`, `rolloutgroup`).
    pub fn not_found(kind: &str, namespace: &str, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{kind} {namespace}/{name} not found"),
        )
    }

    /// 409 `NotReady`: the sandbox exists but its agent cannot take calls in `phase`.
    pub fn not_ready(namespace: &str, name: &str, phase: Option<&str>) -> Self {
        let shown = phase.unwrap_or("Pending");
        let (message, retryable) = match shown {
            "Failed" | "Expired" | "Terminating" | "Succeeded" => (
                format!(
                    "sandbox {namespace}/{name} is {shown}; its agent no longer takes calls (see `status.reason` and `status.message`)"
                ),
                false,
            ),
            _ => (
                format!(
                    "sandbox {namespace}/{name} is not ready yet (phase {shown}); wait with GET .../{name}/wait and retry"
                ),
                true,
            ),
        };
        let mut error = Self::new(StatusCode::CONFLICT, "NotReady", message).retryable(retryable);
        error.body.phase = Some(shown.to_string());
        error
    }

    /// 409 `Conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "Conflict", message)
    }

    /// 503 `Unavailable` (retryable): a dependency (the API server) did not answer.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", message).retryable(true)
    }

    /// 500 `Internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "Internal", message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.body.code,
            self.body.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        response
    }
}

/// Maps a failed Kubernetes API request to what the gateway's client should see. The API server's
/// own message is kept (it names the field or rule that failed); what the object is called is
/// prefixed so the message stands alone.
pub fn from_kube(error: &kube::Error, what: &str) -> ApiError {
    match error {
        kube::Error::Api(status) => {
            let message = format!("{what}: {}", status.message);
            match status.code {
                400 => ApiError::bad_request(message),
                // The caller's namespace is full: a ResourceQuota's own refusal (the API server
                // names the quota, what is used and the limit), not a missing permission of ours.
                403 if status.message.contains("exceeded quota") => {
                    ApiError::new(StatusCode::FORBIDDEN, "QuotaExceeded", message)
                }
                401 | 403 => ApiError::internal(format!(
                    "{message} (the operator's own service account lacks this permission; check its RBAC)"
                )),
                404 => ApiError::new(StatusCode::NOT_FOUND, "NotFound", message),
                409 if status.reason == "AlreadyExists" => {
                    ApiError::new(StatusCode::CONFLICT, "AlreadyExists", message)
                }
                409 => ApiError::conflict(message).retryable(true),
                422 => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message),
                429 => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message)
                    .retryable(true),
                code if code >= 500 => ApiError::unavailable(message),
                _ => ApiError::new(StatusCode::BAD_GATEWAY, "ApiError", message),
            }
        }
        other => ApiError::unavailable(format!(
            "{what}: the Kubernetes API did not answer: {other}"
        )),
    }
}

/// Wraps a value as JSON with an explicit status.
pub fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            bytes,
        )
            .into_response(),
        Err(err) => {
            ApiError::internal(format!("cannot encode the response: {err}")).into_response()
        }
    }
}

/// A JSON object from pairs (small helper for ad-hoc answers such as `{"deleted": true}`).
pub fn object(pairs: impl IntoIterator<Item = (&'static str, Value)>) -> Value {
    Value::Object(
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect::<Map<String, Value>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure(message, reason).with_code(code),
        ))
    }

    #[test]
    fn not_ready_names_the_phase_and_is_retryable_only_while_starting() {
        let starting = ApiError::not_ready("ns", "s", Some("Starting"));
        assert_eq!(starting.status, StatusCode::CONFLICT);
        assert_eq!(starting.body.phase.as_deref(), Some("Starting"));
        assert!(starting.body.retryable);
        assert!(starting.body.message.contains("phase Starting"));
        let failed = ApiError::not_ready("ns", "s", Some("Failed"));
        assert!(!failed.body.retryable);
        assert!(failed.body.message.contains("is Failed"));
        let unknown = ApiError::not_ready("ns", "s", None);
        assert_eq!(unknown.body.phase.as_deref(), Some("Pending"));
    }

    #[test]
    fn kube_errors_map_to_actionable_statuses() {
        let invalid = from_kube(
            &api(422, "Invalid", "spec.image: Required value"),
            "sandbox ns/x",
        );
        assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(invalid.body.message.contains("spec.image: Required value"));
        let exists = from_kube(&api(409, "AlreadyExists", "exists"), "sandbox ns/x");
        assert_eq!(exists.body.code, "AlreadyExists");
        assert!(!exists.body.retryable);
        let conflict = from_kube(&api(409, "Conflict", "modified"), "sandbox ns/x");
        assert!(conflict.body.retryable);
        let missing = from_kube(&api(404, "NotFound", "gone"), "sandbox ns/x");
        assert_eq!(missing.status, StatusCode::NOT_FOUND);
        let down = from_kube(&api(503, "ServiceUnavailable", "etcd"), "sandbox ns/x");
        assert_eq!(down.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(down.body.retryable);
        let full = from_kube(
            &api(
                403,
                "Forbidden",
                "sandboxsnapshots.orchard.dev \"s2\" is forbidden: exceeded quota: snaps, requested: count/sandboxsnapshots.orchard.dev=1, used: count/sandboxsnapshots.orchard.dev=1, limited: count/sandboxsnapshots.orchard.dev=1",
            ),
            "sandboxsnapshot ns/s2",
        );
        assert_eq!(full.status, StatusCode::FORBIDDEN);
        assert_eq!(full.body.code, "QuotaExceeded");
        assert!(!full.body.retryable);
        assert!(
            full.body
                .message
                .contains("limited: count/sandboxsnapshots.orchard.dev=1")
        );
        let ours = from_kube(&api(403, "Forbidden", "no"), "sandbox ns/x");
        assert_eq!(ours.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(ours.body.message.contains("operator's own service account"));
    }

    #[test]
    fn overload_is_a_retryable_503_with_retry_after() {
        let response = ApiError::overloaded(8).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[axum::http::header::RETRY_AFTER], "1");
        let plain = ApiError::forbidden("no").into_response();
        assert!(
            plain
                .headers()
                .get(axum::http::header::RETRY_AFTER)
                .is_none()
        );
    }

    #[test]
    fn error_bodies_serialise_without_empty_phase() {
        let body = serde_json::to_value(ApiError::forbidden("no").body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"code": "Forbidden", "message": "no", "retryable": false})
        );
    }
}
