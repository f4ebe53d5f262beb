//! The data path: a request for `.../sandboxes/{name}/<agent route>` is sent to the sandbox's agent at
//! `status.agentEndpoint` (the pod IP) with the sandbox's own token. Bodies stream through in both
//! directions without buffering or re-encoding; connections to each agent are pooled and reused.
//! Agent answers (errors included) pass through unchanged; only a missing answer becomes a gateway
//! error (502/503/504).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Method, Request, StatusCode, header};
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::oneshot;

use crate::gateway::http::errors::ApiError;
use crate::gateway::http::metrics::GatewayMetrics;
use crate::gateway::objects::lookup::AgentAccess;

/// Header a client may set to bound how long the gateway waits for the agent's answer, in seconds
/// (counted from when the request body has been sent). Defaults depend on the route.
pub const TIMEOUT_HEADER: &str = "x-orchard-timeout";

/// Longest accepted `X-Orchard-Timeout` (one day).
const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

/// How long a TCP connect to an agent may take before the agent counts as unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a proxied call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    /// Namespace of the sandbox (for messages).
    pub namespace: &'a str,
    /// Name of the sandbox (for messages).
    pub name: &'a str,
    /// Its agent's endpoint, token and `Authorization` header.
    pub agent: Arc<AgentAccess>,
}

/// Why the agent gave no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentFailure {
    /// The TCP connection was refused or reset before the request went out.
    Unreachable,
    /// The TCP connect did not finish in time.
    ConnectTimeout,
    /// The request went out but no answer came within the timeout.
    Timeout,
    /// The connection broke after the request went out.
    Broken,
}

impl AgentFailure {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::ConnectTimeout => "connect_timeout",
            Self::Timeout => "timeout",
            Self::Broken => "broken",
        }
    }
}

/// Whether repeating `method` cannot run an operation twice (so a client may retry it blindly).
pub fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
    )
}

/// The error a client sees when the agent gave no answer (pure). Failures before the request reached
/// the agent are always retryable; after it, only idempotent requests are (an exec may have run).
pub fn agent_error(failure: AgentFailure, method: &Method, target: &Target) -> ApiError {
    let sandbox = format!("{}/{}", target.namespace, target.name);
    let endpoint = &target.agent.endpoint;
    match failure {
        AgentFailure::Unreachable => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "AgentUnreachable",
            format!(
                "cannot connect to the agent of sandbox {sandbox} at {endpoint}; the sandbox may be restarting or failing (check its phase)"
            ),
        )
        .retryable(true),
        AgentFailure::ConnectTimeout => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "AgentUnavailable",
            format!(
                "connecting to the agent of sandbox {sandbox} at {endpoint} timed out after {}s",
                CONNECT_TIMEOUT.as_secs()
            ),
        )
        .retryable(true),
        AgentFailure::Timeout => ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            "AgentTimeout",
            format!(
                "the agent of sandbox {sandbox} did not answer in time; raise the `X-Orchard-Timeout` header (seconds) for long commands"
            ),
        )
        .retryable(is_idempotent(method)),
        AgentFailure::Broken if is_idempotent(method) => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "AgentConnectionLost",
            format!(
                "the connection to the agent of sandbox {sandbox} broke before it answered; the request is safe to retry"
            ),
        )
        .retryable(true),
        AgentFailure::Broken => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "AgentConnectionLost",
            format!(
                "the connection to the agent of sandbox {sandbox} broke before it answered: the command may have run; \
                 if the agent died the sandbox turns Failed (check its phase) and the work belongs on a new sandbox"
            ),
        )
        .retryable(false),
    }
}

/// The wait for the agent's answer: `X-Orchard-Timeout` when given (seconds, fractions allowed),
/// else `default`. A malformed value is a 400.
pub fn answer_timeout(headers: &HeaderMap, default: Duration) -> Result<Duration, ApiError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else {
        return Ok(default);
    };
    let seconds: f64 = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|s: &f64| s.is_finite() && *s > 0.0)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{TIMEOUT_HEADER} must be a positive number of seconds"
            ))
        })?;
    Ok(Duration::from_secs_f64(seconds).min(MAX_TIMEOUT))
}

/// A request body that reports when it has been sent completely (end of stream or dropped).
pub struct NotifyOnEnd {
    inner: Body,
    done: Option<oneshot::Sender<()>>,
}

impl NotifyOnEnd {
    pub(super) fn new(inner: Body) -> (Self, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        (
            Self {
                inner,
                done: Some(tx),
            },
            rx,
        )
    }

