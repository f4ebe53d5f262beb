//! Whose is an existing object (pure): the operator's one ownership test. An object counts as the
//! operator's child of an owner only when its controller owner reference carries the owner's UID
//! *and* it carries the operator's seal for that UID (annotation `orchard.dev/seal`, see
//! [`OperatorKey::seal`]). Anyone who may create an object may write any owner reference into it,
//! `controller: true` included, and UIDs are readable by anyone with `get`; only the operator holds
//! the key the seal is computed with. Names are reused too (trainers name groups after prompts), and
//! anyone who may create a Sandbox may also create a Pod under a name we would pick: an object that
//! is not sealed for the owner is never used, changed or deleted.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use crate::plumbing::operator_key::OperatorKey;
use orchard_api::SEAL_ANNOTATION;

/// How an existing object relates to the owner that wants its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Sealed for the owner (same UID): ours to use.
    Ours,
    /// Controlled by an earlier object of the owner's kind and name, now deleted: the garbage
    /// collector removes it. Wait for that; never use it.
    PreviousIncarnation,
    /// Anything else (another owner, none, or our owner's UID without a valid seal): not ours; never
    /// touched.
    Foreign(String),
}

/// The owner that wants a name: kind, name and UID.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    /// Kind, e.g. `Sandbox`.
    pub kind: &'a str,
    /// Name.
    pub name: &'a str,
    /// UID.
    pub uid: &'a str,
}

/// The controller owner reference of `meta`, if any.
fn controller_reference(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .as_deref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// Puts the operator's seal on `object` (pure): for its kind, namespace and name and the UID of the
/// controller reference it carries. Builders call it last, once those are set.
pub fn seal<K: Resource<DynamicType = ()>>(object: &mut K, key: &OperatorKey) {
    let kind = K::kind(&());
    let meta = object.meta_mut();
    let uid = controller_reference(meta).map_or("", |r| r.uid.as_str());
    let value = key.seal(
        &kind,
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        uid,
    );
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(SEAL_ANNOTATION.to_string(), value);
}

/// The UID of the owner `object` was sealed for: its controller reference's UID, when the object
/// carries the operator's seal for that UID and its own kind, namespace and name. `None`: not the
/// operator's child of anything, whatever its owner references say.
pub fn sealed<'a, K: Resource<DynamicType = ()>>(
    object: &'a K,
    key: &OperatorKey,
) -> Option<&'a str> {
    let meta = object.meta();
    let controller = controller_reference(meta)?;
    let seal = meta.annotations.as_ref()?.get(SEAL_ANNOTATION)?;
    key.verify_seal(
        &K::kind(&()),
        meta.namespace.as_deref()?,
        meta.name.as_deref()?,
        &controller.uid,
        seal,
    )
    .then_some(controller.uid.as_str())
}

/// Whether `object` is the operator's child of the owner with UID `owner_uid` (see [`sealed`]). The
/// UID is compared first: callers test every object of a namespace, and most name another owner.
pub fn sealed_for<K: Resource<DynamicType = ()>>(
    object: &K,
    owner_uid: &str,
    key: &OperatorKey,
) -> bool {
    !owner_uid.is_empty()
        && controller_reference(object.meta()).is_some_and(|r| r.uid == owner_uid)
        && sealed(object, key) == Some(owner_uid)
}

/// Classifies `existing` for `owner` (pure). Only one object of a kind can hold a name at a time, so
/// a controller reference to the owner's kind and name with another UID names a deleted incarnation
/// (its garbage collection is awaited; no seal is needed for that, since waiting harms no one).
pub fn claim<K: Resource<DynamicType = ()>>(
    existing: &K,
    owner: Owner<'_>,
    key: &OperatorKey,
) -> Claim {
    let Some(controller) = controller_reference(existing.meta()) else {
        return Claim::Foreign("not created by the operator".into());
    };
    if controller.uid == owner.uid {
        return if sealed_for(existing, owner.uid, key) {
            Claim::Ours
        } else {
            Claim::Foreign(format!(
                "not the operator's: it names {} {} as its controller but carries no valid seal of this operator (annotation {SEAL_ANNOTATION})",
                controller.kind, controller.name
            ))
        };
    }
    if controller.kind == owner.kind && controller.name == owner.name {
        return Claim::PreviousIncarnation;
    }
    Claim::Foreign(format!(
        "controlled by {} {}",
        controller.kind, controller.name
    ))
}

