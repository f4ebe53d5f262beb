//! The gateway's hardening limits on the local cluster, each test with an operator of its own (scoped
//! to its namespace, with the flags under test): slow and silent clients are disconnected after the
//! header-read timeout; connections beyond the limit wait and requests beyond the in-flight limit are
//! shed with a retryable 503; a flood of bogus tokens costs the API server at most the TokenReview
//! budget (counted in its audit log) while a valid caller keeps being served from the cache, and
//! concurrent first calls with one token share one review; with
//! audiences configured only tokens issued for them are accepted; an exec stream ends with an
//! `AccessRevoked` event, a wait with 403 `AccessRevoked` and a long download is cut, soon after the
//! caller's RoleBinding is deleted; bodies of callers without access are never read, an authorised
//! caller's slow or many bodies are bounded, and one caller's waits leave room for other callers.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, PostParams};
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::operator_process::{OperatorProcess, metric_sum};
use orchard_testcluster::test_support::gateway::{
    Caller, TickingStream, Tunnel, audited_requests, get_through, grant, sandbox_path,
    scoped_operator, trainer_rules,
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One test at a time: they measure times and count API requests on a two-core machine.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The cluster of this test binary: no shared operator (each test starts its own), an audit log.
fn env() -> &'static TestEnv {
    static ENV: OnceLock<TestEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        TestEnv::start_named_on_own_thread(
            "gwlimits",
            EnvOptions {
                operator: false,
                audit_log: true,
                ..EnvOptions::default()
            },
        )
    })
}

/// Reads from `stream` until the peer closes it; `None` if it is still open after `wait`.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(wait, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| seen)
}

fn gateway_addr(operator: &OperatorProcess) -> String {
    format!("127.0.0.1:{}", operator.gateway_port)
}

async fn metric(operator: &OperatorProcess, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum(&operator.metrics().await.expect("metrics"), name, labels)
}

