//! The cluster's own addresses that sandbox egress depends on, kept current while the operator runs:
//!
//! - the API server's endpoints (EndpointSlice `default/kubernetes`): excepted from `AllowAll` and
//!   `AllowList` policies, and the canaries a new sandbox's agent must find denied before it serves
//!   (`--await-policy-enforcement`). Control-plane addresses rotate (upgrades, scaling, EKS's ENIs),
//!   so the slice is watched, and every open policy is rewritten when they change;
//! - the nodes' pod ranges (`spec.podCIDRs`, with `--discover-pod-cidrs`): excepted from `AllowAll`'s IP
//!   blocks, so enforcers that match IP blocks against pod addresses keep sandboxes away from the
//!   operator's pods, beside `--cluster-pod-cidrs`.
//!
//! A canary counts only once the operator itself has connected to it within the last probe round: an
//! endpoint that is gone would refuse every sandbox's connection too, and the agent would take that
//! for an enforced policy. So dead addresses are never handed to agents (they stay excepted, which is
//! harmless), and when no endpoint answers, new sandboxes get no canary and a warning is logged.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::cidr::{Cidr, endpoint_cidrs};
use super::policy_canary::endpoint_addresses;

/// How often the canaries' liveness is checked again.
pub const PROBE_EVERY: Duration = Duration::from_secs(15);
/// How long a connection to a canary may take before it counts as dead.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The ranges as last observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterRanges {
    /// The API server's ready endpoint addresses.
    pub api_server: Vec<Cidr>,
    /// The API server's endpoints that answered the operator's last probe: the policy canaries.
    pub live_canaries: Vec<SocketAddr>,
    /// The API server's endpoints that did not answer it.
    pub dead_canaries: Vec<SocketAddr>,
    /// The nodes' pod ranges.
    pub pod_cidrs: Vec<Cidr>,
}

/// What the operator observed, from which the ranges follow.
#[derive(Debug, Clone, Default)]
pub struct Observations {
    /// The `default/kubernetes` EndpointSlice, if any.
    pub slice: Option<EndpointSlice>,
    /// Pod ranges by node name.
    pub nodes: BTreeMap<String, Vec<Cidr>>,
    /// Endpoints that answered the last probe.
    pub live: BTreeSet<SocketAddr>,
}

impl Observations {
    /// The endpoints to probe (pure).
    pub fn candidates(&self) -> Vec<SocketAddr> {
        self.slice
            .as_ref()
            .map(endpoint_addresses)
            .unwrap_or_default()
    }

    /// The ranges these observations give (pure).
    pub fn ranges(&self) -> ClusterRanges {
        let candidates = self.candidates();
        let (live_canaries, dead_canaries) = candidates
            .into_iter()
            .partition(|address| self.live.contains(address));
        let pod_cidrs: BTreeSet<String> = self
            .nodes
            .values()
            .flatten()
            .map(ToString::to_string)
            .collect();
        ClusterRanges {
            api_server: self.slice.as_ref().map(endpoint_cidrs).unwrap_or_default(),
            live_canaries,
            dead_canaries,
            pod_cidrs: pod_cidrs
                .iter()
                .filter_map(|text| Cidr::parse(text).ok())
                .collect(),
        }
    }
}

/// A node's pod ranges (`spec.podCIDRs`, or the older `spec.podCIDR`), the unparseable left out
/// (pure).
pub fn node_pod_cidrs(node: &Node) -> Vec<Cidr> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    let listed = spec.pod_cidrs.iter().flatten();
    let single = spec.pod_cidr.iter();
    let texts: BTreeSet<&String> = listed.chain(single).collect();
    texts
        .into_iter()
        .filter_map(|text| Cidr::parse(text).ok())
        .collect()
}

