//! Status writes as RFC 6902 JSON Patches (pure): only what changed, guarded by a `test` of the
//! object's UID.
//!
//! Why not a merge patch: a status write goes to the object that holds the *name* when it lands. A
//! Sandbox deleted and recreated under the same name between our read and our write would receive the
//! old incarnation's status (its pod, its ready time, its result). On the status subresource a
//! `metadata.uid` in a merge patch is silently ignored, but a JSON Patch `test` of `/metadata/uid` is
//! evaluated against the stored object: the API server answers 422 and writes nothing.
//!
//! Like the merge patch before it, the patch touches only the members that changed, so a concurrent
//! writer's fields (an external driver's `result`) survive; objects are diffed member by member, arrays
//! and scalars are replaced whole (never patched by index).

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use serde_json::Value;

/// The patch that turns the object's status `from` (`None`: it has none) into `to`, for the object with
/// `uid`; `None` when nothing changes. Nulls in `to` mean "absent".
pub fn status_patch(uid: &str, from: Option<&Value>, to: &Value) -> Option<Patch> {
    let to = strip_nulls(to);
    let mut ops = Vec::new();
    let status = PointerBuf::from_tokens(["status"]);
    match from {
        Some(from) if from.is_object() => diff_into(&mut ops, &status, from, &to),
        _ => ops.push(add(status, to)),
    }
    if ops.is_empty() {
        return None;
    }
    ops.insert(0, uid_test(uid));
    Some(Patch(ops))
}

/// The patch that sets `status.<member>` of the object with `uid` (which has a status: a sandbox
/// recording a result is past Ready), leaving every other member as it is.
pub fn status_member_patch(uid: &str, member: &str, value: Value) -> Patch {
    Patch(vec![
        uid_test(uid),
        add(
            PointerBuf::from_tokens(["status", member]),
            strip_nulls(&value),
        ),
    ])
}

/// The patch that appends `condition` to `status.conditions` of the object with `uid`.
pub fn append_condition_patch(uid: &str, condition: Value) -> Patch {
    Patch(vec![
        uid_test(uid),
        add(
            PointerBuf::from_tokens(["status", "conditions", "-"]),
            condition,
        ),
    ])
}

/// The `test` that makes a patch apply only to the object with `uid`.
pub fn uid_test(uid: &str) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: PointerBuf::from_tokens(["metadata", "uid"]),
        value: Value::String(uid.to_string()),
    })
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

fn diff_into(ops: &mut Vec<PatchOperation>, path: &PointerBuf, from: &Value, to: &Value) {
    if from == to {
        return;
    }
    match (from, to) {
        (Value::Object(old), Value::Object(new)) => {
            for (key, new_value) in new {
                let child = path.with_trailing_token(key);
                match old.get(key) {
                    Some(old_value) => diff_into(ops, &child, old_value, new_value),
                    None => ops.push(add(child, new_value.clone())),
                }
            }
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                ops.push(PatchOperation::Remove(RemoveOperation {
                    path: path.with_trailing_token(key),
                }));
            }
        }
        // "add" on an existing object member replaces it.
        _ => ops.push(add(path.clone(), to.clone())),
    }
}

fn strip_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn object(uid: &str, status: Option<Value>) -> Value {
        let mut o = json!({"metadata": {"uid": uid, "name": "s"}, "spec": {"image": "busybox"}});
        if let Some(status) = status {
            o["status"] = status;
        }
        o
    }

    fn applied(mut doc: Value, patch: &Patch) -> Result<Value, json_patch::PatchError> {
        json_patch::patch(&mut doc, patch)?;
        Ok(doc)
    }

    #[test]
    fn equal_statuses_need_no_patch() {
        assert!(status_patch("u", Some(&json!({"a": 1})), &json!({"a": 1})).is_none());
    }

    #[test]
    fn only_changes_are_sent_and_arrays_are_replaced_whole() {
        let from = json!({"phase": "Pending", "podName": "s", "conditions": [{"type": "Ready", "status": "False"}], "keep": {"x": 1, "y": 2}});
        let to = json!({"phase": "Ready", "podName": "s", "conditions": [{"type": "Ready", "status": "True"}], "keep": {"x": 1}, "podIP": "10.0.0.1"});
        let patch = status_patch("u", Some(&from), &to).unwrap();
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "u"},
                {"op": "add", "path": "/status/conditions", "value": [{"type": "Ready", "status": "True"}]},
                {"op": "remove", "path": "/status/keep/y"},
                {"op": "add", "path": "/status/phase", "value": "Ready"},
                {"op": "add", "path": "/status/podIP", "value": "10.0.0.1"},
            ])
        );
        assert_eq!(
            applied(object("u", Some(from)), &patch).unwrap()["status"],
            to
        );
    }

    #[test]
    fn a_status_written_for_one_incarnation_never_lands_on_the_next() {
        let patch =
            status_patch("uid-old", Some(&json!({})), &json!({"podName": "again"})).unwrap();
        assert!(applied(object("uid-new", Some(json!({}))), &patch).is_err());
        assert!(applied(object("uid-old", Some(json!({}))), &patch).is_ok());
    }

    #[test]
    fn an_object_without_status_gets_it_whole() {
        let patch = status_patch("u", None, &json!({"phase": "Pending", "x": null})).unwrap();
        assert_eq!(
            applied(object("u", None), &patch).unwrap()["status"],
            json!({"phase": "Pending"})
        );
    }

    #[test]
    fn a_concurrent_writers_field_survives() {
        let ours = json!({"phase": "Ready"});
        let server = object(
            "u",
            Some(json!({"phase": "Ready", "result": {"reward": 1.0}})),
        );
        let patch = status_patch("u", Some(&ours), &json!({"phase": "Succeeded"})).unwrap();
        assert_eq!(
            applied(server, &patch).unwrap()["status"],
            json!({"phase": "Succeeded", "result": {"reward": 1.0}})
        );
    }

    fn document() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::from),
            (-5i64..5).prop_map(Value::from),
            "[a-c~/]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::btree_map("[a-d~/]{1,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn applying_the_patch_reproduces_the_target(
            from in prop::collection::btree_map("[a-d~/]{1,2}", document(), 0..4),
            to in prop::collection::btree_map("[a-d~/]{1,2}", document(), 0..4),
        ) {
            let from = Value::Object(from.into_iter().collect());
            let to = strip_nulls(&Value::Object(to.into_iter().collect()));
            match status_patch("u", Some(&from), &to) {
                None => prop_assert_eq!(&from, &to),
                Some(patch) => prop_assert_eq!(
                    applied(object("u", Some(from)), &patch).unwrap()["status"].clone(),
                    to
                ),
            }
        }
    }
}
