//! The local node: a Ready `Node` that stands in for a scheduler and a kubelet on a machine without a
//! container engine. It binds unscheduled pods to itself (honouring `nodeSelector`, required node
//! affinity, the Node's taints and its extended resources as its Node object shows them: see
//! [`scheduling`]), and for each pod
//! runs the init containers for real (the agent injector's `orchard-agent install`), starts the task
//! container's agent as a process on the pod's own loopback address, reports `podIP`, container
//! statuses and readiness from the pod's HTTP readiness probe, and on deletion kills the process tree
//! and removes the pod. Tests inject faults through [`HollowNode`]: kill an agent, evict a pod, make
//! images unpullable, pause the node.
//!
//! What differs from a kubelet (documented in `docs/TESTING.md`): task images are not pulled or
//! unpacked, so task commands run on the host filesystem; there is no network or PID isolation between
//! pods (loopback addresses stand in for pod IPs, and NetworkPolicies are stored but not enforced).

mod ip_pool;
pub mod mounts;
pub mod pod_status;
mod pod_worker;
pub mod scheduling;
mod shared;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};
use tracing::{debug, warn};

use crate::error::Result;
use ip_pool::IpPool;
use pod_status::pod_ready;
use pod_worker::{PodCommand, PodWorker, resource_version};
use scheduling::{NodeOffer, extended_requests, unfit};
pub use shared::NodeConfig;
use shared::NodeShared;

struct PodHandle {
    namespace: String,
    name: String,
    commands: mpsc::UnboundedSender<PodCommand>,
    agent_pid: Arc<AtomicU32>,
}

pub(crate) struct Inner {
    /// What the pod workers share with the node (its fields read through `Deref`).
    shared: Arc<NodeShared>,
    pods: Mutex<HashMap<String, PodHandle>>,
    /// The `Unschedulable` message last reported for each pod, by uid (reported again only when it
    /// changes).
    unschedulable_reported: Mutex<HashMap<String, String>>,
    /// Unbound pods that did not fit when last looked at, by uid: tried again when the Node changes
    /// (a taint removed, GPUs advertised) or a pod gives back extended resources, as kube-scheduler
    /// requeues them.
    unscheduled: Mutex<HashMap<String, Pod>>,
    bind_slots: Semaphore,
    /// The node's own Node object as last seen (labels, taints, allocatable extended resources
    /// another party may have patched in, as a device plugin would).
    node_object: kube::runtime::reflector::Store<Node>,
    /// Extended resources (e.g. `nvidia.com/gpu`) held by each pod bound (or being bound) to the node
    /// and not finished, by pod uid; only pods holding some are listed.
    extended_in_use: Mutex<HashMap<String, BTreeMap<String, i64>>>,
}

impl std::ops::Deref for Inner {
    type Target = NodeShared;

    fn deref(&self) -> &NodeShared {
        &self.shared
    }
}

/// Handle to a running local node.
#[derive(Clone)]
pub struct HollowNode {
    inner: Arc<Inner>,
}

