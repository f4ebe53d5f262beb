//! The writes both controllers send, each in one place: create a child unless its name is taken
//! (an existing object is classified by its seal and owner UID, never modified), delete an object only if it is
//! still the one we mean (UID precondition; gone is done), and write a status as the smallest merge
//! JSON Patch guarded by the object's UID, remembered until the watch delivers it. Every write is counted in
//! `orchard_api_writes_total`.

use std::any::Any;
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{
    Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::plumbing::error::{Error, Result};
use crate::plumbing::kube_ctx::{FIELD_MANAGER, KubeCtx};
use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::own_writes::child_key;
use crate::plumbing::ownership::{Claim, Owner, claim};
use crate::plumbing::status_patch::status_patch;

/// What became of a child we want under a given name.
#[derive(Debug, Clone, PartialEq)]
pub enum ChildState<T> {
    /// Ours (created now, or found sealed for our UID).
    Ours(T),
    /// A previous incarnation's object holds the name until the garbage collector removes it; its
    /// deletion wakes the owner's reconcile.
    Waiting(String),
    /// Somebody else's object holds the name; nothing was touched.
    Conflict(String),
}

impl<T> ChildState<T> {
    /// The same state without the value.
    pub fn unit(&self) -> ChildState<()> {
        match self {
            Self::Ours(_) => ChildState::Ours(()),
            Self::Waiting(why) => ChildState::Waiting(why.clone()),
            Self::Conflict(why) => ChildState::Conflict(why.clone()),
        }
    }
}

/// The state of an existing object `K` named `name`, as seen from `owner` (pure; `key` verifies
/// seals).
pub fn existing_state<K: Resource<DynamicType = ()>>(
    existing: K,
    owner: Owner<'_>,
    key: &OperatorKey,
) -> ChildState<K> {
    let what = format!("{} {}", K::kind(&()), existing.name_any());
    match claim(&existing, owner, key) {
        Claim::Ours => ChildState::Ours(existing),
        Claim::PreviousIncarnation => ChildState::Waiting(format!(
            "{what} of a deleted {} with this name is still being removed",
            owner.kind
        )),
        Claim::Foreign(who) => ChildState::Conflict(format!(
            "{what} already exists and is {who}; delete it or choose another {} name",
            owner.kind
        )),
    }
}

/// Creates `desired` in `namespace`; if its name is taken, reads the existing object and classifies
/// it. Counts the create.
async fn create_child<K: Child>(
    ctx: &KubeCtx,
    namespace: &str,
    desired: &K,
    owner: Owner<'_>,
) -> Result<ChildState<K>> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    match api.create(&PostParams::default(), desired).await {
        Ok(created) => {
            ctx.metrics.api_write(&K::plural(&()), "create");
            Ok(ChildState::Ours(created))
        }
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            match api.get_opt(&desired.name_any()).await? {
                Some(existing) => Ok(existing_state(existing, owner, &ctx.key)),
                // Deleted between the two calls: the deletion event brings us back.
                None => Ok(ChildState::Waiting(format!(
                    "{} {} was being deleted",
                    K::kind(&()),
                    desired.name_any()
                ))),
            }
        }
        Err(err) => Err(err.into()),
    }
}

/// Whether `cache` shows `namespace/name` as the object with `uid` (a write of ours the watch has
/// delivered, for [`OwnWrites::record`](crate::plumbing::own_writes::OwnWrites::record)).
fn cache_holds<K>(cache: &Store<K>, namespace: &str, name: &str, uid: Option<&str>) -> bool
where
    K: Resource<DynamicType = ()> + Clone,
{
    cache
        .get(&ObjectRef::new(name).within(namespace))
        .is_some_and(|cached| uid.is_some() && cached.meta().uid.as_deref() == uid)
}

/// Deletes `namespace/name` if it is still the object with `uid` (a precondition: a newer object
/// under the same name is never touched). Gone, or replaced, counts as done.
pub async fn delete_if_same<K: Child>(
    ctx: &KubeCtx,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<()> {
    delete_with::<K>(ctx, namespace, name, uid, None, "delete").await
}

/// Removes `namespace/name` at once (grace period 0) if it is still the object with `uid`: only for a
/// Pod whose node will never confirm its deletion (`pod::disruption::stuck_on_lost_node`). Counted as
/// a `force_delete` write.
pub async fn force_delete_if_same<K: Child>(
    ctx: &KubeCtx,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<()> {
    delete_with::<K>(ctx, namespace, name, uid, Some(0), "force_delete").await
}

async fn delete_with<K: Child>(
    ctx: &KubeCtx,
    namespace: &str,
    name: &str,
    uid: &str,
    grace_period_seconds: Option<u32>,
    verb: &str,
) -> Result<()> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        grace_period_seconds,
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            ctx.metrics.api_write(&K::plural(&()), verb);
            Ok(())
        }
        // Not found: already gone. Conflict: the precondition failed, the name holds another object.
        Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// A namespaced object type, built in or ours.
pub trait Namespaced: Resource<DynamicType = (), Scope = NamespaceResourceScope> {}
impl<K: Resource<DynamicType = (), Scope = NamespaceResourceScope>> Namespaced for K {}

/// An object type the write layer, the watch caches and the gateway handle.
pub trait Child:
    Namespaced + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
}
impl<K: Namespaced + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static> Child
    for K
{
}

