//! The egress proxy end to end, on loopback only: real sockets, a static resolver (`allowed.test`
//! is 127.0.0.2, `other.test` 127.0.0.3, `internal.test` 127.0.0.1), sandboxes told apart by the
//! source address their client binds (127.0.0.1, 127.0.1.x). Every wait is on an event with a
//! timeout; nothing sleeps to synchronise.

use std::collections::BTreeSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use orchard_api::{EgressPolicy, EgressRule, HostDeny, NetworkSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::audit::{Cut, RecordingAudit, Via};
use super::proxy::{ProxyDeps, serve};
use super::resolve::{Protected, StaticResolver};
use super::rules::{Decision, Rules};
use super::table::{PolicyTable, SandboxPolicy};
use crate::pod::cidr::Cidr;

/// Longest wait for anything that should happen at once.
const WAIT: Duration = Duration::from_secs(5);

/// How soon a policy change must cut an open connection.
const CUT_WITHIN: Duration = Duration::from_secs(1);

fn ip(text: &str) -> IpAddr {
    text.parse().expect(text)
}

fn resolver() -> StaticResolver {
    StaticResolver::default()
        .with("allowed.test", [ip("127.0.0.2")])
        .with("other.test", [ip("127.0.0.3")])
        .with("internal.test", [ip("127.0.0.1")])
        .with("mixed.test", [ip("127.0.0.1"), ip("127.0.0.2")])
}

fn host(pattern: &str) -> EgressRule {
    EgressRule {
        cidr: None,
        host: Some(pattern.into()),
        ports: vec![],
    }
}

fn cidr(range: &str) -> EgressRule {
    EgressRule {
        cidr: Some(range.into()),
        host: None,
        ports: vec![],
    }
}

fn allow(rules: Vec<EgressRule>, deny: &[&str]) -> NetworkSpec {
    NetworkSpec {
        egress: EgressPolicy::AllowList,
        allow: rules,
        deny: deny
            .iter()
            .map(|host| HostDeny {
                host: (*host).into(),
            })
            .collect(),
    }
}

fn sandbox(name: &str, generation: i64, network: &NetworkSpec) -> Arc<SandboxPolicy> {
    Arc::new(SandboxPolicy {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        generation,
        rules: Rules::of(Some(network)).expect("rules compile"),
    })
}

fn table(entries: &[(&str, Arc<SandboxPolicy>)]) -> Arc<PolicyTable> {
    let mut table = PolicyTable::default();
    for (address, policy) in entries {
        table.insert(ip(address), policy.clone());
    }
    Arc::new(table)
}

/// A running proxy and its handles.
struct Proxy {
    addr: SocketAddr,
    tables: watch::Sender<Arc<PolicyTable>>,
    audit: Arc<RecordingAudit>,
    shutdown: CancellationToken,
    served: JoinHandle<io::Result<()>>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start(table: Arc<PolicyTable>) -> Proxy {
    start_with(table, Protected::none(), Duration::from_secs(5)).await
}

async fn start_with(
    table: Arc<PolicyTable>,
    protected: Protected,
    header_read_timeout: Duration,
) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let addr = listener.local_addr().expect("proxy address");
    let (tables, receiver) = watch::channel(table);
    let audit = Arc::new(RecordingAudit::default());
    let deps = ProxyDeps {
        table: receiver,
        resolver: Arc::new(resolver()),
        protected: watch::channel(Arc::new(protected)).1,
        audit: audit.clone(),
        connect_timeout: Duration::from_secs(2),
        header_read_timeout,
    };
    let shutdown = CancellationToken::new();
    let served = tokio::spawn(serve(listener, deps, shutdown.clone()));
    Proxy {
        addr,
        tables,
        audit,
        shutdown,
        served,
    }
}

/// A TCP echo server on `address` (port chosen by the system).
async fn echo_upstream(address: &str) -> SocketAddr {
    let listener = TcpListener::bind((ip(address), 0))
        .await
        .expect("bind echo");
    let addr = listener.local_addr().expect("echo address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut reader, mut writer) = stream.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            });
        }
    });
    addr
}

