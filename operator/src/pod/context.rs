//! The settings and live state every sandbox Pod is built with, shared by the Sandbox and
//! SandboxPool controllers: the pod and policy shapes from the command line, the cluster's own
//! ranges as last observed (`cluster_ranges`), and one baseline-policy apply per namespace at a time.

use tokio::sync::watch;

use crate::plumbing::keyed_locks::KeyedLocks;
use crate::pod::cluster_ranges::{ClusterRanges, Watched};
use crate::pod::placement::Placement;
use crate::pod::policy::PolicyShape;
use crate::pod::policy_canary::PolicyCanaries;
use crate::pod::spec::PodShape;

/// How sandbox Pods and their policies are shaped (from the command line).
#[derive(Debug, Clone, PartialEq)]
pub struct PodSettings {
    /// Shape of sandbox pods.
    pub pod: PodShape,
    /// Inputs of the NetworkPolicies.
    pub policy: PolicyShape,
    /// Which placement fields sandboxes may set.
    pub placement: Placement,
    /// How the cluster's own ranges ([`ClusterRanges`]) enter policies and pods.
    pub ranges: RangeUse,
}

/// How the cluster's own ranges, observed while the operator runs, enter policies and pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeUse {
    /// The API server's endpoints are excepted from `AllowAll` and `AllowList` (not
    /// `--egress-allow-api-server`).
    pub protect_api_server: bool,
    /// New sandboxes' agents wait until their policies deny the canaries
    /// (`--await-policy-enforcement`).
    pub await_enforcement: bool,
    /// The nodes' pod ranges are excepted from `AllowAll`'s IP blocks (`--discover-pod-cidrs`, and
    /// not `--egress-allow-operator-namespace`).
    pub protect_pod_cidrs: bool,
}

impl RangeUse {
    /// What the operator must observe for this use.
    pub fn watched(&self) -> Watched {
        Watched {
            api_server: self.protect_api_server || self.await_enforcement,
            nodes: self.protect_pod_cidrs,
        }
    }
}

impl PodSettings {
    /// The inputs of the NetworkPolicies with the cluster's current `ranges` (pure).
    pub fn policy_shape(&self, ranges: &ClusterRanges) -> PolicyShape {
        let mut shape = self.policy.clone();
        if self.ranges.protect_api_server {
            shape
                .protected_cidrs
                .extend(ranges.api_server.iter().cloned());
        }
        if self.ranges.protect_pod_cidrs {
            shape
                .protected_cidrs
                .extend(ranges.pod_cidrs.iter().cloned());
        }
        shape
    }

    /// The shape of new sandbox pods with the cluster's current `ranges` (pure): the canaries are
    /// the API server's endpoints that answered the operator.
    pub fn pod_shape(&self, ranges: &ClusterRanges) -> PodShape {
        let mut shape = self.pod.clone();
        if self.ranges.await_enforcement {
            shape.policy_canaries = PolicyCanaries {
                addresses: ranges.live_canaries.clone(),
                denied_to_open_egress: self.ranges.protect_api_server,
            };
        }
        shape
    }
}

/// The pod settings with the cluster's ranges as they change, and the namespace baseline lock.
pub struct PodCtx {
    /// From the command line.
    pub settings: PodSettings,
    /// The cluster's own ranges as last observed (`cluster_ranges`).
    pub ranges: watch::Receiver<ClusterRanges>,
    /// One baseline-policy apply in flight per namespace (the first sandboxes of a new namespace would
    /// otherwise all apply the same object at once, and the API server serialises those updates).
    pub baselines: KeyedLocks,
}

impl PodCtx {
    /// A context over `settings` and the ranges `ranges` reports.
    pub fn new(settings: PodSettings, ranges: watch::Receiver<ClusterRanges>) -> Self {
        Self {
            settings,
            ranges,
            baselines: KeyedLocks::default(),
        }
    }

    /// The inputs of the NetworkPolicies now (see [`PodSettings::policy_shape`]).
    pub fn policy_shape(&self) -> PolicyShape {
        self.settings.policy_shape(&self.ranges.borrow())
    }

    /// The shape of a sandbox pod created now (see [`PodSettings::pod_shape`]).
    pub fn pod_shape(&self) -> PodShape {
        self.settings.pod_shape(&self.ranges.borrow())
    }
}
