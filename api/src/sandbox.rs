//! The `Sandbox` custom resource (`orchard.dev/v1alpha1`): one isolated environment built from an
//! arbitrary task image, reachable through the injected agent at its pod IP.
//!
//! Every field carries a doc comment: they become the `kubectl explain` text of the CRD.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::retry::{AttemptRecord, RetryPolicy, first_attempt, is_first_attempt};

/// The CEL rule (on a sandbox's spec) "`retry.onOOM.$max`, when set, is not below the spec's
/// `resources.$amount`, when that is set" (the RolloutGroup's `not_below_template!` on a Sandbox's own
/// fields). Quantities that do not parse are left to their own rules.
macro_rules! not_below_resources {
    ($max:literal, $amount:literal) => {
        concat!(
            "!has(self.retry) || !has(self.retry.onOOM) || !has(self.retry.onOOM.",
            $max,
            ") || !has(self.resources) || !has(self.resources.",
            $amount,
            ") || !isQuantity(string(self.retry.onOOM.",
            $max,
            ")) || !isQuantity(string(self.resources.",
            $amount,
            ")) || quantity(string(self.retry.onOOM.",
            $max,
            ")).compareTo(quantity(string(self.resources.",
            $amount,
            "))) >= 0"
        )
    };
}

/// Desired state of a Sandbox: which image to run and how it is isolated, sized and expired.
// Each printer column repeats `type_ = ...`; clippy mistakes the repeats for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "orchard.dev",
    version = "v1alpha1",
    kind = "Sandbox",
    namespaced,
    status = "SandboxStatus",
    shortname = "sbx",
    category = "orchard",
    derive = "PartialEq",
    doc = "An isolated sandbox built from an arbitrary task image. The operator runs it as a Pod whose task container serves the Orchard agent (exec, files, patches) on its pod IP.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Lifecycle phase"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the agent answers"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why it is (not) Ready: e.g. PodPending, ImagePullBackOff, PolicyEnforcementMissing, StartupTimeout, SandboxReady"
    ),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".status.podIP",
        description = "Pod IP the agent listens on"
    ),
    printcolumn(
        name = "Expires",
        // `string`, not `date`: kubectl renders a future `date` as `<invalid>`.
        type_ = "string",
        json_path = ".status.expiresAt",
        description = "When the sandbox is deleted unless a heartbeat arrives (UTC)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Node",
        type_ = "string",
        json_path = ".status.nodeName",
        priority = 1,
        description = "Node the pod runs on"
    ),
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".status.podName",
        priority = 1,
        description = "The sandbox's pod (a pool member's own name when claimed from a pool)"
    ),
    printcolumn(
        name = "Pool",
        type_ = "string",
        json_path = ".spec.pool",
        priority = 1,
        description = "The SandboxPool it was claimed from"
    ),
    validation = Rule::new("size(self.metadata.name) <= 63").message("a Sandbox name must be at most 63 characters (it labels the sandbox's pod and policies)")
)]
#[x_kube(validation = Rule::new("size(self.image) > 0 || has(self.pool) || has(self.fromSnapshot)").message("spec.image is required unless spec.pool names a SandboxPool or spec.fromSnapshot names a SandboxSnapshot"))]
#[x_kube(validation = Rule::new("!has(self.fromSnapshot) || size(self.image) == 0").message("spec.image and spec.fromSnapshot are mutually exclusive: a snapshot's image is the image of the sandbox it was taken from plus its committed layer"))]
#[x_kube(validation = Rule::new("has(self.fromSnapshot) == has(oldSelf.fromSnapshot) && (!has(self.fromSnapshot) || self.fromSnapshot == oldSelf.fromSnapshot)").message("spec.fromSnapshot is immutable: create a new Sandbox"))]
#[x_kube(validation = Rule::new("has(self.pool) == has(oldSelf.pool) && (!has(self.pool) || self.pool == oldSelf.pool)").message("spec.pool is immutable: create a new Sandbox"))]
#[x_kube(validation = Rule::new("!has(self.whenPoolEmpty) || has(self.pool)").message("spec.whenPoolEmpty needs spec.pool"))]
#[x_kube(validation = Rule::new("self.image == oldSelf.image").message("spec.image is immutable: create a new Sandbox"))]
#[x_kube(validation = Rule::new("has(self.resources) == has(oldSelf.resources) && (!has(self.resources) || self.resources == oldSelf.resources)").message("spec.resources is immutable: create a new Sandbox"))]
#[x_kube(validation = Rule::new("has(self.run) == has(oldSelf.run) && (!has(self.run) || self.run == oldSelf.run)").message("spec.run is immutable once the sandbox exists"))]
#[x_kube(validation = Rule::new("has(self.security) == has(oldSelf.security) && (!has(self.security) || self.security == oldSelf.security)").message("spec.security is immutable: create a new Sandbox"))]
#[x_kube(validation = Rule::new("has(self.retry) == has(oldSelf.retry) && (!has(self.retry) || self.retry == oldSelf.retry)").message("spec.retry is immutable: create a new Sandbox"))]
#[x_kube(validation = Rule::new(not_below_resources!("maxMemory", "memory")).message("retry.onOOM.maxMemory must not be below spec.resources.memory: escalation only ever raises the memory the sandbox starts with"))]
#[x_kube(validation = Rule::new(not_below_resources!("maxCpu", "cpu")).message("retry.onOOM.maxCpu must not be below spec.resources.cpu: escalation only ever raises the CPU the sandbox starts with"))]
#[x_kube(validation = Rule::new("!has(self.tolerations) || self.tolerations.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || size(t.value) == 0)").message("tolerations[].value must be empty when the operator is Exists"))]
#[x_kube(validation = Rule::new("!has(self.tolerations) || self.tolerations.all(t, (has(t.key) && size(t.key) > 0) || (has(t.operator) && t.operator == 'Exists'))").message("a toleration with an empty key must use operator Exists"))]
#[x_kube(validation = Rule::new("!has(self.tolerations) || self.tolerations.all(t, !has(t.tolerationSeconds) || (has(t.effect) && t.effect == 'NoExecute'))").message("tolerations[].tolerationSeconds needs effect NoExecute"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    /// Container image of the task environment (any Linux image: distroless and scratch work, no shell needed). Required unless `pool` names a SandboxPool, whose template's image applies when this is empty.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub image: String,

    /// When the node pulls the image: Always, IfNotPresent or Never. Kubernetes' default applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Secrets in the sandbox's namespace used to pull the image (Kubernetes looks them up in the Pod's namespace only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub image_pull_secrets: Vec<SecretName>,

    /// CPU, memory, ephemeral storage and GPUs of the task container. Requests equal limits; unset values take the operator's defaults (no GPU by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<SandboxResources>,

    /// Environment variables of the task container and of every command run through the agent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub env: Vec<EnvVar>,

    /// Default working directory of commands run through the agent. Defaults to the image's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub working_dir: Option<String>,

    /// Network isolation of the sandbox. Egress is denied unless this says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,

    /// Expiry: a hard time-to-live and a heartbeat timeout, both counted from when the sandbox becomes Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleSpec>,

    /// RuntimeClass of the Pod, e.g. `gvisor` or `kata` for stronger isolation than runc. The operator may limit the names (`--allowed-runtime-classes`); a refused one fails the sandbox with reason `PlacementRefused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub runtime_class_name: Option<String>,

    /// Node labels the Pod must be scheduled onto. Control-plane node-role keys are refused unless the operator allows them (`--allow-control-plane-placement`), and the operator may limit the keys (`--allowed-node-selector-keys`); a refused selector fails the sandbox with reason `PlacementRefused`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,

    /// Tolerations of the Pod, e.g. for a tainted sandbox node pool. Tolerating control-plane taints or every taint (empty key, `Exists`) is refused unless the operator allows it (`--allow-control-plane-placement`, `--allow-wildcard-tolerations`), and the operator may limit the keys (`--allowed-toleration-keys`); a refused toleration fails the sandbox with reason `PlacementRefused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tolerations: Vec<Toleration>,

    /// PriorityClass of the Pod: only names the operator allows (`--allowed-priority-classes`, none by default); another fails the sandbox with reason `PlacementRefused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,

    /// Optional command the agent starts in the background at boot (for example a browser for GUI tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<StartupSpec>,

    /// Optional one-shot trajectory runner: when the sandbox is Ready the operator runs this command through the agent and records its JSON result in `status.result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunSpec>,

    /// Security profile of the sandbox's containers; the operator's default (`--default-security-profile`) applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<SecuritySpec>,

    /// Name of a SandboxPool in the same namespace to claim a warm, already Ready Pod from instead of starting one. Fields left unset here take the pool template's values. A member is claimed only if the Pod this spec describes equals the member's (image, resources, env, working directory, security, startup, placement; `network`, `lifecycle` and `run` may differ); otherwise, or when no member is Ready, `whenPoolEmpty` decides. The expiry clocks start at the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pool: Option<String>,

    /// What a sandbox with `pool` does when no Ready member fits: `ColdStart` (default: start its own Pod, as without a pool) or `Wait` (stay Pending until a member is Ready; a spec that differs from the pool's template waits with reason `PoolTemplateMismatch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_pool_empty: Option<PoolFallback>,

    /// Give the sandbox a new pod instead of failing it when its pod is lost in a way a new one may fix: its task container killed by the out-of-memory killer or its pod evicted because the node was low on memory (`onOOM`: with more memory), or its pod evicted, deleted or lost with its node (`onEviction`: with the same resources). At most `maxAttempts` pods in all; then the sandbox fails as without it, with the last attempt's reason. The new pod starts from the image again: the files, processes and sessions of the lost one are gone (they lived in that pod: its container's writable layer and emptyDir volumes). While it starts, the Ready condition is False with reason `Retrying`; `status.attempts` and `status.previousAttempts` say what happened, and each retry is an Event `SandboxRetry`. The pod of attempt n > 1 is named `<sandbox>-attempt-<n>`, carries the label `orchard.dev/attempt`, and is the sandbox's own (never claimed from a pool). The expiry clocks keep counting from the first Ready. A result already recorded stands: a `run` whose own command the out-of-memory killer ended is recorded aborted (OOMKilled) and not retried (a RolloutGroup's `spec.retry` retries that). Not allowed in a RolloutGroup's template (set the group's own `spec.retry`) or a SandboxPool's template. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Name of a SandboxSnapshot in the same namespace to start from instead of `image` (the two are mutually exclusive): the task container runs the snapshot's image (`status.image`: the snapshotted sandbox's image plus its committed filesystem changes). Until the snapshot is Ready the sandbox stays Pending with reason `SnapshotNotReady`; a Failed, missing-for-good or deleting snapshot fails it with reason `SnapshotFailed`. A snapshot is not deleted while a Sandbox names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub from_snapshot: Option<String>,
}

