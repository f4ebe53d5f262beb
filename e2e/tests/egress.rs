//! Egress by host name on real packets: the chart installed on the real node (kube-router enforcing
//! NetworkPolicies) with its egress proxy resolving names through the fake internet's DNS server
//! (`orchard_testcluster::fake_internet`), and Debian sandboxes whose task code uses curl, Python's
//! `urllib` and pip through the proxy variables the operator gives them. The test CA is put in each
//! sandbox's trust store (`update-ca-certificates`), as a task image would carry its own.
//!
//! Checked: allowed names over HTTP and HTTPS, a wildcard, a denied name (403), a client that lies
//! (an SNI naming another host reaches only the allowed host's address; an IP literal is refused;
//! a connection around the proxy is dropped by the NetworkPolicy), a policy switched on the running
//! sandbox (Harbor's agent phase, then verifier phase) in force within 2 s with an open connection to
//! the removed host cut, sandboxes with different lists at once getting exactly their own, the proxy
//! restarted (nothing gets through while it is down; the same rules afterwards), and the metrics and
//! `EgressDenied` events a task author reads.

use std::collections::BTreeSet;

use futures::StreamExt;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::chart_install::ChartRelease;
use orchard_testcluster::env::{EnvOptions, NodeKind, TestEnv};
use orchard_testcluster::fake_internet::FakeInternet;
use orchard_testcluster::test_support::gateway::{Answer, Caller};
use orchard_testcluster::test_support::internet::{self, InternetRelease};
use orchard_testcluster::test_support::nodes::pod_ready;
use orchard_testcluster::wait;
use serde_json::{Value, json};
use tokio::sync::OnceCell;

/// The fake internet's names: a host, one of its subdomains, others, and `h1.test`..`h50.test`.
fn names() -> Vec<String> {
    let mut names: Vec<String> = [
        "allowed.test",
        "files.allowed.test",
        "other.test",
        "verifier.test",
    ]
    .map(String::from)
    .to_vec();
    names.extend((1..=MANY).map(|n| format!("h{n}.test")));
    names
}

/// Sandboxes with lists of their own at once (each allowed exactly one `hN.test`).
const MANY: usize = 50;

/// The bound the docs promise for a policy change to be in force.
const IN_FORCE_WITHIN: Duration = Duration::from_secs(2);

/// Tests hold this shared; the one that restarts the proxy holds it alone (every sandbox loses its
/// way out meanwhile).
static PROXY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

struct Setup {
    env: &'static TestEnv,
    internet: FakeInternet,
    release: ChartRelease,
    /// The gateway through its Service.
    gateway: String,
}

impl Setup {
    /// The cluster admin at the gateway, with an HTTP client of the calling test's own runtime (a
    /// pooled connection of a finished test's runtime is gone).
    fn admin(&self) -> Caller {
        Caller {
            base: self.gateway.clone(),
            token: Some(self.env.control_plane.tokens["admin"].clone()),
            http: orchard_testcluster::gateway_http(),
        }
    }
}

fn env() -> &'static TestEnv {
    static ENV: std::sync::OnceLock<TestEnv> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        TestEnv::start_named_on_own_thread(
            "egress",
            EnvOptions {
                operator: false,
                node: NodeKind::Real,
                enforce_network_policies: true,
                ..EnvOptions::default()
            },
        )
    })
}

/// The cluster, the fake internet and the chart (egress proxy pointed at the fake DNS server),
/// once for the binary.
async fn setup() -> &'static Setup {
    static SETUP: OnceCell<Setup> = OnceCell::const_new();
    SETUP
        .get_or_init(|| async {
            let env = env();
            env.on_env_runtime(async move {
                let names = names();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let InternetRelease {
                    release,
                    internet,
                    gateway,
                } = internet::install(env, &names).await;
                Setup {
                    env,
                    internet,
                    release,
                    gateway,
                }
            })
            .await
        })
        .await
}

