//! A small typed client for the operator's own calls to sandbox agents (the trajectory runner): start
//! a background process, wait for it, read a file. Pooled HTTP/1.1 connections over the pod network;
//! every call carries the sandbox's token. The gateway proxies user traffic separately. Requests and
//! answers are the agent's wire types of [`orchard_api::agent`].

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use orchard_api::agent::{ExecRequest, ProcessStatus};
use serde::Serialize;

/// Where an agent listens and the token it accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTarget {
    /// `http://<podIP>:<port>`.
    pub endpoint: String,
    /// The sandbox's bearer token.
    pub token: String,
}

/// What went wrong talking to an agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentCallError {
    /// The agent could not be reached (connection refused, reset, timeout): worth retrying.
    #[error("agent unreachable: {0}")]
    Unreachable(String),
    /// The agent answered with an error status.
    #[error("agent answered {status}: {body}")]
    Status {
        /// HTTP status.
        status: u16,
        /// Response body (truncated).
        body: String,
    },
    /// The agent's answer was not what its API promises.
    #[error("unexpected agent response: {0}")]
    Protocol(String),
}

/// Most bytes of a result file the operator reads.
pub const MAX_RESULT_BYTES: usize = 1 << 20;

/// A pooled client for agents.
#[derive(Clone)]
pub struct AgentClient {
    http: Client<HttpConnector, Full<Bytes>>,
    /// `--simulated-agent` (KWOK test clusters): no call leaves the process; an identity is taken as
    /// told, everything else is [`AgentCallError::Unreachable`].
    simulated: bool,
}

impl Default for AgentClient {
    fn default() -> Self {
        Self::new()
    }
}

/// How long a pooled connection to an agent may idle: below the agent's header-read timeout (10 s by
/// default), after which the agent closes it; a request sent on a connection the agent is closing
/// at that moment would fail without an answer.
pub const AGENT_POOL_IDLE: Duration = Duration::from_secs(5);

impl AgentClient {
    /// A client with connect timeouts suited to pod networks.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(3)));
        connector.set_nodelay(true);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(AGENT_POOL_IDLE)
            .pool_max_idle_per_host(4)
            .build(connector);
        Self {
            http,
            simulated: false,
        }
    }

    /// A client for pods with no agent behind them (`--simulated-agent`, KWOK test clusters): a
    /// claimed member's identity is taken as told without a call, and every other call fails as
    /// unreachable, naming the flag.
    pub fn simulated() -> Self {
        Self {
            simulated: true,
            ..Self::new()
        }
    }

    async fn call(
        &self,
        target: &AgentTarget,
        method: Method,
        path_and_query: &str,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Duration,
        limit: usize,
    ) -> Result<(StatusCode, Bytes), AgentCallError> {
        if self.simulated {
            return Err(AgentCallError::Unreachable(format!(
                "{path_and_query}: --simulated-agent: no agent runs behind this pod"
            )));
        }
        let uri = format!(
            "{}{}",
            target.endpoint.trim_end_matches('/'),
            path_and_query
        );
        let mut builder = Request::builder()
            .method(method)
            .uri(&uri)
            .header("authorization", format!("Bearer {}", target.token));
        let payload = match body {
            Some(json) => {
                builder = builder.header("content-type", "application/json");
                Bytes::from(serde_json::to_vec(json).map_err(|e| {
                    AgentCallError::Protocol(format!("cannot encode the request to {uri}: {e}"))
                })?)
            }
            None => Bytes::new(),
        };
        let request = builder
            .body(Full::new(payload))
            .map_err(|e| AgentCallError::Protocol(format!("cannot build request to {uri}: {e}")))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| AgentCallError::Unreachable(format!("{uri}: {e}")))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| AgentCallError::Protocol(format!("reading {uri}: {e}")))?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(timeout, exchange).await.map_err(|_| {
            AgentCallError::Unreachable(format!("{uri}: no answer within {timeout:?}"))
        })?
    }

    /// Starts `argv` as background process `id` with an agent-side timeout. If a process with that id
    /// already exists (a restarted operator), returns its status instead.
    pub async fn start_process(
        &self,
        target: &AgentTarget,
        id: &str,
        argv: &[String],
        timeout_seconds: i64,
    ) -> Result<ProcessStatus, AgentCallError> {
        let body = ExecRequest {
            id: Some(id.to_string()),
            argv: Some(argv.to_vec()),
            timeout_seconds: Some(timeout_seconds as f64),
            // Never evicted from the agent's process table before the runner has read its end.
            keep: Some(true),
            ..ExecRequest::default()
        };
        let (status, bytes) = self
            .call(
                target,
                Method::POST,
                "/v1/processes",
                Some(&body),
                Duration::from_secs(30),
                64 << 10,
            )
            .await?;
        match status {
            StatusCode::CREATED | StatusCode::OK => parse_status(&bytes),
            StatusCode::CONFLICT => {
                // The 409 body carries the existing process' status (the agent contract), but read it
                // explicitly so a different body shape cannot confuse us.
                self.process(target, id, 0).await
            }
            other => Err(status_error(other, &bytes)),
        }
    }

    /// The status of process `id`; with `wait_seconds` > 0 the agent answers as soon as it exits, or
    /// after that many seconds.
    pub async fn process(
        &self,
        target: &AgentTarget,
        id: &str,
        wait_seconds: u64,
    ) -> Result<ProcessStatus, AgentCallError> {
        let path = format!("/v1/processes/{id}?wait={wait_seconds}&output=false");
        let (status, bytes) = self
            .call(
                target,
                Method::GET,
                &path,
                None::<&()>,
                Duration::from_secs(wait_seconds + 15),
                64 << 10,
            )
            .await?;
        if status != StatusCode::OK {
            return Err(status_error(status, &bytes));
        }
        parse_status(&bytes)
    }

    /// Kills process `id` (its whole group).
    pub async fn kill_process(&self, target: &AgentTarget, id: &str) -> Result<(), AgentCallError> {
        let (status, bytes) = self
            .call(
                target,
                Method::DELETE,
                &format!("/v1/processes/{id}"),
                None::<&()>,
                Duration::from_secs(15),
                64 << 10,
            )
            .await?;
        match status {
            s if s.is_success() || s == StatusCode::NOT_FOUND => Ok(()),
            other => Err(status_error(other, &bytes)),
        }
    }

    /// Tells the agent which Sandbox it serves (`PUT /v1/identity`): later commands get
    /// `ORCHARD_SANDBOX=<sandbox>`. Sent when a Sandbox claims a pool member.
    pub async fn set_identity(
        &self,
        target: &AgentTarget,
        sandbox: &str,
    ) -> Result<(), AgentCallError> {
        if self.simulated {
            return Ok(());
        }
        let body = orchard_api::agent::AgentIdentity {
            sandbox: sandbox.to_string(),
        };
        let (status, bytes) = self
            .call(
                target,
                Method::PUT,
                "/v1/identity",
                Some(&body),
                Duration::from_secs(5),
                64 << 10,
            )
            .await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(status_error(status, &bytes))
        }
    }

    /// Reads a file of at most [`MAX_RESULT_BYTES`]; `Ok(None)` when it does not exist.
    pub async fn read_file(
        &self,
        target: &AgentTarget,
        path: &str,
    ) -> Result<Option<Bytes>, AgentCallError> {
        let query = format!("/v1/files?path={}", percent_encode(path));
        match self
            .call(
                target,
                Method::GET,
                &query,
                None::<&()>,
                Duration::from_secs(30),
                MAX_RESULT_BYTES,
            )
            .await
        {
            Ok((StatusCode::OK, bytes)) => Ok(Some(bytes)),
            Ok((StatusCode::NOT_FOUND, _)) => Ok(None),
            Ok((status, bytes)) => Err(status_error(status, &bytes)),
            Err(AgentCallError::Protocol(message)) if message.contains("length limit") => Err(
                AgentCallError::Protocol(format!("{path} is larger than {MAX_RESULT_BYTES} bytes")),
            ),
            Err(err) => Err(err),
        }
    }
}

