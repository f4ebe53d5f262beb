//! `/openapi.json`: the OpenAPI document generated from the route handlers (`#[utoipa::path]`, bound to
//! the router by `utoipa-axum`, so a route cannot be served undocumented), the agent routes' table
//! (`routes::agent`) and the types below. The agent's request and answer schemas are those of its wire
//! types (`orchard_api::agent`, feature `openapi`). The Sandbox and RolloutGroup schemas are the
//! CRDs' own structural schemas (the ones `kubectl explain` shows), inserted into the document's
//! components.

use std::borrow::Cow;
use std::collections::BTreeMap;

use kube::CustomResourceExt;
use serde_json::{Value, json};
use utoipa::openapi::schema::{ObjectBuilder, Schema};
use utoipa::openapi::{OpenApi, RefOr};
use utoipa::{PartialSchema, ToSchema};

use orchard_api::{RolloutGroup, Sandbox, SandboxSnapshot};

/// A schema whose body is filled from a CRD after generation (see [`document`]).
macro_rules! crd_schema {
    ($marker:ident, $name:literal, $description:literal) => {
        #[doc = $description]
        pub struct $marker;

        impl PartialSchema for $marker {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new().description(Some($description)).into()
            }
        }

        impl ToSchema for $marker {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
        }
    };
}

crd_schema!(
    SandboxSchema,
    "Sandbox",
    "A Sandbox object (orchard.dev/v1alpha1), as `kubectl get sandbox -o json` shows it."
);
crd_schema!(
    SandboxSpecSchema,
    "SandboxSpec",
    "Spec of a Sandbox (see `kubectl explain sandbox.spec`)."
);
crd_schema!(
    NetworkSpecSchema,
    "NetworkSpec",
    "Network isolation of a sandbox (see `kubectl explain sandbox.spec.network`): `egress`, `allow` (`cidr` or `host` entries with `ports`) and `deny` (`host` entries)."
);
crd_schema!(
    TrajectoryResultSchema,
    "TrajectoryResult",
    "Outcome of one trajectory, recorded once in `status.result`."
);
crd_schema!(
    RolloutGroupSchema,
    "RolloutGroup",
    "A RolloutGroup object (orchard.dev/v1alpha1)."
);
crd_schema!(
    SandboxSnapshotSchema,
    "SandboxSnapshot",
    "A SandboxSnapshot object (orchard.dev/v1alpha1): a Ready sandbox's filesystem committed as an image (`status.image`) that Sandboxes start from with `fromSnapshot`."
);
crd_schema!(
    SandboxSnapshotSpecSchema,
    "SandboxSnapshotSpec",
    "Spec of a SandboxSnapshot (see `kubectl explain sandboxsnapshot.spec`)."
);
crd_schema!(
    RolloutGroupSpecSchema,
    "RolloutGroupSpec",
    "Spec of a RolloutGroup (see `kubectl explain rolloutgroup.spec`)."
);

/// `POST .../sandboxes`: a full `spec`, or the spec's fields at the top level (the shorthand), plus
/// metadata. Every SandboxSpec field (`image`, `env`, `resources`, `network`, `lifecycle`, `run`,
/// `startup`, ...) may stand at the top level; unknown fields are a 400.
#[derive(ToSchema)]
#[schema(example = json!({"image": "python:3.11", "env": {"PYTHONHASHSEED": "0"}, "ttlSeconds": 3600, "heartbeatTimeoutSeconds": 300, "labels": {"experiment": "e1"}}))]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandboxRequest {
    /// Name of the Sandbox; when absent, `generateName` (default `sbx-`) makes one.
    name: Option<String>,
    /// Prefix of a generated name.
    generate_name: Option<String>,
    /// Labels of the Sandbox (list with `?labelSelector=`).
    labels: Option<BTreeMap<String, String>>,
    /// Annotations of the Sandbox.
    annotations: Option<BTreeMap<String, String>>,
    /// The full spec; give either this or spec fields at the top level.
    #[schema(value_type = Option<SandboxSpecSchema>)]
    spec: Option<()>,
    /// Shorthand: container image (required unless `spec` is given).
    image: Option<String>,
    /// Shorthand: environment as an object (`{"A": "1"}`) or the spec's list of `{name, value}`.
    #[schema(value_type = Option<Object>)]
    env: Option<()>,
    /// Shorthand for `lifecycle.ttlSeconds`.
    ttl_seconds: Option<i64>,
    /// Shorthand for `lifecycle.heartbeatTimeoutSeconds` (0 = off).
    heartbeat_timeout_seconds: Option<i64>,
    /// Shorthand for `resources.cpu` (e.g. `"500m"` or `2`).
    #[schema(value_type = Option<String>)]
    cpu: Option<()>,
    /// Shorthand for `resources.memory` (e.g. `"1Gi"`).
    memory: Option<String>,
}

