//! What the node's pod workers share with the node: its configuration, its API client, whether it is
//! paused, the Secrets it watches, pod addresses and the pods it is done with. Below both, so neither imports the other's internals.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use kube::Client;

use super::ip_pool::IpPool;

/// How the local node behaves.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Node name.
    pub name: String,
    /// Where per-pod directories (volumes, root) are created.
    pub work_dir: PathBuf,
    /// Root filesystem of the agent injector image: a directory holding `orchard-agent`.
    pub agent_image_root: PathBuf,
    /// Images whose reference contains this string use `agent_image_root`.
    pub agent_image_pattern: String,
    /// Labels of the Node (pods' `nodeSelector` must match them).
    pub labels: BTreeMap<String, String>,
}

impl NodeConfig {
    /// A node named `name` working under `work_dir`, with the agent image rooted at `agent_image_root`.
    pub fn new(name: &str, work_dir: PathBuf, agent_image_root: PathBuf) -> Self {
        Self {
            name: name.to_string(),
            work_dir,
            agent_image_root,
            agent_image_pattern: "orchard-agent".to_string(),
            labels: BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                ("kubernetes.io/os".to_string(), "linux".to_string()),
                ("orchard.dev/local-node".to_string(), "true".to_string()),
            ]),
        }
    }
}

/// The node's state its pod workers read.
pub(crate) struct NodeShared {
    pub(crate) client: Client,
    pub(crate) config: NodeConfig,
    /// Paused like a kubelet whose node went silent: no status writes.
    pub(crate) paused: AtomicBool,
    /// Secrets from a watch, like a kubelet's watch-based secret manager (no GET per pod).
    pub(crate) secrets: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Secret>,
    /// Woken on every Secret change.
    pub(crate) secret_changed: tokio::sync::Notify,
    /// The image reference the unpullable fault refuses, if set.
    pub(crate) unpullable: Mutex<Option<String>>,
    /// Pod addresses handed out and returned.
    pub(crate) ip_pool: Mutex<IpPool>,
    /// Uids of pods removed since the last sweep for processes that escaped their agent.
    pub(crate) finished_pods: Mutex<HashSet<String>>,
    /// Uids of pods this node sent its final DELETE for, until the watch reports them gone: a late
    /// update of such a pod must not start a second worker (whose DELETE would only get a 404).
    pub(crate) terminated_pods: Mutex<HashSet<String>>,
}