/// A plain-HTTP server on `addr` that reports the head of every request it reads and answers
/// `hello`.
async fn http_upstream(addr: SocketAddr) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let listener = TcpListener::bind(addr).await.expect("bind http upstream");
    let addr = listener.local_addr().expect("upstream address");
    let (heads, seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                let head = read_head(&mut stream).await;
                let _ = heads.send(head);
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                    )
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A plain-HTTP server that promises 1000 bytes, sends 7 and then holds the connection.
async fn stalling_upstream(address: &str) -> SocketAddr {
    let listener = TcpListener::bind((ip(address), 0))
        .await
        .expect("bind stalling upstream");
    let addr = listener.local_addr().expect("upstream address");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                read_head(&mut stream).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial")
                    .await;
                // Hold the connection until the proxy closes it.
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
            });
        }
    });
    addr
}

/// A client connection to the proxy from `source`.
async fn client(proxy: SocketAddr, source: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(ip(source), 0))
        .expect("bind source");
    socket.connect(proxy).await.expect("connect to the proxy")
}

/// Reads one message head (through the blank line), byte by byte so nothing after it is consumed;
/// what came before EOF if the peer closed first.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let read = tokio::time::timeout(WAIT, async {
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no head within {WAIT:?}: {head:?}");
    String::from_utf8_lossy(&head).into_owned()
}

/// One answer of the proxy.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The head, lowercased.
    head: String,
    body: String,
}

impl Answer {
    fn denied(&self) -> bool {
        self.status == 403 && self.head.contains("\r\nx-orchard-egress: denied\r\n")
    }
}

/// Reads an answer: its head, then `Content-Length` bytes of body (none when absent).
async fn read_answer(stream: &mut TcpStream) -> Answer {
    let head = read_head(stream).await.to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head:?}"));
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    tokio::time::timeout(WAIT, stream.read_exact(&mut body))
        .await
        .expect("body within the wait")
        .expect("body read");
    Answer {
        status,
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// `CONNECT authority` from `source`: the answer, and the connection (a tunnel after a 200).
async fn connect_via(proxy: SocketAddr, source: &str, authority: &str) -> (Answer, TcpStream) {
    let mut stream = client(proxy, source).await;
    stream
        .write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .expect("send CONNECT");
    let answer = read_answer(&mut stream).await;
    (answer, stream)
}

/// Sends `request` from `source` and reads the answer.
async fn request_via(proxy: SocketAddr, source: &str, request: &str) -> Answer {
    let mut stream = client(proxy, source).await;
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send request");
    read_answer(&mut stream).await
}

/// Whether `tunnel` echoes what it is sent.
async fn echoes(tunnel: &mut TcpStream, text: &str) -> bool {
    if tunnel.write_all(text.as_bytes()).await.is_err() {
        return false;
    }
    let mut back = vec![0u8; text.len()];
    matches!(
        tokio::time::timeout(WAIT, tunnel.read_exact(&mut back)).await,
        Ok(Ok(_))
    ) && back == text.as_bytes()
}

/// Whether the peer closes `stream` within `wait` (bytes still in flight are drained).
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    tokio::time::timeout(wait, async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn connect_to_an_allowed_name_tunnels_bytes_both_ways() {
    let echo = echo_upstream("127.0.0.2").await;
    let a = sandbox("a", 1, &allow(vec![host("allowed.test")], &[]));
    let proxy = start(table(&[("127.0.0.1", a)])).await;
    let (answer, mut tunnel) = connect_via(
        proxy.addr,
        "127.0.0.1",
        &format!("allowed.test:{}", echo.port()),
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer
            .head
            .starts_with("http/1.1 200 connection established\r\n"),
        "{answer:?}"
    );
    assert!(echoes(&mut tunnel, "ping").await);
    assert!(echoes(&mut tunnel, "and a longer second message").await);
    let records = proxy.audit.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].sandbox.as_deref(), Some("ns/a"));
    assert_eq!(
        (records[0].host.as_str(), records[0].port, records[0].via),
        ("allowed.test", echo.port(), Via::Connect)
    );
    assert_eq!(
        records[0].decision,
        Decision::Allow {
            rule: "allowed.test".into()
        }
    );
}

