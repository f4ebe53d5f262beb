//! The heap one object takes in a watch cache, counted exactly: objects as the API server serves
//! them are decoded into a reflector store on the calling thread, as the operator's watches decode
//! them (metadata trimmed by `orchard_operator::plumbing::watch::trim_metadata`), while the counting allocator ([`crate::alloc`]) counts that
//! thread's allocations. Only meaningful in a binary whose global allocator is
//! [`crate::alloc::Counting`] (bench-control-plane); elsewhere nothing is counted and the answer is
//! 0.

use kube::Resource;
use kube::runtime::reflector;
use kube::runtime::watcher;
use orchard_operator::plumbing::watch::trim_metadata;
use serde::de::DeserializeOwned;

use crate::alloc;

/// The objects of a list the API server answered (`{"items": [...]}`), each given the `apiVersion`
/// and `kind` a watch event carries (list items lack them), as JSON texts (pure).
pub fn items_of(list: &serde_json::Value, api_version: &str, kind: &str) -> Vec<String> {
    let items = list["items"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    items
        .iter()
        .filter_map(|item| {
            let mut item = item.clone();
            let object = item.as_object_mut()?;
            object.insert("apiVersion".into(), api_version.into());
            object.insert("kind".into(), kind.into());
            serde_json::to_string(&item).ok()
        })
        .collect()
}

/// Heap bytes per object of `objects` (JSON texts) decoded as `K` into one reflector store, the
/// store's own map included; `None` when none decodes.
pub fn per_object<K>(objects: &[String]) -> Option<f64>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
{
    let before = alloc::live();
    alloc::count(true);
    let (store, mut writer) = reflector::store::<K>();
    let mut decoded = 0usize;
    for text in objects {
        if let Ok(mut object) = serde_json::from_str::<K>(text) {
            trim_metadata(object.meta_mut());
            writer.apply_watcher_event(&watcher::Event::Apply(object));
            decoded += 1;
        }
    }
    alloc::count(false);
    let bytes = alloc::live() - before;
    drop((store, writer));
    (decoded > 0).then(|| bytes as f64 / decoded as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn list_items_get_the_kind_a_watch_event_carries() {
        let list = json!({"kind": "PodList", "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]});
        let items = items_of(&list, "v1", "Pod");
        assert_eq!(items.len(), 2);
        let first: serde_json::Value = serde_json::from_str(&items[0]).expect("JSON");
        assert_eq!(first["kind"], "Pod");
        assert_eq!(first["apiVersion"], "v1");
        assert_eq!(first["metadata"]["name"], "a");
        assert!(items_of(&json!({"items": null}), "v1", "Pod").is_empty());
    }

    #[test]
    fn objects_that_do_not_decode_are_not_counted() {
        let objects = vec!["not JSON".to_string()];
        assert_eq!(
            per_object::<k8s_openapi::api::core::v1::Pod>(&objects),
            None
        );
    }
}