/// `POST .../rolloutgroups`: a full `spec`, or its fields at the top level. `template` may be
/// `{metadata, spec}` or a bare sandbox shorthand (`{"image": ..., "run": {...}}`).
#[derive(ToSchema)]
#[schema(example = json!({"name": "prompt-17", "groupSize": 8, "maxTrajectories": 16, "stride": 8, "template": {"image": "python:3.11", "run": {"command": ["python", "/task/run.py"], "timeoutSeconds": 900}}}))]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
pub struct CreateRolloutGroupRequest {
    /// Name of the group; when absent, `generateName` (default `rg-`) makes one.
    name: Option<String>,
    /// Prefix of a generated name.
    generate_name: Option<String>,
    /// Labels.
    labels: Option<BTreeMap<String, String>>,
    /// Annotations.
    annotations: Option<BTreeMap<String, String>>,
    /// The full spec; give either this or its fields at the top level.
    #[schema(value_type = Option<RolloutGroupSpecSchema>)]
    spec: Option<()>,
    /// Shorthand: N, the group size.
    group_size: Option<i32>,
    /// Shorthand: Nmax, the trajectory budget.
    max_trajectories: Option<i32>,
    /// Shorthand: trajectories per stride.
    stride: Option<i32>,
    /// Shorthand: the sandbox of each trajectory (`{metadata, spec}` or a bare sandbox shorthand).
    #[schema(value_type = Option<Object>)]
    template: Option<()>,
}

/// `POST .../sandboxsnapshots`: a full `spec`, or its fields at the top level, plus metadata.
#[derive(ToSchema)]
#[schema(example = json!({"name": "prepared", "sandbox": "prep", "paths": ["/work"], "ttlSecondsAfterUnused": 3600}))]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
pub struct CreateSnapshotRequest {
    /// Name of the snapshot; when absent, `generateName` (default `snap-`) makes one.
    name: Option<String>,
    /// Prefix of a generated name.
    generate_name: Option<String>,
    /// Labels.
    labels: Option<BTreeMap<String, String>>,
    /// Annotations.
    annotations: Option<BTreeMap<String, String>>,
    /// The full spec; give either this or its fields at the top level.
    #[schema(value_type = Option<SandboxSnapshotSpecSchema>)]
    spec: Option<()>,
    /// Shorthand: the Ready Sandbox whose filesystem is committed.
    sandbox: Option<String>,
    /// Shorthand: absolute paths to keep (default: the whole root filesystem).
    paths: Option<Vec<String>>,
    /// Shorthand: delete the snapshot this long after nothing names it any more.
    ttl_seconds_after_unused: Option<i64>,
}

/// A list of SandboxSnapshots.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SandboxSnapshotList {
    /// `orchard.dev/v1alpha1`.
    #[schema(rename = "apiVersion")]
    api_version: String,
    /// `SandboxSnapshotList`.
    kind: String,
    /// The snapshots, sorted by name.
    #[schema(value_type = Vec<SandboxSnapshotSchema>)]
    items: Vec<()>,
}

/// A list of Sandboxes.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SandboxList {
    /// `orchard.dev/v1alpha1`.
    #[schema(rename = "apiVersion")]
    api_version: String,
    /// `SandboxList`.
    kind: String,
    /// The sandboxes, sorted by name.
    #[schema(value_type = Vec<SandboxSchema>)]
    items: Vec<()>,
}

/// A list of RolloutGroups.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct RolloutGroupList {
    /// `orchard.dev/v1alpha1`.
    #[schema(rename = "apiVersion")]
    api_version: String,
    /// `RolloutGroupList`.
    kind: String,
    /// The groups, sorted by name.
    #[schema(value_type = Vec<RolloutGroupSchema>)]
    items: Vec<()>,
}

/// Answer of a delete.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct Deleted {
    /// Namespace.
    namespace: String,
    /// Name.
    name: String,
    /// Always true (deletion has started; children are garbage-collected).
    deleted: bool,
}

/// Answer of `GET .../token`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct AgentAccessResponse {
    /// The agent's URL at the sandbox's own pod (`http://<pod IP>:<port>`).
    endpoint: String,
    /// The bearer token the agent accepts: bound to that pod, valid while it lives.
    token: String,
}

/// Answer of `POST .../heartbeat`.
#[derive(ToSchema)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse {
    /// Effective heartbeat timeout of the sandbox (0 = heartbeats are off).
    heartbeat_timeout_seconds: i64,
    /// Whether this call wrote the annotation (false: coalesced with a recent write).
    written: bool,
    /// The sandbox's deadline as last computed by the controller (RFC 3339), if Ready.
    expires_at: Option<String>,
}