/// What a Sandbox naming a pool does when no Ready member fits.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum PoolFallback {
    /// Start the sandbox's own Pod (a cold start).
    #[default]
    ColdStart,
    /// Stay Pending until a member is Ready.
    Wait,
}

/// How the sandbox's containers run. The agent's init container is Pod Security `restricted` in every profile.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.runAsUser) || self.runAsUser > 0").message("security.runAsUser must be a non-root uid (greater than 0)"))]
#[x_kube(validation = Rule::new("!has(self.runAsGroup) || self.runAsGroup >= 0").message("security.runAsGroup must be 0 or greater"))]
pub struct SecuritySpec {
    /// `Default`: the image's user and the runtime's default capabilities, no privilege escalation, RuntimeDefault seccomp (admitted under Pod Security `baseline`). `Restricted`: a non-root user, all capabilities dropped, no privilege escalation, RuntimeDefault seccomp (admitted under `restricted`). The operator's default applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<SecurityProfile>,

    /// User id the task container (and every command) runs as under `Restricted`; 65532 when unset. Under `Default` it overrides the image's user when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_user: Option<i64>,

    /// Primary group id of the task container; the user id's value when unset under `Restricted`, the image's otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as_group: Option<i64>,
}

/// Security profile of a sandbox's containers, named after the Pod Security Standard that admits it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum SecurityProfile {
    /// The image's user, the runtime's default capabilities (Pod Security `baseline`).
    #[default]
    Default,
    /// Non-root, no capabilities, no privilege escalation (Pod Security `restricted`).
    Restricted,
}

