//! A pool's members (pure): how one is built (the Sandbox builders applied to a stand-in Sandbox named
//! after the member, owned by the pool, plus the pool's label and template hash), and what a pool
//! reconcile does with the members it sees: which to delete, how many to start, and the counts of
//! its status.

use crate::plumbing::cached_pod::CachedPod;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use super::template::template_hash;
use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::sealed_for;
use crate::pod::health::{pod_failure, pod_ready};
use crate::pod::spec::{PodShape, desired_pod};
use crate::pod::token::{KEY_ID_ANNOTATION, NONCE_ANNOTATION, PodCredentials};
use orchard_api::{POOL_LABEL, POOL_TEMPLATE_HASH_ANNOTATION, Sandbox, SandboxPool};

/// Length of the random suffix of a member's name (`<pool>-<suffix>`).
pub const SUFFIX_LEN: usize = 5;

/// Characters of a member suffix (those `generateName` uses: no vowels, no look-alikes).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A member name for `pool` from random `bytes` (pure).
pub fn member_name(pool: &str, bytes: [u8; SUFFIX_LEN]) -> String {
    let suffix: String = bytes
        .iter()
        .map(|b| char::from(SUFFIX_ALPHABET[usize::from(*b) % SUFFIX_ALPHABET.len()]))
        .collect();
    format!("{pool}-{suffix}")
}

/// The stand-in Sandbox a member is built from: the member's name, the pool's namespace, the
/// template as its spec.
fn stand_in(pool: &SandboxPool, member: &str) -> Sandbox {
    Sandbox {
        metadata: ObjectMeta {
            name: Some(member.to_string()),
            namespace: pool.metadata.namespace.clone(),
            ..ObjectMeta::default()
        },
        spec: pool.spec.template.clone(),
        status: None,
    }
}

/// The Pod of member `member` of `pool` (controlled by `owner`, the pool, and sealed for it under
/// `key`): a sandbox Pod of the template, labelled with the pool and annotated with the template's
/// hash. Its agent token (`credentials`, derived for the member's name) follows the Pod when a Sandbox
/// claims it; the claim seals it for the Sandbox.
pub fn member_pod(
    pool: &SandboxPool,
    member: &str,
    owner: &OwnerReference,
    shape: &PodShape,
    credentials: &PodCredentials,
    key: &OperatorKey,
) -> Pod {
    let mut pod = desired_pod(&stand_in(pool, member), owner, shape, credentials, key);
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    pod.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POOL_LABEL.to_string(), pool_name);
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(
            POOL_TEMPLATE_HASH_ANNOTATION.to_string(),
            template_hash(&pool.spec.template),
        );
    pod
}

/// What the pool reconcile sees of one member Pod.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberView {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Pod resourceVersion (deletes are conditional on it: a member claimed meanwhile is never deleted).
    pub resource_version: String,
    /// Creation time.
    pub created: Option<Timestamp>,
    /// Ready (the agent answers).
    pub ready: bool,
    /// Can no longer serve (and why).
    pub failed: Option<String>,
    /// Being deleted.
    pub terminating: bool,
    /// Being deleted because its node was lost: only a removal with grace period 0 ends it
    /// (`pod::disruption::stuck_on_lost_node`).
    pub lost: bool,
    /// Built from the current template.
    pub current: bool,
}

/// Reads `pod` as a member of the pool with UID `pool_uid` and template hash `hash`; `None` if it is
/// not the pool's (not sealed for the pool under `key`: a claimed member is the Sandbox's, and a Pod
/// somebody made with a controller reference to the pool is nobody's member).
pub fn view(pod: &CachedPod, pool_uid: &str, hash: &str, key: &OperatorKey) -> Option<MemberView> {
    sealed_for(pod, pool_uid, key).then(|| unsealed_view(pod, hash, key))
}

/// [`view`] without the seal check (pure), for callers that look at many Pods and use few: they must
/// verify the seal of each one they use (`sandbox::claim::candidates` does).
pub fn unsealed_view(pod: &CachedPod, hash: &str, key: &OperatorKey) -> MemberView {
    let key_id = key.id();
    let annotations = pod.metadata.annotations.as_ref();
    let annotation = annotations.and_then(|a| a.get(POOL_TEMPLATE_HASH_ANNOTATION));
    let ready = pod_ready(pod)
        && pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .is_some_and(|ip| !ip.is_empty());
    MemberView {
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        ready,
        failed: pod_failure(pod).map(|f| format!("{}: {}", f.reason, f.message)),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        lost: crate::pod::disruption::stuck_on_lost_node(pod),
        // Built from the current template, with a token the operator's key derives (a member made
        // under another key, or before tokens were derived, is replaced like an outdated one).
        current: annotation.is_some_and(|h| h == hash)
            && annotations
                .and_then(|a| a.get(KEY_ID_ANNOTATION))
                .is_some_and(|k| k == key_id)
            && annotations.is_some_and(|a| a.contains_key(NONCE_ANNOTATION)),
    }
}

