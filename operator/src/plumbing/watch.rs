//! One way to watch a kind: a watch kept in a cache (reflector store) whose every event, once the
//! cache applied it, is told to the subscribers that keep state about those objects (the operator's
//! memory of its own writes, the controllers' triggers, the change feed, the pools' and queues'
//! books). Each subscriber says in its own `notify` what an event means to it, where it is
//! unit-tested; start-up only lists who listens to which kind.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, future};
use kube::api::{Api, ObjectMeta};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

use crate::plumbing::backoff::ReconcileBackoff;
use crate::plumbing::change_feed::ChangeFeed;
use crate::plumbing::own_writes::{OwnWrites, child_key, namespace_scope};
use crate::plumbing::ownership::controller_uid;
use crate::plumbing::triggers::{MappedTrigger, Trigger};

/// Something that keeps state about the objects of a watch.
pub trait Subscriber<K>: Send + 'static {
    /// Told every event after the watch's cache applied it (so what it reads from the cache is at
    /// least as new as the event).
    fn notify(&mut self, event: &watcher::Event<K>);
}

impl<K: Clone + Send + Sync + 'static> Subscriber<K> for Trigger<K> {
    fn notify(&mut self, event: &watcher::Event<K>) {
        self.forward(event);
    }
}

impl<K, T> Subscriber<K> for MappedTrigger<K, T>
where
    K: Send + 'static,
    T: Resource<DynamicType = ()> + Send + 'static,
{
    fn notify(&mut self, event: &watcher::Event<K>) {
        self.forward(event);
    }
}

/// The subscribers of one watch.
pub type Subscribers<K> = Vec<Box<dyn Subscriber<K>>>;

/// A watch of `api` with `config`, kept in the returned cache, telling `subscribers` every event;
/// `filled` is set once the first full list is in the cache. Every object's metadata is trimmed
/// ([`trim_metadata`]) before anyone sees it (what else a cache leaves out is its type's:
/// `cached_pod`). The future drives the watch until its stream ends; errors are logged and retried
/// with kube-runtime's default backoff.
pub fn cached_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    filled: Arc<AtomicBool>,
    mut subscribers: Subscribers<K>,
) -> (Store<K>, BoxFuture<'static, ()>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let kind = K::kind(&()).to_string();
    let watch = watcher(api, config)
        .default_backoff()
        .modify(|o: &mut K| trim_metadata(o.meta_mut()))
        .reflect(writer)
        .for_each(move |event| {
            match event {
                Ok(event) => {
                    if matches!(event, watcher::Event::InitDone)
                        && !filled.swap(true, Ordering::Relaxed)
                    {
                        debug!(%kind, "watch cache filled");
                    }
                    for subscriber in &mut subscribers {
                        subscriber.notify(&event);
                    }
                }
                Err(err) => warn!(%kind, %err, "watch error (retrying)"),
            }
            future::ready(())
        })
        .boxed();
    (store, watch)
}

/// `meta` as the caches keep it (pure): without managed fields (no reader uses them, and they are
/// often the largest part of an object), its owner references and finalizers in lists no longer
/// than their contents (a decoded list of one reserves room for four, 312 bytes of it unused for
/// an owner reference).
pub fn trim_metadata(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(owners) = meta.owner_references.as_mut() {
        owners.shrink_to_fit();
    }
    if let Some(finalizers) = meta.finalizers.as_mut() {
        finalizers.shrink_to_fit();
    }
}

/// Tells the operator's memory what a watch delivered: a version of an object (its remembered
/// status may end), a child shown or deleted (the owner's entry for it ends), an object deleted
/// (everything remembered about its UID ends, backoff included).
#[derive(Clone)]
pub struct Memory {
    /// The memory of the operator's own writes.
    pub own_writes: Arc<OwnWrites>,
    /// Per-object backoff.
    pub backoff: Arc<ReconcileBackoff>,
}

