//! API types of `orchard.dev/v1alpha1` (types only: no I/O, no controller logic) and the label and
//! annotation keys that tie Sandboxes, RolloutGroups and their children together, and the wire
//! protocol of the in-pod agent ([`agent`]).
//!
//! Features: `crd` (default) carries the Kubernetes kinds and needs kube, k8s-openapi and schemars;
//! without it only [`agent`] and the keys remain (serde only: the static agent builds that way).
//! `openapi` adds utoipa schemas to the agent's wire types.

pub mod agent;

/// The CEL rule "field `$field` of `self`, when set, is a quantity above zero". A Quantity field is
/// `x-kubernetes-int-or-string`: `string()` turns a number (`cpu: 2`) into its quantity text.
#[cfg(feature = "crd")]
macro_rules! positive_quantity {
    ($field:literal) => {
        concat!(
            "!has(self.",
            $field,
            ") || (isQuantity(string(self.",
            $field,
            ")) && quantity(string(self.",
            $field,
            ")).isGreaterThan(quantity('0')))"
        )
    };
}

#[cfg(feature = "crd")]
mod retry;
#[cfg(feature = "crd")]
mod rollout_group;
#[cfg(feature = "crd")]
mod rollout_queue;
#[cfg(feature = "crd")]
mod sandbox;
#[cfg(feature = "crd")]
mod sandbox_pool;
#[cfg(feature = "crd")]
mod sandbox_snapshot;

#[cfg(feature = "crd")]
pub use retry::{AttemptRecord, OomEscalation, RetryPolicy};
#[cfg(feature = "crd")]
pub use rollout_group::*;
#[cfg(feature = "crd")]
pub use rollout_queue::*;
#[cfg(feature = "crd")]
pub use sandbox::*;
#[cfg(feature = "crd")]
pub use sandbox_pool::*;
#[cfg(feature = "crd")]
pub use sandbox_snapshot::*;

/// API group of every Orchard Env kind.
pub const GROUP: &str = "orchard.dev";

/// Label on every object the operator creates for a Sandbox (Pod, Secret, NetworkPolicies), holding the
/// Sandbox's name; it selects a sandbox's Pod for its policies and for the controller's watch.
pub const SANDBOX_LABEL: &str = "orchard.dev/sandbox";

/// Label on every sandbox Pod (value `"true"`); the namespace baseline NetworkPolicy selects on it.
pub const SANDBOX_POD_LABEL: &str = "orchard.dev/sandbox-pod";

/// Label on trajectory Sandboxes naming their RolloutGroup.
pub const ROLLOUT_GROUP_LABEL: &str = "orchard.dev/rollout-group";

/// Label on trajectory Sandboxes holding the stride index (0-based) they were launched in.
pub const STRIDE_LABEL: &str = "orchard.dev/stride";

/// Label on trajectory Sandboxes holding their attempt (1-based): a retried trajectory is created
/// again under the same name with the next number, so an old attempt still being removed is never
/// taken for the new one. Absent means 1.
pub const ATTEMPT_LABEL: &str = "orchard.dev/attempt";

/// Label on trajectory Sandboxes (and their Pods) of a group that names a RolloutQueue, holding the
/// queue's name: the queue's accounting counts what carries it.
pub const ROLLOUT_QUEUE_LABEL: &str = "orchard.dev/rollout-queue";

/// Label on the unclaimed members of a SandboxPool (Pods), holding the pool's name; the pool's scale
/// selector. A claim removes it.
pub const POOL_LABEL: &str = "orchard.dev/pool";

/// Label a claim puts on a former pool member (Pod), holding the pool's name.
pub const CLAIMED_FROM_LABEL: &str = "orchard.dev/claimed-from";

/// Annotation on a SandboxPool member (Pod): the hash of the pod-shaping template it was built from.
/// A Sandbox claims only a member whose hash equals its own pod-shaping spec's.
pub const POOL_TEMPLATE_HASH_ANNOTATION: &str = "orchard.dev/pool-template-hash";

/// Annotation on the Pod of a Sandbox of a pool (claimed or cold): the pool template's `network` and
/// `lifecycle` (JSON) the Sandbox runs with where its own spec leaves them unset, fixed when it got its
/// Pod.
pub const POOL_DEFAULTS_ANNOTATION: &str = "orchard.dev/pool-defaults";

/// Annotation on every object the operator creates under an owner (a sandbox's Pod and egress
/// NetworkPolicy, a pool member Pod, a RolloutGroup's trajectory Sandboxes): lower-case hex of an
/// HMAC-SHA256, under the operator's key, of the object's kind, namespace and name and its owner's
/// UID. Anyone who may create an object may write any owner reference into it; only an object whose
/// seal verifies for its controller reference counts as the operator's.
pub const SEAL_ANNOTATION: &str = "orchard.dev/seal";

/// Prefix of the label and annotation keys the operator owns: users may not set them on the objects
/// they create through the gateway, nor in a RolloutGroup's template.
pub const RESERVED_KEY_PREFIX: &str = "orchard.dev/";

/// Label on every object the operator manages (value `orchard-operator`).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "orchard-operator";

/// Label on every committer Pod the operator creates for a SandboxSnapshot (in the snapshot namespace),
/// holding the snapshot's UID; the operator watches committer pods by it.
pub const SNAPSHOT_UID_LABEL: &str = "orchard.dev/snapshot-uid";

/// Annotation on a committer Pod naming its SandboxSnapshot as `namespace/name` (a Pod in another
/// namespace cannot carry an owner reference to it).
pub const SNAPSHOT_ANNOTATION: &str = "orchard.dev/snapshot";

/// Finalizer on a SandboxSnapshot: held while a Sandbox, SandboxPool or RolloutGroup names the
/// snapshot in `fromSnapshot`, and until its committer Pod is gone.
pub const SNAPSHOT_FINALIZER: &str = "orchard.dev/snapshot-in-use";

/// The ResourceQuota resource name (`spec.hard`) limiting the total size of a namespace's
/// SandboxSnapshots in bytes (their `status.sizeBytes`, uncompressed layers). The API server does not
/// count it (it cannot know a snapshot's size); the operator enforces it when it commits one. Their
/// number is Kubernetes' own `count/sandboxsnapshots.orchard.dev`.
pub const SNAPSHOT_BYTES_QUOTA: &str = "orchard.dev/snapshot-bytes";

/// Annotation recording who created an object through the gateway (the gateway writes with the
/// operator's identity, so the API server's audit log alone would not say).
pub const CREATED_BY_ANNOTATION: &str = "orchard.dev/created-by";

/// Annotation a client sets (RFC 3339 time, e.g. with `kubectl annotate`) to record a heartbeat.
pub const HEARTBEAT_ANNOTATION: &str = "orchard.dev/heartbeat";

/// Annotation a RolloutGroup sets on a trajectory Sandbox of a stride it spreads out
/// (`launchJitterSeconds`): the RFC 3339 time before which the operator creates no Pod for it.
pub const LAUNCH_AFTER_ANNOTATION: &str = "orchard.dev/launch-after";

#[cfg(all(test, feature = "crd"))]
mod cel_tests;