/// Why a member is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// It can no longer serve.
    Failed,
    /// Built from an earlier template.
    Outdated,
    /// More members than `replicas`.
    Surplus,
    /// Being deleted on a node that was lost, which will never confirm it: removed with grace
    /// period 0.
    LostNode,
}

/// What one pool reconcile does.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Members to delete, with why.
    pub delete: Vec<(MemberView, Removal)>,
    /// Members to start.
    pub create: usize,
    /// Unclaimed current members kept (status `replicas`).
    pub replicas: i32,
    /// Of those, Ready.
    pub ready: i32,
    /// The first failure seen, for the status.
    pub failure: Option<String>,
}

/// Plans a reconcile of a pool that wants `desired` members, given the members it controls (pure).
/// Failed and outdated members go; a surplus goes starting ones first, then the youngest Ready ones
/// (the oldest are claimed first); `may_start` false (members failed moments ago) starts none.
/// Members being deleted on a lost node are removed at once.
pub fn plan(desired: i32, members: &[MemberView], may_start: bool) -> Plan {
    let mut plan = Plan::default();
    let mut kept: Vec<&MemberView> = Vec::new();
    for member in members.iter().filter(|m| m.terminating && m.lost) {
        plan.delete.push((member.clone(), Removal::LostNode));
    }
    for member in members.iter().filter(|m| !m.terminating) {
        if let Some(why) = &member.failed {
            plan.failure
                .get_or_insert_with(|| format!("{}: {why}", member.name));
            plan.delete.push((member.clone(), Removal::Failed));
        } else if !member.current {
            plan.delete.push((member.clone(), Removal::Outdated));
        } else {
            kept.push(member);
        }
    }
    let desired = usize::try_from(desired.max(0)).unwrap_or(0);
    if kept.len() > desired {
        // Starting members first, then the youngest.
        kept.sort_by_key(|m| (m.ready, std::cmp::Reverse(m.created)));
        let surplus = kept.len() - desired;
        for member in kept.drain(..surplus) {
            plan.delete.push((member.clone(), Removal::Surplus));
        }
    }
    if may_start {
        plan.create = desired.saturating_sub(kept.len());
    }
    plan.replicas = i32::try_from(kept.len()).unwrap_or(i32::MAX);
    plan.ready = i32::try_from(kept.iter().filter(|m| m.ready).count()).unwrap_or(i32::MAX);
    plan
}

/// Fixtures the pool module's tests share.
#[cfg(test)]
pub mod fixtures {
    use crate::pod::spec::PodShape;
    use orchard_api::{SandboxPool, SandboxPoolSpec, SandboxSpec};

    /// Pool `py` of `replicas` python members in namespace `ns`, UID `pool-uid`.
    pub fn pool(replicas: i32) -> SandboxPool {
        let mut pool = SandboxPool::new(
            "py",
            SandboxPoolSpec {
                replicas,
                template: SandboxSpec {
                    image: "python:3.11".into(),
                    ..SandboxSpec::default()
                },
            },
        );
        pool.metadata.namespace = Some("ns".into());
        pool.metadata.uid = Some("pool-uid".into());
        pool
    }

