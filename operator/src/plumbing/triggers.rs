//! Controller triggers fed from a watch stream right after the reflector updated its cache.
//!
//! Why not the shared store's subscribers (`Writer::subscribe` / `ReflectHandle`): in kube-runtime
//! 5.0.0 a `ReflectHandle` that is told about an object which has left the cache by the time it is
//! polled (deleted in between) returns `Pending` without registering a waker, so its controller
//! stops seeing that stream until something else happens to wake the task. A RolloutGroup waited
//! more than two minutes for its children's results that way, after an `Eager` group in the same
//! operator deleted running trajectories. The handle also never forwards deletions. These channels
//! do neither: every forwarded object is delivered, and the receiving end wakes on each send.

use std::sync::Arc;

use futures::Stream;
use futures::channel::mpsc;
use kube::runtime::watcher;

/// Which objects of a watch event a trigger forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// Applied and (re-)listed objects: what makes a controller reconcile the object itself.
    Applied,
    /// Applied, (re-)listed and deleted objects: what makes a controller reconcile their owner.
    AppliedAndDeleted,
}

/// The object of `event` that a trigger of kind `forward` passes on, if any (pure).
pub fn forwarded<K>(event: &watcher::Event<K>, forward: Forward) -> Option<&K> {
    match event {
        watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => Some(obj),
        watcher::Event::Delete(obj) if forward == Forward::AppliedAndDeleted => Some(obj),
        _ => None,
    }
}

/// The sending side: a subscriber of a watch (`watch::cached_watch`), told each event after the
/// reflector applied it.
#[derive(Clone)]
pub struct Trigger<K> {
    sender: mpsc::UnboundedSender<Arc<K>>,
    forward: Forward,
}

