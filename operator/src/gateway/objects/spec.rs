//! Create requests -> objects (pure). `POST .../sandboxes` takes a full `spec` or the same fields at
//! the top level (`{"image": "python:3.11", "env": {"A": "1"}, "ttlSeconds": 600}`), plus `name` or
//! `generateName`, `labels` and `annotations`. `POST .../rolloutgroups` does the same for RolloutGroups,
//! and its `template` may be a bare sandbox shorthand. Unknown fields are rejected so typos never pass
//! silently, and so are label and annotation keys under `orchard.dev/` (on the object and in a group's
//! template): the operator's own keys decide things (a queue's slots, a sandbox's group), and the
//! gateway writes with the operator's identity.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use kube::api::ObjectMeta;
use serde_json::{Map, Value, json};

use crate::gateway::http::errors::ApiError;
use orchard_api::{
    RESERVED_KEY_PREFIX, RolloutGroup, RolloutGroupSpec, Sandbox, SandboxSnapshot,
    SandboxSnapshotSpec, SandboxSpec,
};

pub use orchard_api::CREATED_BY_ANNOTATION;

/// `generateName` used when a sandbox request names neither `name` nor `generateName`.
pub const DEFAULT_SANDBOX_PREFIX: &str = "sbx-";

/// `generateName` used when a rollout group request names neither.
pub const DEFAULT_GROUP_PREFIX: &str = "rg-";

/// `generateName` used when a snapshot request names neither.
pub const DEFAULT_SNAPSHOT_PREFIX: &str = "snap-";

/// Top-level conveniences of the sandbox shorthand, folded into the spec.
const SANDBOX_CONVENIENCES: &[&str] = &["ttlSeconds", "heartbeatTimeoutSeconds", "cpu", "memory"];

fn property_names(schema: schemars::Schema) -> BTreeSet<String> {
    schema
        .as_value()
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

static SANDBOX_FIELDS: LazyLock<BTreeSet<String>> =
    LazyLock::new(|| property_names(schemars::schema_for!(SandboxSpec)));
static GROUP_FIELDS: LazyLock<BTreeSet<String>> =
    LazyLock::new(|| property_names(schemars::schema_for!(RolloutGroupSpec)));
static SNAPSHOT_FIELDS: LazyLock<BTreeSet<String>> =
    LazyLock::new(|| property_names(schemars::schema_for!(SandboxSnapshotSpec)));

fn unknown_fields<'a>(
    object: &'a Map<String, Value>,
    known: &BTreeSet<String>,
    extra: &[&str],
) -> Vec<&'a str> {
    object
        .keys()
        .map(String::as_str)
        .filter(|k| !known.contains(*k) && !extra.contains(k))
        .collect()
}

fn reject_unknown(
    object: &Map<String, Value>,
    known: &BTreeSet<String>,
    extra: &[&str],
    what: &str,
) -> Result<(), ApiError> {
    let unknown = unknown_fields(object, known, extra);
    if unknown.is_empty() {
        return Ok(());
    }
    let mut allowed: Vec<&str> = known.iter().map(String::as_str).collect();
    allowed.extend_from_slice(extra);
    Err(ApiError::bad_request(format!(
        "unknown field(s) {} in {what}; allowed: {}",
        unknown.join(", "),
        allowed.join(", ")
    )))
}

/// Turns `env` given as an object (`{"A": "1"}`) into the spec's list form; a list stays as is.
fn normalise_env(spec: &mut Map<String, Value>) -> Result<(), ApiError> {
    if let Some(Value::Object(map)) = spec.get("env") {
        let mut list = Vec::with_capacity(map.len());
        for (name, value) in map {
            let value = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "env.{name} must be a string, number or boolean"
                    )));
                }
            };
            list.push(json!({"name": name, "value": value}));
        }
        spec.insert("env".into(), Value::Array(list));
    }
    Ok(())
}