    /// A pod shape.
    pub fn shape() -> PodShape {
        PodShape {
            agent_image: "agent:test".into(),
            agent_injection: crate::pod::spec::AgentInjection::InitContainer,
            agent_port: 9090,
            default_cpu: "1".into(),
            default_memory: "1Gi".into(),
            default_ephemeral_storage: None,
            termination_grace_seconds: 5,
            default_security_profile: orchard_api::SecurityProfile::Default,
            policy_canaries: crate::pod::policy_canary::PolicyCanaries::default(),
            egress_proxy_url: None,
            gpu: crate::pod::gpu::GpuShape::default(),
            node_lost_seconds: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{pool as test_pool, shape as test_shape};
    use super::*;
    use kube::Resource;

    fn member(name: &str, ready: bool, age: i64) -> MemberView {
        MemberView {
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: "1".into(),
            created: Some(Timestamp::from_second(1_000_000 - age).expect("time")),
            ready,
            failed: None,
            terminating: false,
            lost: false,
            current: true,
        }
    }

    #[test]
    fn member_names_are_the_pool_and_five_safe_characters() {
        let name = member_name("py", [0, 1, 26, 27, 255]);
        assert_eq!(name.len(), "py-".len() + SUFFIX_LEN);
        assert!(name.starts_with("py-"));
        assert!(name[3..].bytes().all(|b| SUFFIX_ALPHABET.contains(&b)));
    }

    #[test]
    fn a_short_pool_is_filled_and_terminating_members_do_not_count() {
        let mut gone = member("c", true, 5);
        gone.terminating = true;
        let p = plan(
            4,
            &[member("a", true, 10), member("b", false, 1), gone],
            true,
        );
        assert_eq!(p.create, 2);
        assert!(p.delete.is_empty());
        assert_eq!((p.replicas, p.ready), (2, 1));
    }

    #[test]
    fn a_member_being_deleted_on_a_lost_node_is_removed_at_once_and_replaced() {
        let mut lost = member("l", false, 5);
        (lost.terminating, lost.lost) = (true, true);
        let p = plan(2, &[member("a", true, 10), lost], true);
        let removed: Vec<_> = p
            .delete
            .iter()
            .map(|(m, why)| (m.name.as_str(), *why))
            .collect();
        assert_eq!(removed, [("l", Removal::LostNode)]);
        assert_eq!((p.create, p.replicas), (1, 1));
    }

    #[test]
    fn failed_and_outdated_members_are_replaced() {
        let mut failed = member("f", false, 3);
        failed.failed = Some("ImagePullBackOff: no such image".into());
        let mut old = member("o", true, 9);
        old.current = false;
        let p = plan(2, &[failed, old, member("a", true, 1)], true);
        let removed: Vec<_> = p
            .delete
            .iter()
            .map(|(m, why)| (m.name.as_str(), *why))
            .collect();
        assert_eq!(
            removed,
            vec![("f", Removal::Failed), ("o", Removal::Outdated)]
        );
        assert_eq!(p.create, 1);
        assert!(
            p.failure
                .as_deref()
                .is_some_and(|f| f.contains("ImagePullBackOff"))
        );
        assert_eq!(
            plan(2, &[], false).create,
            0,
            "no starts right after failures"
        );
    }

    #[test]
    fn a_surplus_loses_starting_members_first_then_the_youngest() {
        let members = [
            member("old", true, 100),
            member("young", true, 1),
            member("starting", false, 50),
            member("mid", true, 10),
        ];
        let p = plan(2, &members, true);
        let removed: Vec<_> = p.delete.iter().map(|(m, _)| m.name.as_str()).collect();
        assert_eq!(removed, vec!["starting", "young"]);
        assert_eq!((p.create, p.replicas, p.ready), (0, 2, 2));
        assert_eq!(plan(0, &members, true).delete.len(), 4);
    }

    #[test]
    fn members_are_template_pods_owned_by_the_pool_carrying_their_own_token() {
        let pool = test_pool(2);
        let owner = OwnerReference {
            api_version: "orchard.dev/v1alpha1".into(),
            kind: "SandboxPool".into(),
            name: "py".into(),
            uid: "pool-uid".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let shape = test_shape();
        let key = crate::plumbing::mock_api::test_token_key();
        let credentials = crate::pod::token::credentials(&key, "ns", "py-abcde", "00aa");
        let pod = member_pod(&pool, "py-abcde", &owner, &shape, &credentials, &key);
        assert_eq!(pod.metadata.name.as_deref(), Some("py-abcde"));
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[POOL_LABEL], "py");
        assert_eq!(labels[orchard_api::SANDBOX_LABEL], "py-abcde");
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[POOL_TEMPLATE_HASH_ANNOTATION],
            template_hash(&pool.spec.template)
        );
        assert!(sealed_for(&pod, "pool-uid", &key));
        let token =
            crate::pod::token::token_of(&key, &pod).expect("the member's token can be derived");
        assert_eq!(crate::pod::token::verifier(&token), credentials.verifier);
        let hash = template_hash(&pool.spec.template);
        let seen = view(&CachedPod::from(&pod), "pool-uid", &hash, &key).expect("a member");
        assert!(seen.current && !seen.ready && seen.failed.is_none());
        assert!(view(&CachedPod::from(&pod), "other", "h", &key).is_none());
        // A sealed member whose token another key derives is outdated: the pool replaces it.
        let mut old_token = pod.clone();
        old_token
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(KEY_ID_ANNOTATION.into(), "another-key".into());
        let outdated =
            view(&CachedPod::from(&old_token), "pool-uid", &hash, &key).expect("a member");
        assert!(!outdated.current);
    }

    #[test]
    fn a_pod_planted_with_the_pools_controller_reference_is_no_member() {
        let pool = test_pool(2);
        let owner = pool.controller_owner_ref(&()).expect("owner");
        let key = crate::plumbing::mock_api::test_token_key();
        let credentials = crate::pod::token::credentials(&key, "ns", "py-fake1", "00aa");
        let hash = template_hash(&pool.spec.template);
        let genuine = member_pod(&pool, "py-fake1", &owner, &test_shape(), &credentials, &key);
        // Everything a member carries (labels, template hash, token annotations, controller
        // reference) is writable by whoever creates a Pod; the seal is not.
        let mut unsealed = genuine.clone();
        unsealed
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .remove(orchard_api::SEAL_ANNOTATION);
        assert!(view(&CachedPod::from(&unsealed), "pool-uid", &hash, &key).is_none());
        // A real member's seal copied onto another name does not verify either.
        let mut copied = genuine.clone();
        copied.metadata.name = Some("py-fake2".into());
        assert!(view(&CachedPod::from(&copied), "pool-uid", &hash, &key).is_none());
        // Sealed under another operator's key.
        let theirs = crate::plumbing::operator_key::OperatorKey::new(&[3; 32]).expect("key");
        let foreign = member_pod(
            &pool,
            "py-fake1",
            &owner,
            &test_shape(),
            &credentials,
            &theirs,
        );
        assert!(view(&CachedPod::from(&foreign), "pool-uid", &hash, &key).is_none());
    }
}
