//! The `RolloutQueue` custom resource (`orchard.dev/v1alpha1`): a namespaced bound on how many
//! trajectory Sandboxes the RolloutGroups that name it (`spec.queue`) run at once. A group's stride
//! waits for admission instead of launching; strides are admitted whole, in FIFO or Fair order.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired admission: how many trajectory Sandboxes may hold capacity at once, and in which order
/// waiting strides are admitted.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "orchard.dev",
    version = "v1alpha1",
    kind = "RolloutQueue",
    namespaced,
    status = "RolloutQueueStatus",
    shortname = "rq",
    category = "orchard",
    derive = "PartialEq",
    doc = "A bound on the trajectory Sandboxes that the RolloutGroups naming this queue (spec.queue) run at once: a group's stride waits for admission instead of launching, and is admitted whole, in FIFO or Fair order.",
    printcolumn(
        name = "Max",
        type_ = "integer",
        json_path = ".spec.maxRunningTrajectories",
        description = "Most trajectory Sandboxes holding capacity at once"
    ),
    printcolumn(
        name = "Running",
        type_ = "integer",
        json_path = ".status.runningTrajectories",
        description = "Trajectory Sandboxes holding capacity now"
    ),
    printcolumn(
        name = "Waiting",
        type_ = "integer",
        json_path = ".status.waitingGroups",
        description = "Groups whose next stride waits for admission"
    ),
    printcolumn(
        name = "Order",
        type_ = "string",
        json_path = ".spec.admission",
        description = "FIFO or Fair"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RolloutQueueSpec {
    /// Most trajectory Sandboxes of this queue's groups that hold capacity at once: from admission until the Sandbox and its Pod are gone (a finished trajectory of a group with cleanup Delete is deleted as soon as the group has recorded its outcome).
    #[schemars(range(min = 1, max = 100000))]
    pub max_running_trajectories: i32,

    /// Order in which waiting strides are admitted: Fair (default; round-robin: the group admitted least recently goes first, so every group's next stride gets its turn) or FIFO (by the group's creation time: older groups finish first).
    #[serde(default)]
    pub admission: AdmissionOrder,
}

/// Order in which a queue admits waiting strides.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum AdmissionOrder {
    /// Round-robin across groups: the group admitted least recently (never admitted first) goes first.
    #[default]
    Fair,
    /// By the group's creation time, oldest first.
    #[serde(rename = "FIFO")]
    Fifo,
}

impl AdmissionOrder {
    /// The order's name as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionOrder::Fair => "Fair",
            AdmissionOrder::Fifo => "FIFO",
        }
    }
}

/// Observed use of a queue, recomputed by the operator from the Sandboxes and Pods it watches.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutQueueStatus {
    /// Trajectory Sandboxes holding capacity now (admitted and not yet gone).
    #[serde(default)]
    pub running_trajectories: i32,

    /// Groups whose next stride waits for admission.
    #[serde(default)]
    pub waiting_groups: i32,

    /// Trajectories the waiting strides ask for in all.
    #[serde(default)]
    pub waiting_trajectories: i32,

    /// When the longest-waiting stride began to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_waiting_since: Option<Time>,

    /// The first waiting strides in admission order (at most 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<WaitingStride>,

    /// Conditions: `Active=True` once the operator accounts for the queue.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One stride waiting for admission.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitingStride {
    /// The RolloutGroup's name.
    pub group: String,
    /// Trajectories the stride asks for.
    pub trajectories: i32,
    /// When it began to wait.
    pub since: Time,
}