/// Creates `desired` for `owner` (see [`create_child`]) and, when it is ours, remembers the write in
/// the owner's scope (tagged `tag`; with the returned object when `keep_object`, for callers that need
/// it before the cache has it) until `cache` shows it.
pub async fn create_owned<K: Child, C: Resource<DynamicType = ()> + Clone>(
    ctx: &KubeCtx,
    cache: &Store<C>,
    desired: &K,
    owner: Owner<'_>,
    tag: &str,
    keep_object: bool,
) -> Result<ChildState<K>> {
    let namespace = desired.namespace().unwrap_or_default();
    let state = create_child(ctx, &namespace, desired, owner).await?;
    if let ChildState::Ours(created) = &state {
        let name = created.name_any();
        let key = child_key(&K::kind(&()), &name);
        let uid = created.meta().uid.as_deref();
        let shown = || cache_holds(cache, &namespace, &name, uid);
        if keep_object {
            ctx.own_writes
                .record_object(owner.uid, &key, tag, created.clone(), shown);
        } else {
            ctx.own_writes.record(owner.uid, &key, tag, shown);
        }
    }
    Ok(state)
}

/// Server-side applies `desired` (named `namespace/name`) with the operator's field manager unless
/// the cache shows an object for which `current` holds or `scope` remembers this very write (`tag`);
/// then remembers it until the cache shows it.
pub async fn apply_owned<K: Child>(
    ctx: &KubeCtx,
    cache: &Store<K>,
    scope: &str,
    desired: &K,
    tag: &str,
    current: impl Fn(&K) -> bool,
) -> Result<()> {
    let namespace = desired.namespace().unwrap_or_default();
    let name = desired.name_any();
    let key = child_key(&K::kind(&()), &name);
    let shown = || {
        cache
            .get(&ObjectRef::new(&name).within(&namespace))
            .is_some_and(|cached| current(&cached))
    };
    if shown() || ctx.own_writes.recorded(scope, &key, tag) {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(desired)).await?;
    ctx.metrics.api_write(&K::plural(&()), "apply");
    ctx.own_writes.record(scope, &key, tag, shown);
    Ok(())
}

/// Deletes the child `namespace/name` of `scope` if it is still the object with `uid` (see
/// [`delete_if_same`]), once: the delete is remembered until `cache` no longer shows that object
/// alive.
pub async fn ensure_deleted<K: Child, C: Resource<DynamicType = ()> + Clone>(
    ctx: &KubeCtx,
    cache: &Store<C>,
    scope: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<()> {
    let key = child_key(&K::kind(&()), name);
    if ctx.own_writes.recorded(scope, &key, "delete") {
        return Ok(());
    }
    delete_if_same::<K>(ctx, namespace, name, uid).await?;
    ctx.own_writes.record(scope, &key, "delete", || {
        cache
            .get(&ObjectRef::new(name).within(namespace))
            .is_none_or(|c| {
                c.meta().uid.as_deref() != Some(uid) || c.meta().deletion_timestamp.is_some()
            })
    });
    Ok(())
}

/// What a status write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWrite {
    /// The status was written.
    Written,
    /// Nothing changed; nothing was sent.
    Unchanged,
    /// The object is gone (deleted, or replaced by a new one under the name); nothing was written.
    Gone,
}