impl std::str::FromStr for SecurityProfile {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "Default" => Ok(Self::Default),
            "Restricted" => Ok(Self::Restricted),
            other => Err(format!(
                "unknown security profile `{other}` (Default or Restricted)"
            )),
        }
    }
}

/// When the node pulls the sandbox image.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ImagePullPolicy {
    /// Pull on every start.
    Always,
    /// Pull only when the image is not on the node.
    IfNotPresent,
    /// Never pull; the image must already be on the node.
    Never,
}

/// A Secret in the same namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretName {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Compute resources of the task container; requests equal limits so sandboxes get a predictable share.
/// Every amount given must be above zero: Kubernetes reads a zero limit as none, which would make the
/// pod BestEffort, unlimited and invisible to a ResourceQuota.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new(positive_quantity!("cpu")).message("resources.cpu must be a quantity greater than 0 (e.g. 500m or 2); leave it out to get the operator's default"))]
#[x_kube(validation = Rule::new(positive_quantity!("memory")).message("resources.memory must be a quantity greater than 0 (e.g. 512Mi); leave it out to get the operator's default"))]
#[x_kube(validation = Rule::new(positive_quantity!("ephemeralStorage")).message("resources.ephemeralStorage must be a quantity greater than 0 (e.g. 10Gi); leave it out to get the operator's default"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxResources {
    /// CPU, e.g. `500m` or `2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory, e.g. `512Mi` or `4Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Ephemeral storage (container writable layer, logs and the agent's emptyDir), e.g. `10Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<Quantity>,
    /// GPUs of the task container: `count` of the operator's GPU extended resource (`--gpu-resource`, default `nvidia.com/gpu`) as request and limit, on a node of one of `types` when given (a required node affinity from the operator's GPU type map, `--gpu-type`), with a toleration of that resource's `NoSchedule` taint unless the operator turns it off (`--gpu-toleration=false`). A type the operator does not know fails the sandbox with reason `PlacementRefused`. Unset: no GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuRequest>,
}

