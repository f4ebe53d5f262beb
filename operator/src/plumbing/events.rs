//! Kubernetes events on transitions, through the process' one `Recorder`. Publishing is best effort:
//! a failure is logged, never fails a reconcile.

use kube::Resource;
use kube::runtime::events::{Event, EventType};
use tracing::warn;

use crate::plumbing::kube_ctx::KubeCtx;

/// Publishes an event about `object` with `reason` (CamelCase) and `note`.
pub async fn publish<K>(ctx: &KubeCtx, object: &K, type_: EventType, reason: &str, note: String)
where
    K: Resource<DynamicType = ()>,
{
    let event = Event {
        type_,
        reason: reason.chars().take(128).collect(),
        note: Some(note.chars().take(1024).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    match ctx.recorder.publish(&event, &object.object_ref(&())).await {
        Ok(()) => ctx.metrics.api_write("events", "create"),
        Err(error) => warn!(
            object = object.meta().name.as_deref().unwrap_or(""),
            %error,
            "cannot publish event"
        ),
    }
}