impl HollowNode {
    /// Registers the Node and starts serving pods on the current tokio runtime.
    pub async fn start(client: Client, config: NodeConfig) -> Result<Self> {
        std::fs::create_dir_all(&config.work_dir)?;
        let (secrets, secret_writer) = kube::runtime::reflector::store();
        let (node_object, node_writer) = kube::runtime::reflector::store();
        let inner = Arc::new(Inner {
            shared: Arc::new(NodeShared {
                client,
                config,
                paused: AtomicBool::new(false),
                secrets,
                secret_changed: tokio::sync::Notify::new(),
                unpullable: Mutex::new(None),
                ip_pool: Mutex::new(IpPool::for_this_process()),
                finished_pods: Mutex::new(Default::default()),
                terminated_pods: Mutex::new(Default::default()),
            }),
            pods: Mutex::new(HashMap::new()),
            unschedulable_reported: Mutex::new(Default::default()),
            unscheduled: Mutex::new(HashMap::new()),
            bind_slots: Semaphore::new(64),
            node_object,
            extended_in_use: Mutex::new(HashMap::new()),
        });
        tokio::spawn(sweep_finished_pods(inner.clone()));
        {
            let inner = inner.clone();
            let api: Api<k8s_openapi::api::core::v1::Secret> = Api::all(inner.client.clone());
            tokio::spawn(async move {
                let mut events = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .reflect(secret_writer)
                    .boxed();
                while let Some(event) = events.next().await {
                    if event.is_ok() {
                        inner.secret_changed.notify_waiters();
                    }
                }
            });
        }
        register(&inner, true).await?;
        register_witness(&inner).await?;
        tokio::spawn(heartbeat(inner.clone()));
        let node = Self { inner };
        {
            // Only this node's object: its labels, taints and allocatable decide what fits, and each
            // change of it is a new chance for the pods that did not fit.
            let api: Api<Node> = Api::all(node.inner.client.clone());
            let config = watcher::Config::default()
                .fields(&format!("metadata.name={}", node.inner.config.name));
            let node = node.clone();
            tokio::spawn(async move {
                let mut events = watcher(api, config)
                    .default_backoff()
                    .reflect(node_writer)
                    .boxed();
                while let Some(event) = events.next().await {
                    if event.is_ok() && !node.inner.paused.load(Ordering::SeqCst) {
                        node.retry_unscheduled();
                    }
                }
            });
        }
        let watcher_node = node.clone();
        tokio::spawn(async move { watcher_node.watch_pods().await });
        Ok(node)
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    async fn watch_pods(&self) {
        let api: Api<Pod> = Api::all(self.inner.client.clone());
        let mut events = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        loop {
            match events.try_next().await {
                Ok(Some(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                    self.on_pod(pod)
                }
                Ok(Some(watcher::Event::Delete(pod))) => self.on_deleted(&pod),
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(err) => warn!(%err, "local node: pod watch error (retrying)"),
            }
        }
    }

    fn on_pod(&self, pod: Pod) {
        if self.inner.paused.load(Ordering::SeqCst) {
            return;
        }
        let uid = pod.uid().unwrap_or_default();
        if self
            .inner
            .terminated_pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&uid)
        {
            return;
        }
        let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let deleting = pod.metadata.deletion_timestamp.is_some();
        if node_name.is_some() {
            self.forget_unscheduled(&uid);
        }
        if node_name.as_deref() == Some(self.inner.config.name.as_str()) {
            self.account(&uid, &pod);
        }
        match node_name {
            None if !deleting => self.schedule(pod),
            Some(node) if node == self.inner.config.name => {
                let mut pods = self.inner.pods.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(handle) = pods.get(&uid) {
                    let command = if deleting {
                        PodCommand::Terminate
                    } else if let Some(resource_version) = resource_version(&pod) {
                        PodCommand::Observed {
                            resource_version,
                            ready: pod_ready(&pod),
                        }
                    } else {
                        return;
                    };
                    let _ = handle.commands.send(command);
                    return;
                }
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                let finished = phase == "Failed" || phase == "Succeeded";
                if finished && !deleting {
                    return;
                }
                let (tx, rx) = mpsc::unbounded_channel();
                let agent_pid = Arc::new(AtomicU32::new(0));
                pods.insert(
                    uid.clone(),
                    PodHandle {
                        namespace: pod.namespace().unwrap_or_default(),
                        name: pod.name_any(),
                        commands: tx.clone(),
                        agent_pid: agent_pid.clone(),
                    },
                );
                drop(pods);
                if deleting {
                    let _ = tx.send(PodCommand::Terminate);
                }
                let inner = self.inner.clone();
                tokio::spawn(async move {
                    PodWorker::new(inner.shared.clone(), pod, rx, agent_pid)
                        .run()
                        .await;
                    inner
                        .pods
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&uid);
                });
            }
            _ => {}
        }
    }

