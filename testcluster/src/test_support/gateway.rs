//! Helpers of the gateway end-to-end tests: RBAC for the test
//! cluster's token users, an HTTP client that speaks to the gateway as one of them, and sandbox setup.

use std::time::Duration;

use crate::env::TestEnv;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// Every permission a trainer needs in a namespace (what docs/API.md's example Role grants).
pub fn trainer_rules() -> Value {
    json!([
        {"apiGroups": ["orchard.dev"], "resources": ["sandboxes", "rolloutgroups"],
         "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": ["orchard.dev"],
         "resources": ["sandboxes/exec", "sandboxes/portforward", "sandboxes/files",
                       "sandboxes/heartbeat", "sandboxes/result"],
         "verbs": ["get", "create"]},
    ])
}

/// Grants `user` the `rules` in `namespace` with a Role and RoleBinding named `name`.
pub async fn grant(env: &TestEnv, namespace: &str, user: &str, name: &str, rules: Value) {
    let client = env.client().await;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "rules": rules,
    }))
    .expect("role JSON");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .expect("binding JSON");
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    Api::<RoleBinding>::namespaced(client, namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create role binding");
}

/// A caller of the gateway.
#[derive(Clone)]
pub struct Caller {
    /// Gateway base URL.
    pub base: String,
    /// Bearer token (none: unauthenticated).
    pub token: Option<String>,
    /// HTTP client (keep-alive).
    pub http: reqwest::Client,
}

/// An answer: status and body (JSON when it parses, else a string).
#[derive(Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: Value,
    /// Raw body.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body = self.body.to_string();
        let shown: String = body.chars().take(600).collect();
        write!(f, "HTTP {} {shown}", self.status)
    }
}

impl Answer {
    /// The error code of a gateway or agent error.
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or("")
    }

    /// The error message.
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }
}

impl Caller {
    /// A caller authenticating as test user `user` (`admin`, `alice`, `bob`).
    pub fn user(env: &TestEnv, user: &str) -> Self {
        Self {
            base: env.operator().gateway_url(),
            token: Some(env.control_plane.tokens[user].clone()),
            http: crate::gateway_http(),
        }
    }

    /// A caller with an arbitrary token (or none).
    pub fn with_token(env: &TestEnv, token: Option<&str>) -> Self {
        Self {
            base: env.operator().gateway_url(),
            token: token.map(str::to_string),
            http: crate::gateway_http(),
        }
    }

    /// A request builder for `method path` with the bearer token.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(Duration::from_secs(120));
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// Sends a built request and reads the whole answer.
    pub async fn send(&self, builder: reqwest::RequestBuilder) -> Answer {
        let response = builder.send().await.expect("gateway answers");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("body").to_vec();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).to_string()));
        Answer {
            status,
            body,
            bytes,
        }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Answer {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    /// `DELETE path`.
    pub async fn delete(&self, path: &str) -> Answer {
        self.send(self.request(reqwest::Method::DELETE, path)).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(self.request(reqwest::Method::POST, path).json(&body))
            .await
    }

    /// Creates a sandbox from `body` in `namespace`; returns its name.
    pub async fn create_sandbox(&self, namespace: &str, body: Value) -> String {
        let answer = self
            .post(&format!("/v1/namespaces/{namespace}/sandboxes"), body)
            .await;
        assert_eq!(answer.status, 201, "create: {answer:?}");
        answer.body["metadata"]["name"]
            .as_str()
            .expect("created sandbox has a name")
            .to_string()
    }

    /// Waits (server side) until the sandbox is Ready; panics otherwise.
    pub async fn wait_ready(&self, namespace: &str, name: &str) -> Value {
        let answer = self
            .get(&format!(
                "/v1/namespaces/{namespace}/sandboxes/{name}/wait?timeoutSeconds=90"
            ))
            .await;
        assert_eq!(answer.status, 200, "wait: {answer:?}");
        assert_eq!(answer.body["status"]["phase"], "Ready", "{answer:?}");
        answer.body
    }

    /// `POST .../exec` with `request`.
    pub async fn exec(&self, namespace: &str, name: &str, request: Value) -> Answer {
        self.post(
            &format!("/v1/namespaces/{namespace}/sandboxes/{name}/exec"),
            request,
        )
        .await
    }
}

/// Path of a sandbox route.
pub fn sandbox_path(namespace: &str, name: &str, rest: &str) -> String {
    format!("/v1/namespaces/{namespace}/sandboxes/{name}{rest}")
}

/// Starts an operator of its own for `namespace` only (`--watch-namespace`), with the replica
/// identity `identity` (it names the operator's requests in the audit log) and `extra_args`.
pub async fn scoped_operator(
    env: &TestEnv,
    namespace: &str,
    identity: &str,
    extra_args: &[&str],
) -> crate::operator_process::OperatorProcess {
    let mut args = vec![
        format!("--watch-namespace={namespace}"),
        format!("--identity={identity}"),
    ];
    args.extend(extra_args.iter().map(|a| a.to_string()));
    crate::operator_process::OperatorProcess::start(
        &crate::binaries::operator_bin().expect("operator binary"),
        &env.control_plane.kubeconfig,
        &env.dir
            .join(format!("logs/orchard-operator-{identity}.log")),
        &args,
    )
    .await
    .expect("operator starts")
}

impl Caller {
    /// A caller of the gateway at `base` with `token` (or none), on a client of its own.
    pub fn at(base: &str, token: Option<&str>) -> Self {
        Self {
            base: base.to_string(),
            token: token.map(str::to_string),
            http: crate::gateway_http(),
        }
    }
}