/// GPUs of a sandbox: how many, and optionally which types any one of which will do.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[x_kube(validation = Rule::new("self.count >= 1 && self.count <= 64").message("resources.gpu.count must be between 1 and 64"))]
#[x_kube(validation = Rule::new("!has(self.types) || size(self.types) <= 8").message("resources.gpu.types lists at most 8 GPU types"))]
#[x_kube(validation = Rule::new("!has(self.types) || self.types.all(t, t.matches('^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'))").message("resources.gpu.types[] must be GPU type names such as h100 or a100-80gb: 1 to 63 letters, digits, '-', '.' or '_', starting with a letter or digit"))]
#[x_kube(validation = Rule::new("!has(self.types) || self.types.all(t, self.types.filter(u, u.lowerAscii() == t.lowerAscii()).size() == 1)").message("resources.gpu.types must not list a type twice (names are matched case-insensitively)"))]
pub struct GpuRequest {
    /// Number of GPUs (1 to 64): the request and limit of the operator's GPU extended resource (`--gpu-resource`, default `nvidia.com/gpu`) on the task container. All of them are on one node.
    pub count: u32,

    /// GPU types any one of which will do, e.g. `h100` or `a100-80gb`, as named in the operator's GPU type map (`--gpu-type NAME=LABEL=VALUE`, Helm value `gpu.types`); matched case-insensitively. Each type becomes one term of a required node affinity (the Pod lands on a node carrying the label of any listed type). Empty: any node with the GPU resource.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(min = 1, max = 63)))]
    pub types: Vec<String>,
}