    fn finish(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
    }
}

impl HttpBody for NotifyOnEnd {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.finish();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Request headers passed on to the agent (everything else, the caller's token above all, stays).
const FORWARDED_REQUEST_HEADERS: &[HeaderName] =
    &[header::CONTENT_TYPE, header::CONTENT_LENGTH, header::ACCEPT];

/// Response headers that describe one hop and are not passed back.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The pooled HTTP client of every agent.
#[derive(Clone)]
pub struct AgentProxy {
    pub(super) client: Client<HttpConnector, NotifyOnEnd>,
    pub(super) metrics: GatewayMetrics,
}

impl AgentProxy {
    /// A proxy with keep-alive connection pools per agent.
    pub fn new(metrics: GatewayMetrics) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(crate::pod::agent_client::AGENT_POOL_IDLE)
            .pool_max_idle_per_host(256)
            .build(connector);
        Self { client, metrics }
    }

    /// Sends `method agent_path` (path and query as the agent expects them, e.g. `/v1/exec`) with
    /// `body` to the agent of `target`, and returns its answer as it streams in.
    pub async fn forward(
        &self,
        target: &Target<'_>,
        method: Method,
        agent_path: String,
        headers: &HeaderMap,
        body: Body,
        timeout: Duration,
    ) -> Result<Response, ApiError> {
        let uri = target.agent.url(agent_path)?;
        let (body, sent) = NotifyOnEnd::new(body);
        let mut request = Request::builder()
            .method(method.clone())
            .uri(uri)
            .body(body)
            .map_err(|err| ApiError::internal(format!("cannot build the agent request: {err}")))?;
        for name in FORWARDED_REQUEST_HEADERS {
            if let Some(value) = headers.get(name) {
                request.headers_mut().insert(name.clone(), value.clone());
            }
        }
        let headers = request.headers_mut();
        headers.insert(header::AUTHORIZATION, target.agent.authorization.clone());
        // Given here, made once per agent: the client would format it for every call.
        headers.insert(header::HOST, target.agent.host.clone());

        let answer = self.client.request(request);
        tokio::pin!(answer);
        let deadline = answer_deadline(sent, timeout);
        let result = tokio::select! {
            result = &mut answer => result.map_err(|err| classify(&err)),
            () = deadline => Err(AgentFailure::Timeout),
        };
        match result {
            Ok(response) => Ok(passed_through(response)),
            Err(failure) => {
                self.metrics
                    .agent_errors
                    .with_label_values(&[failure.label()])
                    .inc();
                Err(agent_error(failure, &method, target))
            }
        }
    }
}

/// Ends `timeout` after the request's body has been sent (or dropped), which `sent` reports.
pub(super) async fn answer_deadline(sent: oneshot::Receiver<()>, timeout: Duration) {
    let _ = sent.await;
    tokio::time::sleep(timeout).await;
}

/// The agent's answer as the gateway passes it back: status, body and end-to-end headers.
pub(super) fn passed_through(response: hyper::Response<hyper::body::Incoming>) -> Response {
    let (parts, incoming) = response.into_parts();
    let mut out = Response::new(Body::new(incoming));
    *out.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if !is_hop_by_hop(name) {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    out
}

/// Sorts a client error into the failure a caller can act on.
pub(super) fn classify(error: &hyper_util::client::legacy::Error) -> AgentFailure {
    if error.is_connect() {
        let mut source: Option<&(dyn std::error::Error + 'static)> =
            std::error::Error::source(error);
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::TimedOut
            {
                return AgentFailure::ConnectTimeout;
            }
            source = cause.source();
        }
        return AgentFailure::Unreachable;
    }
    AgentFailure::Broken
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn agent(endpoint: String) -> Arc<AgentAccess> {
        Arc::new(AgentAccess::new(endpoint, "t".into()).expect("access"))
    }

    fn target() -> Target<'static> {
        Target {
            namespace: "ns",
            name: "s",
            agent: agent("http://127.0.0.9:9090".into()),
        }
    }

    #[test]
    fn agent_failures_map_to_statuses_and_retryability() {
        let post = Method::POST;
        let get = Method::GET;
        let refused = agent_error(AgentFailure::Unreachable, &post, &target());
        assert_eq!(refused.status, StatusCode::BAD_GATEWAY);
        assert!(refused.body.retryable, "nothing reached the agent");
        assert!(refused.body.message.contains("http://127.0.0.9:9090"));
        let slow_connect = agent_error(AgentFailure::ConnectTimeout, &post, &target());
        assert_eq!(slow_connect.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(slow_connect.body.retryable);
        let exec_timeout = agent_error(AgentFailure::Timeout, &post, &target());
        assert_eq!(exec_timeout.status, StatusCode::GATEWAY_TIMEOUT);
        assert!(!exec_timeout.body.retryable, "the exec may have run");
        assert!(
            agent_error(AgentFailure::Timeout, &get, &target())
                .body
                .retryable
        );
        let broken = agent_error(AgentFailure::Broken, &post, &target());
        assert_eq!(broken.status, StatusCode::BAD_GATEWAY);
        assert!(!broken.body.retryable);
        assert!(broken.body.message.contains("may have run"));
        assert!(
            agent_error(AgentFailure::Broken, &Method::PUT, &target())
                .body
                .retryable
        );
    }

    #[test]
    fn timeout_header_overrides_the_default_and_is_validated() {
        let default = Duration::from_secs(60);
        let mut headers = HeaderMap::new();
        assert_eq!(answer_timeout(&headers, default).unwrap(), default);
        headers.insert(TIMEOUT_HEADER, HeaderValue::from_static("2.5"));
        assert_eq!(
            answer_timeout(&headers, default).unwrap(),
            Duration::from_millis(2500)
        );
        headers.insert(TIMEOUT_HEADER, HeaderValue::from_static("999999999"));
        assert_eq!(answer_timeout(&headers, default).unwrap(), MAX_TIMEOUT);
        for bad in ["0", "-1", "soon", "NaN"] {
            headers.insert(TIMEOUT_HEADER, HeaderValue::from_static(bad));
            assert_eq!(
                answer_timeout(&headers, default).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        assert!(is_hop_by_hop(&header::CONNECTION));
        assert!(is_hop_by_hop(&header::TRANSFER_ENCODING));
        assert!(!is_hop_by_hop(&header::CONTENT_TYPE));
        assert!(!is_hop_by_hop(&header::CONTENT_LENGTH));
    }

    #[tokio::test]
    async fn unreachable_agent_is_a_retryable_502() {
        // A port nothing listens on: bind, learn the port, close.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let registry = prometheus::Registry::new();
        let proxy = AgentProxy::new(GatewayMetrics::register(&registry).unwrap());
        let target = Target {
            namespace: "ns",
            name: "s",
            agent: agent(format!("http://127.0.0.1:{port}")),
        };
        let err = proxy
            .forward(
                &target,
                Method::POST,
                "/v1/exec".into(),
                &HeaderMap::new(),
                Body::from("{}"),
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_GATEWAY);
        assert_eq!(err.body.code, "AgentUnreachable");
        assert!(err.body.retryable);
    }

    /// When `answer_deadline` ends, with the body's end reported `sent_after` from the start.
    async fn deadline_after(sent_after: Duration, timeout: Duration) -> Duration {
        let started = tokio::time::Instant::now();
        let (body, sent) = NotifyOnEnd::new(Body::from("x"));
        tokio::spawn(async move {
            tokio::time::sleep(sent_after).await;
            drop(body);
        });
        answer_deadline(sent, timeout).await;
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_deadline_counts_from_the_end_of_the_body() {
        let s = Duration::from_secs;
        assert_eq!(deadline_after(Duration::ZERO, s(2)).await, s(2));
        assert_eq!(
            deadline_after(s(1), s(2)).await,
            s(3),
            "sent within the timeout"
        );
        assert_eq!(deadline_after(s(3), s(2)).await, s(5), "sent after it");
    }

    #[tokio::test]
    async fn silent_agent_times_out_with_504_after_the_body_was_sent() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _keep = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let registry = prometheus::Registry::new();
        let proxy = AgentProxy::new(GatewayMetrics::register(&registry).unwrap());
        let target = Target {
            namespace: "ns",
            name: "s",
            agent: agent(format!("http://127.0.0.1:{port}")),
        };
        let started = std::time::Instant::now();
        let err = proxy
            .forward(
                &target,
                Method::POST,
                "/v1/exec".into(),
                &HeaderMap::new(),
                Body::from("{\"argv\":[\"true\"]}"),
                Duration::from_millis(200),
            )
            .await
            .unwrap_err();
        assert_eq!(err.status, StatusCode::GATEWAY_TIMEOUT);
        assert!(started.elapsed() < Duration::from_secs(3));
    }
}
