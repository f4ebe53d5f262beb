//! The JSON request extractor: size limit (413), media type (415; JSON, no type, or `curl -d`'s form
//! type are accepted), syntax (400) and schema (422) errors,
//! all as JSON `AgentError`s instead of axum's plain-text rejections.

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use crate::error::AgentError;
use crate::state::AppState;

/// A request body parsed as JSON into `T` (whose serde attributes reject unknown fields).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = AgentError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config.max_body_bytes;
        let headers = request.headers();
        if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
            let essence = content_type
                .to_str()
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            // `curl -d` labels bodies as form data; accept it so the obvious command works.
            let json_like = essence == "application/json"
                || essence.ends_with("+json")
                || essence == "application/x-www-form-urlencoded";
            if !json_like {
                return Err(AgentError::UnsupportedMediaType(format!(
                    "request body must be JSON: send `Content-Type: application/json` (got `{essence}`)"
                )));
            }
        }
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        if declared.is_some_and(|length| length > limit) {
            drain_body(request.into_body(), DRAIN_LIMIT).await;
            return Err(too_large(limit));
        }
        let mut body = request.into_body();
        let mut collected = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| {
                AgentError::BadRequest(format!("cannot read request body: {error}"))
            })?;
            if let Ok(data) = frame.into_data() {
                if (collected.len() + data.len()) as u64 > limit {
                    drain_body(body, DRAIN_LIMIT).await;
                    return Err(too_large(limit));
                }
                collected.extend_from_slice(&data);
            }
        }
        parse_json(&collected).map(JsonBody)
    }
}

/// How much of an oversized body is still read (and discarded) before answering 413, so that ordinary
/// clients see the 413 instead of a broken pipe; past this the connection is simply closed.
pub const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// Reads and discards up to `max_bytes` of `body`.
pub async fn drain_body(mut body: Body, max_bytes: u64) {
    let mut drained = 0u64;
    while drained <= max_bytes {
        match body.frame().await {
            Some(Ok(frame)) => drained += frame.data_ref().map_or(0, |data| data.len() as u64),
            _ => return,
        }
    }
}

fn too_large(limit: u64) -> AgentError {
    AgentError::PayloadTooLarge(format!(
        "JSON body exceeds the {limit}-byte limit (--max-body-bytes); upload large data with PUT /v1/files"
    ))
}

/// Parses JSON bytes, classifying failures: broken JSON is 400, a valid document of the wrong shape is 422.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, AgentError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(AgentError::BadRequest(
            "request body is empty: send a JSON object".into(),
        ));
    }
    serde_json::from_slice(bytes).map_err(|error| match error.classify() {
        serde_json::error::Category::Data => {
            AgentError::InvalidRequest(format!("invalid request: {error}"))
        }
        _ => AgentError::BadRequest(format!("malformed JSON: {error}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Example {
        name: String,
    }

    #[test]
    fn classifies_errors() {
        assert!(parse_json::<Example>(b"{\"name\": \"x\"}").is_ok());
        assert!(matches!(
            parse_json::<Example>(b"{\"name\": "),
            Err(AgentError::BadRequest(_))
        ));
        assert!(matches!(
            parse_json::<Example>(b"  "),
            Err(AgentError::BadRequest(_))
        ));
        match parse_json::<Example>(b"{\"name\": \"x\", \"nmae\": 1}") {
            Err(AgentError::InvalidRequest(message)) => {
                assert!(message.contains("unknown field `nmae`"), "{message}")
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            parse_json::<Example>(b"{}"),
            Err(AgentError::InvalidRequest(_))
        ));
        assert!(matches!(
            parse_json::<Example>(b"{\"name\": 5}"),
            Err(AgentError::InvalidRequest(_))
        ));
    }
}
