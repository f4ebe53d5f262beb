//! The `RolloutGroup` custom resource (`orchard.dev/v1alpha1`): one prompt's trajectories, launched one
//! stride at a time until Balanced Adaptive Rollout (BAR, see `docs/BAR.md`) can assemble a
//! reward-balanced group of exactly `groupSize` members, recorded in `status.group`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::retry::{AttemptRecord, RetryPolicy, first_attempt, is_first_attempt};
use super::sandbox::{SandboxSpec, TrajectoryStatus};

/// The CEL rule (on the group's spec) "`retry.onOOM.$max`, when set, is not below the template's
/// `resources.$amount`, when that is set". Quantities that do not parse are left to their own rules.
macro_rules! not_below_template {
    ($max:literal, $amount:literal) => {
        concat!(
            "!has(self.retry) || !has(self.retry.onOOM) || !has(self.retry.onOOM.",
            $max,
            ") || !has(self.template.spec.resources) || !has(self.template.spec.resources.",
            $amount,
            ") || !isQuantity(string(self.retry.onOOM.",
            $max,
            ")) || !isQuantity(string(self.template.spec.resources.",
            $amount,
            ")) || quantity(string(self.retry.onOOM.",
            $max,
            ")).compareTo(quantity(string(self.template.spec.resources.",
            $amount,
            "))) >= 0"
        )
    };
}

/// Desired rollout: group size, trajectory budget, stride and the reward balance to aim for.
// Each printer column repeats `type_ = ...`; clippy mistakes the repeats for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "orchard.dev",
    version = "v1alpha1",
    kind = "RolloutGroup",
    namespaced,
    status = "RolloutGroupStatus",
    shortname = "rg",
    category = "orchard",
    derive = "PartialEq",
    doc = "One prompt's trajectories under Balanced Adaptive Rollout: the operator launches trajectory Sandboxes one stride at a time until it can record a reward-balanced group of exactly groupSize members in status.group.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Pending, Queued, Generating, Complete or Failed"
    ),
    printcolumn(
        name = "Selection",
        type_ = "string",
        json_path = ".status.selection",
        description = "How the group was chosen: Balanced, Relaxed, TopRanked or Dropped"
    ),
    printcolumn(
        name = "Positives",
        type_ = "integer",
        json_path = ".status.positives",
        description = "Members of the group with positive reward"
    ),
    printcolumn(
        name = "Launched",
        type_ = "integer",
        json_path = ".status.trajectoriesLaunched",
        description = "Trajectories launched so far"
    ),
    printcolumn(
        name = "Queue",
        type_ = "string",
        json_path = ".spec.queue",
        priority = 1,
        description = "The RolloutQueue admitting its strides"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    validation = Rule::new("size(self.metadata.name) <= 58").message("a RolloutGroup name must be at most 58 characters (trajectory Sandboxes are named <group>-<index>)")
)]
#[x_kube(validation = Rule::new("self.groupSize <= self.maxTrajectories").message("groupSize must not exceed maxTrajectories"))]
#[x_kube(validation = Rule::new("!has(self.stride) || self.maxTrajectories % self.stride == 0").message("stride must divide maxTrajectories"))]
#[x_kube(validation = Rule::new("!has(self.filter) || !has(self.filter.maxBackfill) || self.filter.maxBackfill <= self.groupSize").message("filter.maxBackfill must not exceed groupSize"))]
#[x_kube(validation = Rule::new("self == oldSelf").message("RolloutGroup spec is immutable: create a new RolloutGroup instead"))]
#[x_kube(validation = Rule::new(not_below_template!("maxMemory", "memory")).message("retry.onOOM.maxMemory must not be below template.spec.resources.memory: escalation only ever raises the memory a trajectory starts with"))]
#[x_kube(validation = Rule::new(not_below_template!("maxCpu", "cpu")).message("retry.onOOM.maxCpu must not be below template.spec.resources.cpu: escalation only ever raises the CPU a trajectory starts with"))]
#[x_kube(validation = Rule::new("!has(self.template.spec.retry)").message("template.spec.retry cannot be set: a RolloutGroup retries its trajectories itself; set the group's own spec.retry (the same fields)"))]
#[serde(rename_all = "camelCase")]
pub struct RolloutGroupSpec {
    /// N: trajectories in the recorded group (trainers normalise advantages per group of exactly N).
    #[serde(default = "default_group_size")]
    #[schemars(range(min = 1, max = 1024))]
    pub group_size: i32,

    /// Nmax: most trajectories ever launched for this group.
    #[serde(default = "default_max_trajectories")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_trajectories: i32,

    /// s: trajectories launched in parallel per stride; must divide maxTrajectories. Defaults to maxTrajectories (one stride, as in the paper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub stride: Option<i32>,