impl GpuRequest {
    /// The listed types as the operator matches them (pure): lower-cased, sorted, each once.
    pub fn type_names(&self) -> std::collections::BTreeSet<String> {
        self.types.iter().map(|t| t.to_ascii_lowercase()).collect()
    }
}

/// One environment variable.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EnvVar {
    /// Variable name.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Variable value (may be empty).
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub value: String,
}

/// Network isolation of one sandbox. The namespace baseline denies all egress of sandbox pods; this adds
/// only what the sandbox asks for, never a broad allow that would widen a user's own default-deny.
/// It may change while the sandbox runs (`kubectl patch`, the gateway's `PUT .../network`): new
/// NetworkPolicies and host rules apply within seconds, and connections to hosts no longer allowed
/// are cut.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("self.egress == 'AllowList' || !has(self.allow) || size(self.allow) == 0").message("network.allow may only be set when network.egress is AllowList"))]
#[x_kube(validation = Rule::new("self.egress != 'AllowList' || (has(self.allow) && size(self.allow) > 0)").message("network.egress AllowList needs at least one network.allow rule"))]
#[x_kube(validation = Rule::new("!has(self.deny) || size(self.deny) == 0 || (self.egress == 'AllowList' && self.allow.exists(r, has(r.host)))").message("network.deny needs egress AllowList with at least one allow[].host entry (AllowAll connects directly, where host names cannot be checked); for every host but some, write allow: [{host: '*'}] and the deny list"))]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// Egress policy: `Deny` (default: no egress at all, not even DNS), `AllowAll` (any destination), or `AllowList` (only `allow`, plus DNS to the cluster resolver).
    #[serde(default)]
    pub egress: EgressPolicy,

    /// Destinations the sandbox may reach when `egress` is `AllowList`: address ranges (`cidr`, reached directly) and host names (`host`, reached through the operator's egress proxy by the name the client asks for).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub allow: Vec<EgressRule>,

    /// Host names the sandbox may not reach even when an `allow[].host` entry matches them (deny wins). Needs `egress: AllowList` with host entries: `allow: [{host: "*"}]` plus this list is "every host but these".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub deny: Vec<HostDeny>,
}

impl NetworkSpec {
    /// Whether these rules name hosts (`allow[].host` or `deny`): they are enforced by the egress
    /// proxy, which a sandbox must have in force before it is Ready.
    pub fn names_hosts(&self) -> bool {
        !self.deny.is_empty() || self.allow.iter().any(|rule| rule.host.is_some())
    }
}

/// Egress policy of a sandbox.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum EgressPolicy {
    /// No egress at all (the namespace baseline).
    #[default]
    Deny,
    /// Any destination, plus DNS.
    AllowAll,
    /// Only the destinations listed in `allow`, plus DNS.
    AllowList,
}

/// The CEL rule "`host` of `self`, when set, is a host-name pattern": `*`, `name` or `*.name`, lowercase
/// labels of letters, digits and hyphens, no IP address.
macro_rules! host_pattern {
    () => {
        "!has(self.host) || (size(self.host) <= 253 && self.host.matches('^(\\\\*|(\\\\*\\\\.)?([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\\\\.)*[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)$') && !isIP(self.host.replace('*.', '')))"
    };
}

/// The message of a bad host pattern (one text for allow and deny entries).
macro_rules! host_pattern_message {
    ($list:literal) => {
        concat!(
            "network.",
            $list,
            "[].host must be a host name such as pypi.org, a wildcard such as *.github.com (its subdomains), or * (any host): lowercase, no scheme (https://), port, path or IP address (write an IP range as cidr)"
        )
    };
}