/// The UID in `existing`'s controller owner reference, if any. Not proof of anything: it only says
/// which owner's short memory of its own writes an object's watch event ends (`app::start`);
/// ownership is [`sealed`].
pub fn controller_uid(existing: &ObjectMeta) -> Option<&str> {
    controller_reference(existing).map(|r| r.uid.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::mock_api::test_token_key;
    use k8s_openapi::api::core::v1::Pod;

    fn owned_by(kind: &str, name: &str, uid: &str, controller: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("x".into()),
                namespace: Some("ns".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "orchard.dev/v1alpha1".into(),
                    kind: kind.into(),
                    name: name.into(),
                    uid: uid.into(),
                    controller: Some(controller),
                    block_owner_deletion: Some(true),
                }]),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn sealed_pod(kind: &str, name: &str, uid: &str) -> Pod {
        let mut pod = owned_by(kind, name, uid, true);
        seal(&mut pod, &test_token_key());
        pod
    }

    const OWNER: Owner<'static> = Owner {
        kind: "Sandbox",
        name: "again",
        uid: "uid-2",
    };

    #[test]
    fn a_sealed_object_with_our_uid_is_ours() {
        let key = test_token_key();
        let pod = sealed_pod("Sandbox", "again", "uid-2");
        assert_eq!(claim(&pod, OWNER, &key), Claim::Ours);
        assert_eq!(sealed(&pod, &key), Some("uid-2"));
        assert!(sealed_for(&pod, "uid-2", &key));
        assert!(!sealed_for(&pod, "uid-3", &key));
    }

    #[test]
    fn our_uid_without_a_valid_seal_is_foreign() {
        let key = test_token_key();
        // A controller reference anyone could write, no seal.
        let forged = owned_by("Sandbox", "again", "uid-2", true);
        let Claim::Foreign(why) = claim(&forged, OWNER, &key) else {
            panic!("an unsealed object is never ours");
        };
        assert!(why.contains("carries no valid seal"), "{why}");
        assert_eq!(sealed(&forged, &key), None);
        assert!(!sealed_for(&forged, "uid-2", &key));

        // A seal copied from another object of ours: another name, another owner, another kind, another
        // namespace, or made under another key.
        let copied = |from: &Pod, to: &mut Pod| {
            let seal = from.metadata.annotations.as_ref().unwrap()[SEAL_ANNOTATION].clone();
            to.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(SEAL_ANNOTATION.into(), seal);
        };
        let mut other_name = sealed_pod("Sandbox", "again", "uid-2");
        other_name.metadata.name = Some("y".into());
        let mut other_namespace = sealed_pod("Sandbox", "again", "uid-2");
        other_namespace.metadata.namespace = Some("elsewhere".into());
        let mut other_owner = forged.clone();
        copied(&sealed_pod("Sandbox", "again", "uid-9"), &mut other_owner);
        let mut other_key = owned_by("Sandbox", "again", "uid-2", true);
        seal(
            &mut other_key,
            &OperatorKey::new(&[9; 32]).expect("a 32-byte key"),
        );
        let mut as_policy = k8s_openapi::api::networking::v1::NetworkPolicy {
            metadata: forged.metadata.clone(),
            ..Default::default()
        };
        seal(&mut as_policy, &key);
        let mut other_kind = forged.clone();
        other_kind.metadata.annotations = as_policy.metadata.annotations.clone();
        for pod in [
            other_name,
            other_namespace,
            other_owner,
            other_key,
            other_kind,
        ] {
            assert!(
                matches!(claim(&pod, OWNER, &key), Claim::Foreign(_)),
                "{:?}",
                pod.metadata
            );
            assert_eq!(sealed(&pod, &key), None, "{:?}", pod.metadata);
        }
    }

    #[test]
    fn the_same_kind_and_name_with_another_uid_is_a_previous_incarnation() {
        let key = test_token_key();
        assert_eq!(
            claim(&owned_by("Sandbox", "again", "uid-1", true), OWNER, &key),
            Claim::PreviousIncarnation
        );
    }

    #[test]
    fn other_owners_and_unowned_objects_are_foreign() {
        let key = test_token_key();
        assert!(matches!(
            claim(&sealed_pod("Sandbox", "other", "uid-9"), OWNER, &key),
            Claim::Foreign(_)
        ));
        assert!(matches!(
            claim(&sealed_pod("RolloutGroup", "again", "uid-9"), OWNER, &key),
            Claim::Foreign(_)
        ));
        assert!(matches!(
            claim(&Pod::default(), OWNER, &key),
            Claim::Foreign(_)
        ));
        let mut not_controller = owned_by("Sandbox", "again", "uid-2", false);
        seal(&mut not_controller, &key);
        assert!(
            matches!(claim(&not_controller, OWNER, &key), Claim::Foreign(_)),
            "only a controller reference counts"
        );
        assert_eq!(sealed(&not_controller, &key), None);
        assert_eq!(controller_uid(&ObjectMeta::default()), None);
    }
}