/// Body of `POST .../timeout`.
#[derive(ToSchema)]
#[schema(as = TimeoutRequest)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct TimeoutRequestSchema {
    /// Seconds from now until the sandbox ends (1 to 31622400); its TTL becomes the time since Ready plus this.
    timeout_seconds: i64,
}

/// Answer of `POST .../timeout`.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct TimeoutResponse {
    /// The sandbox's new `spec.lifecycle.ttlSeconds`.
    ttl_seconds: i64,
    /// When that TTL ends the sandbox (RFC 3339); the heartbeat deadline may end it earlier (`status.expiresAt` once the controller recomputed it).
    ttl_ends_at: String,
    /// The operator's `--max-ttl-seconds`.
    max_ttl_seconds: i64,
}

/// Answer of `PUT .../network`.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct NetworkResponse {
    /// The sandbox's `metadata.generation` holding the new `spec.network`.
    generation: i64,
    /// Whether the egress proxy enforces this generation (`status.egress`); `null` when the rules name no hosts (NetworkPolicies carry them; the operator applies them within a reconcile).
    host_rules_in_force: Option<bool>,
    /// Why the egress proxy does not enforce it, when it says so (the previous rules stay in force).
    message: Option<String>,
}

/// Answer of `POST .../result`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ResultResponse {
    /// True when this call recorded the result; false when the same result was already recorded.
    recorded: bool,
    /// The recorded result.
    #[schema(value_type = TrajectoryResultSchema)]
    result: (),
}

/// The CRD's structural schema of `kind` (the whole object).
fn crd_object_schema(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_else(|| json!({"type": "object"}))
}

fn pointer(value: &Value, path: &str) -> Value {
    value
        .pointer(path)
        .cloned()
        .unwrap_or_else(|| json!({"type": "object"}))
}

/// The final document: the generated one with CRD schemas, the bearer security scheme and server
/// information filled in.
pub fn document(openapi: OpenApi) -> Value {
    let mut document = serde_json::to_value(&openapi).unwrap_or_else(|_| json!({}));
    let sandbox = crd_object_schema(Sandbox::crd());
    let group = crd_object_schema(RolloutGroup::crd());
    let snapshot = crd_object_schema(SandboxSnapshot::crd());
    let schemas = [
        (
            "SandboxSnapshotSpec",
            pointer(&snapshot, "/properties/spec"),
        ),
        ("SandboxSnapshot", snapshot),
        ("SandboxSpec", pointer(&sandbox, "/properties/spec")),
        (
            "TrajectoryResult",
            pointer(&sandbox, "/properties/status/properties/result"),
        ),
        ("RolloutGroupSpec", pointer(&group, "/properties/spec")),
        ("Sandbox", sandbox),
        ("RolloutGroup", group),
    ];
    if let Some(root) = document.as_object_mut() {
        let components = root
            .entry("components")
            .or_insert_with(|| json!({}))
            .as_object_mut();
        if let Some(components) = components {
            let target = components
                .entry("schemas")
                .or_insert_with(|| json!({}))
                .as_object_mut();
            if let Some(target) = target {
                for (name, schema) in schemas {
                    target.insert(name.to_string(), schema);
                }
            }
            components.insert(
                "securitySchemes".into(),
                json!({"bearer": {"type": "http", "scheme": "bearer", "description": "A Kubernetes bearer token (service-account or user token), checked with TokenReview; permissions with SubjectAccessReview on orchard.dev resources (see docs/API.md)."}}),
            );
        }
        root.insert("security".into(), json!([{"bearer": []}]));
        root.insert(
            "info".into(),
            json!({
                "title": "Orchard Env gateway",
                "version": env!("CARGO_PKG_VERSION"),
                "description": "REST API of the orchard-operator gateway: sandbox lifecycle, exec and files routed straight to each sandbox's agent at its pod IP, heartbeats, trajectory results and RolloutGroups. Errors are JSON {code, message, retryable}. See docs/API.md.",
                "license": {"name": "Apache-2.0"}
            }),
        );
    }
    document
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_schemas_fill_the_components() {
        let doc = document(OpenApi::default());
        let sandbox = &doc["components"]["schemas"]["Sandbox"];
        assert_eq!(sandbox["type"], "object");
        assert!(sandbox["properties"]["spec"]["properties"]["image"].is_object());
        let result = &doc["components"]["schemas"]["TrajectoryResult"];
        assert!(result["properties"]["reward"].is_object(), "{result}");
        assert!(
            doc["components"]["schemas"]["RolloutGroupSpec"]["properties"]["groupSize"].is_object()
        );
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
    }
}