/// Waits until the operator's gauge `name{labels}` satisfies `done`, or fails after 20 s naming
/// `what` and the last value.
async fn gauge_until(
    operator: &OperatorProcess,
    name: &str,
    labels: &[(&str, &str)],
    what: &str,
    done: impl Fn(f64) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let value = metric(operator, name, labels).await;
        if done(value) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {name} is {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the gateway serves `count` connections.
async fn open_connections_reach(operator: &OperatorProcess, count: f64) {
    let what = format!("the gateway never served {count} connections");
    gauge_until(
        operator,
        "orchard_gateway_open_connections",
        &[],
        &what,
        |open| open == count,
    )
    .await;
}

/// A Ready sandbox of `caller` in `namespace`.
async fn ready_sandbox(caller: &Caller, namespace: &str) -> String {
    let name = caller
        .create_sandbox(namespace, json!({"image": "busybox"}))
        .await;
    caller.wait_ready(namespace, &name).await;
    name
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_silent_clients_are_disconnected_after_the_header_timeout() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("gwl-slow").await;
    let operator = scoped_operator(
        env,
        &ns,
        "gwl-slow",
        &["--gateway-header-read-timeout-seconds=2"],
    )
    .await;
    let addr = gateway_addr(&operator);

    // Correctness bounds, not speed: not closed before the 2 s timeout, closed long before "never"
    // (the silent one within 12 s; the trickling one before its 15 s of header bytes are all sent).
    let started = Instant::now();
    let mut silent = TcpStream::connect(&addr).await.expect("connect");
    let mut trickle = TcpStream::connect(&addr).await.expect("connect");
    let header = b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaa";
    let trickler = tokio::spawn(async move {
        // One header byte every 300 ms: always sending, never done.
        let mut sent = 0;
        for byte in header {
            if trickle.write_all(&[*byte]).await.is_err() {
                break;
            }
            sent += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        (trickle, sent)
    });
    assert!(
        closed_within(&mut silent, Duration::from_secs(12))
            .await
            .is_some(),
        "a connection that sends nothing is still open after 12 s"
    );
    let silent_closed = started.elapsed();
    let (mut trickle, sent) = trickler.await.expect("trickler");
    let trickle_closed = started.elapsed();
    assert!(
        sent < header.len(),
        "the trickling client sent all {sent} header bytes ({trickle_closed:?}) without being cut"
    );
    assert!(
        closed_within(&mut trickle, Duration::from_secs(1))
            .await
            .is_some(),
        "a connection trickling headers is still open"
    );
    assert!(
        silent_closed >= Duration::from_millis(1900),
        "silent connection closed after {silent_closed:?}, before the 2 s timeout"
    );
    eprintln!("silent closed after {silent_closed:?}, trickling after {trickle_closed:?}");

    // A prompt client is served as before.
    let (status, _) = orchard_testcluster::http_get(&addr, "/healthz")
        .await
        .expect("healthz");
    assert_eq!(status, 200);
    env.delete_namespace(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_wait_and_requests_beyond_the_limit_are_shed() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("gwl-limits").await;
    let operator = scoped_operator(
        env,
        &ns,
        "gwl-limits",
        &[
            "--gateway-max-connections=6",
            "--gateway-max-in-flight-requests=2",
        ],
    )
    .await;
    let addr = gateway_addr(&operator);

    // Connections: six idle ones take every slot; a seventh is not served until one closes.
    let mut idle = Vec::new();
    for _ in 0..6 {
        idle.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    open_connections_reach(&operator, 6.0).await;
    let mut seventh = TcpStream::connect(&addr)
        .await
        .expect("the kernel queues the seventh connection");
    seventh
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    assert!(
        closed_within(&mut seventh, Duration::from_secs(2))
            .await
            .is_none(),
        "the seventh connection was served while six were open"
    );
    assert_eq!(
        metric(&operator, "orchard_gateway_open_connections", &[]).await,
        6.0
    );
    let freed = Instant::now();
    idle.pop();
    let answer = closed_within(&mut seventh, Duration::from_secs(5))
        .await
        .expect("served once a connection closed");
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    eprintln!(
        "seventh connection served {:?} after a slot freed",
        freed.elapsed()
    );
    drop(idle);
    open_connections_reach(&operator, 0.0).await;

    // Requests: two execs in flight take every slot; a third request is shed, retryably.
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let token = env.control_plane.tokens["alice"].clone();
    let alice = Caller::at(&operator.gateway_url(), Some(&token));
    let name = ready_sandbox(&alice, &ns).await;
    let slow = |caller: Caller| {
        let (ns, name) = (ns.clone(), name.clone());
        tokio::spawn(async move {
            let caller = Caller::at(&caller.base, caller.token.as_deref());
            caller
                .exec(&ns, &name, json!({"argv": ["/bin/sh", "-c", "sleep 3"]}))
                .await
        })
    };
    let first = slow(alice.clone());
    let second = slow(alice.clone());
    gauge_until(
        &operator,
        "orchard_gateway_requests_in_flight",
        &[("pool", "calls")],
        "the two execs never held their slots",
        |held| held >= 2.0,
    )
    .await;
    let third = Caller::at(&alice.base, alice.token.as_deref());
    let response = third
        .request(reqwest::Method::GET, &sandbox_path(&ns, &name, ""))
        .send()
        .await
        .expect("answer");
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: serde_json::Value = response.json().await.expect("JSON error");
    assert_eq!(body["code"], "Overloaded", "{body}");
    assert_eq!(body["retryable"], true, "{body}");
    // Agent calls, served before the router, draw from the same pool.
    let shed_exec = third.exec(&ns, &name, json!({"argv": ["true"]})).await;
    assert_eq!(shed_exec.status, 503, "{shed_exec:?}");
    assert_eq!(shed_exec.code(), "Overloaded");
    assert_eq!(first.await.expect("exec").status, 200);
    assert_eq!(second.await.expect("exec").status, 200);
    let again = third.get(&sandbox_path(&ns, &name, "")).await;
    assert_eq!(again.status, 200, "{again:?}");
    // A percent-encoded name is left to the router, which decodes it: the same sandbox, the same
    // route label.
    let encoded = format!("%{:02X}{}", name.as_bytes()[0], &name[1..]);
    let through_router = third
        .post(
            &sandbox_path(&ns, &encoded, "/exec"),
            json!({"argv": ["true"]}),
        )
        .await;
    assert_eq!(through_router.status, 200, "{through_router:?}");
    let exec_route = "/v1/namespaces/{namespace}/sandboxes/{name}/exec";
    let counted = |code: &'static str| {
        let operator = &operator;
        async move {
            metric(
                operator,
                "orchard_gateway_requests_total",
                &[("route", exec_route), ("code", code)],
            )
            .await
        }
    };
    assert_eq!(
        counted("200").await,
        3.0,
        "two slow execs and the encoded one"
    );
    assert_eq!(counted("503").await, 1.0, "the shed exec");
    assert!(
        metric(
            &operator,
            "orchard_gateway_throttled_total",
            &[("reason", "in_flight")]
        )
        .await
            >= 1.0
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bogus_tokens_stays_within_the_review_budget_and_starves_nobody() {
    const RATE: f64 = 5.0;
    const BURST: f64 = 10.0;
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("gwl-flood").await;
    let identity = format!("gwl-flood-{}", std::process::id());
    let operator = scoped_operator(
        env,
        &ns,
        &identity,
        &[
            "--gateway-token-review-rate=5",
            "--gateway-token-review-burst=10",
            "--gateway-token-review-rate-per-client=5",
            "--gateway-token-review-burst-per-client=10",
        ],
    )
    .await;
    let agent = format!("({identity})");
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let token = env.control_plane.tokens["alice"].clone();
    let alice = Caller::at(&operator.gateway_url(), Some(&token));
    let list = format!("/v1/namespaces/{ns}/sandboxes");
    // alice's token is reviewed once and cached.
    let warm = alice.get(&list).await;
    assert_eq!(warm.status, 200, "{warm:?}");
    let reviews_before = audited_requests(env, "tokenreviews", &agent);
    let hits_before = metric(
        &operator,
        "orchard_gateway_auth_cache_total",
        &[("cache", "token"), ("result", "hit")],
    )
    .await;

    let started = Instant::now();
    let flood_for = Duration::from_secs(3);
    let flooders: Vec<_> = (0..8)
        .map(|worker| {
            let base = operator.gateway_url();
            let list = list.clone();
            tokio::spawn(async move {
                let http = orchard_testcluster::gateway_http();
                let (mut refused, mut throttled, mut n) = (0u32, 0u32, 0u32);
                while started.elapsed() < flood_for {
                    n += 1;
                    let response = http
                        .get(format!("{base}{list}"))
                        .bearer_auth(format!("bogus-{worker}-{n}"))
                        .send()
                        .await
                        .expect("gateway answers");
                    match response.status().as_u16() {
                        401 => refused += 1,
                        429 => {
                            assert!(response.headers().contains_key("retry-after"));
                            let body: serde_json::Value = response.json().await.expect("JSON");
                            assert_eq!(body["retryable"], true, "{body}");
                            throttled += 1;
                        }
                        other => panic!("a bogus token got {other}"),
                    }
                }
                (refused, throttled)
            })
        })
        .collect();
    let mut valid_calls = 0u32;
    while started.elapsed() < flood_for {
        let answer = alice.get(&list).await;
        assert_eq!(
            answer.status, 200,
            "the valid caller was starved: {answer:?}"
        );
        valid_calls += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut refused, mut throttled) = (0, 0);
    for flooder in flooders {
        let (r, t) = flooder.await.expect("flooder");
        refused += r;
        throttled += t;
    }
    let elapsed = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reviews = audited_requests(env, "tokenreviews", &agent) - reviews_before;
    let hits = metric(
        &operator,
        "orchard_gateway_auth_cache_total",
        &[("cache", "token"), ("result", "hit")],
    )
    .await
        - hits_before;
    let budget = BURST + RATE * elapsed;
    eprintln!(
        "{elapsed:.1} s flood: {refused} refused (401), {throttled} throttled (429), {reviews} TokenReviews (budget {budget:.0}); valid caller {valid_calls} calls, {hits} cache hits"
    );
    assert!(throttled > 0, "the flood was never throttled");
    assert!(
        reviews as f64 <= budget + 1.0,
        "{reviews} TokenReviews in {elapsed:.1} s, budget {budget:.0}"
    );
    assert!(reviews > 0, "the audit log shows the flood's reviews");
    assert_eq!(
        hits,
        f64::from(valid_calls),
        "every call of the valid caller came from the cache (bogus tokens are all distinct)"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_with_one_token_share_one_review() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("gwl-burst").await;
    let identity = format!("gwl-burst-{}", std::process::id());
    // A per-client budget of 2 reviews: 20 concurrent first calls would exhaust it ten times over if
    // each asked for its own review.
    let operator = scoped_operator(
        env,
        &ns,
        &identity,
        &[
            "--gateway-token-review-rate-per-client=1",
            "--gateway-token-review-burst-per-client=2",
        ],
    )
    .await;
    let agent = format!("({identity})");
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let alice = Caller::at(
        &operator.gateway_url(),
        Some(&env.control_plane.tokens["alice"]),
    );
    let list = format!("/v1/namespaces/{ns}/sandboxes");
    let reviews_before = audited_requests(env, "tokenreviews", &agent);
    let answers = futures::future::join_all((0..20).map(|_| alice.get(&list))).await;
    for answer in &answers {
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reviews = audited_requests(env, "tokenreviews", &agent) - reviews_before;
    assert_eq!(reviews, 1, "one TokenReview for 20 concurrent first calls");
    env.delete_namespace(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_audiences_only_tokens_issued_for_them_are_accepted() {
    const AUDIENCE: &str = "orchard-gateway-e2e";
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("gwl-aud").await;
    let operator = scoped_operator(
        env,
        &ns,
        "gwl-aud",
        &[&format!("--gateway-token-audiences=other,{AUDIENCE}")],
    )
    .await;
    let client = env.client().await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client, &ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "trainer"}})).expect("SA JSON");
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("create service account");
    grant(
        env,
        &ns,
        &format!("system:serviceaccount:{ns}:trainer"),
        "trainer",
        trainer_rules(),
    )
    .await;
    let token_for = |audiences: Vec<String>| {
        let accounts = accounts.clone();
        async move {
            let request = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: Some(audiences).filter(|a| !a.is_empty()),
                    expiration_seconds: Some(600),
                    ..TokenRequestSpec::default()
                }),
                ..TokenRequest::default()
            };
            accounts
                .create_token_request("trainer", &PostParams::default(), &request)
                .await
                .expect("token request")
                .status
                .expect("token")
                .token
                .expect("token")
        }
    };
    let list = format!("/v1/namespaces/{ns}/sandboxes");
    let ours = token_for(vec![AUDIENCE.to_string()]).await;
    let accepted = Caller::at(&operator.gateway_url(), Some(&ours))
        .get(&list)
        .await;
    assert_eq!(accepted.status, 200, "{accepted:?}");

    // A token for the API server (the default audience) could be replayed there: refused.
    let api_server = token_for(Vec::new()).await;
    let refused = Caller::at(&operator.gateway_url(), Some(&api_server))
        .get(&list)
        .await;
    assert_eq!(refused.status, 401, "{refused:?}");
    assert!(
        refused.message().contains("accepts only tokens issued for")
            && refused.message().contains(AUDIENCE),
        "the 401 says which tokens to use: {refused:?}"
    );
    // So is a static token (valid for the API server's audience only).
    let static_token = env.control_plane.tokens["alice"].clone();
    let alice = Caller::at(&operator.gateway_url(), Some(&static_token))
        .get(&list)
        .await;
    assert_eq!(alice.status, 401, "{alice:?}");
    env.delete_namespace(&ns).await;
}

/// The auth cache TTL of the revocation tests' operators: calls re-check their caller every second.
const TTL_SECONDS: u64 = 2;

/// A namespace named after `prefix` with an operator of its own whose auth cache lasts
/// [`TTL_SECONDS`], and alice granted a trainer's Role (RoleBinding `trainer`) in it.
async fn short_ttl_operator(env: &TestEnv, prefix: &str) -> (String, OperatorProcess) {
    let ns = env.namespace(prefix).await;
    let ttl_flag = format!("--gateway-auth-cache-ttl-seconds={TTL_SECONDS}");
    let operator = scoped_operator(env, &ns, prefix, &[&ttl_flag]).await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    (ns, operator)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_stream_and_a_wait_end_soon_after_access_is_revoked() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let (ns, operator) = short_ttl_operator(env, "gwl-revoke").await;
    let token = env.control_plane.tokens["alice"].clone();
    let alice = Caller::at(&operator.gateway_url(), Some(&token));
    let name = ready_sandbox(&alice, &ns).await;
    // A RolloutGroup whose one trajectory runs for ten minutes: a wait on it runs its whole timeout.
    let group = alice
        .post(
            &format!("/v1/namespaces/{ns}/rolloutgroups"),
            json!({"groupSize": 1, "maxTrajectories": 1, "stride": 1,
                   "template": {"image": "busybox",
                                "run": {"command": ["sleep", "600"], "timeoutSeconds": 900}}}),
        )
        .await;
    assert_eq!(group.status, 201, "{group:?}");
    let group = group.body["metadata"]["name"]
        .as_str()
        .expect("group name")
        .to_string();
    let wait = {
        let (alice, ns) = (alice.clone(), ns.clone());
        tokio::spawn(async move {
            alice
                .get(&format!(
                    "/v1/namespaces/{ns}/rolloutgroups/{group}/wait?timeoutSeconds=60"
                ))
                .await
        })
    };

    // A 64 MiB download the caller reads slowly: it outlives the caller's access.
    let made = alice
        .exec(
            &ns,
            &name,
            json!({"argv": ["/bin/sh", "-c", "head -c 67108864 /dev/zero > big.bin"]}),
        )
        .await;
    assert_eq!(made.status, 200, "{made:?}");
    let download = alice
        .request(
            reqwest::Method::GET,
            &sandbox_path(&ns, &name, "/files?path=big.bin"),
        )
        .send()
        .await
        .expect("download");
    assert_eq!(download.status(), 200);
    let mut download = download.bytes_stream();
    let first = download
        .next()
        .await
        .expect("the download starts")
        .expect("chunk");
    let mut downloaded = first.len();

    let mut stream = TickingStream::start(&alice, &ns, &name).await;

    Api::<RoleBinding>::namespaced(env.client().await, &ns)
        .delete("trainer", &DeleteParams::default())
        .await
        .expect("delete the role binding");
    let revoked = Instant::now();
    let limit = Duration::from_secs(TTL_SECONDS * 2 + 4);
    let ended = stream.ends_within(limit).await;
    let took = revoked.elapsed();
    assert!(ended, "the stream still runs {limit:?} after revocation");
    stream.assert_revoked();
    eprintln!("stream ended {took:?} after the RoleBinding was deleted (TTL {TTL_SECONDS} s)");
    let waited = tokio::time::timeout(limit, wait)
        .await
        .expect("the wait ends soon after revocation")
        .expect("wait task");
    let wait_took = revoked.elapsed();
    assert_eq!(waited.status, 403, "{waited:?}");
    assert_eq!(waited.code(), "AccessRevoked", "{waited:?}");
    eprintln!("wait ended {wait_took:?} after the RoleBinding was deleted");
    // The download, read on now, ends before its end (the gateway sent what it had buffered).
    let mut cut = false;
    while let Some(chunk) = tokio::time::timeout(limit, download.next())
        .await
        .expect("the download ends soon after revocation")
    {
        match chunk {
            Ok(chunk) => downloaded += chunk.len(),
            Err(_) => {
                cut = true;
                break;
            }
        }
    }
    eprintln!("download cut after {downloaded} of 67108864 bytes");
    assert!(
        cut && downloaded < 67_108_864,
        "the download went on after revocation ({downloaded} bytes, cut: {cut})"
    );
    assert!(
        metric(&operator, "orchard_gateway_revoked_total", &[]).await >= 1.0,
        "revocation counted"
    );
    env.delete_namespace(&ns).await;
}

/// A port nothing on this machine listens on (bound, learnt, closed).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// A TCP echo server on 127.0.0.1 (`python3 -c ECHO_SERVER PORT`) that keeps every connection open
/// until its client closes it.
const ECHO_SERVER: &str = "
import socketserver, sys
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(4096):
            self.request.sendall(data)
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(('127.0.0.1', int(sys.argv[1])), Echo).serve_forever()
";

/// Sends a `GET /hello.txt` through `tunnel` and reads the answer until the server closes.
async fn fetch_hello(tunnel: TcpStream) -> String {
    get_through(tunnel, "/hello.txt").await
}

fn opened(tunnel: Tunnel) -> TcpStream {
    match tunnel {
        Tunnel::Open(stream) => stream,
        Tunnel::Refused(answer) => panic!("tunnel refused: {answer:?}"),
    }
}

fn refused(tunnel: Tunnel) -> orchard_testcluster::test_support::gateway::Answer {
    match tunnel {
        Tunnel::Open(_) => panic!("a tunnel opened that should have been refused"),
        Tunnel::Refused(answer) => answer,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_reaches_a_loopback_server_and_ends_on_revocation() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let (ns, operator) = short_ttl_operator(env, "gwl-tunnel").await;
    // Everything a trainer may do but forward ports.
    let mut rules = trainer_rules();
    rules[1]["resources"]
        .as_array_mut()
        .expect("subresources")
        .retain(|resource| resource != "sandboxes/portforward");
    grant(env, &ns, "bob", "runner", rules).await;
    let alice = Caller::at(
        &operator.gateway_url(),
        Some(&env.control_plane.tokens["alice"]),
    );
    let bob = Caller::at(
        &operator.gateway_url(),
        Some(&env.control_plane.tokens["bob"]),
    );
    let name = ready_sandbox(&alice, &ns).await;

    // An HTTP server bound to the sandbox's loopback only.
    let port = free_port();
    let put = alice
        .send(
            alice
                .request(
                    reqwest::Method::PUT,
                    &sandbox_path(&ns, &name, "/files?path=site/hello.txt"),
                )
                .body("hello through the tunnel\n"),
        )
        .await;
    assert!(put.status < 300, "{put:?}");
    let server = alice
        .post(
            &sandbox_path(&ns, &name, "/processes"),
            json!({"argv": ["python3", "-m", "http.server", "--bind", "127.0.0.1",
                            "--directory", "site", port.to_string()]}),
        )
        .await;
    assert_eq!(server.status, 201, "{server:?}");
    let port_text = port.to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match alice.tunnel(&ns, &name, &port_text).await {
            Tunnel::Open(stream) => break fetch_hello(stream).await,
            Tunnel::Refused(answer) if Instant::now() < deadline && answer.status == 502 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Tunnel::Refused(answer) => panic!("the server never came up: {answer:?}"),
        }
    };
    assert!(first.starts_with("HTTP/1.0 200"), "{first}");
    assert!(first.ends_with("hello through the tunnel\n"), "{first}");

    // 100 connections at once, each through a tunnel of its own.
    let answers = futures::future::join_all((0..100).map(|_| {
        let (alice, ns, name, port) = (alice.clone(), ns.clone(), name.clone(), port_text.clone());
        async move { fetch_hello(opened(alice.tunnel(&ns, &name, &port).await)).await }
    }))
    .await;
    let served = answers
        .iter()
        .filter(|answer| answer.ends_with("hello through the tunnel\n"))
        .count();
    assert_eq!(
        served,
        100,
        "{:?}",
        answers.iter().find(|a| !a.contains("hello"))
    );

    // Refusals, each before anything is upgraded.
    let nothing = refused(alice.tunnel(&ns, &name, &free_port().to_string()).await);
    assert_eq!(nothing.status, 502, "{nothing:?}");
    assert!(
        nothing.message().contains("nothing accepts connections"),
        "{nothing:?}"
    );
    let bad_port = refused(alice.tunnel(&ns, &name, "70000").await);
    assert_eq!(bad_port.status, 400, "{bad_port:?}");
    assert!(bad_port.message().contains("1 to 65535"), "{bad_port:?}");
    let denied = refused(bob.tunnel(&ns, &name, &port_text).await);
    assert_eq!(denied.status, 403, "{denied:?}");
    assert!(
        denied
            .message()
            .contains("cannot create sandboxes/portforward"),
        "{denied:?}"
    );
    let plain = alice
        .get(&sandbox_path(&ns, &name, &format!("/ports/{port}/tunnel")))
        .await;
    assert_eq!(plain.status, 400, "{plain:?}");
    assert!(plain.message().contains("Upgrade: tcp"), "{plain:?}");

    // An open tunnel to an echo server, which never closes a connection itself, ends once access
    // is revoked.
    let echo_port = free_port();
    let echo = alice
        .post(
            &sandbox_path(&ns, &name, "/processes"),
            json!({"argv": ["python3", "-c", ECHO_SERVER, echo_port.to_string()]}),
        )
        .await;
    assert_eq!(echo.status, 201, "{echo:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut held = loop {
        match alice.tunnel(&ns, &name, &echo_port.to_string()).await {
            Tunnel::Open(stream) => break stream,
            Tunnel::Refused(answer) if Instant::now() < deadline && answer.status == 502 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Tunnel::Refused(answer) => panic!("the echo server never came up: {answer:?}"),
        }
    };
    let mut buffer = vec![0u8; 4096];
    for round in ["ping 1\n", "ping 2\n"] {
        held.write_all(round.as_bytes()).await.expect("send");
        let read = held.read(&mut buffer).await.expect("echo");
        assert_eq!(&buffer[..read], round.as_bytes());
        // The tunnel outlives a re-check of its caller (every TTL/2).
        tokio::time::sleep(Duration::from_secs(TTL_SECONDS)).await;
    }
    assert_eq!(
        metric(&operator, "orchard_gateway_open_tunnels", &[]).await,
        1.0,
        "the open tunnel is counted"
    );
    let revocations = metric(&operator, "orchard_gateway_revoked_total", &[]).await;
    Api::<RoleBinding>::namespaced(env.client().await, &ns)
        .delete("trainer", &DeleteParams::default())
        .await
        .expect("delete the role binding");
    let revoked = Instant::now();
    let limit = Duration::from_secs(TTL_SECONDS * 2 + 4);
    let ended = tokio::time::timeout(limit, async {
        loop {
            match held.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "the tunnel still runs {limit:?} after revocation"
    );
    eprintln!(
        "tunnel cut {:?} after the RoleBinding was deleted",
        revoked.elapsed()
    );
    assert!(
        metric(&operator, "orchard_gateway_revoked_total", &[]).await > revocations,
        "the cut is counted as a revocation"
    );
    gauge_until(
        &operator,
        "orchard_gateway_open_tunnels",
        &[],
        "tunnels closed",
        |open| open == 0.0,
    )
    .await;
    env.delete_namespace(&ns).await;
}

/// The operator's resident memory in bytes (`VmRSS` of `/proc/<pid>/status`).
fn resident_bytes(operator: &OperatorProcess) -> u64 {
    let pid = operator.pid().expect("the operator runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// What became of one connection that announced a large body: the status line of its answer (empty
/// if none came) and whether the gateway closed the connection.
struct Announced {
    status: String,
    closed: bool,
}

/// Opens a connection, sends the head of `POST path` announcing a 2,000,000-byte body with the
/// `authorization` header (if any), then up to 1 MiB of that body as fast as the gateway takes it, and
/// reads what the gateway answers within `wait` (the rest of the body is never sent).
async fn announce_large_body(
    addr: String,
    path: String,
    authorization: Option<String>,
    wait: Duration,
) -> Announced {
    let mut stream = TcpStream::connect(&addr).await.expect("connect");
    let auth = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n{auth}Content-Length: 2000000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let (mut reader, mut writer) = stream.into_split();
    let sender = tokio::spawn(async move {
        let chunk = vec![b' '; 64 * 1024];
        for _ in 0..16 {
            match tokio::time::timeout(Duration::from_secs(1), writer.write_all(&chunk)).await {
                Ok(Ok(())) => {}
                // The gateway stopped reading (a full socket buffer) or closed the connection.
                _ => break,
            }
        }
        writer
    });
    let mut seen = Vec::new();
    let closed = tokio::time::timeout(wait, async {
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    drop(sender.await);
    let text = String::from_utf8_lossy(&seen);
    Announced {
        status: text.lines().next().unwrap_or_default().to_string(),
        closed,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_of_callers_without_access_are_never_read() {
    const CONNECTIONS: usize = 600;
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("gwl-bodies").await;
    let operator = scoped_operator(env, &ns, "gwl-bodies", &[]).await;
    let addr = gateway_addr(&operator);
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    // bob may read sandboxes, not create them.
    grant(
        env,
        &ns,
        "bob",
        "reader",
        json!([{"apiGroups": ["orchard.dev"], "resources": ["sandboxes"], "verbs": ["get", "list"]}]),
    )
    .await;
    let alice = Caller::at(
        &operator.gateway_url(),
        Some(&env.control_plane.tokens["alice"]),
    );
    let bob_token = env.control_plane.tokens["bob"].clone();
    let list = format!("/v1/namespaces/{ns}/sandboxes");
    assert_eq!(alice.get(&list).await.status, 200);
    let idle = resident_bytes(&operator);

    // 600 connections announce 2 MB bodies: most without a token, some with a bogus one, some as
    // bob, who may not create sandboxes. None may have its body read.
    let started = Instant::now();
    let flood: Vec<_> = (0..CONNECTIONS)
        .map(|n| {
            let authorization = match n % 6 {
                0 => Some(format!("Bearer bogus-{n}")),
                1 => Some(format!("Bearer {bob_token}")),
                _ => None,
            };
            tokio::spawn(announce_large_body(
                addr.clone(),
                list.clone(),
                authorization,
                Duration::from_secs(20),
            ))
        })
        .collect();
    let mut peak = idle;
    let mut served = 0;
    while flood.iter().any(|task| !task.is_finished())
        && started.elapsed() < Duration::from_secs(30)
    {
        peak = peak.max(resident_bytes(&operator));
        let answer = tokio::time::timeout(Duration::from_secs(10), alice.get(&list))
            .await
            .expect("an authorised caller is answered during the flood");
        assert_eq!(answer.status, 200, "{answer:?}");
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for task in flood {
        let announced = task.await.expect("connection task");
        assert!(
            announced.closed,
            "a connection with an unread body is still open: {}",
            announced.status
        );
        *statuses.entry(announced.status).or_default() += 1;
    }
    peak = peak.max(resident_bytes(&operator));
    eprintln!(
        "{CONNECTIONS} announced bodies answered in {:?}: {statuses:?}; operator RSS idle {} MiB, peak {} MiB; the authorised caller was served {served} times meanwhile",
        started.elapsed(),
        idle >> 20,
        peak >> 20
    );
    for status in statuses.keys() {
        assert!(
            status.starts_with("HTTP/1.1 401")
                || status.starts_with("HTTP/1.1 403")
                || status.starts_with("HTTP/1.1 429"),
            "an unauthorised body got {status:?}: {statuses:?}"
        );
    }
    assert!(
        statuses.keys().any(|s| s.starts_with("HTTP/1.1 403")),
        "bob's requests were refused by RBAC: {statuses:?}"
    );
    assert!(
        peak < idle + 100 * 1024 * 1024,
        "the operator grew from {} MiB to {} MiB",
        idle >> 20,
        peak >> 20
    );
    assert!(served > 0);
    env.delete_namespace(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorised_callers_slow_and_many_bodies_are_bounded() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("gwl-slowbody").await;
    let operator = scoped_operator(
        env,
        &ns,
        "gwl-slowbody",
        &[
            "--gateway-body-read-timeout-seconds=2",
            "--gateway-max-body-bytes=2000000",
            "--gateway-body-bytes-per-caller=5000000",
        ],
    )
    .await;
    let addr = gateway_addr(&operator);
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let token = env.control_plane.tokens["alice"].clone();
    let list = format!("/v1/namespaces/{ns}/sandboxes");
    // Alice sends eight 2 MB bodies and never finishes them: two fit her 5 MB budget and time out
    // (408), the other six are refused at once (429); none holds the gateway for longer.
    let started = Instant::now();
    let bodies: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(announce_large_body(
                addr.clone(),
                list.clone(),
                Some(format!("Bearer {token}")),
                Duration::from_secs(15),
            ))
        })
        .collect();
    let mut statuses = Vec::new();
    for body in bodies {
        let announced = body.await.expect("connection task");
        assert!(announced.closed, "{}", announced.status);
        statuses.push(announced.status.chars().skip(9).take(3).collect::<String>());
    }
    statuses.sort();
    eprintln!("{statuses:?} after {:?}", started.elapsed());
    assert_eq!(
        statuses,
        vec!["408", "408", "429", "429", "429", "429", "429", "429"]
    );
    // A whole body is read as before.
    let alice = Caller::at(&operator.gateway_url(), Some(&token));
    let created = alice
        .post(&list, json!({"image": "busybox", "name": "after"}))
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    for reason in ["body_timeout", "body_budget"] {
        assert!(
            metric(
                &operator,
                "orchard_gateway_throttled_total",
                &[("reason", reason)]
            )
            .await
                >= 1.0,
            "{reason} counted"
        );
    }
    env.delete_namespace(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_callers_waits_neither_take_the_slots_of_calls_nor_lock_out_other_callers() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("gwl-fair").await;
    let operator = scoped_operator(
        env,
        &ns,
        "gwl-fair",
        &[
            "--gateway-max-in-flight-requests=4",
            "--gateway-max-waits=4",
            "--gateway-max-in-flight-per-caller=3",
        ],
    )
    .await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    grant(env, &ns, "bob", "trainer-bob", trainer_rules()).await;
    let alice = Caller::at(
        &operator.gateway_url(),
        Some(&env.control_plane.tokens["alice"]),
    );
    let bob = Caller::at(
        &operator.gateway_url(),
        Some(&env.control_plane.tokens["bob"]),
    );
    // Alice's sandbox never settles: it waits for a pool that does not exist.
    let stuck = alice
        .create_sandbox(&ns, json!({"pool": "nope", "whenPoolEmpty": "Wait"}))
        .await;
    let bobs = ready_sandbox(&bob, &ns).await;
    let waits: Vec<_> = (0..4)
        .map(|_| {
            let alice = Caller::at(&alice.base, alice.token.as_deref());
            let path = sandbox_path(&ns, &stuck, "/wait?timeoutSeconds=30");
            tokio::spawn(async move { alice.get(&path).await })
        })
        .collect();
    // Three of Alice's waits hold slots for their 30 s; her fourth is over her share of waits and
    // is answered at once.
    let (first_done, _, held) =
        tokio::time::timeout(Duration::from_secs(20), futures::future::select_all(waits))
            .await
            .expect("one of alice's four waits is answered at once");
    let refused = first_done.expect("wait task");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.code(), "TooManyRequests", "{refused:?}");
    assert!(
        refused
            .message()
            .contains("--gateway-max-in-flight-per-caller"),
        "{refused:?}"
    );
    gauge_until(
        &operator,
        "orchard_gateway_requests_in_flight",
        &[("pool", "waits")],
        "alice's waits never started",
        |held| held >= 3.0,
    )
    .await;
    // Bob's calls and his own wait are served while Alice's waits are held.
    let get = bob.get(&sandbox_path(&ns, &bobs, "")).await;
    assert_eq!(get.status, 200, "{get:?}");
    let wait = bob
        .get(&sandbox_path(&ns, &bobs, "/wait?timeoutSeconds=5"))
        .await;
    assert_eq!(wait.status, 200, "{wait:?}");
    let own = alice.get(&sandbox_path(&ns, &stuck, "")).await;
    assert_eq!(
        own.status, 200,
        "alice's own calls are still served: {own:?}"
    );
    assert!(
        held.iter().all(|wait| !wait.is_finished()),
        "alice's other waits are still waiting"
    );
    for wait in held {
        wait.abort();
    }
    env.delete_namespace(&ns).await;
}