/// How many requests to `resource` the audit log of `env` holds from clients whose User-Agent
/// contains `agent` (the environment must have been started with `audit_log`).
pub fn audited_requests(env: &TestEnv, resource: &str, agent: &str) -> usize {
    let path = env
        .control_plane
        .audit_log()
        .expect("the environment writes an audit log");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| {
            event["objectRef"]["resource"] == resource
                && event["userAgent"]
                    .as_str()
                    .is_some_and(|ua| ua.contains(agent))
        })
        .count()
}

/// A streamed exec (`POST .../exec/stream`) of a command that prints `tick N` twice a second for a
/// minute, read up to its second tick: a call in progress, for tests that take its caller's access
/// away.
pub struct TickingStream {
    chunks: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    /// The NDJSON read so far.
    pub text: String,
}

impl TickingStream {
    /// Starts the stream in sandbox `namespace/name` as `caller` and reads it up to `tick 2`.
    pub async fn start(caller: &Caller, namespace: &str, name: &str) -> Self {
        use futures::StreamExt;
        let response = caller
            .request(
                reqwest::Method::POST,
                &sandbox_path(namespace, name, "/exec/stream"),
            )
            .json(&json!({"command": "for i in $(seq 1 120); do echo tick $i; sleep 0.5; done"}))
            .send()
            .await
            .expect("stream");
        assert_eq!(response.status(), 200);
        let mut stream = Self {
            chunks: response.bytes_stream().boxed(),
            text: String::new(),
        };
        while !stream.text.contains("tick 2") {
            let chunk = tokio::time::timeout(Duration::from_secs(10), stream.chunks.next())
                .await
                .expect("output within 10 s")
                .expect("the stream goes on")
                .expect("chunk");
            stream.text.push_str(&String::from_utf8_lossy(&chunk));
        }
        stream
    }

    /// Reads the rest of the stream; false if it still runs after `limit`.
    pub async fn ends_within(&mut self, limit: Duration) -> bool {
        use futures::StreamExt;
        let chunks = &mut self.chunks;
        let text = &mut self.text;
        tokio::time::timeout(limit, async {
            while let Some(chunk) = chunks.next().await {
                text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
            }
        })
        .await
        .is_ok()
    }

    /// Asserts that the stream ended with an `AccessRevoked` error event and that the command was
    /// not left to finish.
    pub fn assert_revoked(&self) {
        let last: Value =
            serde_json::from_str(self.text.lines().last().expect("a last line")).expect("NDJSON");
        assert_eq!(last["type"], "error", "{last}");
        assert_eq!(last["code"], "AccessRevoked", "{last}");
        assert!(
            !self.text.contains("\"exit\""),
            "the command was not left to finish: {}",
            self.text
        );
    }
}

/// What a tunnel request got: the upgraded connection, or the gateway's refusal.
pub enum Tunnel {
    /// `101 Switching Protocols`: the connection now carries the port's bytes.
    Open(tokio::net::TcpStream),
    /// Any other answer, with its body.
    Refused(Answer),
}

impl Caller {
    /// Asks for a tunnel to `port` in sandbox `namespace/name` on a connection of its own (raw
    /// HTTP/1.1, since the answer is an upgrade).
    pub async fn tunnel(&self, namespace: &str, name: &str, port: &str) -> Tunnel {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let address = self
            .base
            .strip_prefix("http://")
            .expect("an http:// gateway URL");
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect to the gateway");
        let authorization = self
            .token
            .as_ref()
            .map(|token| format!("Authorization: Bearer {token}\r\n"))
            .unwrap_or_default();
        let path = sandbox_path(namespace, name, &format!("/ports/{port}/tunnel"));
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        );
        stream
            .write_all(head.as_bytes())
            .await
            .expect("send the request");
        // Byte by byte up to the end of the head: nothing of the tunnel may be read past it.
        let mut answer = Vec::new();
        while !answer.ends_with(b"\r\n\r\n") {
            let byte = stream.read_u8().await.expect("the answer's head");
            answer.push(byte);
        }
        let head = String::from_utf8_lossy(&answer).to_string();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .expect("a status line");
        if status == 101 {
            return Tunnel::Open(stream);
        }
        let header = |wanted: &str| {
            head.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case(wanted)
                    .then(|| value.trim().to_ascii_lowercase())
            })
        };
        let bytes = match header("content-length") {
            Some(length) => {
                let mut bytes = vec![0; length.parse().expect("a content length")];
                stream
                    .read_exact(&mut bytes)
                    .await
                    .expect("the refusal's body");
                bytes
            }
            None => {
                assert_eq!(
                    header("transfer-encoding").as_deref(),
                    Some("chunked"),
                    "a body of unknown length: {head}"
                );
                let mut raw = Vec::new();
                while !raw.ends_with(b"0\r\n\r\n") {
                    raw.push(stream.read_u8().await.expect("the refusal's body"));
                }
                dechunk(&raw)
            }
        };
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).to_string()));
        Tunnel::Refused(Answer {
            status,
            body,
            bytes,
        })
    }
}

/// Sends an HTTP/1.0 `GET path` through an open tunnel and reads the answer until the server closes.
pub async fn get_through(mut tunnel: tokio::net::TcpStream, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tunnel
        .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .expect("send through the tunnel");
    let mut answer = Vec::new();
    tunnel
        .read_to_end(&mut answer)
        .await
        .expect("read through the tunnel");
    String::from_utf8_lossy(&answer).to_string()
}

/// The data of a chunked HTTP/1.1 body (`raw` ends with the last chunk).
fn dechunk(raw: &[u8]) -> Vec<u8> {
    let mut data = Vec::new();
    let mut rest = raw;
    loop {
        let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return data;
        };
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|size| usize::from_str_radix(size.trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 {
            return data;
        }
        let start = end + 2;
        data.extend_from_slice(&rest[start..start + size]);
        rest = &rest[start + size + 2..];
    }
}