/// Writes `status` to `object` as the smallest JSON Patch from `previous` (what the object's status
/// is as far as we know; nothing is sent when equal), guarded by the object's UID, and remembers it
/// until the watch delivers the version the write returned. An object that now holds the name after a
/// delete and recreate is left untouched ([`StatusWrite::Gone`]).
pub async fn write_status<K, S>(
    ctx: &KubeCtx,
    cache: &Store<K>,
    object: &K,
    previous: Option<&S>,
    status: &S,
) -> Result<StatusWrite>
where
    K: Child,
    S: Serialize + Clone + Any + Send + Sync,
{
    let what = "status";
    let from = previous
        .map(serde_json::to_value)
        .transpose()
        .map_err(|source| Error::Serialize { what, source })?;
    let to = serde_json::to_value(status).map_err(|source| Error::Serialize { what, source })?;
    let uid = object.uid().unwrap_or_default();
    let Some(patch) = status_patch(&uid, from.as_ref(), &to) else {
        return Ok(StatusWrite::Unchanged);
    };
    let namespace = object.namespace().unwrap_or_default();
    let name = object.name_any();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let written = match api
        .patch_status(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(written) => written,
        Err(kube::Error::Api(status)) if status.code == 422 || status.is_not_found() => {
            // The UID test failed (another object holds the name now) or the object is gone: nothing
            // of this incarnation is left to write to. Any other rejection is an error.
            let replaced = api
                .get_opt(&name)
                .await?
                .is_none_or(|current| current.uid().as_deref() != Some(uid.as_str()));
            if replaced {
                return Ok(StatusWrite::Gone);
            }
            return Err(kube::Error::Api(status).into());
        }
        Err(err) => return Err(err.into()),
    };
    ctx.metrics
        .api_write(&format!("{}/status", K::plural(&())), "patch");
    let key = ObjectRef::from_obj(object);
    ctx.own_writes.remember_status(
        &uid,
        written.meta().resource_version.clone(),
        status.clone(),
        || {
            cache
                .get(&key)
                .filter(|cached| cached.uid().as_deref() == Some(uid.as_str()))
                .and_then(|cached| cached.meta().resource_version.clone())
        },
    );
    Ok(StatusWrite::Written)
}

/// The object to reconcile: the one the cache holds under the name now (the controller may hand us an
/// older incarnation it queued before a delete and recreate), with our own last status write put in with
/// `set_status` if the watch has not delivered it yet; `None` when the name holds nothing any more.
/// Memory first, cache second: a status dropped from memory has reached the cache by then.
pub fn freshest<K, S>(
    ctx: &KubeCtx,
    cache: &Store<K>,
    queued: &K,
    set_status: impl FnOnce(&mut K, S),
) -> Option<K>
where
    K: Resource<DynamicType = ()> + Clone,
    S: Any + Clone,
{
    let key = ObjectRef::from_obj(queued);
    let uid_now = cache.get(&key)?.uid().unwrap_or_default();
    let ahead = ctx.own_writes.status_ahead_of_cache::<S>(&uid_now);
    let mut object = (*cache.get(&key)?).clone();
    if let Some(status) = ahead.filter(|_| object.uid().as_deref() == Some(uid_now.as_str())) {
        set_status(&mut object, status);
    }
    Some(object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::mock_api::test_token_key;
    use crate::plumbing::ownership::seal;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn secret(owner_kind: &str, owner_name: &str, owner_uid: &str) -> Secret {
        let mut secret = Secret {
            metadata: ObjectMeta {
                name: Some("again-agent-token".into()),
                namespace: Some("ns".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "orchard.dev/v1alpha1".into(),
                    kind: owner_kind.into(),
                    name: owner_name.into(),
                    uid: owner_uid.into(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        seal(&mut secret, &test_token_key());
        secret
    }

    const OWNER: Owner<'static> = Owner {
        kind: "Sandbox",
        name: "again",
        uid: "uid-2",
    };

    #[test]
    fn existing_objects_are_ours_waited_for_or_conflicts() {
        let key = test_token_key();
        assert!(matches!(
            existing_state(secret("Sandbox", "again", "uid-2"), OWNER, &key),
            ChildState::Ours(_)
        ));
        let ChildState::Waiting(why) =
            existing_state(secret("Sandbox", "again", "uid-1"), OWNER, &key)
        else {
            panic!("a previous incarnation's Secret is waited for");
        };
        assert!(why.contains("Secret again-agent-token"), "{why}");
        let ChildState::Conflict(why) =
            existing_state(secret("Sandbox", "other", "uid-9"), OWNER, &key)
        else {
            panic!("somebody else's Secret is a conflict");
        };
        assert!(why.contains("controlled by Sandbox other"), "{why}");
        let mut unsealed = secret("Sandbox", "again", "uid-2");
        unsealed.metadata.annotations = None;
        let ChildState::Conflict(why) = existing_state(unsealed, OWNER, &key) else {
            panic!("a Secret with our UID but no seal is a conflict");
        };
        assert!(
            why.contains("already exists and is not the operator's")
                && why.contains("no valid seal"),
            "{why}"
        );
    }
}