/// Folds the top-level conveniences (`ttlSeconds`, `heartbeatTimeoutSeconds`, `cpu`, `memory`) into
/// `lifecycle` and `resources`.
fn fold_conveniences(spec: &mut Map<String, Value>) -> Result<(), ApiError> {
    for (field, parent) in [
        ("ttlSeconds", "lifecycle"),
        ("heartbeatTimeoutSeconds", "lifecycle"),
        ("cpu", "resources"),
        ("memory", "resources"),
    ] {
        let Some(value) = spec.remove(field) else {
            continue;
        };
        let target = spec
            .entry(parent)
            .or_insert_with(|| Value::Object(Map::new()));
        let Value::Object(target) = target else {
            return Err(ApiError::bad_request(format!("{parent} must be an object")));
        };
        if target.contains_key(field) {
            return Err(ApiError::bad_request(format!(
                "{field} is given twice (top level and in {parent})"
            )));
        }
        // Quantities are strings in the spec; accept numbers for convenience (`"cpu": 2`).
        let value = match (field, value) {
            ("cpu" | "memory", Value::Number(n)) => Value::String(n.to_string()),
            (_, v) => v,
        };
        target.insert(field.to_string(), value);
    }
    Ok(())
}

/// A SandboxSpec from its JSON (full or shorthand form), checking field names.
pub fn sandbox_spec(value: Value, shorthand: bool) -> Result<SandboxSpec, ApiError> {
    let Value::Object(mut spec) = value else {
        return Err(ApiError::bad_request(
            "a sandbox spec must be a JSON object",
        ));
    };
    let extra: &[&str] = if shorthand { SANDBOX_CONVENIENCES } else { &[] };
    reject_unknown(&spec, &SANDBOX_FIELDS, extra, "the sandbox spec")?;
    normalise_env(&mut spec)?;
    fold_conveniences(&mut spec)?;
    if !spec.contains_key("image")
        && !spec.contains_key("pool")
        && !spec.contains_key("fromSnapshot")
    {
        return Err(ApiError::bad_request(
            "`image` is required (any Linux image, e.g. \"python:3.11\"), unless `pool` names a SandboxPool to claim a warm sandbox from or `fromSnapshot` a SandboxSnapshot to start from",
        ));
    }
    serde_json::from_value(Value::Object(spec))
        .map_err(|err| ApiError::bad_request(format!("invalid sandbox spec: {err}")))
}

/// Metadata fields of a create request.
struct RequestMeta {
    name: Option<String>,
    generate_name: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn string_map(value: Option<Value>, field: &str) -> Result<BTreeMap<String, String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(v) => serde_json::from_value(v)
            .map_err(|_| ApiError::bad_request(format!("{field} must map strings to strings"))),
    }
}

fn optional_string(value: Option<Value>, field: &str) -> Result<Option<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(_) => Err(ApiError::bad_request(format!(
            "{field} must be a non-empty string"
        ))),
    }
}

/// Refuses keys of `map` (the request's `field`) under `orchard.dev/`: the operator sets those.
fn refuse_reserved_keys(map: &BTreeMap<String, String>, field: &str) -> Result<(), ApiError> {
    match map.keys().find(|k| k.starts_with(RESERVED_KEY_PREFIX)) {
        Some(key) => Err(ApiError::bad_request(format!(
            "{field} key `{key}` is reserved: keys under `{RESERVED_KEY_PREFIX}` are set by the operator only; use another prefix"
        ))),
        None => Ok(()),
    }
}

/// Splits a request object into its metadata and the rest (spec fields, or `spec` itself).
fn take_meta(object: &mut Map<String, Value>) -> Result<RequestMeta, ApiError> {
    let meta = RequestMeta {
        name: optional_string(object.remove("name"), "name")?,
        generate_name: optional_string(object.remove("generateName"), "generateName")?,
        labels: string_map(object.remove("labels"), "labels")?,
        annotations: string_map(object.remove("annotations"), "annotations")?,
    };
    refuse_reserved_keys(&meta.labels, "labels")?;
    refuse_reserved_keys(&meta.annotations, "annotations")?;
    Ok(meta)
}