/// One allowed egress destination: an address range (`cidr`) or a host name (`host`), with optional ports.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new("has(self.cidr) != has(self.host)").message("each network.allow[] entry names exactly one of cidr (an address range) or host (a host name)"))]
#[x_kube(validation = Rule::new("!has(self.cidr) || isCIDR(self.cidr)").message("network.allow[].cidr must be a CIDR such as 10.0.0.0/8 or 2001:db8::/32"))]
#[x_kube(validation = Rule::new(host_pattern!()).message(host_pattern_message!("allow")))]
#[x_kube(validation = Rule::new("!has(self.host) || !has(self.ports) || self.ports.all(p, !has(p.protocol) || p.protocol == 'TCP')").message("network.allow[].host entries are reached through the egress proxy, which carries TCP only: leave out ports[].protocol or write TCP"))]
#[serde(rename_all = "camelCase")]
pub struct EgressRule {
    /// Destination network in CIDR notation, e.g. `203.0.113.0/24` or `10.1.2.3/32`; reached directly (a NetworkPolicy IP block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub cidr: Option<String>,

    /// Destination host name: exactly `pypi.org`, `*.github.com` for every subdomain of github.com (not github.com itself), or `*` for any host name. Reached through the operator's egress proxy (the task container's `HTTP_PROXY`/`HTTPS_PROXY`), which checks the name the client asks for (HTTP request target or `CONNECT` host), resolves it itself and connects; TLS is not intercepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub host: Option<String>,

    /// Destination ports; all ports when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub ports: Vec<EgressPort>,
}

/// A host name the sandbox may not reach.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new(host_pattern!()).message(host_pattern_message!("deny")))]
pub struct HostDeny {
    /// Host name pattern, as in `allow[].host`: `huggingface.co`, `*.github.com` or `*`.
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
}

/// One destination port of an egress rule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EgressPort {
    /// Port number.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Protocol: TCP (default), UDP or SCTP.
    #[serde(default)]
    pub protocol: PortProtocol,
}

/// Transport protocol of an egress port.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[allow(clippy::upper_case_acronyms)]
pub enum PortProtocol {
    /// TCP.
    #[default]
    TCP,
    /// UDP.
    UDP,
    /// SCTP.
    SCTP,
}

/// Expiry of a sandbox. Both clocks start when it becomes Ready; it is deleted at the earlier deadline.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[x_kube(validation = Rule::new("!has(self.ttlSeconds) || self.ttlSeconds > 0").message("lifecycle.ttlSeconds must be positive"))]
#[x_kube(validation = Rule::new("!has(self.heartbeatTimeoutSeconds) || self.heartbeatTimeoutSeconds >= 0").message("lifecycle.heartbeatTimeoutSeconds must be 0 (off) or positive"))]
#[serde(rename_all = "camelCase")]
pub struct LifecycleSpec {
    /// Hard maximum age in seconds after Ready (a sandbox that failed before Ready: after its creation); the operator's default applies when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<i64>,

    /// Delete the sandbox when no heartbeat arrived for this many seconds (0 = off). Heartbeats: the `orchard.dev/heartbeat` annotation (RFC 3339 time) and calls through the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout_seconds: Option<i64>,
}

/// A sandbox's expiry as it applies: its spec's values, else the operator's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifecycle {
    /// Hard maximum age after Ready, in seconds.
    pub ttl_seconds: i64,
    /// Heartbeat timeout in seconds; 0 is off.
    pub heartbeat_timeout_seconds: i64,
}