#[tokio::test]
async fn connect_to_a_name_not_allowed_is_refused_with_403() {
    let a = sandbox("a", 1, &allow(vec![host("*.test")], &["other.test"]));
    let proxy = start(table(&[("127.0.0.1", a)])).await;
    let cases = [
        (
            "other.test:443",
            "other.test matches network.deny entry other.test\n",
        ),
        ("pypi.org:443", "pypi.org:443 is not in network.allow\n"),
        ("test:443", "test:443 is not in network.allow\n"),
    ];
    for (authority, reason) in cases {
        let (answer, _) = connect_via(proxy.addr, "127.0.0.1", authority).await;
        assert!(answer.denied(), "{authority}: {answer:?}");
        assert!(
            answer
                .head
                .contains("\r\ncontent-type: text/plain; charset=utf-8\r\n"),
            "{answer:?}"
        );
        assert_eq!(answer.body, reason, "{authority}");
    }
    let denials: Vec<Option<String>> = proxy
        .audit
        .records()
        .into_iter()
        .map(|record| match record.decision {
            Decision::Deny { rule, .. } => rule,
            Decision::Allow { rule } => panic!("allowed by {rule}"),
        })
        .collect();
    assert_eq!(denials, vec![Some("other.test".into()), None, None]);
}

#[tokio::test]
async fn connect_to_an_ip_literal_needs_a_cidr_rule() {
    let echo = echo_upstream("127.0.0.2").await;
    let a = sandbox(
        "a",
        1,
        &allow(vec![host("allowed.test"), cidr("127.0.0.2/32")], &[]),
    );
    let b = sandbox("b", 1, &allow(vec![host("*")], &[]));
    let proxy = start(table(&[("127.0.1.1", a), ("127.0.1.2", b)])).await;
    let port = echo.port();

    let (answer, mut tunnel) =
        connect_via(proxy.addr, "127.0.1.1", &format!("127.0.0.2:{port}")).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(echoes(&mut tunnel, "by address").await);

    let (answer, _) = connect_via(proxy.addr, "127.0.1.1", &format!("127.0.0.3:{port}")).await;
    assert!(answer.denied(), "{answer:?}");
    assert!(
        answer
            .body
            .starts_with(&format!("127.0.0.3:{port} is not in network.allow"))
    );

    // `*` is every name, never an address.
    let (answer, _) = connect_via(proxy.addr, "127.0.1.2", &format!("127.0.0.2:{port}")).await;
    assert!(answer.denied(), "{answer:?}");
    assert!(answer.body.contains("never host names"), "{answer:?}");
    let (answer, _) = connect_via(
        proxy.addr,
        "127.0.1.2",
        &format!("[::ffff:127.0.0.2]:{port}"),
    )
    .await;
    assert!(answer.denied(), "{answer:?}");
}