fn object_meta(
    namespace: &str,
    meta: RequestMeta,
    default_prefix: &str,
    creator: &str,
) -> ObjectMeta {
    let mut annotations = meta.annotations;
    annotations.insert(CREATED_BY_ANNOTATION.to_string(), creator.to_string());
    let generate_name = match (&meta.name, meta.generate_name) {
        (Some(_), _) => None,
        (None, Some(prefix)) => Some(prefix),
        (None, None) => Some(default_prefix.to_string()),
    };
    ObjectMeta {
        name: meta.name,
        generate_name,
        namespace: Some(namespace.to_string()),
        labels: Some(meta.labels).filter(|l| !l.is_empty()),
        annotations: Some(annotations),
        ..ObjectMeta::default()
    }
}

/// Takes the spec of a request: `spec` when given (then no spec field may stand at the top level),
/// else the remaining top-level fields (the shorthand).
fn take_spec(mut object: Map<String, Value>) -> Result<(Value, bool), ApiError> {
    match object.remove("spec") {
        Some(spec) => {
            if !object.is_empty() {
                let fields: Vec<&str> = object.keys().map(String::as_str).collect();
                return Err(ApiError::bad_request(format!(
                    "give either `spec` or its fields at the top level, not both (found {} beside `spec`)",
                    fields.join(", ")
                )));
            }
            Ok((spec, false))
        }
        None => Ok((Value::Object(object), true)),
    }
}

fn request_object(body: Value) -> Result<Map<String, Value>, ApiError> {
    match body {
        Value::Object(object) => Ok(object),
        _ => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
    }
}

/// The Sandbox a `POST .../sandboxes` body describes.
pub fn sandbox_from_request(
    namespace: &str,
    body: Value,
    creator: &str,
) -> Result<Sandbox, ApiError> {
    let mut object = request_object(body)?;
    let meta = take_meta(&mut object)?;
    let (spec, shorthand) = take_spec(object)?;
    let spec = sandbox_spec(spec, shorthand)?;
    let mut sandbox = Sandbox::new("", spec);
    sandbox.metadata = object_meta(namespace, meta, DEFAULT_SANDBOX_PREFIX, creator);
    Ok(sandbox)
}

/// Normalises a group's `template`: a bare sandbox shorthand becomes `{metadata: {}, spec: ...}`, and
/// the template's spec gets the same conveniences as `POST .../sandboxes`.
fn normalise_template(spec: &mut Map<String, Value>) -> Result<(), ApiError> {
    let Some(template) = spec.remove("template") else {
        return Err(ApiError::bad_request(
            "`template` is required: the sandbox each trajectory runs in, e.g. {\"image\": \"python:3.11\", \"run\": {\"command\": [...]}}",
        ));
    };
    let Value::Object(mut template) = template else {
        return Err(ApiError::bad_request("`template` must be a JSON object"));
    };
    let (metadata, sandbox) = match template.remove("spec") {
        Some(sandbox_spec_value) => {
            let metadata = template.remove("metadata").unwrap_or_else(|| json!({}));
            if let Some(field) = template.keys().next() {
                return Err(ApiError::bad_request(format!(
                    "unknown field `{field}` in template (expected `metadata` and `spec`, or a bare sandbox spec)"
                )));
            }
            (metadata, sandbox_spec(sandbox_spec_value, true)?)
        }
        None => {
            let metadata = template.remove("metadata").unwrap_or_else(|| json!({}));
            (metadata, sandbox_spec(Value::Object(template), true)?)
        }
    };
    let sandbox = serde_json::to_value(sandbox)
        .map_err(|err| ApiError::internal(format!("cannot encode the template: {err}")))?;
    spec.insert(
        "template".into(),
        json!({"metadata": metadata, "spec": sandbox}),
    );
    Ok(())
}