fn parse_status(bytes: &[u8]) -> Result<ProcessStatus, AgentCallError> {
    serde_json::from_slice::<ProcessStatus>(bytes)
        .map_err(|e| AgentCallError::Protocol(format!("process status: {e}")))
}

fn status_error(status: StatusCode, bytes: &[u8]) -> AgentCallError {
    AgentCallError::Status {
        status: status.as_u16(),
        body: String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).to_string(),
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved characters and `/` pass through).
pub fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(byte as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_simulated_client_takes_an_identity_and_refuses_everything_else_without_a_call() {
        // Nothing listens on port 9 of this address: a call that left the process would fail
        // differently (and slowly), not name the flag.
        let target = AgentTarget {
            endpoint: "http://192.0.2.1:9".into(),
            token: "t".into(),
        };
        let client = AgentClient::simulated();
        client
            .set_identity(&target, "s1")
            .await
            .expect("an identity is taken as told");
        let refused = client
            .start_process(&target, "orchard-run", &["true".to_string()], 5)
            .await
            .expect_err("no agent runs processes");
        assert!(matches!(refused, AgentCallError::Unreachable(_)));
        assert!(
            refused.to_string().contains("--simulated-agent"),
            "{refused}"
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            percent_encode("/tmp/orchard-result.json"),
            "/tmp/orchard-result.json"
        );
        assert_eq!(percent_encode("/a b/c&d=e"), "/a%20b/c%26d%3De");
    }

    #[test]
    fn process_status_parses_the_agent_shape() {
        let status = parse_status(br#"{"id":"orchard-run","pid":7,"argv":["python","/task/run.py"],"state":"exited","exitCode":0,"signal":null,"timedOut":false,"oomKilled":false,"startedAt":"x","finishedAt":"y","durationMs":5,"stderr":"boom","stdoutTruncated":false,"stderrTruncated":false,"stdoutLossy":false,"stderrLossy":false,"outputEncoding":"text"}"#).unwrap();
        assert!(status.exited());
        assert_eq!(status.exit_code, Some(0));
        assert_eq!(status.stderr.as_deref(), Some("boom"));
        assert!(!status.timed_out);
    }
}
