//! The smallest JSON merge patch (RFC 7386) turning one document into another (pure). Status writes
//! send only what changed: cheaper for the API server than applying the whole status, and a concurrent
//! writer's fields (an external driver's `result`) are never touched unless we change them.

use serde_json::{Map, Value};

/// The merge patch that turns `from` into `to`, or `None` when they are equal. Objects are diffed key by
/// key (a removed key becomes `null`); anything else (arrays, scalars) is replaced whole.
pub fn diff(from: &Value, to: &Value) -> Option<Value> {
    if from == to {
        return None;
    }
    match (from, to) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = Map::new();
            for (key, new_value) in new {
                match old.get(key) {
                    Some(old_value) => {
                        if let Some(change) = diff(old_value, new_value) {
                            patch.insert(key.clone(), change);
                        }
                    }
                    None => {
                        patch.insert(key.clone(), strip_nulls(new_value));
                    }
                }
            }
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ => Some(strip_nulls(to)),
    }
}

/// `null` inside a merge patch means "delete": values we add must not carry nulls of their own.
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

/// Applies a merge patch (RFC 7386) — the API server's semantics, for tests.
pub fn apply(target: &Value, patch: &Value) -> Value {
    match (target, patch) {
        (_, Value::Object(changes)) => {
            let mut result = match target {
                Value::Object(map) => map.clone(),
                _ => Map::new(),
            };
            for (key, change) in changes {
                if change.is_null() {
                    result.remove(key);
                } else {
                    let merged = apply(result.get(key).unwrap_or(&Value::Null), change);
                    result.insert(key.clone(), merged);
                }
            }
            Value::Object(result)
        }
        (_, other) => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn equal_documents_need_no_patch() {
        assert_eq!(diff(&json!({"a": 1}), &json!({"a": 1})), None);
    }

    #[test]
    fn only_changes_are_sent_and_removals_are_null() {
        let from = json!({"phase": "Pending", "podName": "s", "conditions": [{"type": "Ready", "status": "False"}], "keep": {"x": 1, "y": 2}});
        let to = json!({"phase": "Ready", "podName": "s", "conditions": [{"type": "Ready", "status": "True"}], "keep": {"x": 1}, "podIP": "10.0.0.1"});
        let patch = diff(&from, &to).unwrap();
        assert_eq!(
            patch,
            json!({"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}], "keep": {"y": null}, "podIP": "10.0.0.1"})
        );
        assert_eq!(apply(&from, &patch), to);
    }

    #[test]
    fn a_concurrent_writers_field_survives() {
        let ours = json!({"phase": "Ready"});
        let server = json!({"phase": "Ready", "result": {"reward": 1.0}});
        let patch = diff(&ours, &json!({"phase": "Succeeded"})).unwrap();
        assert_eq!(
            apply(&server, &patch),
            json!({"phase": "Succeeded", "result": {"reward": 1.0}})
        );
    }

    fn document() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::from),
            (-5i64..5).prop_map(Value::from),
            "[a-c]{0,2}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::btree_map("[a-d]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn applying_the_diff_reproduces_the_target(from in document(), to in document()) {
            // Merge patches cannot express nulls inside objects; documents of statuses never hold them.
            let to = strip_nulls(&to);
            match diff(&from, &to) {
                None => prop_assert_eq!(&from, &to),
                Some(patch) => prop_assert_eq!(apply(&from, &patch), to),
            }
        }
    }
}