    fn on_deleted(&self, pod: &Pod) {
        let uid = pod.uid().unwrap_or_default();
        self.forget_unscheduled(&uid);
        self.release(&uid);
        self.inner
            .terminated_pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&uid);
        if let Some(handle) = self
            .inner
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&uid)
        {
            let _ = handle.commands.send(PodCommand::Terminate);
        }
    }

    /// What the node offers pods now: its Node object as last seen, else its configuration.
    pub fn offer(&self) -> NodeOffer {
        let key = kube::runtime::reflector::ObjectRef::new(&self.inner.config.name);
        match self.inner.node_object.get(&key) {
            Some(node) => NodeOffer::from_node(&node),
            None => NodeOffer::from_config(&self.inner.config),
        }
    }

    /// Records the extended resources `pod`, bound to this node, holds (released when it finishes).
    fn account(&self, uid: &str, pod: &Pod) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Failed" | "Succeeded")) {
            self.release(uid);
            return;
        }
        let wanted = extended_requests(pod).unwrap_or_default();
        if !wanted.is_empty() {
            self.inner
                .extended_in_use
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(uid.to_string(), wanted);
        }
    }

    /// Gives back what pod `uid` held; pods waiting for it are tried again.
    fn release(&self, uid: &str) {
        let held = self
            .inner
            .extended_in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
        if held.is_some() {
            self.retry_unscheduled();
        }
    }

    fn forget_unscheduled(&self, uid: &str) {
        self.inner
            .unscheduled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
        self.inner
            .unschedulable_reported
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Looks again at every unbound pod that did not fit.
    fn retry_unscheduled(&self) {
        let waiting: Vec<Pod> = self
            .inner
            .unscheduled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for pod in waiting {
            self.schedule(pod);
        }
    }

    /// Binds `pod` to this node if it fits (taking its extended resources at once, so that pods
    /// decided one after another never share a device), or reports it `Unschedulable` with
    /// kube-scheduler's wording (again only when the reason changes). A pod that does not fit is
    /// tried again when it changes, when the Node changes and when a pod gives back extended
    /// resources.
    fn schedule(&self, pod: Pod) {
        let uid = pod.uid().unwrap_or_default();
        let why = {
            let mut in_use_by_pod = self
                .inner
                .extended_in_use
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let mut in_use: BTreeMap<String, i64> = BTreeMap::new();
            for (_, held) in in_use_by_pod.iter().filter(|(holder, _)| **holder != uid) {
                for (name, units) in held {
                    *in_use.entry(name.clone()).or_default() += units;
                }
            }
            let verdict = match extended_requests(&pod) {
                Ok(wanted) => unfit(&pod, &wanted, &self.offer(), &in_use).ok_or(wanted),
                Err(why) => Ok(format!("0/1 nodes are available: {why}.")),
            };
            let mut unscheduled = self
                .inner
                .unscheduled
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            match verdict {
                Ok(why) => {
                    unscheduled.insert(uid.clone(), pod.clone());
                    Some(why)
                }
                Err(wanted) => {
                    unscheduled.remove(&uid);
                    if !wanted.is_empty() {
                        in_use_by_pod.insert(uid.clone(), wanted);
                    }
                    None
                }
            }
        };
        let inner = self.inner.clone();
        let node = self.clone();
        tokio::spawn(async move {
            let Ok(_slot) = inner.bind_slots.acquire().await else {
                return;
            };
            let namespace = pod.namespace().unwrap_or_default();
            let name = pod.name_any();
            let api: Api<Pod> = Api::namespaced(inner.client.clone(), &namespace);
            if let Some(why) = why {
                let said_already = inner
                    .unschedulable_reported
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(uid, why.clone())
                    .is_some_and(|said| said == why);
                if said_already {
                    return;
                }
                let patch = json!({"status": {"conditions": [{
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": why,
                    "lastTransitionTime": crate::now_rfc3339(),
                }]}});
                if let Err(err) = api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    debug!(%err, pod = %name, "cannot report unschedulable");
                }
                return;
            }
            let binding = json!({
                "apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": inner.config.name},
            });
            if let Err(err) = api
                .create_subresource::<_, serde_json::Value>(
                    "binding",
                    &name,
                    &PostParams::default(),
                    &binding,
                )
                .await
            {
                warn!(%err, pod = %name, "bind failed");
                // A conflict is a pod bound already (by an earlier decision): it keeps what it holds.
                let bound = matches!(&err, kube::Error::Api(status) if status.code == 409);
                if !bound {
                    node.release(&uid);
                }
            }
        });
    }

    fn handle_of(&self, namespace: &str, name: &str) -> Option<mpsc::UnboundedSender<PodCommand>> {
        self.inner
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|h| h.namespace == namespace && h.name == name)
            .map(|h| h.commands.clone())
    }

    /// Fault: SIGKILLs the agent of pod `namespace/name` (the node then reports the container
    /// terminated and the pod Failed, as a kubelet does with `restartPolicy: Never`).
    pub fn kill_agent(&self, namespace: &str, name: &str) -> bool {
        self.handle_of(namespace, name)
            .is_some_and(|tx| tx.send(PodCommand::KillAgent).is_ok())
    }

    /// Fault: evicts pod `namespace/name` like node-pressure eviction (processes killed, pod Failed with
    /// reason `Evicted`).
    pub fn evict(&self, namespace: &str, name: &str) -> bool {
        self.handle_of(namespace, name)
            .is_some_and(|tx| tx.send(PodCommand::Evict).is_ok())
    }

    /// Fault: images matching `pattern` (`*` wildcards, else substring) fail to pull from now on.
    pub fn set_unpullable(&self, pattern: Option<&str>) {
        *self
            .inner
            .unpullable
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = pattern.map(str::to_string);
    }

    fn freeze_agents(&self, frozen: bool) {
        let pods = self.inner.pods.lock().unwrap_or_else(|p| p.into_inner());
        for handle in pods.values() {
            let _ = handle.commands.send(PodCommand::Freeze(frozen));
        }
    }

    /// Fault: freezes the node like a hung kubelet: agents are stopped (SIGSTOP), no pod is bound,
    /// started, probed or reported, and the node Lease is no longer renewed, so the controller
    /// manager's node-lifecycle controller marks the Node unknown and its pods not ready.
    pub async fn pause(&self) -> Result<()> {
        self.inner.paused.store(true, Ordering::SeqCst);
        self.freeze_agents(true);
        // Like a hung kubelet, say nothing: the node-lifecycle controller notices the silence.
        Ok(())
    }

    /// Undoes [`HollowNode::pause`] and catches up with every pod.
    pub async fn resume(&self) -> Result<()> {
        self.inner.paused.store(false, Ordering::SeqCst);
        self.freeze_agents(false);
        register(&self.inner, true).await?;
        let api: Api<Pod> = Api::all(self.inner.client.clone());
        for pod in api.list(&Default::default()).await? {
            self.on_pod(pod);
        }
        Ok(())
    }

    /// Process id of the agent of pod `namespace/name`, if it runs.
    pub fn agent_pid(&self, namespace: &str, name: &str) -> Option<u32> {
        self.inner
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|h| h.namespace == namespace && h.name == name)
            .map(|h| h.agent_pid.load(Ordering::SeqCst))
            .filter(|pid| *pid != 0)
    }

    /// Number of pods the node is running.
    pub fn running_pods(&self) -> usize {
        self.inner
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Stops every pod's processes (for teardown).
    pub async fn shutdown(&self) {
        let handles: Vec<_> = self
            .inner
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|h| h.commands.clone())
            .collect();
        for tx in handles {
            let _ = tx.send(PodCommand::Shutdown);
        }
    }
}

