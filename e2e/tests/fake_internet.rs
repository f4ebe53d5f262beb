//! The tests' fake internet (`orchard_testcluster::fake_internet`) on a real node that enforces
//! NetworkPolicies (kube-router), with no operator: hosts under names that a DNS server of the test
//! answers, reached by name over HTTP and over HTTPS with the test CA, from the node's network
//! namespace and from plain pods (the Debian image, `dnsPolicy: None` with the fake DNS server); a pod
//! under an egress NetworkPolicy reaches exactly what the policy allows; dropping the fake internet
//! leaves no link or process.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, LogParams, PostParams};
use orchard_testcluster::env::{EnvOptions, NodeKind, TestEnv};
use orchard_testcluster::fake_internet::{FakeInternet, link_names};
use orchard_testcluster::supervise::{RUN_MARKER, processes_with_env, run_marker};
use orchard_testcluster::wait;
use serde_json::json;

const NAMES: [&str; 3] = ["allowed.test", "other.test", "files.allowed.test"];

/// The body every host answers with (`testcluster/fake-internet/hosts.py`).
fn body(host: &str, path: &str, sni: &str) -> String {
    format!("host={host} path={path} sni={sni}\n")
}

/// Runs `script` (bash) in a plain pod of `ns` from the Debian image, resolving names through the fake
/// DNS server alone, with the test CA in `$CA_PEM`; returns what it printed once it has ended.
async fn run_pod(
    env: &TestEnv,
    internet: &FakeInternet,
    ns: &str,
    name: &str,
    script: &str,
) -> String {
    let api: Api<Pod> = Api::namespaced(env.client().await, ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": [internet.dns().to_string()]},
            "containers": [{
                "name": "main",
                "image": env.node.real().image("debian-python"),
                "command": ["bash", "-c", script],
                "env": [{"name": "CA_PEM", "value": internet.ca_pem()}],
                "resources": {"requests": {"cpu": "5m", "memory": "32Mi"}},
            }],
        },
    }))
    .expect("pod JSON");
    // A new namespace's `default` ServiceAccount may not exist yet (ServiceAccount admission).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match api.create(&PostParams::default(), &pod).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 403 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("create pod {ns}/{name}: {e}"),
        }
    }
    let ended = wait::until(
        &api,
        name,
        "the pod's end",
        Duration::from_secs(120),
        |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
        },
    )
    .await;
    let logs = api
        .logs(name, &LogParams::default())
        .await
        .expect("pod logs");
    let phase = ended.status.and_then(|s| s.phase).unwrap_or_default();
    assert_eq!(phase, "Succeeded", "pod {name} printed:\n{logs}");
    logs
}

/// This run's processes (they carry its marker) in a network namespace that is neither the host's nor
/// the node's (whose PID 1 is `node_init`): the fake internet's (pods' processes carry no marker).
fn fake_internet_processes(node_init: u32) -> Vec<String> {
    let netns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let known = [netns("self"), netns(&node_init.to_string())];
    processes_with_env(RUN_MARKER, Some(run_marker()))
        .into_iter()
        .filter(|pid| {
            let ns = netns(&pid.to_string());
            ns.is_some() && !known.contains(&ns)
        })
        .filter_map(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .collect()
}

/// The line of `output` that starts with `key ` (without the key).
fn line<'a>(output: &'a str, key: &str) -> &'a str {
    output
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .unwrap_or_else(|| panic!("no `{key}` line in:\n{output}"))
}

/// Name resolution (Python's `socket.gethostbyname`: glibc's resolver, the pod's resolv.conf) of the
/// three names, a subdomain of one and another name the fake DNS server does not have, and an
/// outside one.
const RESOLVE: &str = r#"python3 - <<'EOF'
import socket
for name in ["allowed.test", "other.test", "files.allowed.test", "x.allowed.test", "nothere.test", "example.com"]:
    try:
        print("resolve", name, socket.gethostbyname(name))
    except OSError as e:
        print("resolve", name, "error", type(e).__name__)