impl<K: Resource<DynamicType = ()> + Send + Sync + 'static> Subscriber<K> for Memory {
    fn notify(&mut self, event: &watcher::Event<K>) {
        let (object, deleted) = match event {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => (o, false),
            watcher::Event::Delete(o) => (o, true),
            _ => return,
        };
        let meta = object.meta();
        let uid = meta.uid.as_deref().unwrap_or_default();
        let parent = controller_uid(meta)
            .map(str::to_string)
            .unwrap_or_else(|| namespace_scope(meta.namespace.as_deref().unwrap_or_default()));
        let key = child_key(&K::kind(&()), meta.name.as_deref().unwrap_or_default());
        self.own_writes.child_observed(&parent, &key);
        if deleted {
            self.own_writes.forget(uid);
            self.backoff.reset(uid);
        } else {
            self.own_writes
                .observed(uid, meta.resource_version.as_deref());
        }
    }
}

/// Publishes every applied or deleted object of kind `kind` to a change feed (and a relist as a
/// note without a name), for the gateway's waiters.
pub struct Publish {
    /// The feed.
    pub feed: ChangeFeed,
    /// The kind's name in the feed (`Sandbox`, `RolloutGroup`).
    pub kind: &'static str,
}

impl<K: Resource + Send + 'static> Subscriber<K> for Publish {
    fn notify(&mut self, event: &watcher::Event<K>) {
        match event {
            watcher::Event::Apply(obj) | watcher::Event::Delete(obj) => self.feed.publish(
                self.kind,
                obj.meta().namespace.as_deref(),
                obj.meta().name.as_deref(),
            ),
            watcher::Event::InitDone => self.feed.publish(self.kind, None, None),
            _ => {}
        }
    }
}

/// `namespace` of an object, empty when it has none (cluster-scoped).
pub fn namespace_of<K: ResourceExt>(object: &K) -> String {
    object.namespace().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};

    fn object(name: &str, uid: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn cached_metadata_has_no_managed_fields_and_no_spare_room() {
        let text = serde_json::json!({
            "name": "s1",
            "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u"}],
            "finalizers": ["orchard.dev/cleanup"],
            "managedFields": [{"manager": "m"}],
        });
        let mut meta: ObjectMeta = serde_json::from_value(text).expect("metadata");
        let before = meta.clone();
        trim_metadata(&mut meta);
        assert_eq!(meta.managed_fields, None::<Vec<ManagedFieldsEntry>>);
        let owners: &Vec<OwnerReference> = meta.owner_references.as_ref().expect("owners");
        assert_eq!((owners.len(), owners.capacity()), (1, 1));
        let finalizers = meta.finalizers.as_ref().expect("finalizers");
        assert_eq!((finalizers.len(), finalizers.capacity()), (1, 1));
        assert_eq!(
            (meta.owner_references, meta.finalizers),
            (before.owner_references, before.finalizers),
            "the same contents"
        );
    }

    #[test]
    fn a_deleted_object_ends_its_memory_and_its_backoff() {
        let own_writes = Arc::new(OwnWrites::default());
        let backoff = Arc::new(ReconcileBackoff::new(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_secs(1),
        ));
        let mut memory = Memory {
            own_writes: own_writes.clone(),
            backoff: backoff.clone(),
        };
        backoff.next_delay("u1");
        backoff.next_delay("u1");
        memory.notify(&watcher::Event::Apply(object("a", "u1")));
        assert_eq!(backoff.failures("u1"), 2, "a new version keeps the backoff");
        memory.notify(&watcher::Event::Delete(object("a", "u1")));
        assert_eq!(backoff.failures("u1"), 0, "the deletion ends it");
    }

    #[tokio::test]
    async fn changes_are_published_under_their_names() {
        let feed = ChangeFeed::default();
        let mut named = feed.subscribe("ConfigMap", "ns", "a");
        let mut publish = Publish {
            feed: feed.clone(),
            kind: "ConfigMap",
        };
        publish.notify(&watcher::Event::Apply(object("a", "u1")));
        tokio::time::timeout(std::time::Duration::from_secs(5), named.next())
            .await
            .expect("the subscriber of the name is told");
    }
}