/// How often the node renews its Lease (a kubelet renews every 10 s; the test cluster's node-lifecycle
/// controller is configured with a 5 s grace period to match this faster beat).
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long one Lease renewal may take before the beat moves on.
const LEASE_RENEWAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// How often processes of removed pods that escaped their agent are swept.
const SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// Kills, every [`SWEEP_PERIOD`], leftover processes of pods removed since the last sweep. A stopped
/// agent kills its own commands; only processes that left their command's process group (daemons) can
/// outlive it. One pass over `/proc` per sweep keeps this cheap with thousands of pods.
async fn sweep_finished_pods(inner: Arc<Inner>) {
    loop {
        tokio::time::sleep(SWEEP_PERIOD).await;
        let finished = std::mem::take(
            &mut *inner
                .finished_pods
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        if !finished.is_empty() {
            let killed = tokio::task::spawn_blocking(move || {
                crate::supervise::kill_marked_any(pod_worker::POD_MARKER, &finished)
            })
            .await
            .unwrap_or(0);
            if killed > 0 {
                debug!(killed, "killed processes that outlived their pods");
            }
        }
    }
}

/// Name of the witness node: a cordoned Node that only heartbeats. With a single node, a silent node
/// would mean *all* nodes are silent, and the node-lifecycle controller then assumes a control-plane
/// partition and deliberately leaves pods alone ("master disruption mode"); a second healthy node makes
/// a paused node look like what it is.
fn witness_name(node: &str) -> String {
    format!("{node}-witness")
}

/// Renews the node Leases in `kube-node-lease` like a kubelet: the node's own while it is not paused,
/// the witness' always.
async fn heartbeat(inner: Arc<Inner>) {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(inner.client.clone(), "kube-node-lease");
    let node = inner.config.name.clone();
    let witness = witness_name(&node);
    loop {
        let paused = inner.paused.load(Ordering::SeqCst);
        for name in [&node, &witness] {
            if paused && name == &node {
                continue;
            }
            // MicroTime: the API server insists on exactly microseconds.
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now(),
            );
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now},
            });
            // Bounded like a kubelet's renewal: a request that hangs (an API server restarting under
            // it) must not stop every later beat, or the node would look dead for good.
            let params = PatchParams::apply("orchard-local-node").force();
            let patch = Patch::Apply(&lease);
            let renewal = leases.patch(name, &params, &patch);
            match tokio::time::timeout(LEASE_RENEWAL_TIMEOUT, renewal).await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => warn!(%err, "node lease renewal failed"),
                Err(_) => warn!(
                    lease = %name,
                    "node lease renewal timed out after {LEASE_RENEWAL_TIMEOUT:?}"
                ),
            }
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