/// A Ready Debian sandbox `name` in `ns` with `network`, the test CA in its trust store.
async fn sandbox(setup: &Setup, ns: &str, name: &str, network: Value) {
    let image = setup.env.node.real().image("debian-python");
    setup
        .admin()
        .create_sandbox(
            ns,
            json!({"name": name, "image": image, "network": network}),
        )
        .await;
    let ready = setup.admin().wait_ready(ns, name).await;
    // Ready only once the proxy enforces its rules for its pod.
    let status = &ready["status"];
    assert_eq!(
        status["egress"]["podIP"], status["podIP"],
        "status.egress names the pod: {status}"
    );
    assert!(
        status["conditions"].as_array().is_some_and(|c| c
            .iter()
            .any(|c| c["type"] == "HostEgress" && c["status"] == "True")),
        "HostEgress True at Ready: {status}"
    );
    let trust = "printf '%s' \"$CA\" > /usr/local/share/ca-certificates/orchard-test.crt && update-ca-certificates >/dev/null 2>&1 && echo trusted";
    let answer = setup
        .admin()
        .exec(
            ns,
            name,
            json!({"command": trust, "env": {"CA": setup.internet.ca_pem()}}),
        )
        .await;
    assert_eq!(stdout(&answer).trim(), "trusted", "{answer:?}");
}

