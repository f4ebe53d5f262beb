//! The gateway client: sandbox route URLs (pure), authenticated requests, and answers turned into
//! values or [`CliError`]s.

use std::time::Duration;

use reqwest::{Method, RequestBuilder, Response, Url};
use serde::de::DeserializeOwned;

use crate::error::{CliError, Result};
use crate::settings::Settings;

/// The header that sets how long the gateway waits for the agent's answer (seconds).
pub const ANSWER_TIMEOUT_HEADER: &str = "X-Orchard-Timeout";

/// Seconds added to a command's own timeout for `X-Orchard-Timeout`, so the command's timeout, not the
/// gateway's, ends it (the SDK's margin).
pub const ANSWER_TIMEOUT_MARGIN_SECONDS: u64 = 30;

/// The URL of route `rest` (segments after the sandbox's name, e.g. `["files", "tar"]`) of sandbox
/// `namespace/name`, with `query` pairs, every part percent-encoded (pure).
pub fn sandbox_url(
    base: &str,
    namespace: &str,
    name: &str,
    rest: &[&str],
    query: &[(&str, &str)],
) -> Result<Url> {
    let mut url =
        Url::parse(base).map_err(|e| CliError::Settings(format!("gateway URL `{base}`: {e}")))?;
    {
        let mut segments = url
            .path_segments_mut()
            .map_err(|()| CliError::Settings(format!("gateway URL `{base}` cannot take a path")))?;
        segments
            .pop_if_empty()
            .extend(["v1", "namespaces", namespace, "sandboxes", name])
            .extend(rest);
    }
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    Ok(url)
}

/// A connection to the gateway for the sandboxes of one namespace.
#[derive(Clone)]
pub struct Gateway {
    http: reqwest::Client,
    base: String,
    token: String,
    namespace: String,
}

impl Gateway {
    /// A client for `settings` (reads the token file, if the token is one).
    pub fn new(settings: &Settings) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            // The gateway closes idle connections after 10 s: drop them sooner.
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| CliError::Settings(format!("HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: settings.gateway.clone(),
            token: settings.token.read()?,
            namespace: settings.namespace.clone(),
        })
    }

    /// The gateway base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The bearer token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The namespace of the sandboxes.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The same connection for the sandboxes of `namespace` (this one's when `None`).
    pub fn in_namespace(&self, namespace: Option<String>) -> Self {
        let mut other = self.clone();
        if let Some(namespace) = namespace {
            other.namespace = namespace;
        }
        other
    }

    /// The URL of a route of `sandbox` in this namespace.
    pub fn url(&self, sandbox: &str, rest: &[&str], query: &[(&str, &str)]) -> Result<Url> {
        sandbox_url(&self.base, &self.namespace, sandbox, rest, query)
    }

    /// An authenticated request for `method` on a route of `sandbox`.
    pub fn request(
        &self,
        method: Method,
        sandbox: &str,
        rest: &[&str],
        query: &[(&str, &str)],
    ) -> Result<RequestBuilder> {
        Ok(self
            .http
            .request(method, self.url(sandbox, rest, query)?)
            .bearer_auth(&self.token))
    }

    /// Sends `request`; a non-success answer becomes the gateway's error.
    pub async fn send(&self, request: RequestBuilder) -> Result<Response> {
        let response = request.send().await.map_err(|e| self.connection(e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| self.connection(e))?;
        Err(CliError::from_answer(status, &body))
    }

    /// Sends `request` and reads its whole answer, whatever the status.
    pub async fn answer(&self, request: RequestBuilder) -> Result<(u16, bytes::Bytes)> {
        let response = request.send().await.map_err(|e| self.connection(e))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| self.connection(e))?;
        Ok((status, body))
    }

    /// Sends `request` and parses its JSON answer.
    pub async fn json<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T> {
        let body = self
            .send(request)
            .await?
            .bytes()
            .await
            .map_err(|e| self.connection(e))?;
        serde_json::from_slice(&body).map_err(|e| {
            CliError::Protocol(format!(
                "{e}: {}",
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            ))
        })
    }

    /// The error of a failed transfer.
    pub fn connection(&self, error: impl std::fmt::Display) -> CliError {
        CliError::Connection {
            url: self.base.clone(),
            reason: error_chain(&error.to_string()),
        }
    }
}

fn error_chain(text: &str) -> String {
    text.lines().next().unwrap_or(text).to_string()
}

/// The `X-Orchard-Timeout` value for a command that may run `seconds` (pure).
pub fn answer_timeout(seconds: u64) -> String {
    (seconds + ANSWER_TIMEOUT_MARGIN_SECONDS).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_urls_are_encoded() {
        let url = sandbox_url("http://gw:8080", "rl", "s1", &["exec"], &[]).unwrap();
        assert_eq!(
            url.as_str(),
            "http://gw:8080/v1/namespaces/rl/sandboxes/s1/exec"
        );
        let url = sandbox_url(
            "http://gw:8080/prefix/",
            "rl",
            "s1",
            &["files", "tar"],
            &[("path", "/a b/c&d=e?")],
        )
        .unwrap();
        assert_eq!(
            url.as_str(),
            "http://gw:8080/prefix/v1/namespaces/rl/sandboxes/s1/files/tar?path=%2Fa+b%2Fc%26d%3De%3F"
        );
        let sneaky = sandbox_url("http://gw", "rl", "../x", &["exec"], &[]).unwrap();
        assert!(!sneaky.path().contains("/../"), "{sneaky}");
    }

    #[test]
    fn answer_timeouts_leave_a_margin() {
        assert_eq!(answer_timeout(3600), "3630");
        assert_eq!(answer_timeout(0), "30");
    }
}