/// Connects to each of `candidates` at once; the ones that accepted (`PROBE_TIMEOUT` each).
pub async fn probe(candidates: &[SocketAddr]) -> BTreeSet<SocketAddr> {
    let attempts = candidates.iter().map(|address| async move {
        let connected =
            tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await;
        matches!(connected, Ok(Ok(_))).then_some(*address)
    });
    futures::future::join_all(attempts)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// What to observe.
#[derive(Debug, Clone, Copy)]
pub struct Watched {
    /// The API server's EndpointSlice (its addresses are protected, or its canaries awaited).
    pub api_server: bool,
    /// The nodes' pod ranges.
    pub nodes: bool,
}

/// Reads everything once, at start: the operator must know the ranges before its first reconcile.
pub async fn observe_once(client: &Client, watched: Watched) -> kube::Result<Observations> {
    let mut observed = Observations::default();
    if watched.api_server {
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
        observed.slice = slices.get_opt("kubernetes").await?;
        observed.live = probe(&observed.candidates()).await;
    }
    if watched.nodes {
        let nodes: Api<Node> = Api::all(client.clone());
        for node in nodes.list(&Default::default()).await? {
            observed
                .nodes
                .insert(node.name_any(), node_pod_cidrs(&node));
        }
    }
    Ok(observed)
}

/// One change the watches report.
enum Change {
    Slice(Option<Box<EndpointSlice>>),
    Node(String, Option<Vec<Cidr>>),
    Nodes(BTreeMap<String, Vec<Cidr>>),
}

/// Keeps `ranges` current from `observed` onwards until `shutdown`: watches the EndpointSlice and
/// the nodes, probes the canaries every [`PROBE_EVERY`] and after each change of the slice, and sends
/// `()` on `changed` whenever the ranges change (every sandbox is then reconciled again).
pub async fn keep_current(
    client: Client,
    watched: Watched,
    mut observed: Observations,
    ranges: watch::Sender<ClusterRanges>,
    changed: mpsc::Sender<()>,
    shutdown: CancellationToken,
) {
    let (changes_tx, mut changes) = mpsc::channel::<Change>(64);
    if watched.api_server {
        tokio::spawn(watch_slice(client.clone(), changes_tx.clone()));
    }
    if watched.nodes {
        tokio::spawn(watch_nodes(client.clone(), changes_tx.clone()));
    }
    drop(changes_tx);
    let mut probe_timer = tokio::time::interval(PROBE_EVERY);
    probe_timer.tick().await;
    loop {
        let mut reprobe = false;
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = probe_timer.tick(), if watched.api_server => reprobe = true,
            change = changes.recv() => match change {
                None => return,
                Some(Change::Slice(slice)) => {
                    observed.slice = slice.map(|slice| *slice);
                    reprobe = true;
                }
                Some(Change::Node(name, Some(cidrs))) => {
                    observed.nodes.insert(name, cidrs);
                }
                Some(Change::Node(name, None)) => {
                    observed.nodes.remove(&name);
                }
                Some(Change::Nodes(all)) => observed.nodes = all,
            },
        }
        if reprobe {
            observed.live = probe(&observed.candidates()).await;
        }
        let next = observed.ranges();
        if *ranges.borrow() != next {
            log_ranges(&next);
            ranges.send_replace(next);
            let _ = changed.try_send(());
        }
    }
}

/// Logs what changed ranges mean for sandboxes.
pub fn log_ranges(ranges: &ClusterRanges) {
    let show = |items: &[Cidr]| items.iter().map(ToString::to_string).collect::<Vec<_>>();
    info!(
        api_server = ?show(&ranges.api_server),
        canaries = ?ranges.live_canaries,
        pod_cidrs = ?show(&ranges.pod_cidrs),
        "the cluster's protected ranges"
    );
    if !ranges.dead_canaries.is_empty() {
        warn!(
            dead = ?ranges.dead_canaries,
            "API server endpoints that did not answer the operator are not used as policy canaries (a gone address would look like an enforced policy)"
        );
    }
}