EOF
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_the_fake_internet_by_name_and_policies_still_apply() {
    let started = Instant::now();
    let env = TestEnv::start(
        "fake-internet",
        EnvOptions {
            operator: false,
            node: NodeKind::Real,
            enforce_network_policies: true,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("a real-node cluster");
    let node = env.node.real();
    let cluster_ready = started.elapsed();
    let internet = FakeInternet::start(node, &NAMES)
        .await
        .expect("the fake internet");
    let internet_ready = started.elapsed() - cluster_ready;
    // One per node: a second start fails and leaves the first as it was (the checks below use it).
    let second = FakeInternet::start(node, &["second.test"])
        .await
        .err()
        .expect("a second fake internet on the same node");
    assert!(second.to_string().contains("already runs"), "{second}");
    let allowed = internet.address("allowed.test").expect("allowed.test");
    let other = internet.address("other.test").expect("other.test");
    assert_eq!(internet.address("nothere.test"), None);
    assert!(internet.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));

    // From the node's own network namespace (the host's curl; names pinned with --resolve).
    let ca = internet.ca_file().display().to_string();
    let curl = |args: &[&str]| {
        let mut all = vec!["-sS", "--max-time", "10"];
        all.extend(args);
        node.exec("curl", &all)
    };
    let resolve = format!("allowed.test:443:{allowed}");
    assert_eq!(
        curl(&[
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "https://allowed.test/from-node"
        ])
        .expect("HTTPS from the node"),
        body("allowed.test", "/from-node", "allowed.test")
    );
    assert_eq!(
        curl(&[&format!("http://{other}/plain?x=1")]).expect("HTTP from the node"),
        body("other.test", "/plain?x=1", "-")
    );
    assert_eq!(
        curl(&[
            "-o",
            "/dev/null",
            "-w",
            "%{size_download}",
            &format!("http://{allowed}/big?bytes=3000000")
        ])
        .expect("/big"),
        "3000000"
    );
    assert_eq!(
        curl(&[&format!("http://{allowed}/slow?seconds=2")]).expect("/slow"),
        "host=allowed.test second=1\nhost=allowed.test second=2\n"
    );
    // Each host presents its own certificate, whatever name the client asks for.
    let wrong = format!("other.test:443:{allowed}");
    let mismatch = curl(&["--cacert", &ca, "--resolve", &wrong, "https://other.test/"])
        .expect_err("allowed.test's certificate does not name other.test");
    assert!(
        mismatch.to_string().contains("exit status: 60"),
        "{mismatch}"
    );

    // A pod in a namespace without policies: DNS, HTTPS verified with the CA (curl, and Python's
    // ssl, which verifies strictly), HTTP; the CA is not a system one.
    let open = env.namespace("inet-open").await;
    let output = run_pod(
        &env,
        &internet,
        &open,
        "open",
        &format!(
            "{RESOLVE}\
             printf '%s' \"$CA_PEM\" > /tmp/ca.pem\n\
             echo \"https $(curl -sS --max-time 10 --cacert /tmp/ca.pem https://allowed.test/from-pod)\"\n\
             echo \"http $(curl -sS --max-time 10 'http://other.test/plain?x=1')\"\n\
             echo \"files $(curl -sS --max-time 10 --cacert /tmp/ca.pem https://files.allowed.test/f)\"\n\
             curl -sS --max-time 10 -o /dev/null https://allowed.test/ 2>/dev/null; echo \"untrusted $?\"\n\
             python3 -c \"import ssl, urllib.request; ctx = ssl.create_default_context(cafile='/tmp/ca.pem'); print('python', urllib.request.urlopen('https://other.test/py', context=ctx, timeout=10).read().decode(), end='')\"\n"
        ),
    )
    .await;
    for (name, address) in internet.hosts() {
        assert_eq!(
            line(&output, &format!("resolve {name}")),
            address.to_string(),
            "{output}"
        );
    }
    for missing in ["x.allowed.test", "nothere.test", "example.com"] {
        assert_eq!(
            line(&output, &format!("resolve {missing}")),
            "error gaierror",
            "{output}"
        );
    }
    assert_eq!(
        format!("{}\n", line(&output, "https")),
        body("allowed.test", "/from-pod", "allowed.test")
    );
    assert_eq!(
        format!("{}\n", line(&output, "http")),
        body("other.test", "/plain?x=1", "-")
    );
    assert_eq!(
        format!("{}\n", line(&output, "files")),
        body("files.allowed.test", "/f", "files.allowed.test")
    );
    assert_eq!(
        line(&output, "untrusted"),
        "60",
        "not a system CA: {output}"
    );
    assert_eq!(
        format!("{}\n", line(&output, "python")),
        body("other.test", "/py", "other.test")
    );

    // A pod under an egress policy: the DNS server and allowed.test:443 only.
    let fenced = env.namespace("inet-fenced").await;
    let policies: Api<NetworkPolicy> = Api::namespaced(env.client().await, &fenced);
    let policy: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "egress"},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": format!("{}/32", internet.dns())}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"to": [{"ipBlock": {"cidr": format!("{allowed}/32")}}],
                 "ports": [{"protocol": "TCP", "port": 443}]},
            ],
        },
    }))
    .expect("policy JSON");
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the policy");
    // kube-router applies the policy to the pod some time after it starts: wait until other.test is
    // closed (at most 30 s), then try each target once.
    let output = run_pod(
        &env,
        &internet,
        &fenced,
        "fenced",
        "printf '%s' \"$CA_PEM\" > /tmp/ca.pem\n\
         for i in $(seq 30); do curl -s --max-time 1 -o /dev/null http://other.test/ || break; sleep 1; done\n\
         try() { out=$(curl -sS --max-time 3 --cacert /tmp/ca.pem \"$2\" 2>/dev/null); echo \"$1 $? $out\"; }\n\
         try allowed-443 https://allowed.test/fenced\n\
         try allowed-80 http://allowed.test/fenced\n\
         try other-443 https://other.test/fenced\n\
         try files-443 https://files.allowed.test/fenced\n",
    )
    .await;
    assert_eq!(
        format!("{}\n", line(&output, "allowed-443")),
        format!("0 {}", body("allowed.test", "/fenced", "allowed.test")),
        "{output}"
    );
    for blocked in ["allowed-80", "other-443", "files-443"] {
        let result = line(&output, blocked);
        assert!(
            !result.starts_with("0 "),
            "{blocked} is outside the policy, yet it answered: {output}"
        );
    }

    let running = fake_internet_processes(node.namespaces.init_pid);
    assert!(
        running.len() >= 4,
        "holder, PID 1, hosts, dnsmasq: {running:?}"
    );
    // Dropping it removes the link (with the node's route) and every process of it.
    drop(internet);
    let (node_link, _) = link_names(std::process::id());
    let links = node.exec("ip", &["-o", "link"]).expect("ip link");
    assert!(
        !links.contains(&node_link),
        "{node_link} left in the node: {links}"
    );
    let routes = node.exec("ip", &["route"]).expect("ip route");
    assert!(
        !routes.contains("198.18."),
        "a route left in the node: {routes}"
    );
    wait::poll(
        "the fake internet's processes gone",
        Duration::from_secs(10),
        || async {
            fake_internet_processes(node.namespaces.init_pid)
                .is_empty()
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "fake internet: cluster {:.1}s, fake internet start {:.2}s, total {:.1}s",
        cluster_ready.as_secs_f64(),
        internet_ready.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    env.delete_namespace(&open).await;
    env.delete_namespace(&fenced).await;
    env.stop().await;
}