/// Registers the cordoned witness node (no pods are ever bound to it).
async fn register_witness(inner: &Inner) -> Result<()> {
    let nodes: Api<Node> = Api::all(inner.client.clone());
    let name = witness_name(&inner.config.name);
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"orchard.dev/local-node-witness": "true"}},
        "spec": {"unschedulable": true},
    });
    nodes
        .patch(
            &name,
            &PatchParams::apply("orchard-local-node").force(),
            &Patch::Apply(&node),
        )
        .await?;
    let now = crate::now_rfc3339();
    let status = json!({"status": {
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "witness node of the orchard local node", "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
    }});
    nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Creates or updates the Node with a Ready (or NotReady) condition.
async fn register(inner: &Inner, ready: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(inner.client.clone());
    let name = &inner.config.name;
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": inner.config.labels},
        "spec": {},
    });
    nodes
        .patch(
            name,
            &PatchParams::apply("orchard-local-node").force(),
            &Patch::Apply(&node),
        )
        .await?;
    let now = crate::now_rfc3339();
    let capacity =
        json!({"cpu": "512", "memory": "2Ti", "pods": "20000", "ephemeral-storage": "100Ti"});
    let status = json!({"status": {
        "capacity": capacity, "allocatable": capacity,
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "conditions": [{
            "type": "Ready", "status": if ready { "True" } else { "Unknown" },
            "reason": if ready { "KubeletReady" } else { "NodeStatusUnknown" },
            "message": if ready { "orchard local node is posting ready status" } else { "local node paused" },
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "nodeInfo": {
            "machineID": "orchard-local", "systemUUID": "orchard-local", "bootID": "orchard-local",
            "kernelVersion": "local", "osImage": "orchard local node", "containerRuntimeVersion": "process://local",
            "kubeletVersion": "v1.36.3", "kubeProxyVersion": "v1.36.3", "operatingSystem": "linux", "architecture": "amd64",
        },
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}
