//! The `SandboxSnapshot` custom resource (`orchard.dev/v1alpha1`): the filesystem of a Ready
//! Sandbox's task container, committed on its node as one image layer on top of the sandbox's own
//! image and pushed to the operator's snapshot registry, so that new Sandboxes (`spec.fromSnapshot`)
//! start from that prepared state. Only the filesystem is kept: processes, memory and open
//! connections are not (docs/SNAPSHOTS.md).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which Sandbox to commit, which of its paths to keep, and how long to keep the snapshot once
/// nothing uses it.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "orchard.dev",
    version = "v1alpha1",
    kind = "SandboxSnapshot",
    namespaced,
    status = "SandboxSnapshotStatus",
    shortname = "sbxsnap",
    category = "orchard",
    derive = "PartialEq",
    doc = "The filesystem of a Ready Sandbox's task container, committed on its node (processes paused meanwhile) as one image layer on its image and pushed to the operator's snapshot registry. Sandboxes, SandboxPool and RolloutGroup templates start from it with spec.fromSnapshot. Memory and processes are not kept.",
    printcolumn(
        name = "Sandbox",
        type_ = "string",
        json_path = ".spec.sandbox",
        description = "The Sandbox it was taken from"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Pending, Committing, Ready or Failed"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why it is (not) Ready: e.g. SandboxNotReady, PushRefused, NodeGone, Committed"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".status.sizeBytes",
        description = "Bytes of the committed layer (uncompressed)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Image",
        type_ = "string",
        json_path = ".status.image",
        priority = 1,
        description = "The digest-pinned image forks run"
    ),
    validation = Rule::new("size(self.metadata.name) <= 63").message("a SandboxSnapshot name must be at most 63 characters (it labels the committer pod and names the image's repository)")
)]
#[x_kube(validation = Rule::new("self.sandbox == oldSelf.sandbox").message("spec.sandbox is immutable: create a new SandboxSnapshot"))]
#[x_kube(validation = Rule::new("has(self.paths) == has(oldSelf.paths) && (!has(self.paths) || self.paths == oldSelf.paths)").message("spec.paths is immutable: create a new SandboxSnapshot"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotSpec {
    /// Name of the Sandbox, in this namespace, whose task container's filesystem is committed. It must be Ready when the snapshot is taken; a Sandbox that is not fails the snapshot with reason `SandboxNotReady`.
    #[schemars(length(min = 1, max = 63))]
    pub sandbox: String,

    /// Absolute paths inside the container whose changes are kept (each with everything under it), e.g. `/work` and `/usr/local/lib/python3.11`. Changes elsewhere are left out. Empty or unset: every change of the whole root filesystem. Volumes mounted into the container are never part of a snapshot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 4096)))]
    #[x_kube(validation = Rule::new("self.all(p, p.startsWith('/'))").message("spec.paths must be absolute paths inside the container (starting with /)"))]
    #[x_kube(validation = Rule::new("self.all(p, !p.matches('(^|/)\\\\.\\\\.?(/|$)'))").message("spec.paths may not contain . or .. components: a path must stay inside the container's root filesystem"))]
    #[x_kube(validation = Rule::new("self.all(p, !p.contains('//') && !p.contains('\\n'))").message("spec.paths must be clean paths: no empty components (//) or line breaks"))]
    pub paths: Vec<String>,

    /// Delete the snapshot this many seconds after the last Sandbox, SandboxPool or RolloutGroup that names it in `fromSnapshot` stopped doing so (and at the earliest that long after it became Ready). Unset: kept until deleted. The image in the registry is not removed (the registry's retention does that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0").message("spec.ttlSecondsAfterUnused must be positive (leave it out to keep the snapshot until it is deleted)"))]
    pub ttl_seconds_after_unused: Option<i64>,
}

/// Lifecycle phase of a snapshot.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SnapshotPhase {
    /// Accepted; waiting for the Sandbox or for the committer pod to start.
    Pending,
    /// The committer pod runs on the sandbox's node: pause, diff, resume, push.
    Committing,
    /// The image is pushed: `status.image` is what forks run.
    Ready,
    /// The snapshot cannot be taken; the `Ready` condition's reason and message say why. Terminal: create a new SandboxSnapshot to try again.
    Failed,
}

impl SnapshotPhase {
    /// The phase's name as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Committing => "Committing",
            Self::Ready => "Ready",
            Self::Failed => "Failed",
        }
    }
}

/// Observed state of a SandboxSnapshot, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotStatus {
    /// Pending, Committing, Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SnapshotPhase>,

    /// The snapshot's image, pinned by digest (`registry/repository@sha256:...`): the sandbox's base image plus one layer holding the committed changes. Set once Ready; never changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub image: Option<String>,

    /// Size in bytes of the committed layer, uncompressed (what the sandbox changed, within `spec.paths`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,

    /// The image the Sandbox's task container runs, as its node resolved it (digest-pinned when the runtime reports a repository digest): the snapshot's layer goes on top of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub base_image: Option<String>,

    /// Node the Sandbox ran on, where the commit happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,

    /// UID of the Sandbox's Pod whose task container was committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,

    /// Milliseconds the sandbox's processes were paused (cgroup freezer) while the layer was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_milliseconds: Option<i64>,

    /// When the snapshot became Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// Since when nothing names this snapshot in `fromSnapshot` (absent while something does); `spec.ttlSecondsAfterUnused` counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unused_since: Option<Time>,

    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Conditions: `Ready` (reason `Committed` when True; `SandboxNotFound`, `SandboxNotReady`, `NodeGone`, `CommitFailed`, `PushRefused`, `SnapshotsDisabled`, `CommitterFailed`, `QuotaExceeded` (the namespace's `orchard.dev/snapshot-bytes` quota has no room for it) when it failed; `WaitingForSandbox`, `Committing` while pending), `InUse` (True while a Sandbox, SandboxPool or RolloutGroup names it: its deletion waits until none does, and the message names them), and the kstatus pair `Reconciling`/`Stalled`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