#[tokio::test]
async fn protected_addresses_are_never_reached() {
    let echo = echo_upstream("127.0.0.2").await;
    let port = echo.port();
    let mut protected = Protected::none();
    protected.extend([Cidr::parse("127.0.0.1/32").expect("cidr")]);
    let a = sandbox("a", 1, &allow(vec![host("*"), cidr("127.0.0.0/8")], &[]));
    let proxy = start_with(table(&[("127.0.0.1", a.clone())]), protected, WAIT).await;
    let cases = [
        (
            format!("internal.test:{port}"),
            "internal.test resolves only to addresses sandboxes never reach\n",
        ),
        (
            format!("127.0.0.1:{port}"),
            "127.0.0.1 is an address sandboxes never reach\n",
        ),
        (
            format!("[::ffff:127.0.0.1]:{port}"),
            "127.0.0.1 is an address sandboxes never reach\n",
        ),
    ];
    for (authority, reason) in &cases {
        let (answer, _) = connect_via(proxy.addr, "127.0.0.1", authority).await;
        assert!(answer.denied(), "{authority}: {answer:?}");
        assert_eq!(answer.body, *reason);
    }
    // A name with a protected and a reachable address reaches the reachable one.
    let (answer, mut tunnel) =
        connect_via(proxy.addr, "127.0.0.1", &format!("mixed.test:{port}")).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(echoes(&mut tunnel, "not loopback one").await);
    let allowed: Vec<bool> = proxy
        .audit
        .records()
        .iter()
        .map(|record| record.decision.is_allowed())
        .collect();
    assert_eq!(allowed, vec![false, false, false, true]);

    // The defaults protect all of loopback.
    let defaults = start_with(table(&[("127.0.0.1", a)]), Protected::defaults(), WAIT).await;
    let (answer, _) =
        connect_via(defaults.addr, "127.0.0.1", &format!("allowed.test:{port}")).await;
    assert!(answer.denied(), "{answer:?}");
    assert_eq!(
        answer.body,
        "allowed.test resolves only to addresses sandboxes never reach\n"
    );
}