    /// Target share [min, max] of positive-reward members in the group.
    #[serde(default)]
    pub positive_fraction: PositiveFraction,

    /// When BAR checks whether a balanced group can be assembled: at stride boundaries (the paper) or after every finished trajectory (Eager: faster, but favours shorter trajectories).
    #[serde(default)]
    pub early_stop: EarlyStop,

    /// Group-level filter: drop groups with zero reward variance or too much backfill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<GroupFilter>,

    /// Template of each trajectory's Sandbox.
    pub template: SandboxTemplate,

    /// Overrides `template.spec.run.timeoutSeconds`: a trajectory running longer is aborted with reason TimeExceeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub trajectory_timeout_seconds: Option<i64>,

    /// What happens to trajectory Sandboxes once the group is complete: Delete (default; status keeps what a trainer needs) or Keep. On a queue, Delete also deletes each finished trajectory as soon as its outcome is recorded, so its capacity is freed.
    #[serde(default)]
    pub cleanup: CleanupPolicy,

    /// Name of a RolloutQueue in the same namespace: each stride waits for admission by it instead of launching at once. Without it the group launches its strides unconditionally.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub queue: Option<String>,

    /// Seconds over which each stride's trajectories start (their Pods are created at spread-out times in [0, launchJitterSeconds), in an order that is a fixed function of the group's UID and the trajectory's index) so that many groups launching at once do not create every Pod in the same instant (the paper's jitter against thundering herds). Unset: 1 second; 0 starts the whole stride at once. A retried attempt starts at once. Most 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 60.0))]
    pub launch_jitter_seconds: Option<f64>,

    /// Retries of trajectories whose sandbox ran out of memory (with more memory, and optionally more CPU, each time) or lost its pod to an eviction. A retry is the same trajectory again: it keeps its name and stride, BAR sees only its last attempt's outcome, and it counts once toward maxTrajectories. Without it nothing is retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,

    /// The group's own deadline in seconds, counted from its first admitted stride (status.startTime): when it passes, trajectories without an outcome are aborted with reason DeadlineExceeded and the group is recorded from what finished. Trajectories waiting for quota or for a node wait until then (without it, they wait indefinitely).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,
}

fn default_group_size() -> i32 {
    8
}

fn default_max_trajectories() -> i32 {
    16
}

/// Bounds of the share of positive-reward members, each in [0, 1].
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.min <= self.max").message("positiveFraction.min must not exceed positiveFraction.max"))]
pub struct PositiveFraction {
    /// Lowest share of positives (rounded up to whole members: ceil(min x N)).
    #[serde(default = "default_positive_min")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min: f64,
    /// Highest share of positives (rounded down to whole members: floor(max x N)).
    #[serde(default = "default_positive_max")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub max: f64,
}

impl Default for PositiveFraction {
    fn default() -> Self {
        Self {
            min: default_positive_min(),
            max: default_positive_max(),
        }
    }
}

fn default_positive_min() -> f64 {
    0.375
}

fn default_positive_max() -> f64 {
    0.625
}

/// When BAR tries to assemble the group.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum EarlyStop {
    /// After every stride has fully finished (the paper's schedule).
    #[default]
    StrideBoundary,
    /// After every finished trajectory; still-running trajectories are deleted once the group is assembled.
    Eager,
}

/// Group-level filter applied to the assembled group.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupFilter {
    /// Whether the filter is on (default true).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Most backfill (aborted) members a group may hold; defaults to groupSize / 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_backfill: Option<i32>,
}

fn default_true() -> bool {
    true
}

/// Metadata and spec of each trajectory Sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct SandboxTemplate {
    /// Labels and annotations copied onto each trajectory Sandbox.
    #[serde(default)]
    pub metadata: TemplateMetadata,
    /// Spec of each trajectory Sandbox (usually with `run` set).
    pub spec: SandboxSpec,
}

/// Labels and annotations of a template. Keys under `orchard.dev/` are the operator's (they decide a
/// queue's slots and which group a Sandbox belongs to) and are refused.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[x_kube(validation = Rule::new("!has(self.labels) || self.labels.all(k, !k.startsWith('orchard.dev/'))").message("template.metadata.labels may not use keys under orchard.dev/: the operator sets those on each trajectory"))]
#[x_kube(validation = Rule::new("!has(self.annotations) || self.annotations.all(k, !k.startsWith('orchard.dev/'))").message("template.metadata.annotations may not use keys under orchard.dev/: the operator sets those on each trajectory"))]
pub struct TemplateMetadata {
    /// Labels added to each trajectory Sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations added to each trajectory Sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// What happens to trajectory Sandboxes once the group is complete.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum CleanupPolicy {
    /// Delete them (status keeps rewards, lengths and artifacts).
    #[default]
    Delete,
    /// Keep them for inspection; they still expire by their own lifecycle.
    Keep,
}