/// The RolloutGroup a `POST .../rolloutgroups` body describes.
pub fn rollout_group_from_request(
    namespace: &str,
    body: Value,
    creator: &str,
) -> Result<RolloutGroup, ApiError> {
    let mut object = request_object(body)?;
    let meta = take_meta(&mut object)?;
    let (spec, _) = take_spec(object)?;
    let Value::Object(mut spec) = spec else {
        return Err(ApiError::bad_request(
            "a rollout group spec must be a JSON object",
        ));
    };
    reject_unknown(&spec, &GROUP_FIELDS, &[], "the rollout group spec")?;
    normalise_template(&mut spec)?;
    let spec: RolloutGroupSpec = serde_json::from_value(Value::Object(spec))
        .map_err(|err| ApiError::bad_request(format!("invalid rollout group spec: {err}")))?;
    let template = &spec.template.metadata;
    refuse_reserved_keys(&template.labels, "template.metadata.labels")?;
    refuse_reserved_keys(&template.annotations, "template.metadata.annotations")?;
    let mut group = RolloutGroup::new("", spec);
    group.metadata = object_meta(namespace, meta, DEFAULT_GROUP_PREFIX, creator);
    Ok(group)
}

/// The SandboxSnapshot a `POST .../sandboxsnapshots` body describes: `sandbox`, `paths` and
/// `ttlSecondsAfterUnused` at the top level or under `spec`, plus metadata.
pub fn snapshot_from_request(
    namespace: &str,
    body: Value,
    creator: &str,
) -> Result<SandboxSnapshot, ApiError> {
    let mut object = request_object(body)?;
    let meta = take_meta(&mut object)?;
    let (spec, _) = take_spec(object)?;
    let Value::Object(spec) = spec else {
        return Err(ApiError::bad_request(
            "a snapshot spec must be a JSON object",
        ));
    };
    reject_unknown(&spec, &SNAPSHOT_FIELDS, &[], "the snapshot spec")?;
    if !spec.contains_key("sandbox") {
        return Err(ApiError::bad_request(
            "`sandbox` is required: the name of the Ready Sandbox whose filesystem is snapshotted",
        ));
    }
    let spec: SandboxSnapshotSpec = serde_json::from_value(Value::Object(spec))
        .map_err(|err| ApiError::bad_request(format!("invalid snapshot spec: {err}")))?;
    let mut snapshot = SandboxSnapshot::new("", spec);
    snapshot.metadata = object_meta(namespace, meta, DEFAULT_SNAPSHOT_PREFIX, creator);
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::{EgressPolicy, EnvVar};

    #[test]
    fn a_snapshot_request_names_a_sandbox_and_nothing_unknown() {
        let snapshot = snapshot_from_request(
            "ns",
            json!({"sandbox": "prep", "paths": ["/work"], "labels": {"task": "t1"}}),
            "alice",
        )
        .expect("valid");
        assert_eq!(snapshot.spec.sandbox, "prep");
        assert_eq!(snapshot.spec.paths, vec!["/work".to_string()]);
        assert_eq!(snapshot.metadata.generate_name.as_deref(), Some("snap-"));
        assert_eq!(
            snapshot.metadata.annotations.as_ref().unwrap()[CREATED_BY_ANNOTATION],
            "alice"
        );
        let full = snapshot_from_request(
            "ns",
            json!({"name": "s1", "spec": {"sandbox": "prep", "ttlSecondsAfterUnused": 60}}),
            "alice",
        )
        .expect("valid");
        assert_eq!(full.metadata.name.as_deref(), Some("s1"));
        assert_eq!(full.spec.ttl_seconds_after_unused, Some(60));
        for (body, message) in [
            (json!({"paths": ["/w"]}), "`sandbox` is required"),
            (json!({"sandbox": "p", "image": "x"}), "image"),
            (
                json!({"sandbox": "p", "labels": {"orchard.dev/x": "1"}}),
                "reserved",
            ),
        ] {
            let err = snapshot_from_request("ns", body, "a").expect_err("refused");
            assert!(err.body.message.contains(message), "{}", err.body.message);
        }
    }

    #[test]
    fn a_snapshot_stands_in_for_the_image() {
        let sandbox =
            sandbox_from_request("ns", json!({"fromSnapshot": "prepared"}), "alice").unwrap();
        assert_eq!(sandbox.spec.from_snapshot.as_deref(), Some("prepared"));
        assert!(sandbox.spec.image.is_empty());
    }

    #[test]
    fn a_pool_stands_in_for_the_image() {
        let sandbox = sandbox_from_request(
            "ns",
            json!({"pool": "python", "whenPoolEmpty": "Wait", "ttlSeconds": 60}),
            "alice",
        )
        .unwrap();
        assert_eq!(sandbox.spec.pool.as_deref(), Some("python"));
        assert_eq!(
            sandbox.spec.when_pool_empty,
            Some(orchard_api::PoolFallback::Wait)
        );
        assert!(
            sandbox.spec.image.is_empty(),
            "the pool's template gives it"
        );
        let refused = sandbox_from_request("ns", json!({"ttlSeconds": 60}), "alice").unwrap_err();
        assert!(
            refused.body.message.contains("unless `pool`"),
            "{}",
            refused.body.message
        );
    }

    #[test]
    fn gpus_pass_through_in_both_forms_and_join_the_cpu_shorthand() {
        let gpu = json!({"count": 2, "types": ["H100", "a100"]});
        for request in [
            json!({"image": "i", "resources": {"gpu": gpu}}),
            json!({"spec": {"image": "i", "resources": {"gpu": gpu}}}),
            json!({"image": "i", "cpu": 4, "resources": {"gpu": gpu}}),
        ] {
            let sandbox = sandbox_from_request("ns", request.clone(), "alice").expect("accepted");
            let resources = sandbox.spec.resources.expect("resources");
            assert_eq!(
                resources.gpu,
                Some(orchard_api::GpuRequest {
                    count: 2,
                    types: vec!["H100".into(), "a100".into()],
                }),
                "{request}"
            );
        }
        let sandbox = sandbox_from_request(
            "ns",
            json!({"image": "i", "cpu": 4, "resources": {"gpu": gpu}}),
            "alice",
        )
        .expect("accepted");
        let cpu = sandbox.spec.resources.and_then(|r| r.cpu);
        assert_eq!(cpu.map(|q| q.0).as_deref(), Some("4"));
    }

    #[test]
    fn shorthand_becomes_a_full_spec() {
        let sandbox = sandbox_from_request(
            "ns",
            json!({
                "image": "python:3.11",
                "env": {"A": "1", "B": 2},
                "ttlSeconds": 600,
                "heartbeatTimeoutSeconds": 30,
                "cpu": 2,
                "memory": "1Gi",
                "network": {"egress": "AllowAll"},
                "labels": {"team": "rl"},
            }),
            "alice",
        )
        .unwrap();
        let spec = &sandbox.spec;
        assert_eq!(spec.image, "python:3.11");
        assert_eq!(
            spec.env,
            vec![
                EnvVar {
                    name: "A".into(),
                    value: "1".into()
                },
                EnvVar {
                    name: "B".into(),
                    value: "2".into()
                }
            ]
        );
        let lifecycle = spec.lifecycle.as_ref().unwrap();
        assert_eq!(lifecycle.ttl_seconds, Some(600));
        assert_eq!(lifecycle.heartbeat_timeout_seconds, Some(30));
        let resources = spec.resources.as_ref().unwrap();
        assert_eq!(resources.cpu.as_ref().unwrap().0, "2");
        assert_eq!(resources.memory.as_ref().unwrap().0, "1Gi");
        assert_eq!(
            spec.network.as_ref().unwrap().egress,
            EgressPolicy::AllowAll
        );
        let meta = &sandbox.metadata;
        assert_eq!(meta.name, None);
        assert_eq!(meta.generate_name.as_deref(), Some(DEFAULT_SANDBOX_PREFIX));
        assert_eq!(meta.namespace.as_deref(), Some("ns"));
        assert_eq!(meta.labels.as_ref().unwrap()["team"], "rl");
        assert_eq!(
            meta.annotations.as_ref().unwrap()[CREATED_BY_ANNOTATION],
            "alice"
        );
    }

    #[test]
    fn full_spec_form_and_names() {
        let sandbox = sandbox_from_request(
            "ns",
            json!({"name": "s1", "spec": {"image": "busybox", "workingDir": "/w"}}),
            "bob",
        )
        .unwrap();
        assert_eq!(sandbox.metadata.name.as_deref(), Some("s1"));
        assert_eq!(sandbox.metadata.generate_name, None);
        assert_eq!(sandbox.spec.working_dir.as_deref(), Some("/w"));
        let generated = sandbox_from_request(
            "ns",
            json!({"generateName": "task-", "image": "busybox"}),
            "bob",
        )
        .unwrap();
        assert_eq!(generated.metadata.generate_name.as_deref(), Some("task-"));
    }

    #[test]
    fn mistakes_are_400s_naming_the_problem() {
        let cases = [
            (json!({"imgae": "x"}), "unknown field(s) imgae"),
            (json!({"env": {}}), "`image` is required"),
            (
                json!({"spec": {"image": "x"}, "env": {}}),
                "either `spec` or its fields",
            ),
            (
                json!({"spec": {"image": "x", "ttlSeconds": 5}}),
                "ttlSeconds",
            ),
            (
                json!({"image": "x", "ttlSeconds": 5, "lifecycle": {"ttlSeconds": 6}}),
                "given twice",
            ),
            (json!({"image": "x", "env": {"A": [1]}}), "env.A"),
            (json!({"image": 5}), "invalid sandbox spec"),
            (json!({"image": "x", "labels": {"a": 1}}), "labels"),
            (json!({"image": "x", "name": ""}), "name must be"),
            (json!([1]), "JSON object"),
        ];
        for (body, expected) in cases {
            let err = sandbox_from_request("ns", body.clone(), "u").unwrap_err();
            assert_eq!(err.status, 400, "{body}");
            assert!(
                err.body.message.contains(expected),
                "{body}: {}",
                err.body.message
            );
        }
    }

    #[test]
    fn rollout_group_template_shorthand_and_full_form() {
        let group = rollout_group_from_request(
            "ns",
            json!({
                "name": "g",
                "groupSize": 2,
                "maxTrajectories": 4,
                "template": {"image": "python:3.11", "env": {"SEED": "1"},
                             "run": {"command": ["python", "run.py"]}},
            }),
            "alice",
        )
        .unwrap();
        assert_eq!(group.spec.group_size, 2);
        assert_eq!(group.spec.template.spec.image, "python:3.11");
        assert_eq!(group.spec.template.spec.env[0].name, "SEED");
        assert_eq!(
            group.spec.template.spec.run.as_ref().unwrap().command,
            vec!["python", "run.py"]
        );
        let full = rollout_group_from_request(
            "ns",
            json!({"spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": {"image": "x"}}}}),
            "alice",
        )
        .unwrap();
        assert_eq!(full.spec.template.metadata.labels["a"], "b");
        assert_eq!(full.spec.group_size, 8, "defaults apply");
        assert_eq!(
            full.metadata.generate_name.as_deref(),
            Some(DEFAULT_GROUP_PREFIX)
        );
        let err = rollout_group_from_request("ns", json!({"groupSize": 2}), "u").unwrap_err();
        assert!(err.body.message.contains("`template` is required"));
        let err = rollout_group_from_request(
            "ns",
            json!({"groupsize": 2, "template": {"image": "x"}}),
            "u",
        )
        .unwrap_err();
        assert!(err.body.message.contains("groupsize"), "{err}");
    }

    #[test]
    fn a_retry_policy_passes_through_for_sandboxes_and_groups() {
        let retry = json!({"maxAttempts": 3, "onOOM": {"memoryFactor": 2.0, "maxMemory": "8Gi"}, "onEviction": true});
        let sandbox = sandbox_from_request(
            "ns",
            json!({"image": "x", "memory": "1Gi", "retry": retry.clone()}),
            "u",
        )
        .unwrap();
        assert_eq!(
            serde_json::to_value(&sandbox.spec.retry).unwrap(),
            retry,
            "the shorthand"
        );
        let full = sandbox_from_request(
            "ns",
            json!({"spec": {"image": "x", "retry": retry.clone()}}),
            "u",
        )
        .unwrap();
        assert_eq!(serde_json::to_value(&full.spec.retry).unwrap(), retry);
        let group = rollout_group_from_request(
            "ns",
            json!({"retry": retry.clone(), "template": {"image": "x"}}),
            "u",
        )
        .unwrap();
        assert_eq!(serde_json::to_value(&group.spec.retry).unwrap(), retry);
        let err = sandbox_from_request(
            "ns",
            json!({"image": "x", "retry": {"maxAttempts": "3"}}),
            "u",
        )
        .unwrap_err();
        assert_eq!(err.status, 400);
        assert!(err.body.message.contains("invalid sandbox spec"), "{err}");
    }

    #[test]
    fn the_operators_label_and_annotation_keys_are_refused() {
        let cases = [
            (
                json!({"image": "x", "labels": {"orchard.dev/rollout-queue": "shared"}}),
                "labels key `orchard.dev/rollout-queue` is reserved",
            ),
            (
                json!({"image": "x", "annotations": {"orchard.dev/seal": "00"}}),
                "annotations key `orchard.dev/seal` is reserved",
            ),
        ];
        for (body, expected) in cases {
            let err = sandbox_from_request("ns", body.clone(), "u").unwrap_err();
            assert_eq!(err.status, 400, "{body}");
            assert!(
                err.body.message.contains(expected),
                "{body}: {}",
                err.body.message
            );
        }
        let groups = [
            (
                json!({"labels": {"orchard.dev/rollout-group": "g"}, "template": {"image": "x"}}),
                "labels key `orchard.dev/rollout-group` is reserved",
            ),
            (
                json!({"template": {"metadata": {"labels": {"orchard.dev/rollout-queue": "q"}},
                                    "spec": {"image": "x"}}}),
                "template.metadata.labels key `orchard.dev/rollout-queue` is reserved",
            ),
            (
                json!({"template": {"image": "x",
                                    "metadata": {"annotations": {"orchard.dev/seal": "00"}}}}),
                "template.metadata.annotations key `orchard.dev/seal` is reserved",
            ),
        ];
        for (body, expected) in groups {
            let err = rollout_group_from_request("ns", body.clone(), "u").unwrap_err();
            assert_eq!(err.status, 400, "{body}");
            assert!(
                err.body.message.contains(expected),
                "{body}: {}",
                err.body.message
            );
        }
        // Other prefixes, and keys that merely contain the domain, are the user's.
        let sandbox = sandbox_from_request(
            "ns",
            json!({"image": "x", "labels": {"team.orchard.dev/x": "1", "orchard.dev": "1"},
                   "annotations": {"example.com/note": "1"}}),
            "u",
        )
        .unwrap();
        assert_eq!(sandbox.metadata.labels.unwrap().len(), 2);
    }
}
