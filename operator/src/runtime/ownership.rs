//! Whose is an existing object that carries the name of one we want (pure). The operator uses or
//! deletes an object only when its controller owner reference carries our UID: names are reused
//! (trainers name groups after prompts), and anyone who may create a Sandbox may also create a Pod or
//! Secret under a name we would pick.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// How an existing object relates to the owner that wants its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Controlled by the owner (same UID): ours to use.
    Ours,
    /// Controlled by an earlier object of the owner's kind and name, now deleted: the garbage
    /// collector removes it. Wait for that; never use it.
    PreviousIncarnation,
    /// Anything else (another owner, or none): not ours; never touched.
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

/// Classifies `existing` for `owner` (pure). Only one object of a kind can hold a name at a time, so
/// a controller reference to the owner's kind and name with another UID names a deleted incarnation.
pub fn claim(existing: &ObjectMeta, owner: Owner<'_>) -> Claim {
    let controller = existing
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.controller == Some(true));
    match controller {
        Some(r) if r.uid == owner.uid => Claim::Ours,
        Some(r) if r.kind == owner.kind && r.name == owner.name => Claim::PreviousIncarnation,
        Some(r) => Claim::Foreign(format!("controlled by {} {}", r.kind, r.name)),
        None => Claim::Foreign("not created by the operator".into()),
    }
}

/// Whether `existing`'s controller owner reference carries `uid`.
pub fn controlled_by(existing: &ObjectMeta, uid: &str) -> bool {
    existing
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

/// The UID in `existing`'s controller owner reference, if any.
pub fn controller_uid(existing: &ObjectMeta) -> Option<&str> {
    existing
        .owner_references
        .as_deref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owned_by(kind: &str, name: &str, uid: &str, controller: bool) -> ObjectMeta {
        ObjectMeta {
            name: Some("x".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "orchard.dev/v1alpha1".into(),
                kind: kind.into(),
                name: name.into(),
                uid: uid.into(),
                controller: Some(controller),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        }
    }

    const OWNER: Owner<'static> = Owner {
        kind: "Sandbox",
        name: "again",
        uid: "uid-2",
    };

    #[test]
    fn our_uid_is_ours() {
        assert_eq!(
            claim(&owned_by("Sandbox", "again", "uid-2", true), OWNER),
            Claim::Ours
        );
        assert!(controlled_by(
            &owned_by("Sandbox", "again", "uid-2", true),
            "uid-2"
        ));
    }

    #[test]
    fn the_same_kind_and_name_with_another_uid_is_a_previous_incarnation() {
        assert_eq!(
            claim(&owned_by("Sandbox", "again", "uid-1", true), OWNER),
            Claim::PreviousIncarnation
        );
    }

    #[test]
    fn other_owners_and_unowned_objects_are_foreign() {
        assert!(matches!(
            claim(&owned_by("Sandbox", "other", "uid-9", true), OWNER),
            Claim::Foreign(_)
        ));
        assert!(matches!(
            claim(&owned_by("RolloutGroup", "again", "uid-9", true), OWNER),
            Claim::Foreign(_)
        ));
        assert!(matches!(
            claim(&ObjectMeta::default(), OWNER),
            Claim::Foreign(_)
        ));
        assert!(
            matches!(
                claim(&owned_by("Sandbox", "again", "uid-2", false), OWNER),
                Claim::Foreign(_)
            ),
            "only a controller reference counts"
        );
        assert_eq!(controller_uid(&ObjectMeta::default()), None);
    }
}
