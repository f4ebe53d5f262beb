//! The `SandboxPool` custom resource (`orchard.dev/v1alpha1`): a namespaced set of warm sandbox Pods,
//! already started and answering, that Sandboxes naming the pool (`spec.pool`) claim instead of
//! starting a Pod of their own. Each member serves exactly one claim; the pool refills.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::SandboxSpec;

/// Desired warm capacity: how many unclaimed members to keep, built from which sandbox template.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "orchard.dev",
    version = "v1alpha1",
    kind = "SandboxPool",
    namespaced,
    status = "SandboxPoolStatus",
    shortname = "sbxpool",
    category = "orchard",
    derive = "PartialEq",
    doc = "Warm sandbox Pods, started and answering, that Sandboxes naming this pool (spec.pool) claim instead of starting their own Pod. Each member serves one claim and is never reused; the pool refills to spec.replicas. Supports the scale subresource (kubectl scale, HPA, KEDA).",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Unclaimed members the pool keeps"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Members ready to be claimed"
    ),
    printcolumn(
        name = "Starting",
        type_ = "integer",
        json_path = ".status.startingReplicas",
        description = "Members still starting"
    ),
    printcolumn(
        name = "Claimed/min",
        type_ = "integer",
        json_path = ".status.claimedLastMinute",
        description = "Members claimed in the last minute"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    validation = Rule::new("size(self.metadata.name) <= 57").message("a SandboxPool name must be at most 57 characters (its members are named <pool>-<5 characters> and labelled with that name)")
)]
#[x_kube(validation = Rule::new("size(self.template.image) > 0 || has(self.template.fromSnapshot)").message("template.image (or template.fromSnapshot) is required"))]
#[x_kube(validation = Rule::new("!has(self.template.pool)").message("template.pool cannot be set: a pool's members start cold"))]
#[x_kube(validation = Rule::new("!has(self.template.run)").message("template.run cannot be set: a warm member runs nothing until it is claimed (set run on the claiming Sandbox)"))]
#[x_kube(validation = Rule::new("!has(self.template.retry)").message("template.retry cannot be set: a warm member is never retried (set retry on the claiming Sandbox: a retry starts the Sandbox's own pod)"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxPoolSpec {
    /// Unclaimed members to keep (Ready or starting). A claimed member leaves the pool and a new one is started; `kubectl scale` and autoscalers set this through the scale subresource.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: i32,

    /// The sandbox every member is built from. Its image, resources, env, working directory, security, startup command and placement shape the member's Pod; a Sandbox claims a member only when its own values of these fields are unset or equal. `network` and `lifecycle` are defaults for the Sandboxes that claim a member (a member itself has no egress at all); `run`, `pool` and `retry` cannot be set.
    pub template: SandboxSpec,
}

/// Observed state of a SandboxPool, written by the operator.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPoolStatus {
    /// Unclaimed members built from the current template (Ready or starting; Terminating ones are not counted).
    #[serde(default)]
    pub replicas: i32,

    /// Members whose agent answers: what the next claims get.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Members still starting (scheduling, pulling, starting the agent).
    #[serde(default)]
    pub starting_replicas: i32,

    /// Members claimed by Sandboxes in the last 60 seconds (as counted by the current leader replica).
    #[serde(default)]
    pub claimed_last_minute: i64,

    /// Members claimed since the current leader replica started.
    #[serde(default)]
    pub claimed_total: i64,

    /// Label selector of the unclaimed members, for the scale subresource (`orchard.dev/pool=<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Conditions: `Ready` (every desired member is Ready), `Reconciling` (members are starting or being replaced) and `Stalled` (members cannot start: `reason` says why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}