#[tokio::test]
async fn absolute_form_get_reaches_the_checked_host_in_origin_form() {
    let (upstream, mut heads) = http_upstream(SocketAddr::new(ip("127.0.0.2"), 0)).await;
    let port = upstream.port();
    let a = sandbox("a", 1, &allow(vec![host("allowed.test")], &[]));
    let proxy = start(table(&[("127.0.0.1", a)])).await;
    let answer = request_via(
        proxy.addr,
        "127.0.0.1",
        &format!(
            "GET http://Allowed.Test:{port}/simple/pkg/?x=1 HTTP/1.1\r\n\
             Host: allowed.test:{port}\r\n\
             Proxy-Authorization: Basic c2VjcmV0\r\n\
             Proxy-Connection: keep-alive\r\n\
             Accept: */*\r\n\
             Connection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (200, "hello"),
        "{answer:?}"
    );
    let head = tokio::time::timeout(WAIT, heads.recv())
        .await
        .expect("upstream saw a request")
        .expect("head")
        .to_ascii_lowercase();
    assert!(
        head.starts_with("get /simple/pkg/?x=1 http/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains(&format!("\r\nhost: allowed.test:{port}\r\n")),
        "{head}"
    );
    assert!(head.contains("\r\naccept: */*\r\n"), "{head}");
    assert!(!head.contains("proxy-"), "{head}");
    let records = proxy.audit.records();
    assert_eq!(
        (
            records[0].host.as_str(),
            records[0].via,
            records[0].decision.is_allowed()
        ),
        ("allowed.test", Via::Http, true)
    );
}

#[tokio::test]
async fn a_lying_host_header_does_not_redirect_the_request() {
    let (allowed, mut allowed_heads) = http_upstream(SocketAddr::new(ip("127.0.0.2"), 0)).await;
    let port = allowed.port();
    // other.test's address, on the same port when it is free.
    let other = TcpListener::bind((ip("127.0.0.3"), port)).await.ok();
    let a = sandbox(
        "a",
        1,
        &allow(vec![host("allowed.test"), host("other.test")], &[]),
    );
    let b = sandbox("b", 1, &allow(vec![host("allowed.test")], &[]));
    let proxy = start(table(&[("127.0.1.1", a), ("127.0.1.2", b)])).await;

    let answer = request_via(
        proxy.addr,
        "127.0.1.1",
        &format!(
            "GET http://allowed.test:{port}/ HTTP/1.1\r\nHost: other.test:{port}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let head = tokio::time::timeout(WAIT, allowed_heads.recv())
        .await
        .expect("allowed.test's address saw the request")
        .expect("head")
        .to_ascii_lowercase();
    assert!(
        head.contains(&format!("\r\nhost: allowed.test:{port}\r\n")),
        "{head}"
    );
    if let Some(other) = other {
        let accepted = tokio::time::timeout(Duration::ZERO, other.accept()).await;
        assert!(accepted.is_err(), "other.test's address was contacted");
    }

    // The URL is checked, not the Host header.
    let answer = request_via(
        proxy.addr,
        "127.0.1.2",
        &format!(
            "GET http://other.test:{port}/ HTTP/1.1\r\nHost: allowed.test:{port}\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(answer.denied(), "{answer:?}");
    assert_eq!(
        answer.body,
        format!("other.test:{port} is not in network.allow\n")
    );
}

#[tokio::test]
async fn requests_that_are_not_proxy_requests_are_refused_with_400() {
    let a = sandbox("a", 1, &allow(vec![host("*")], &[]));
    let proxy = start(table(&[("127.0.0.1", a)])).await;
    let cases = [
        (
            "GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "this is the Orchard egress proxy: set HTTP_PROXY/HTTPS_PROXY to use it\n",
        ),
        (
            "GET https://pypi.org/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "use CONNECT for https:// URLs (the proxy never sees inside TLS); set HTTPS_PROXY\n",
        ),
        (
            "CONNECT pypi.org HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
            "CONNECT needs a host:port target, e.g. CONNECT pypi.org:443\n",
        ),
        (
            "CONNECT bad..name:443 HTTP/1.1\r\nHost: bad..name\r\n\r\n",
            "\"bad..name\" is not a host name: it has an empty label (two dots in a row, or a leading dot)\n",
        ),
    ];
    for (request, message) in cases {
        let answer = request_via(proxy.addr, "127.0.0.1", request).await;
        assert_eq!(answer.status, 400, "{request}: {answer:?}");
        assert!(!answer.head.contains("x-orchard-egress"), "{answer:?}");
        assert_eq!(answer.body, message, "{request}");
    }
    assert!(proxy.audit.records().is_empty(), "no decision was made");
}

#[tokio::test]
async fn an_unknown_source_address_is_refused() {
    let echo = echo_upstream("127.0.0.2").await;
    let a = sandbox("a", 1, &allow(vec![host("allowed.test")], &[]));
    let proxy = start(table(&[("127.0.1.1", a)])).await;
    let (answer, _) = connect_via(
        proxy.addr,
        "127.0.0.1",
        &format!("allowed.test:{}", echo.port()),
    )
    .await;
    assert!(answer.denied(), "{answer:?}");
    assert_eq!(answer.body, "no sandbox has source address 127.0.0.1\n");
    let records = proxy.audit.records();
    assert_eq!(records[0].sandbox, None);
    assert_eq!(records[0].source, ip("127.0.0.1"));
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502() {
    // A port nothing listens on: bind, learn it, close.
    let closed = std::net::TcpListener::bind("127.0.0.2:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port");
    let a = sandbox("a", 1, &allow(vec![host("*")], &[]));
    let proxy = start(table(&[("127.0.0.1", a)])).await;
    let (answer, _) = connect_via(
        proxy.addr,
        "127.0.0.1",
        &format!("allowed.test:{}", closed.port()),
    )
    .await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert_eq!(
        answer.body,
        format!(
            "cannot connect to allowed.test:{port} ({closed}: connection refused)\n",
            port = closed.port()
        )
    );
    let (answer, _) = connect_via(proxy.addr, "127.0.0.1", "nowhere.test:443").await;
    assert_eq!(answer.status, 502, "{answer:?}");
    assert!(
        answer.body.starts_with("cannot resolve nowhere.test"),
        "{answer:?}"
    );
    // The policy allowed both; the upstream failed.
    assert!(
        proxy
            .audit
            .records()
            .iter()
            .all(|r| r.decision.is_allowed())
    );
}

#[tokio::test]
async fn a_policy_change_cuts_an_open_tunnel_and_refuses_new_ones() {
    let echo = echo_upstream("127.0.0.2").await;
    let port = echo.port();
    let before = allow(vec![host("allowed.test"), cidr("127.0.0.2/32")], &[]);
    let proxy = start(table(&[("127.0.0.1", sandbox("a", 1, &before))])).await;
    let (answer, mut by_name) =
        connect_via(proxy.addr, "127.0.0.1", &format!("allowed.test:{port}")).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let (answer, mut by_address) =
        connect_via(proxy.addr, "127.0.0.1", &format!("127.0.0.2:{port}")).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(echoes(&mut by_name, "before").await);

    let after = allow(vec![host("other.test"), cidr("127.0.0.2/32")], &[]);
    proxy
        .tables
        .send(table(&[("127.0.0.1", sandbox("a", 2, &after))]))
        .expect("proxy watches the table");
    assert!(
        closed_within(&mut by_name, CUT_WITHIN).await,
        "the tunnel to allowed.test was not cut within {CUT_WITHIN:?}"
    );
    let cuts = tokio::time::timeout(WAIT, proxy.audit.wait_for_cuts(1))
        .await
        .expect("cut reported");
    assert_eq!(
        cuts,
        vec![Cut {
            sandbox: "ns/a".into(),
            host: "allowed.test".into(),
            port
        }]
    );
    assert!(echoes(&mut by_address, "still allowed").await);
    let (answer, _) = connect_via(proxy.addr, "127.0.0.1", &format!("allowed.test:{port}")).await;
    assert!(answer.denied(), "{answer:?}");
}

#[tokio::test]
async fn a_policy_change_aborts_an_http_answer_in_flight() {
    let upstream = stalling_upstream("127.0.0.2").await;
    let port = upstream.port();
    let a = allow(vec![host("allowed.test")], &[]);
    let proxy = start(table(&[("127.0.0.1", sandbox("a", 1, &a))])).await;
    let mut stream = client(proxy.addr, "127.0.0.1").await;
    stream
        .write_all(
            format!("GET http://allowed.test:{port}/big HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .await
        .expect("send");
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut first = [0u8; 7];
    tokio::time::timeout(WAIT, stream.read_exact(&mut first))
        .await
        .expect("first bytes within the wait")
        .expect("first bytes");
    assert_eq!(&first, b"partial");

    proxy
        .tables
        .send(table(&[(
            "127.0.0.1",
            sandbox("a", 2, &allow(vec![host("other.test")], &[])),
        )]))
        .expect("proxy watches the table");
    assert!(
        closed_within(&mut stream, CUT_WITHIN).await,
        "the answer in flight was not cut within {CUT_WITHIN:?}"
    );
    let cuts = tokio::time::timeout(WAIT, proxy.audit.wait_for_cuts(1))
        .await
        .expect("cut reported");
    assert_eq!(cuts[0].host, "allowed.test");
}

#[tokio::test]
async fn fifty_sandboxes_each_reach_only_their_own_host() {
    const SANDBOXES: u8 = 50;
    let echo = echo_upstream("127.0.0.2").await;
    let port = echo.port();
    let mut resolver_names = Vec::new();
    let mut entries = Vec::new();
    for n in 1..=SANDBOXES {
        let name = format!("host-{n}.test");
        let policy = sandbox(&format!("s{n}"), 1, &allow(vec![host(&name)], &[]));
        entries.push((format!("127.0.1.{n}"), policy));
        resolver_names.push(name);
    }
    let mut policies = PolicyTable::default();
    for (address, policy) in &entries {
        policies.insert(ip(address), policy.clone());
    }
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let addr = listener.local_addr().expect("proxy address");
    let resolver = resolver_names
        .iter()
        .fold(StaticResolver::default(), |resolver, name| {
            resolver.with(name, [ip("127.0.0.2")])
        });
    let (_tables, receiver) = watch::channel(Arc::new(policies));
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    tokio::spawn(serve(
        listener,
        ProxyDeps {
            table: receiver,
            resolver: Arc::new(resolver),
            protected: watch::channel(Arc::new(Protected::none())).1,
            audit: Arc::new(RecordingAudit::default()),
            connect_timeout: Duration::from_secs(2),
            header_read_timeout: WAIT,
        },
        shutdown,
    ));

    let mut tries = tokio::task::JoinSet::new();
    for source in 1..=SANDBOXES {
        tries.spawn(async move {
            let mut reached = Vec::new();
            for target in 1..=SANDBOXES {
                let (answer, mut tunnel) = connect_via(
                    addr,
                    &format!("127.0.1.{source}"),
                    &format!("host-{target}.test:{port}"),
                )
                .await;
                match answer.status {
                    200 => {
                        assert!(echoes(&mut tunnel, "mine").await);
                        reached.push((source, target));
                    }
                    403 => assert_eq!(
                        answer.body,
                        format!("host-{target}.test:{port} is not in network.allow\n")
                    ),
                    other => panic!("{source} -> {target}: {other} {answer:?}"),
                }
            }
            reached
        });
    }
    let mut reached = BTreeSet::new();
    while let Some(joined) = tries.join_next().await {
        reached.extend(joined.expect("source finished"));
    }
    let expected: BTreeSet<(u8, u8)> = (1..=SANDBOXES).map(|n| (n, n)).collect();
    assert_eq!(reached, expected);
}

#[tokio::test]
async fn an_address_claimed_by_two_sandboxes_is_refused_for_both() {
    let echo = echo_upstream("127.0.0.2").await;
    let network = allow(vec![host("allowed.test")], &[]);
    let mut policies = PolicyTable::default();
    policies.insert(ip("127.0.1.7"), sandbox("a", 1, &network));
    policies.insert(ip("127.0.1.7"), sandbox("b", 1, &network));
    policies.insert(ip("127.0.1.8"), sandbox("c", 1, &network));
    assert_eq!(policies.conflicts(), vec![ip("127.0.1.7")]);
    let proxy = start(Arc::new(policies)).await;
    let authority = format!("allowed.test:{}", echo.port());
    let (answer, _) = connect_via(proxy.addr, "127.0.1.7", &authority).await;
    assert!(answer.denied(), "{answer:?}");
    assert!(
        answer
            .body
            .starts_with("source address 127.0.1.7 is claimed by more than one sandbox"),
        "{answer:?}"
    );
    assert_eq!(proxy.audit.records()[0].sandbox, None);
    let (answer, _) = connect_via(proxy.addr, "127.0.1.8", &authority).await;
    assert_eq!(answer.status, 200, "{answer:?}");
}

#[tokio::test]
async fn a_silent_client_is_disconnected() {
    let proxy = start_with(
        Arc::new(PolicyTable::default()),
        Protected::none(),
        Duration::from_millis(200),
    )
    .await;
    let mut silent = client(proxy.addr, "127.0.0.1").await;
    assert!(closed_within(&mut silent, WAIT).await);
}

#[tokio::test]
async fn shutdown_closes_tunnels_and_stops_accepting() {
    let echo = echo_upstream("127.0.0.2").await;
    let a = sandbox("a", 1, &allow(vec![host("allowed.test")], &[]));
    let proxy = start(table(&[("127.0.0.1", a)])).await;
    let (answer, mut tunnel) = connect_via(
        proxy.addr,
        "127.0.0.1",
        &format!("allowed.test:{}", echo.port()),
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(echoes(&mut tunnel, "before shutdown").await);
    let mut proxy = proxy;
    proxy.shutdown.cancel();
    assert!(closed_within(&mut tunnel, WAIT).await, "tunnel left open");
    tokio::time::timeout(WAIT, &mut proxy.served)
        .await
        .expect("serve returned")
        .expect("joined")
        .expect("served without error");
    assert!(
        TcpStream::connect(proxy.addr).await.is_err(),
        "still accepting"
    );
}
