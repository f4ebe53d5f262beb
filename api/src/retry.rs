//! Retries, shared by RolloutGroups (`spec.retry`: each trajectory is tried again) and standalone
//! Sandboxes (`spec.retry`: the sandbox gets a new pod): which endings are retried, how the resources
//! grow after an out-of-memory ending, and the record of an attempt that was tried again.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which failed attempts are tried again, and with what.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    /// Most attempts, the first one included (1 to 10; 1 retries nothing). When the last attempt also fails, a RolloutGroup's trajectory is recorded aborted and a Sandbox fails, each with that attempt's reason.
    #[serde(default = "default_max_attempts")]
    #[schemars(range(min = 1, max = 10))]
    pub max_attempts: i32,

    /// Retry an attempt that ran out of memory (the sandbox's task container OOM-killed, or its pod evicted because the node was low on memory; in a RolloutGroup also the run's own command OOM-killed) with the memory multiplied by memoryFactor, up to maxMemory. Without it, out-of-memory failures are not retried.
    #[serde(rename = "onOOM", default, skip_serializing_if = "Option::is_none")]
    pub on_oom: Option<OomEscalation>,

    /// Retry an attempt whose pod was evicted or deleted under it (reasons Evicted, PodDeleted, NodeLost) with the same resources. An eviction because the node was low on memory gets more memory when onOOM allows it, and the same otherwise. Default false.
    #[serde(default)]
    pub on_eviction: bool,
}

fn default_max_attempts() -> i32 {
    3
}

/// How the resources of an attempt grow when the one before it ran out of memory.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("double(self.memoryFactor) > 1.0").message("retry.onOOM.memoryFactor must be greater than 1 (e.g. 2: each retry gets twice the memory)"))]
#[x_kube(validation = Rule::new("!has(self.cpuFactor) || double(self.cpuFactor) > 1.0").message("retry.onOOM.cpuFactor must be greater than 1 when set (leave it out to keep the CPU unchanged)"))]
#[x_kube(validation = Rule::new(positive_quantity!("maxMemory")).message("retry.onOOM.maxMemory must be a quantity greater than 0 (e.g. 8Gi)"))]
#[x_kube(validation = Rule::new(positive_quantity!("maxCpu")).message("retry.onOOM.maxCpu must be a quantity greater than 0 (e.g. 4 or 1500m)"))]
#[serde(rename_all = "camelCase")]
pub struct OomEscalation {
    /// Each retry's memory is the failed attempt's times this factor, rounded up to whole MiB and capped at maxMemory (default 2; must be greater than 1).
    #[serde(default = "default_memory_factor")]
    pub memory_factor: f64,

    /// Each retry's CPU is the failed attempt's times this factor, rounded up to whole millicores and capped at maxCpu when that is set (greater than 1). Without it the CPU stays as the first attempt had it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_factor: Option<f64>,

    /// The most memory an attempt gets, e.g. `8Gi`. An attempt that runs out of memory with this much already is not retried. Must not be below the memory the first attempt runs with (the group template's or the Sandbox's `resources.memory`, or the operator's default memory when that is unset: the group or the Sandbox then fails with InvalidSpec).
    pub max_memory: Quantity,

    /// The most CPU an attempt gets when cpuFactor is set, e.g. `4`. Must not be below the CPU the first attempt runs with (`resources.cpu`, or the operator's default). Without it the CPU grows with every retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cpu: Option<Quantity>,
}

fn default_memory_factor() -> f64 {
    2.0
}

/// One failed attempt that was tried again: of a RolloutGroup's trajectory, or of a Sandbox's pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// How it ended: `OOMKilled`, `Evicted`, `PodDeleted` or `NodeLost`.
    pub reason: String,
    /// What its sandbox or run said (the start of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The memory it ran with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// The CPU it ran with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
}

/// The `attempts` of a status that says none: the first.
pub(crate) fn first_attempt() -> i32 {
    1
}

/// Whether `attempts` is the first (then a status leaves it out).
pub(crate) fn is_first_attempt(attempts: &i32) -> bool {
    *attempts == 1
}