/// A trigger and the stream a controller consumes (`for_shared_stream` for the controller's own
/// kind; map to owned objects for `owns_stream`).
pub fn trigger<K>(forward: Forward) -> (Trigger<K>, impl Stream<Item = Arc<K>> + Send + 'static)
where
    K: Send + Sync + 'static,
{
    let (sender, receiver) = mpsc::unbounded();
    (Trigger { sender, forward }, receiver)
}

impl<K: Clone> Trigger<K> {
    /// Passes the event's object on; whether a controller received it. A receiver that is gone (the
    /// controller stopped at shutdown) is not an error.
    pub fn forward(&self, event: &watcher::Event<K>) -> bool {
        forwarded(event, self.forward)
            .is_some_and(|obj| self.sender.unbounded_send(Arc::new(obj.clone())).is_ok())
    }
}

/// A reference to an object of kind `T`.
pub type Ref<T> = kube::runtime::reflector::ObjectRef<T>;

/// The sending side of a trigger that maps each object of a watch (applied, listed or deleted) to
/// the objects of another kind it concerns (`map`, pure), e.g. a Sandbox to the SandboxSnapshot it
/// starts from; a controller consumes the references with `reconcile_on`.
pub struct MappedTrigger<K, T: kube::Resource<DynamicType = ()>> {
    sender: mpsc::UnboundedSender<Ref<T>>,
    map: fn(&K) -> Vec<Ref<T>>,
}

/// A channel of references that several [`MappedTrigger`]s feed (`with`) and one controller reads.
pub fn mapped_channel<T>() -> (
    mpsc::UnboundedSender<Ref<T>>,
    impl Stream<Item = Ref<T>> + Send + 'static,
)
where
    T: kube::Resource<DynamicType = ()> + Send + Sync + 'static,
{
    mpsc::unbounded()
}

impl<K, T: kube::Resource<DynamicType = ()>> MappedTrigger<K, T> {
    /// A trigger sending `map`'s references of every object into `sender`.
    pub fn with(sender: &mpsc::UnboundedSender<Ref<T>>, map: fn(&K) -> Vec<Ref<T>>) -> Self {
        Self {
            sender: sender.clone(),
            map,
        }
    }

    /// Sends the references of the event's object; how many were sent (none to a stopped
    /// controller).
    pub fn forward(&self, event: &watcher::Event<K>) -> usize {
        forwarded(event, Forward::AppliedAndDeleted)
            .map(|obj| {
                (self.map)(obj)
                    .into_iter()
                    .filter(|r| self.sender.unbounded_send(r.clone()).is_ok())
                    .count()
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    fn named(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    #[test]
    fn applied_and_listed_objects_are_forwarded_deletions_only_when_asked() {
        let apply = watcher::Event::Apply(named("a"));
        let listed = watcher::Event::InitApply(named("b"));
        let deleted = watcher::Event::Delete(named("c"));
        let name = |o: Option<&ConfigMap>| o.and_then(|o| o.metadata.name.clone());
        for forward in [Forward::Applied, Forward::AppliedAndDeleted] {
            assert_eq!(name(forwarded(&apply, forward)), Some("a".into()));
            assert_eq!(name(forwarded(&listed, forward)), Some("b".into()));
        }
        assert_eq!(name(forwarded(&deleted, Forward::Applied)), None);
        assert_eq!(
            name(forwarded(&deleted, Forward::AppliedAndDeleted)),
            Some("c".into())
        );
        let markers: [watcher::Event<ConfigMap>; 2] =
            [watcher::Event::Init, watcher::Event::InitDone];
        for marker in &markers {
            assert!(forwarded(marker, Forward::AppliedAndDeleted).is_none());
        }
    }

    #[tokio::test]
    async fn a_waiting_consumer_wakes_for_every_object_even_deleted_ones() {
        let (trigger, stream) = trigger::<ConfigMap>(Forward::AppliedAndDeleted);
        let consumer = tokio::spawn(
            stream
                .take(3)
                .map(|o| o.metadata.name.clone())
                .collect::<Vec<_>>(),
        );
        // The consumer is parked on an empty channel before anything is sent.
        tokio::time::sleep(Duration::from_millis(20)).await;
        trigger.forward(&watcher::Event::Apply(named("child")));
        trigger.forward(&watcher::Event::Delete(named("child")));
        tokio::time::sleep(Duration::from_millis(20)).await;
        trigger.forward(&watcher::Event::Apply(named("later")));
        let seen = tokio::time::timeout(Duration::from_secs(5), consumer)
            .await
            .expect("the consumer was woken")
            .expect("consumer task");
        assert_eq!(
            seen,
            vec![
                Some("child".to_string()),
                Some("child".to_string()),
                Some("later".to_string())
            ]
        );
    }

    /// Canary for the kube-runtime bug this module works around: a shared store's subscriber that
    /// is told about an object deleted before it looked stops waking up, even for later objects.
    /// When this fails, kube-runtime has fixed `ReflectHandle` and the subscribers can come back.
    #[tokio::test]
    async fn kube_runtime_reflect_handle_still_stalls_after_a_deleted_object() {
        use kube::runtime::WatchStreamExt;
        use kube::runtime::reflector;

        let (_store, writer) = reflector::store_shared::<ConfigMap>(16);
        let mut handle = writer.subscribe().expect("shared store");
        let (events, watch) =
            mpsc::unbounded::<Result<watcher::Event<ConfigMap>, watcher::Error>>();
        tokio::spawn(watch.reflect_shared(writer).for_each(|_| async {}));

        // Applied, then deleted before the subscriber looks.
        events
            .unbounded_send(Ok(watcher::Event::Apply(named("gone"))))
            .expect("send");
        events
            .unbounded_send(Ok(watcher::Event::Delete(named("gone"))))
            .expect("send");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let consumer =
            tokio::spawn(async move { handle.next().await.map(|o| o.metadata.name.clone()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A later object is in the store and dispatched, but nothing wakes the subscriber.
        events
            .unbounded_send(Ok(watcher::Event::Apply(named("later"))))
            .expect("send");
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !consumer.is_finished(),
            "kube-runtime's ReflectHandle delivered the later object: the bug is fixed upstream"
        );
        consumer.abort();
    }

    #[test]
    fn a_stopped_controller_is_not_an_error() {
        let (trigger, stream) = trigger::<ConfigMap>(Forward::Applied);
        assert!(trigger.forward(&watcher::Event::Apply(named("x"))));
        drop(stream);
        assert!(
            !trigger.forward(&watcher::Event::Apply(named("y"))),
            "nobody receives it, and nothing panics"
        );
    }
}