fn stdout(answer: &Answer) -> String {
    answer.body["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Runs `script` with `sh -c` in the sandbox; (exit code, stdout, stderr).
async fn sh(setup: &Setup, ns: &str, name: &str, script: &str) -> (i64, String, String) {
    let answer = setup
        .admin()
        .exec(ns, name, json!({"command": script, "timeoutSeconds": 30}))
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    (
        answer.body["exitCode"].as_i64().unwrap_or(-1),
        stdout(&answer),
        answer.body["stderr"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// `curl` through the proxy (the sandbox's own variables): the body, or the error.
async fn curl(setup: &Setup, ns: &str, name: &str, url: &str) -> Result<String, String> {
    let (code, out, err) = sh(setup, ns, name, &format!("curl -sSf --max-time 8 '{url}'")).await;
    if code == 0 {
        Ok(out)
    } else {
        Err(format!("exit {code}: {err}"))
    }
}

fn body(host: &str, path: &str, sni: &str) -> String {
    format!("host={host} path={path} sni={sni}\n")
}

fn refused(result: &Result<String, String>) -> bool {
    matches!(result, Err(e) if e.contains("403"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_names_pass_and_everything_else_is_refused() {
    let setup = setup().await;
    let _shared = PROXY.read().await;
    let ns = setup.env.namespace("egress-basic").await;
    let network = json!({"egress": "AllowList", "allow": [
        {"host": "allowed.test"}, {"host": "*.allowed.test", "ports": [{"port": 443}]}]});
    sandbox(setup, &ns, "task", network).await;

    // HTTPS (CONNECT, the CA verified by the client: TLS is not intercepted) and HTTP.
    assert_eq!(
        curl(setup, &ns, "task", "https://allowed.test/a").await,
        Ok(body("allowed.test", "/a", "allowed.test"))
    );
    assert_eq!(
        curl(setup, &ns, "task", "http://allowed.test/b?c=1").await,
        Ok(body("allowed.test", "/b?c=1", "-"))
    );
    // The wildcard, on its port only.
    assert_eq!(
        curl(setup, &ns, "task", "https://files.allowed.test/w").await,
        Ok(body("files.allowed.test", "/w", "files.allowed.test"))
    );
    assert!(refused(
        &curl(setup, &ns, "task", "http://files.allowed.test/w").await
    ));
    // A name not allowed, and an IP literal (even the allowed host's own address).
    let (code, _, err) = sh(
        setup,
        &ns,
        "task",
        "curl -sS --max-time 8 https://other.test/",
    )
    .await;
    assert!(
        code != 0 && err.contains("CONNECT tunnel failed, response 403"),
        "{err}"
    );
    let allowed_ip = setup.internet.address("allowed.test").expect("address");
    assert!(refused(
        &curl(setup, &ns, "task", &format!("http://{allowed_ip}/")).await
    ));
    assert!(refused(
        &curl(setup, &ns, "task", &format!("https://{allowed_ip}/")).await
    ));
    // A client that lies: CONNECT names allowed.test, the TLS SNI names other.test. The proxy
    // connects to allowed.test's address, so other.test is never reached.
    let (code, out, err) = sh(
        setup,
        &ns,
        "task",
        "curl -sS -k --max-time 8 --connect-to other.test:443:allowed.test:443 https://other.test/lie",
    )
    .await;
    assert_eq!(
        (code, out.as_str()),
        (0, body("allowed.test", "/lie", "other.test").as_str()),
        "{err}"
    );
    // Around the proxy: the NetworkPolicy drops it, whatever the name.
    for target in [
        allowed_ip,
        setup.internet.address("other.test").expect("address"),
    ] {
        let around = sh(
            setup,
            &ns,
            "task",
            &format!("curl -sS --noproxy '*' --max-time 3 http://{target}/"),
        )
        .await;
        assert_ne!(
            around.0, 0,
            "a direct connection to {target} passed: {around:?}"
        );
    }
    // Python's urllib and pip read the same variables and the system trust store.
    let (code, out, err) = sh(
        setup,
        &ns,
        "task",
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('https://allowed.test/py').read().decode(), end='')\"",
    )
    .await;
    assert_eq!(
        (code, out.as_str()),
        (0, body("allowed.test", "/py", "allowed.test").as_str()),
        "{err}"
    );
    let (code, _, err) = sh(
        setup,
        &ns,
        "task",
        "python3 -c \"import urllib.request; urllib.request.urlopen('https://other.test/py')\"",
    )
    .await;
    assert!(code != 0 && err.contains("403"), "{err}");
    let (code, out, err) = sh(
        setup,
        &ns,
        "task",
        "pip download --no-deps --no-cache-dir --disable-pip-version-check -d /tmp/dl https://allowed.test/files/orchard_probe-1.0-py3-none-any.whl && ls /tmp/dl",
    )
    .await;
    assert!(
        code == 0 && out.contains("orchard_probe-1.0-py3-none-any.whl"),
        "{out}{err}"
    );
    let (code, out, err) = sh(
        setup,
        &ns,
        "task",
        "git clone -q https://allowed.test/repo.git /tmp/repo && cat /tmp/repo/README",
    )
    .await;
    assert!(code == 0 && out.contains("orchard"), "{out}{err}");

    // What the task author sees: an EgressDenied event naming the host, and the metrics.
    let events: Api<Event> = Api::namespaced(setup.env.client().await, &ns);
    let deadline = Instant::now() + Duration::from_secs(20);
    let denied = loop {
        let list = events.list(&ListParams::default()).await.expect("events");
        let found = list.items.iter().find(|e| {
            e.reason.as_deref() == Some("EgressDenied")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("other.test:443"))
        });
        if let Some(found) = found {
            break found.clone();
        }
        if Instant::now() > deadline {
            panic!(
                "no EgressDenied event for other.test:443 in {:?}; the proxy's log:\n{}",
                list.items
                    .iter()
                    .map(|e| (
                        e.reason.clone(),
                        e.regarding.as_ref().and_then(|r| r.kind.clone())
                    ))
                    .collect::<Vec<_>>(),
                egress_logs(setup).await
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        denied.regarding.as_ref().and_then(|r| r.name.as_deref()),
        Some("task")
    );
    let metrics = egress_metrics(setup).await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("orchard_egress_connections_total")
                && l.contains("sandbox=\"task\"")
                && l.contains("verdict=\"denied\"")),
        "{metrics}"
    );
}

/// The last lines the egress proxy's pods logged.
async fn egress_logs(setup: &Setup) -> String {
    let pods: Api<Pod> = Api::namespaced(setup.env.client().await, &setup.release.namespace);
    let mut all = String::new();
    let Ok(list) = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=orchard-egress"))
        .await
    else {
        return all;
    };
    for pod in list.items {
        let params = kube::api::LogParams {
            tail_lines: Some(40),
            ..Default::default()
        };
        all.push_str(
            &pods
                .logs(&pod.name_any(), &params)
                .await
                .unwrap_or_default(),
        );
    }
    all
}

/// The proxy's `/metrics`, through its Service.
async fn egress_metrics(setup: &Setup) -> String {
    let client = setup.env.client().await;
    let proxy = setup
        .release
        .service_url(&client, "egress")
        .await
        .expect("egress service");
    let base = proxy.rsplit_once(':').map(|(b, _)| b).unwrap_or(&proxy);
    reqwest::get(format!("{base}:8082/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_switched_on_a_running_sandbox_is_in_force_within_two_seconds() {
    let setup = setup().await;
    let _shared = PROXY.read().await;
    let ns = setup.env.namespace("egress-switch").await;
    // Harbor's agent phase: the task may fetch from allowed.test.
    sandbox(
        setup,
        &ns,
        "phases",
        json!({"egress": "AllowList", "allow": [{"host": "allowed.test"}]}),
    )
    .await;
    assert!(
        curl(setup, &ns, "phases", "https://allowed.test/agent")
            .await
            .is_ok()
    );
    assert!(refused(
        &curl(setup, &ns, "phases", "https://verifier.test/").await
    ));
    // An open connection to allowed.test: one line a second for 30 s.
    // A background process of the agent (an exec's own process group ends with it).
    let started = setup
        .admin()
        .post(
            &format!("/v1/namespaces/{ns}/sandboxes/phases/processes"),
            json!({"command": "curl -sSN --max-time 40 'https://allowed.test/slow?seconds=30' > /tmp/slow.out 2>/tmp/slow.err; echo $? > /tmp/slow.exit"}),
        )
        .await;
    assert!(started.status < 300, "{started:?}");
    wait::poll(
        "the slow stream's first line",
        Duration::from_secs(10),
        || async {
            let (_, out, _) = sh(setup, &ns, "phases", "cat /tmp/slow.out").await;
            (!out.is_empty()).then_some(())
        },
    )
    .await;

    // The verifier phase: only verifier.test.
    let switched = Instant::now();
    let answer = setup
        .admin()
        .send(
            setup
                .admin()
                .request(
                    reqwest::Method::PUT,
                    &format!("/v1/namespaces/{ns}/sandboxes/phases/network?timeoutSeconds=5"),
                )
                .json(&json!({"egress": "AllowList", "allow": [{"host": "verifier.test"}]})),
        )
        .await;
    let in_force_after = switched.elapsed();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["hostRulesInForce"], true, "{answer:?}");
    assert!(
        in_force_after < IN_FORCE_WITHIN,
        "in force {in_force_after:?} after the change"
    );
    // The open connection was cut (curl ended early with an error).
    let cut = wait::poll("the open connection cut", IN_FORCE_WITHIN, || async {
        let (_, out, _) = sh(setup, &ns, "phases", "cat /tmp/slow.exit 2>/dev/null").await;
        out.trim().parse::<i64>().ok()
    })
    .await;
    let cut_after = switched.elapsed();
    assert_ne!(cut, 0, "curl ended with an error");
    assert!(
        cut_after < IN_FORCE_WITHIN + Duration::from_secs(1),
        "cut {cut_after:?} after the change"
    );
    let (_, lines, _) = sh(setup, &ns, "phases", "wc -l < /tmp/slow.out").await;
    assert!(
        lines.trim().parse::<u32>().unwrap_or(99) < 10,
        "the stream stopped early: {lines} lines"
    );
    assert!(
        curl(setup, &ns, "phases", "https://verifier.test/v")
            .await
            .is_ok()
    );
    assert!(refused(
        &curl(setup, &ns, "phases", "https://allowed.test/again").await
    ));
    eprintln!(
        "policy switch: in force after {in_force_after:?}, open connection cut after {cut_after:?}"
    );

    // A change the API server refuses loses nothing: the verifier rules stay in force.
    let bad = setup
        .admin()
        .send(
            setup
                .admin()
                .request(
                    reqwest::Method::PUT,
                    &format!("/v1/namespaces/{ns}/sandboxes/phases/network"),
                )
                .json(&json!({"egress": "AllowList", "allow": [{"host": "https://allowed.test"}]})),
        )
        .await;
    assert_eq!(bad.status, 422, "{bad:?}");
    assert!(bad.message().contains("must be a host name"), "{bad:?}");
    assert!(
        curl(setup, &ns, "phases", "https://verifier.test/still")
            .await
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_at_once_get_exactly_their_own_lists() {
    let setup = setup().await;
    let _shared = PROXY.read().await;
    let ns = setup.env.namespace("egress-many").await;
    let hosts: Vec<String> = (1..=MANY).map(|n| format!("h{n}.test")).collect();
    // Created at once; each tries every host at once (urllib through the proxy variables).
    let created = futures::future::join_all(hosts.iter().enumerate().map(|(i, host)| {
        let ns = ns.clone();
        async move {
            sandbox(
                setup,
                &ns,
                &format!("s{}", i + 1),
                json!({"egress": "AllowList", "allow": [{"host": host}]}),
            )
            .await;
        }
    }));
    created.await;
    let probe = format!(
        r#"python3 - <<'EOF'
import concurrent.futures, urllib.request
def get(host):
    try:
        return host, urllib.request.urlopen("https://" + host + "/", timeout=10).status
    except Exception as e:
        return host, "refused:" + str(e).replace(" ", "_")
with concurrent.futures.ThreadPoolExecutor(16) as pool:
    for host, result in pool.map(get, {hosts:?}):
        print(host, result)
EOF"#
    );
    let answers = futures::stream::iter(1..=MANY)
        .map(|i| {
            let (ns, probe) = (ns.clone(), probe.clone());
            async move { (i, sh(setup, &ns, &format!("s{i}"), &probe).await) }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    let mut reached = BTreeSet::new();
    for (i, (_, out, err)) in answers {
        assert_eq!(
            out.lines().count(),
            MANY,
            "s{i} tried every host: {out}{err}"
        );
        for line in out.lines() {
            match line.split_once(' ') {
                Some((host, "200")) => {
                    reached.insert((format!("s{i}"), host.to_string()));
                }
                Some((_, refused)) => assert!(
                    refused.starts_with("refused:") && refused.contains("403"),
                    "s{i}: {line}"
                ),
                None => panic!("s{i}: {line}"),
            }
        }
    }
    let expected: BTreeSet<(String, String)> = (1..=MANY)
        .map(|i| (format!("s{i}"), format!("h{i}.test")))
        .collect();
    assert_eq!(reached, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_proxy_lets_nothing_through_while_down_and_the_same_rules_after() {
    let setup = setup().await;
    let _alone = PROXY.write().await;
    let ns = setup.env.namespace("egress-restart").await;
    sandbox(
        setup,
        &ns,
        "steady",
        json!({"egress": "AllowList", "allow": [{"host": "allowed.test"}]}),
    )
    .await;
    assert!(
        curl(setup, &ns, "steady", "https://allowed.test/before")
            .await
            .is_ok()
    );
    let client = setup.env.client().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &setup.release.namespace);
    let selector = "app.kubernetes.io/name=orchard-egress";
    let old: Vec<String> = pods
        .list(&ListParams::default().labels(selector))
        .await
        .expect("egress pods")
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(old.len(), 1, "{old:?}");
    pods.delete(&old[0], &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the proxy pod");
    // Until a new proxy is Ready, nothing passes: not the allowed host, not another.
    let mut tries = 0;
    let back = Instant::now();
    loop {
        let ready_pods = pods
            .list(&ListParams::default().labels(selector))
            .await
            .expect("egress pods")
            .items
            .into_iter()
            .filter(|p| !old.contains(&p.name_any()) && pod_ready(p))
            .count();
        if ready_pods > 0 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(90),
            "no new proxy pod Ready"
        );
        let other = curl(setup, &ns, "steady", "https://other.test/down").await;
        assert!(
            other.is_err(),
            "other.test reached while the proxy restarts: {other:?}"
        );
        tries += 1;
    }
    assert!(tries > 0, "the restart was observed");
    let after = wait::poll(
        "the allowed host again",
        Duration::from_secs(30),
        || async {
            curl(setup, &ns, "steady", "https://allowed.test/after")
                .await
                .ok()
        },
    )
    .await;
    assert_eq!(after, body("allowed.test", "/after", "allowed.test"));
    assert!(refused(
        &curl(setup, &ns, "steady", "https://other.test/after").await
    ));
    let sandboxes: Api<Sandbox> = Api::namespaced(client, &ns);
    let steady = sandboxes.get("steady").await.expect("sandbox");
    assert!(steady.status.and_then(|s| s.egress).is_some());
}