/// Observed progress of a RolloutGroup; a trainer waits for `Complete=True` and reads `group`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutGroupStatus {
    /// Pending, Queued, Generating, Complete or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RolloutPhase>,

    /// While a stride waits for admission: its 1-based position among the queue's waiting strides when the group was last reconciled (the RolloutQueue's status shows the live order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,

    /// While a stride waits for admission: when it began to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_since: Option<Time>,

    /// When the queue last admitted a stride of this group (the Fair order's round-robin key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_admission_time: Option<Time>,

    /// How the group was chosen: Balanced, Relaxed, TopRanked or Dropped (set when Complete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Selection>,

    /// Why a Dropped group was dropped: ZeroVariance, TooMuchBackfill or Empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_reason: Option<String>,

    /// Members of `group` with positive reward (n+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positives: Option<i32>,

    /// Strides launched so far.
    #[serde(default)]
    pub strides_launched: i32,

    /// Trajectories launched so far.
    #[serde(default)]
    pub trajectories_launched: i32,

    /// Finished usable trajectories with reward > 0.
    #[serde(default)]
    pub positive_trajectories: i32,

    /// Finished usable trajectories with reward <= 0.
    #[serde(default)]
    pub negative_trajectories: i32,

    /// Aborted trajectories (crashes, time-outs, missing results); used only as backfill.
    #[serde(default)]
    pub backfill_trajectories: i32,

    /// Trajectories still running.
    #[serde(default)]
    pub running_trajectories: i32,

    /// Every trajectory launched, with its stride and, once finished, its outcome.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trajectories: Vec<TrajectoryRecord>,

    /// The selected group, ranked: exactly groupSize members when Complete and not Dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group: Vec<GroupMember>,

    /// Conditions; `Complete=True` once the group is recorded (`kubectl wait --for=condition=Complete`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// When the first stride was launched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the group was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// Human-readable detail of the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Phase of a RolloutGroup.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// Accepted, nothing launched yet.
    Pending,
    /// A stride waits for admission by the group's RolloutQueue; the startup and trajectory timeouts have not started for it.
    Queued,
    /// Trajectories are running.
    Generating,
    /// The group is recorded (possibly Dropped).
    Complete,
    /// The group cannot be generated (e.g. invalid spec); `message` says why.
    Failed,
}

impl RolloutPhase {
    /// The phase's name as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Queued => "Queued",
            Self::Generating => "Generating",
            Self::Complete => "Complete",
            Self::Failed => "Failed",
        }
    }
}

/// How the group was chosen (docs/BAR.md).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Selection {
    /// n+ within [ceil(min N), floor(max N)].
    Balanced,
    /// Budget spent: any n+ in [1, N-1].
    Relaxed,
    /// Still nothing: the N best trajectories.
    TopRanked,
    /// Filtered out (zero variance or too much backfill); `group` is empty. Create another RolloutGroup.
    Dropped,
}

/// One launched trajectory.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrajectoryRecord {
    /// Name of the trajectory's Sandbox.
    pub name: String,
    /// Stride (0-based) the trajectory was launched in.
    pub stride: i32,
    /// Outcome, once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TrajectoryStatus>,
    /// Reward, once finished (absent for aborted trajectories without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,
    /// Length, once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<i64>,
    /// Artifact pointer, once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
    /// Why it was aborted, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Attempts launched so far, the first one included (retry); omitted when 1.
    #[serde(default = "first_attempt", skip_serializing_if = "is_first_attempt")]
    #[schemars(range(min = 1))]
    pub attempts: i32,
    /// The attempts that failed and were tried again, oldest first: how each ended and what it ran with. When it holds as many entries as `attempts`, the next attempt is about to be created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_attempts: Vec<AttemptRecord>,
    /// Why a retried attempt has not started: its Sandbox's `Scheduled` condition, as `reason: message` (e.g. `Unschedulable: 0/2 nodes are available: 2 Insufficient memory.` when no node fits the escalated memory). Set only for attempts after the first, while they wait; gone once the attempt is scheduled or has an outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

impl TrajectoryRecord {
    /// Trajectory `name` of stride `stride`, just launched: its first attempt, no outcome yet.
    pub fn launched(name: String, stride: i32) -> Self {
        Self {
            name,
            stride,
            status: None,
            reward: None,
            length: None,
            artifact: None,
            reason: None,
            attempts: 1,
            previous_attempts: Vec::new(),
            waiting: None,
        }
    }
}

/// One member of the selected group.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupMember {
    /// Name of the trajectory's Sandbox.
    pub name: String,
    /// Reward (0 for backfill members without one).
    pub reward: f64,
    /// completed, truncated or aborted (backfill).
    pub status: TrajectoryStatus,
    /// Length in tokens or steps.
    pub length: i64,
    /// Artifact pointer the runner chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<String>,
}
