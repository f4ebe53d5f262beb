//! The API server's addresses that sandboxes never reach, kept current while the operator runs, on
//! the local cluster (hollow node, whose API server manages no `default/kubernetes` EndpointSlice:
//! the test writes it, standing in for a control plane whose endpoints rotate, with addresses it adds
//! to the host's `lo` for the test's length, since EndpointSlices refuse loopback addresses):
//! - an `AllowAll` sandbox's policy gets the new addresses as soon as the slice changes, without an
//!   operator restart;
//! - a new sandbox's agent is given as canaries only the endpoints that answer a connection (a gone
//!   address would look like an enforced policy), while every ready address stays protected;
//! - a sandbox whose policies nothing enforces (the hollow node enforces none) says so after 30 s:
//!   reason `PolicyEnforcementMissing`, `Stalled`, a Warning event, and what to do.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::test_support::gateway::scoped_operator;
use orchard_testcluster::test_support::sandboxes::sandbox;
use orchard_testcluster::wait;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

/// The cluster of this binary: no shared operator, since the test's operator must start after the
/// slice exists.
fn env() -> &'static TestEnv {
    static ENV: OnceLock<TestEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        TestEnv::start_named_on_own_thread(
            "ranges",
            EnvOptions {
                operator: false,
                ..EnvOptions::default()
            },
        )
    })
}

/// An address on the host's `lo` for as long as the value lives.
struct LoopbackAddress(Ipv4Addr);

impl LoopbackAddress {
    fn add(address: Ipv4Addr) -> Self {
        let status = std::process::Command::new("ip")
            .args(["addr", "add", &format!("{address}/32"), "dev", "lo"])
            .status()
            .expect("run ip");
        assert!(
            status.success(),
            "ip addr add {address}/32 dev lo: {status}"
        );
        Self(address)
    }
}

impl Drop for LoopbackAddress {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["addr", "del", &format!("{}/32", self.0), "dev", "lo"])
            .status();
    }
}

/// The slice `default/kubernetes` with `addresses`, all ready, on `port`.
fn slice(addresses: &[Ipv4Addr], port: u16) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": addresses.iter().map(|ip| json!({
            "addresses": [ip.to_string()], "conditions": {"ready": true}
        })).collect::<Vec<_>>(),
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }))
    .expect("slice JSON")
}

/// The agent's canaries in `pod`'s task container, sorted.
fn canaries(pod: &Pod) -> Vec<String> {
    let mut addresses: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.containers.iter())
        .flat_map(|c| c.env.iter().flatten())
        .filter(|v| v.name == "ORCHARD_AGENT_EGRESS_CANARY")
        .flat_map(|v| v.value.as_deref().unwrap_or_default().split(','))
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    addresses.sort();
    addresses
}

fn policy_mentions(policy: Option<&NetworkPolicy>, cidr: &str) -> bool {
    policy.is_some_and(|p| {
        serde_json::to_string(&p.spec)
            .unwrap_or_default()
            .contains(&format!("\"{cidr}\""))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_servers_addresses_are_followed_and_only_answering_ones_are_canaries() {
    let env = env();
    let client = env.client().await;
    // Two endpoints that answer and one that is gone (its address is there, nothing listens).
    let octet = (std::process::id() % 250) as u8;
    let [first, second, gone] = [2, 3, 4].map(|host| Ipv4Addr::new(10, 253, octet, host));
    let _addresses = [first, second, gone].map(LoopbackAddress::add);
    let first_listener = tokio::net::TcpListener::bind((first, 0))
        .await
        .expect("listen");
    let port = first_listener.local_addr().expect("address").port();
    let second_listener = tokio::net::TcpListener::bind((second, port))
        .await
        .expect("listen on the same port");
    // Both answer every connection for the test's length (a listener that never accepts stops
    // answering once its backlog is full, which would look like an enforced policy).
    let listeners = [first_listener, second_listener].map(|listener| {
        tokio::spawn(async move {
            while let Ok((connection, _)) = listener.accept().await {
                drop(connection);
            }
        })
    });
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    slices
        .create(&PostParams::default(), &slice(&[first], port))
        .await
        .expect("create the slice");

    let ns = env.namespace("ranges").await;
    // Awaiting enforcement hands canaries to agents (the hollow node's sandboxes then never become
    // Ready: nothing enforces their policies; the test reads their pods only).
    let _operator = scoped_operator(env, &ns, "ranges", &["--await-policy-enforcement=true"]).await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox(
                "open",
                json!({"image": "busybox", "network": {"egress": "AllowAll"}}),
            ),
        )
        .await
        .expect("create");
    let policy_name = "open-egress";
    let open_policy = wait::until(
        &policies,
        policy_name,
        "the AllowAll policy excepting the first endpoint",
        WAIT,
        |p: Option<&NetworkPolicy>| policy_mentions(p, &format!("{first}/32")),
    )
    .await;
    assert!(!policy_mentions(
        Some(&open_policy),
        &format!("{second}/32")
    ));
    let open_pod = wait::until(&pods, "open", "the pod", WAIT, |p: Option<&Pod>| {
        p.is_some()
    })
    .await;
    assert_eq!(canaries(&open_pod), vec![format!("{first}:{port}")]);

    // The control plane moves: two more endpoints, one of which does not answer.
    slices
        .patch(
            "kubernetes",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": slice(&[first, second, gone], port).endpoints})),
        )
        .await
        .expect("patch the slice");
    wait::until(
        &policies,
        policy_name,
        "the running sandbox's policy excepting the new endpoints",
        WAIT,
        |p: Option<&NetworkPolicy>| {
            policy_mentions(p, &format!("{second}/32")) && policy_mentions(p, &format!("{gone}/32"))
        },
    )
    .await;
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("late", json!({"image": "busybox"})),
        )
        .await
        .expect("create");
    let late_pod = wait::until(&pods, "late", "the pod", WAIT, |p: Option<&Pod>| {
        p.is_some()
    })
    .await;
    let answering = |ip: Ipv4Addr| SocketAddr::new(IpAddr::V4(ip), port).to_string();
    assert_eq!(
        canaries(&late_pod),
        vec![answering(first), answering(second)],
        "the gone endpoint {gone} is no canary"
    );

    // Nothing enforces policies on the hollow node, so the canaries keep answering: after 30 s of
    // waiting the sandbox says that no enforcer seems to be there (stalled, with what to do), and a
    // Warning event says it too.
    let stalled = wait::until(
        &sandboxes,
        "late",
        "PolicyEnforcementMissing",
        Duration::from_secs(90),
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "PolicyEnforcementMissing")
                    && status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Stalled" && c.status == "True")
            })
        },
    )
    .await;
    let ready = stalled
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert!(
        ready
            .message
            .contains("sandboxEgress.awaitEnforcement=false"),
        "{}",
        ready.message
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    wait::poll("the PolicyEnforcementMissing event", WAIT, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("PolicyEnforcementMissing")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("late")
                    && e.type_.as_deref() == Some("Warning")
            })
        }
    })
    .await;

    slices
        .delete("kubernetes", &DeleteParams::default())
        .await
        .expect("delete the slice");
    for listener in listeners {
        listener.abort();
    }
    env.delete_namespace(&ns).await;
}
