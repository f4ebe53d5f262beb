//! What the Sandbox and RolloutGroup routes share: create, list (from the watch cache once it is
//! filled, else one read from the API server) and delete, for either kind.

use std::time::Instant;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::gateway::deps::GATEWAY_FIELD_MANAGER;
use crate::gateway::http::errors::{ApiError, from_kube, json_response};
use crate::gateway::objects::recent_deletes::RecentDeletes;
use crate::gateway::objects::selector;
use crate::gateway::state::State;
use crate::plumbing::writes::Child;

fn api<K: Child>(state: &State, namespace: &str) -> Api<K> {
    Api::namespaced(state.deps.client.clone(), namespace)
}

/// Objects of `store` in `namespace` whose labels match `selector`, in name order, but for those this
/// replica deleted (`deletes`).
pub fn cached_items<K>(
    store: &Store<K>,
    deletes: &RecentDeletes,
    namespace: &str,
    selector: &selector::LabelSelector,
) -> Vec<std::sync::Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let now = Instant::now();
    let mut items = store.state_filter(|o| {
        o.meta().namespace.as_deref() == Some(namespace)
            && selector.matches(o.labels())
            && !deletes.hides(o, now)
    });
    items.sort_by(|a, b| a.meta().name.cmp(&b.meta().name));
    items
}

/// Creates `object` in `namespace` with the gateway's field manager and answers 201 with it.
pub async fn create<K: Child>(
    state: &State,
    namespace: &str,
    object: &K,
    user: &str,
) -> Result<Response, ApiError> {
    let params = PostParams {
        field_manager: Some(GATEWAY_FIELD_MANAGER.to_string()),
        ..PostParams::default()
    };
    let plural = K::plural(&());
    let created = api::<K>(state, namespace)
        .create(&params, object)
        .await
        .map_err(|err| from_kube(&err, &format!("creating a {} in {namespace}", K::kind(&()))))?;
    state.deps.metrics.api_write(&plural, "create");
    tracing::info!(object = %format!("{namespace}/{}", created.name_any()), kind = %K::kind(&()), %user, "created through the gateway");
    Ok(json_response(StatusCode::CREATED, &created))
}

/// The `<Kind>List` of `namespace` filtered by the label selector `text`: from `cache` once
/// `cache_filled`, else (the operator is starting) read once from the API server.
pub async fn list<K: Child>(
    state: &State,
    cache: &Store<K>,
    cache_filled: bool,
    namespace: &str,
    text: &str,
) -> Result<Response, ApiError> {
    let selector = selector::parse(text).map_err(ApiError::bad_request)?;
    let items: Vec<Value> = if cache_filled {
        cached_items(cache, &state.recent_deletes, namespace, &selector)
            .iter()
            .filter_map(|o| serde_json::to_value(o.as_ref()).ok())
            .collect()
    } else {
        api::<K>(state, namespace)
            .list(&ListParams::default().labels(text))
            .await
            .map_err(|err| from_kube(&err, &format!("listing {} in {namespace}", K::plural(&()))))?
            .items
            .iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect()
    };
    let kind = format!("{}List", K::kind(&()));
    Ok(json_response(
        StatusCode::OK,
        &json!({"apiVersion": K::api_version(&()), "kind": kind, "items": items}),
    ))
}

/// Deletes `namespace/name` (its children are garbage-collected) and answers `{deleted: true}` as soon
/// as the API server did. This replica's answers stop showing the deleted incarnation at once, even
/// while its watch cache (`cache`) still shows it ([`RecentDeletes`]): a client that deletes and then
/// lists, reads or waits through the gateway does not see the object it deleted as live.
pub async fn delete<K: Child>(
    state: &State,
    cache: &Store<K>,
    namespace: &str,
    name: &str,
    user: &str,
) -> Result<Response, ApiError> {
    let key = ObjectRef::<K>::new(name).within(namespace);
    // The incarnation the cache shows now: the one deleted, should the answer not name it.
    let cached_uid = cache.get(&key).and_then(|cached| cached.uid());
    let answer = api::<K>(state, namespace)
        .delete(name, &DeleteParams::background())
        .await
        .map_err(|err| from_kube(&err, &format!("{} {namespace}/{name}", K::kind(&()))))?;
    state.deps.metrics.api_write(&K::plural(&()), "delete");
    let uid = match &answer {
        either::Either::Left(object) => object.uid(),
        either::Either::Right(status) => status
            .details
            .as_ref()
            .map(|d| d.uid.clone())
            .filter(|uid| !uid.is_empty()),
    }
    .or(cached_uid);
    if let Some(uid) = uid {
        state
            .recent_deletes
            .record(&K::kind(&()), namespace, name, &uid, Instant::now());
    }
    tracing::info!(object = %format!("{namespace}/{name}"), kind = %K::kind(&()), %user, "deleted through the gateway");
    Ok(Json(json!({"namespace": namespace, "name": name, "deleted": true})).into_response())
}
