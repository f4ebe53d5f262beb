//! Waiting on the cluster from tests: watch-based (`await_condition`), with a timeout and a message
//! that says what was awaited.

use std::fmt::Debug;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::wait::{Condition, await_condition};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Waits until `name` satisfies `condition`, or panics after `timeout` naming `what`.
pub async fn until<K, C>(api: &Api<K>, name: &str, what: &str, timeout: Duration, condition: C) -> K
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + Debug + Send + 'static,
    C: Condition<K>,
{
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, condition)).await {
        Ok(Ok(Some(object))) => object,
        Ok(Ok(None)) => panic!("{name} was deleted while waiting for: {what}"),
        Ok(Err(err)) => panic!("watch failed while waiting for {name}: {what}: {err}"),
        Err(_) => {
            let current = api.get_opt(name).await.ok().flatten();
            panic!(
                "timed out after {:?} waiting for {name}: {what}; last seen: {}",
                timeout,
                current
                    .map(|o| shown(&o))
                    .unwrap_or_else(|| "not found".into())
            )
        }
    }
}

/// `object` as JSON for a failure message, without its managed fields (they only repeat the rest).
fn shown<K: serde::Serialize>(object: &K) -> String {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("managedFields");
    }
    value.to_string()
}

/// Waits until `name` no longer exists: gone, not replaced. An API error fails the test (it tells
/// nothing about the object), and so does a new object under the name (a pod made again for a
/// sandbox that should have none is a bug, not a deletion). A name that holds nothing when the wait
/// starts counts as gone.
pub async fn deleted<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let current = |what: &'static str| {
        let api = api.clone();
        async move {
            api.get_opt(name)
                .await
                .unwrap_or_else(|err| panic!("cannot tell whether {name} is {what}: {err}"))
        }
    };
    let Some(uid) = current("deleted").await.and_then(|o| o.uid()) else {
        return;
    };
    let gone_or_replaced = {
        let uid = uid.clone();
        move |object: Option<&K>| object.is_none_or(|o| o.uid().as_deref() != Some(uid.as_str()))
    };
    match tokio::time::timeout(
        timeout,
        await_condition(api.clone(), name, gone_or_replaced),
    )
    .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => panic!("watch failed while waiting for {name} to be deleted: {err}"),
        Err(_) => panic!("timed out after {timeout:?} waiting for {name} to be deleted"),
    }
    if let Some(replacement) = current("gone").await {
        panic!(
            "{name} (uid {uid}) was deleted but replaced by a new object under its name (uid {})",
            replacement.uid().unwrap_or_default()
        );
    }
}

/// Polls `probe` every 100 ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