async fn watch_slice(client: Client, changes: mpsc::Sender<Change>) {
    let api: Api<EndpointSlice> = Api::namespaced(client, "default");
    let config = watcher::Config::default().fields("metadata.name=kubernetes");
    let mut events = watcher(api, config).default_backoff().boxed();
    let mut listed: Option<EndpointSlice> = None;
    while let Some(event) = events.next().await {
        let change = match event {
            Ok(watcher::Event::Apply(slice)) => Change::Slice(Some(Box::new(slice))),
            Ok(watcher::Event::Delete(_)) => Change::Slice(None),
            Ok(watcher::Event::Init) => {
                listed = None;
                continue;
            }
            Ok(watcher::Event::InitApply(slice)) => {
                listed = Some(slice);
                continue;
            }
            Ok(watcher::Event::InitDone) => Change::Slice(listed.take().map(Box::new)),
            Err(err) => {
                warn!(%err, "EndpointSlice default/kubernetes watch error (retrying)");
                continue;
            }
        };
        if changes.send(change).await.is_err() {
            return;
        }
    }
}

async fn watch_nodes(client: Client, changes: mpsc::Sender<Change>) {
    let api: Api<Node> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listed = BTreeMap::new();
    while let Some(event) = events.next().await {
        let change = match event {
            Ok(watcher::Event::Apply(node)) => {
                Change::Node(node.name_any(), Some(node_pod_cidrs(&node)))
            }
            Ok(watcher::Event::Delete(node)) => Change::Node(node.name_any(), None),
            Ok(watcher::Event::Init) => {
                listed.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(node)) => {
                listed.insert(node.name_any(), node_pod_cidrs(&node));
                continue;
            }
            Ok(watcher::Event::InitDone) => Change::Nodes(std::mem::take(&mut listed)),
            Err(err) => {
                warn!(%err, "node watch error (retrying)");
                continue;
            }
        };
        if changes.send(change).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn slice(addresses: &[(&str, bool)], port: i32) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "addressType": "IPv4",
            "endpoints": addresses.iter().map(|(ip, ready)| serde_json::json!({
                "addresses": [ip], "conditions": {"ready": ready}
            })).collect::<Vec<_>>(),
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        }))
        .unwrap()
    }

    fn node(cidrs: &[&str], single: Option<&str>) -> Node {
        Node {
            spec: Some(NodeSpec {
                pod_cidrs: Some(cidrs.iter().map(ToString::to_string).collect()),
                pod_cidr: single.map(ToString::to_string),
                ..NodeSpec::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn only_endpoints_that_answered_are_canaries_but_every_ready_one_is_protected() {
        let mut observed = Observations {
            slice: Some(slice(
                &[("10.0.0.1", true), ("10.0.0.2", true), ("10.0.0.3", false)],
                6443,
            )),
            ..Observations::default()
        };
        observed.live.insert("10.0.0.2:6443".parse().unwrap());
        let ranges = observed.ranges();
        assert_eq!(
            ranges
                .api_server
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            vec!["10.0.0.1/32", "10.0.0.2/32"],
            "unready endpoints are neither"
        );
        assert_eq!(ranges.live_canaries, vec!["10.0.0.2:6443".parse().unwrap()]);
        assert_eq!(ranges.dead_canaries, vec!["10.0.0.1:6443".parse().unwrap()]);
        assert_eq!(Observations::default().ranges(), ClusterRanges::default());
    }

    #[test]
    fn node_pod_ranges_are_merged_both_families() {
        let mut observed = Observations::default();
        observed.nodes.insert(
            "a".into(),
            node_pod_cidrs(&node(
                &["10.244.0.0/24", "fd00:10:244::/64"],
                Some("10.244.0.0/24"),
            )),
        );
        observed
            .nodes
            .insert("b".into(), node_pod_cidrs(&node(&["10.244.1.0/24"], None)));
        observed
            .nodes
            .insert("c".into(), node_pod_cidrs(&Node::default()));
        let cidrs: Vec<String> = observed
            .ranges()
            .pod_cidrs
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            cidrs,
            vec!["10.244.0.0/24", "10.244.1.0/24", "fd00:10:244::/64"]
        );
        assert!(node_pod_cidrs(&node(&["not a cidr"], None)).is_empty());
    }

    #[tokio::test]
    async fn probing_tells_an_answering_endpoint_from_a_gone_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = listener.local_addr().unwrap();
        let closed = {
            let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            other.local_addr().unwrap()
        };
        let live = probe(&[up, closed]).await;
        assert_eq!(live, BTreeSet::from([up]));
    }
}