impl Lifecycle {
    /// The lifecycle of a sandbox with `spec` under the operator's defaults (pure).
    pub fn of(
        spec: &SandboxSpec,
        default_ttl_seconds: i64,
        default_heartbeat_timeout_seconds: i64,
    ) -> Self {
        let lifecycle = spec.lifecycle.clone().unwrap_or_default();
        Self {
            ttl_seconds: lifecycle.ttl_seconds.unwrap_or(default_ttl_seconds),
            heartbeat_timeout_seconds: lifecycle
                .heartbeat_timeout_seconds
                .unwrap_or(default_heartbeat_timeout_seconds),
        }
    }
}

/// A command the agent starts in the background at boot.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new("size(self.command) > 0").message("startup.command must name a program"))]
pub struct StartupSpec {
    /// Program and arguments (argv; no shell is involved, write `["/bin/sh", "-c", "..."]` for one).
    #[schemars(length(max = 256))]
    pub command: Vec<String>,
}

/// A one-shot trajectory runner. Its result file must hold JSON such as
/// `{"reward": 1.0, "status": "completed", "length": 812, "artifact": "s3://bucket/traj-7"}`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(validation = Rule::new("size(self.command) > 0").message("run.command must name a program"))]
#[x_kube(validation = Rule::new("self.timeoutSeconds > 0").message("run.timeoutSeconds must be positive"))]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    /// Program and arguments (argv; no shell is involved, write `["/bin/sh", "-c", "..."]` for one).
    #[schemars(length(max = 256))]
    pub command: Vec<String>,

    /// Abort the run (status `aborted`, reason `TimeExceeded`) after this many seconds.
    #[serde(default = "default_run_timeout_seconds")]
    pub timeout_seconds: i64,

    /// Where the runner writes its JSON result: an absolute path, or one relative to the sandbox's working directory.
    #[serde(default = "default_result_path")]
    #[schemars(length(min = 1, max = 4096))]
    pub result_path: String,
}

fn default_run_timeout_seconds() -> i64 {
    3600
}

fn default_result_path() -> String {
    "/tmp/orchard-result.json".to_string()
}

/// Observed state of a Sandbox, written only by the operator (and `result` by external drivers).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!has(oldSelf.result) || (has(self.result) && self.result == oldSelf.result)").message("status.result is write-once: a recorded trajectory result is never overwritten"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    /// Lifecycle phase, for humans: Pending, Starting, Ready, Succeeded, Failed, Expired or Terminating.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SandboxPhase>,

    /// Conditions (`Scheduled`, `AgentReady`, `Ready`, `Expired`) in the metav1.Condition shape.
    #[serde(
        default,
        deserialize_with = "exact_list",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Name of the sandbox's Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,

    /// IP of the sandbox's Pod.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,

    /// Node the Pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,

    /// Base URL of the agent (`http://<podIP>:<port>`); exec and file calls go here, never through the API server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_endpoint: Option<String>,

    /// When the sandbox first became Ready; the expiry clocks start here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_time: Option<Time>,

    /// Latest heartbeat seen (annotation or gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Time>,

    /// When the operator deletes the sandbox: min(readyTime + ttl, lastHeartbeatTime + heartbeatTimeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,

    /// Outcome of the trajectory run in this sandbox (from `spec.run` or an external driver). Write-once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<TrajectoryResult>,

    /// The sandbox's attempt: how many pods it has been given so far, the first included (`spec.retry`); omitted when 1. The pod of a later attempt carries it in the label `orchard.dev/attempt`.
    #[serde(default = "first_attempt", skip_serializing_if = "is_first_attempt")]
    #[schemars(range(min = 1))]
    pub attempts: i32,

    /// The attempts whose pods were lost and that were tried again (`spec.retry`), oldest first: how each ended and the memory and CPU it ran with. Each one's files were lost with its pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous_attempts: Vec<AttemptRecord>,

    /// Which host rules the egress proxy enforces for this sandbox, written by the proxy (not the operator); absent until a sandbox that names hosts has them in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressStatus>,

    /// Machine-readable reason of the current phase, e.g. `ImagePullBackOff`, `Evicted`, `AgentUnhealthy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,

    /// Human-readable detail of the current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A list decoded with no room reserved beyond its contents: a decoded list of three conditions
/// reserves four, of five eight (128 bytes each); the operator holds every Sandbox in its cache.
fn exact_list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let mut list = Vec::<T>::deserialize(d)?;
    list.shrink_to_fit();
    Ok(list)
}

impl Default for SandboxStatus {
    /// Nothing observed yet: the first attempt.
    fn default() -> Self {
        Self {
            phase: None,
            conditions: Vec::new(),
            observed_generation: None,
            pod_name: None,
            pod_ip: None,
            node_name: None,
            agent_endpoint: None,
            ready_time: None,
            last_heartbeat_time: None,
            expires_at: None,
            result: None,
            attempts: first_attempt(),
            previous_attempts: Vec::new(),
            egress: None,
            reason: None,
            message: None,
        }
    }
}

/// What the egress proxy enforces for a sandbox.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EgressStatus {
    /// The `metadata.generation` whose `spec.network` the proxy enforces.
    pub observed_generation: i64,
    /// The pod IP the proxy knows the sandbox's connections by.
    #[serde(rename = "podIP")]
    pub pod_ip: String,
    /// Why the latest `spec.network` is not enforced (the generation in `observedGeneration` stays in force); absent when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Lifecycle phase of a sandbox.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SandboxPhase {
    /// Accepted; the Pod is not scheduled yet.
    Pending,
    /// The Pod is scheduled and starting; the agent is not answering yet.
    Starting,
    /// The agent answers at `agentEndpoint`.
    Ready,
    /// The trajectory run finished and its result is recorded.
    Succeeded,
    /// The sandbox cannot run; `reason` says why.
    Failed,
    /// A deadline passed; the sandbox is being deleted.
    Expired,
    /// The sandbox is being deleted.
    Terminating,
}

impl SandboxPhase {
    /// The phase's name as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Starting => "Starting",
            Self::Ready => "Ready",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Expired => "Expired",
            Self::Terminating => "Terminating",
        }
    }
}

/// The outcome of one trajectory, as the RolloutGroup controller and trainers read it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("self.status == 'aborted' || has(self.reward)").message("result.reward is required unless status is aborted"))]
#[serde(rename_all = "camelCase")]
pub struct TrajectoryResult {
    /// Scalar reward; positive counts as a success for BAR. Absent only for aborted trajectories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<f64>,

    /// completed (finished normally), truncated (cut at a length limit but usable) or aborted (unusable: crash, timeout, no result).
    pub status: TrajectoryStatus,

    /// Response length in tokens or steps; shorter ranks first among equals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub length: Option<i64>,

    /// Exit code of the run command, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,

    /// Opaque pointer the runner chose to its payload (tokens, logprobs); never the payload itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub artifact: Option<String>,

    /// Why the trajectory was aborted, e.g. `TimeExceeded`, `NoResult`, `InvalidResult`, `SandboxFailed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub reason: Option<String>,

    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub message: Option<String>,
}

/// How a trajectory ended.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TrajectoryStatus {
    /// Finished normally.
    Completed,
    /// Cut at a length limit but usable.
    Truncated,
    /// Unusable (crash, timeout, missing or invalid result); BAR uses it only as backfill.
    Aborted,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoded_conditions_take_no_more_room_than_they_need() {
        let status: SandboxStatus = serde_json::from_value(serde_json::json!({
            "conditions": [
                {"type": "Scheduled", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-11-29T10:00:00Z"},
                {"type": "AgentReady", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-11-29T10:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-11-29T10:00:00Z"},
            ],
        }))
        .expect("status");
        assert_eq!(
            (status.conditions.len(), status.conditions.capacity()),
            (3, 3)
        );
        assert_eq!(status.conditions[2].type_, "Ready");
        let none: SandboxStatus = serde_json::from_value(serde_json::json!({})).expect("empty");
        assert!(none.conditions.is_empty());
    }
}
