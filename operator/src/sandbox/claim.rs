//! A Sandbox claims a warm member of its pool. The claim is one JSON Patch on the member Pod whose
//! first operations `test` the Pod's UID and resourceVersion as the cache showed them Ready and
//! unclaimed; it then hands the Pod to the Sandbox (controller owner reference) and relabels it as the
//! Sandbox's (its own egress policy selects it from then on, the pool's scale selector no longer
//! does) and seals it for the Sandbox (`plumbing::ownership`): from then on it verifies as the
//! Sandbox's Pod and no longer as the pool's. The API server evaluates the tests against the stored object and applies all or nothing, so
//! of any number of concurrent claims, by any number of reconciles or replicas, before or after a
//! failover, exactly one gets the member; the others get 422 or 409 and try the next one. The Pod's
//! agent token is derived from the Pod's own annotations, so it follows without a second write.

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation, TestOperation};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kube::api::{Api, PatchParams};
use serde_json::Value;
use tracing::{debug, info};

use crate::plumbing::error::{Error, Result};
use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::own_writes::child_key;
use crate::plumbing::ownership::{seal, sealed_for};
use crate::pod::naming::{pod_labels, pod_name};
use crate::pool::book::PoolKey;
use crate::pool::members::unsealed_view;
use crate::pool::template::mismatches;
use crate::pool::template::{PoolDefaults, defaults_annotation, defaults_of, template_hash};
use crate::sandbox::blocked::Blocked;
use crate::sandbox::context::SandboxCtx;
use orchard_api::{
    CLAIMED_FROM_LABEL, POOL_DEFAULTS_ANNOTATION, POOL_LABEL, PoolFallback, Sandbox, SandboxPool,
};

/// How many members one reconcile tries before it gives up (each failed try means a concurrent claim
/// won that member).
const MAX_ATTEMPTS: usize = 8;

/// The claimable members of `pool` for a sandbox whose pod-shaping spec hashes to `hash`, oldest
/// first (pure): Ready, not being deleted, sealed for the pool under `key`, built from that template
/// with a token `key` derives. The seals are verified as the members are taken, so a claim that
/// tries the first one verifies one seal, not one per member of the pool.
pub fn candidates<'a>(
    pods: &[Arc<CachedPod>],
    pool: &'a SandboxPool,
    hash: &str,
    key: &'a OperatorKey,
    reserved: impl Fn(&str) -> bool,
) -> impl Iterator<Item = Arc<CachedPod>> + 'a {
    let namespace = pool.metadata.namespace.as_deref();
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let uid = pool.metadata.uid.as_deref().unwrap_or_default();
    let mut found: Vec<(Option<k8s_openapi::jiff::Timestamp>, Arc<CachedPod>)> = pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == namespace)
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POOL_LABEL))
                .is_some_and(|v| v == name)
        })
        .filter_map(|p| {
            let member = unsealed_view(p, hash, key);
            let usable = member.ready
                && member.current
                && member.failed.is_none()
                && !member.terminating
                && !reserved(&member.uid);
            usable.then(|| (member.created, Arc::clone(p)))
        })
        .collect();
    found.sort_by_key(|(created, _)| *created);
    found
        .into_iter()
        .map(|(_, pod)| pod)
        .filter(move |pod| sealed_for(pod.as_ref(), uid, key))
}

/// The claim patch (pure): `test` that `member` is still exactly the object the cache showed (UID and
/// resourceVersion: unclaimed, not being deleted), then make `owner` its controller, give it
/// `labels`, seal it for `owner` under `key` (replacing the pool's seal), and record the pool
/// template's `defaults` (network, lifecycle) the sandbox runs with.
pub fn claim_patch(
    member: &CachedPod,
    owner: &OwnerReference,
    labels: &std::collections::BTreeMap<String, String>,
    defaults: &PoolDefaults,
    key: &OperatorKey,
) -> Patch {
    // The member as it is once claimed, sealed like any Pod made for `owner`.
    let mut claimed = Pod {
        metadata: ObjectMeta {
            annotations: member.metadata.annotations.clone(),
            namespace: member.metadata.namespace.clone(),
            name: member.metadata.name.clone(),
            owner_references: Some(vec![owner.clone()]),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    };
    seal(&mut claimed, key);
    let mut annotations = claimed.metadata.annotations.unwrap_or_default();
    annotations.insert(
        POOL_DEFAULTS_ANNOTATION.to_string(),
        defaults_annotation(defaults),
    );
    let path = |tokens: &[&str]| PointerBuf::from_tokens(tokens.iter().copied());
    let text = |v: Option<&String>| Value::String(v.cloned().unwrap_or_default());
    Patch(vec![
        PatchOperation::Test(TestOperation {
            path: path(&["metadata", "uid"]),
            value: text(member.metadata.uid.as_ref()),
        }),
        PatchOperation::Test(TestOperation {
            path: path(&["metadata", "resourceVersion"]),
            value: text(member.metadata.resource_version.as_ref()),
        }),
        PatchOperation::Replace(ReplaceOperation {
            path: path(&["metadata", "ownerReferences"]),
            value: serde_json::to_value(vec![owner]).unwrap_or(Value::Null),
        }),
        PatchOperation::Replace(ReplaceOperation {
            path: path(&["metadata", "labels"]),
            value: serde_json::to_value(labels).unwrap_or(Value::Null),
        }),
        // `add` sets the member whether or not the Pod has annotations yet (the seal among them).
        PatchOperation::Add(AddOperation {
            path: path(&["metadata", "annotations"]),
            value: serde_json::to_value(annotations).unwrap_or(Value::Null),
        }),
    ])
}

/// The labels of a member once `sandbox` claimed it from `pool` (pure): the sandbox's pod labels
/// (see [`pod_labels`]; `key` verifies a trajectory's seal), plus where it came from.
pub fn claimed_labels(
    sandbox: &Sandbox,
    pool: &str,
    key: &OperatorKey,
) -> std::collections::BTreeMap<String, String> {
    let mut labels = pod_labels(sandbox, key);
    labels.insert(CLAIMED_FROM_LABEL.to_string(), pool.to_string());
    labels
}

/// Claims a Ready member of `pool` for `sandbox` (its effective spec: the pool's template filled in),
/// controlled by `owner`. `None`: no member fits or every try lost to a concurrent claim.
pub async fn claim_member(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    owner: &OwnerReference,
    pool: &SandboxPool,
) -> Result<Option<Pod>> {
    let pool_name = pool.name_any();
    let namespace = sandbox.namespace().unwrap_or_default();
    let hash = template_hash(&sandbox.spec);
    let pods: Vec<Arc<CachedPod>> = ctx.kube.caches.pods.state();
    let found = candidates(&pods, pool, &hash, &ctx.kube.key, |uid| {
        ctx.pools.is_reserved(uid)
    });
    let api: Api<Pod> = Api::namespaced(ctx.kube.client.clone(), &namespace);
    let labels = claimed_labels(sandbox, &pool_name, &ctx.kube.key);
    let defaults = defaults_of(&pool.spec.template);
    let key = PoolKey {
        namespace: namespace.clone(),
        name: pool_name.clone(),
    };
    for member in found.take(MAX_ATTEMPTS) {
        let member_uid = member.uid().unwrap_or_default();
        if !ctx.pools.reserve(&member_uid) {
            continue;
        }
        let patch = claim_patch(&member, owner, &labels, &defaults, &ctx.kube.key);
        let answer = api
            .patch(
                &member.name_any(),
                &PatchParams::default(),
                &kube::api::Patch::Json::<()>(patch),
            )
            .await;
        ctx.kube.metrics.api_write("pods", "patch");
        match answer {
            Ok(claimed) => {
                ctx.pools.claimed(&key);
                ctx.kube
                    .metrics
                    .pool_claims
                    .with_label_values(&["warm"])
                    .inc();
                // Until the watch shows the Pod as the sandbox's, the reconcile finds it here.
                let sandbox_uid = sandbox.uid().unwrap_or_default();
                ctx.kube.own_writes.record_object(
                    &sandbox_uid,
                    &child_key("Pod", &pod_name(&sandbox.name_any())),
                    "claim",
                    claimed.clone(),
                    || false,
                );
                info!(sandbox = %sandbox.name_any(), member = %claimed.name_any(), pool = %pool_name, "pool member claimed");
                return Ok(Some(claimed));
            }
            // The member changed since the cache showed it (claimed by another reconcile or replica,
            // deleted, relabelled): the next one.
            Err(kube::Error::Api(status))
                if status.code == 422 || status.code == 409 || status.is_not_found() =>
            {
                debug!(member = %member.name_any(), code = status.code, "pool member taken meanwhile");
            }
            Err(err) => {
                ctx.pools.release(&member_uid);
                return Err(err.into());
            }
        }
    }
    Ok(None)
}

/// What a sandbox of a pool does instead of creating its own Pod.
#[derive(Debug)]
pub enum PoolStep {
    /// It claimed this member.
    Claimed(Box<Pod>),
    /// It waits (its `whenPoolEmpty` is `Wait`, or it has no image of its own and no pool).
    Wait(Blocked),
    /// It starts its own Pod.
    Cold,
}

/// Claims a member of `pool` (the cache's, `None` if it does not exist) for `sandbox` (resolved: the
/// template filled in), or says why it waits or starts cold.
pub async fn claim_or_fallback(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    owner: &OwnerReference,
    pool: Option<&SandboxPool>,
    pool_name: &str,
) -> Result<PoolStep> {
    let key = PoolKey {
        namespace: sandbox.namespace().unwrap_or_default(),
        name: pool_name.to_string(),
    };
    let name = sandbox.name_any();
    let wait = sandbox.spec.when_pool_empty == Some(PoolFallback::Wait);
    let waiting = |reason: &'static str, message: String, stalled: bool| {
        ctx.pools.wait_for(&key, &name);
        Ok(PoolStep::Wait(Blocked::Pool {
            reason,
            message,
            stalled,
        }))
    };
    let Some(pool) = pool else {
        if wait || sandbox.spec.image.is_empty() {
            return waiting(
                "PoolNotFound",
                format!(
                    "SandboxPool {pool_name} does not exist in namespace {}; the sandbox waits for it (it has no image of its own, or whenPoolEmpty is Wait)",
                    key.namespace
                ),
                true,
            );
        }
        return Ok(cold(ctx, &key, &name));
    };
    let differs = mismatches(&sandbox.spec, &pool.spec.template);
    if !differs.is_empty() {
        if wait {
            return waiting(
                "PoolTemplateMismatch",
                format!(
                    "the sandbox's {} differ from SandboxPool {pool_name}'s template, so no member can be its Pod; leave them unset or equal to the template's (or use whenPoolEmpty ColdStart)",
                    differs.join(", ")
                ),
                true,
            );
        }
        return Ok(cold(ctx, &key, &name));
    }
    if wait {
        // Before looking: a member that becomes Ready from now on wakes this sandbox.
        ctx.pools.wait_for(&key, &name);
    }
    if let Some(member) = claim_member(ctx, sandbox, owner, pool).await? {
        ctx.pools.stop_waiting(&key, &name);
        return Ok(PoolStep::Claimed(Box::new(member)));
    }
    if wait {
        return waiting(
            "WaitingForPoolMember",
            format!(
                "SandboxPool {pool_name} has no Ready member to claim; the sandbox waits for one (whenPoolEmpty: Wait)"
            ),
            false,
        );
    }
    Ok(cold(ctx, &key, &name))
}

fn cold(ctx: &SandboxCtx, key: &PoolKey, sandbox: &str) -> PoolStep {
    ctx.pools.stop_waiting(key, sandbox);
    ctx.kube
        .metrics
        .pool_claims
        .with_label_values(&["cold"])
        .inc();
    PoolStep::Cold
}

/// Whether `pod` is a pool member `sandbox` claimed (it carries the member's name, not the
/// sandbox's).
pub fn is_claimed_member(sandbox: &Sandbox, pod: &CachedPod) -> bool {
    pod.metadata.name.as_deref() != Some(pod_name(&sandbox.name_any()).as_str())
        && pod
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(CLAIMED_FROM_LABEL))
}

/// Tells the agent of the member `sandbox` claimed which Sandbox it serves now, so commands see the
/// sandbox's name in `ORCHARD_SANDBOX` (the Pod was started under the member's). Done before the
/// sandbox is first written Ready; an error leaves it un-Ready and the reconcile retries.
pub async fn announce_identity(ctx: &SandboxCtx, sandbox: &Sandbox, pod: &CachedPod) -> Result<()> {
    let Some(target) = crate::sandbox::runner::agent_target_of(ctx, sandbox, pod) else {
        return Err(Error::Agent {
            sandbox: sandbox.name_any(),
            message: format!(
                "the claimed pool member {} has no Ready endpoint or token yet",
                pod.name_any()
            ),
        });
    };
    ctx.agent
        .set_identity(&target, &sandbox.name_any())
        .await
        .map_err(|e| Error::Agent {
            sandbox: sandbox.name_any(),
            message: format!("telling pool member {} its sandbox: {e}", pod.name_any()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::mock_api::test_token_key;
    use crate::pod::lookup::claimed_in_cache;
    use crate::pool::members::{fixtures, member_pod, view};
    use kube::Resource;
    use orchard_api::SandboxSpec;

    fn pool() -> SandboxPool {
        fixtures::pool(3)
    }

    fn member(name: &str, ready: bool, second: i64) -> Arc<CachedPod> {
        let pool = pool();
        let owner = pool.controller_owner_ref(&()).expect("owner");
        let shape = fixtures::shape();
        let credentials = crate::pod::token::credentials(&test_token_key(), "team", name, "00");
        let mut pod = member_pod(&pool, name, &owner, &shape, &credentials, &test_token_key());
        pod.metadata.uid = Some(format!("uid-{name}"));
        pod.metadata.resource_version = Some("7".into());
        pod.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(second).expect("time"),
            ));
        pod.status = Some(
            serde_json::from_value(serde_json::json!({
                "podIP": "10.0.0.9",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            }))
            .expect("status"),
        );
        Arc::new(CachedPod::from(&pod))
    }

    #[test]
    fn ready_current_unreserved_members_are_candidates_oldest_first() {
        let pool = pool();
        let hash = template_hash(&pool.spec.template);
        let pods = vec![
            member("py-new", true, 300),
            member("py-old", true, 100),
            member("py-starting", false, 50),
            member("py-held", true, 10),
        ];
        let names: Vec<String> = candidates(&pods, &pool, &hash, &test_token_key(), |uid| {
            uid == "uid-py-held"
        })
        .map(|p| p.name_any())
        .collect();
        assert_eq!(names, vec!["py-old", "py-new"]);
        assert!(
            candidates(&pods, &pool, "other-template", &test_token_key(), |_| {
                false
            })
            .next()
            .is_none()
        );
    }

    #[test]
    fn the_claim_tests_the_member_then_hands_it_over() {
        let pod = member("py-aaaaa", true, 1);
        let mut sandbox = Sandbox::new("task", SandboxSpec::default());
        sandbox.metadata.namespace = Some("ns".into());
        sandbox.metadata.uid = Some("sbx-uid".into());
        let owner = sandbox.controller_owner_ref(&()).expect("owner");
        let key = test_token_key();
        let labels = claimed_labels(&sandbox, "py", &key);
        assert_eq!(labels[orchard_api::SANDBOX_LABEL], "task");
        assert_eq!(labels[CLAIMED_FROM_LABEL], "py");
        assert!(
            !labels.contains_key(POOL_LABEL),
            "out of the pool's selector"
        );
        let defaults = PoolDefaults::default();
        let claim = claim_patch(&pod, &owner, &labels, &defaults, &key);
        let patch = serde_json::to_value(&claim).expect("json");
        assert_eq!(
            patch[0],
            serde_json::json!({"op": "test", "path": "/metadata/uid", "value": "uid-py-aaaaa"})
        );
        assert_eq!(
            patch[1],
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        assert_eq!(patch[2]["op"], "replace");
        assert_eq!(patch[2]["value"][0]["uid"], "sbx-uid");
        assert_eq!(patch[2]["value"][0]["controller"], true);
        assert_eq!(patch[3]["value"][orchard_api::SANDBOX_LABEL], "task");
        assert_eq!(patch[4]["path"], "/metadata/annotations");
        assert_eq!(patch[4]["value"][POOL_DEFAULTS_ANNOTATION], "{}");
        assert!(
            patch[4]["value"][orchard_api::POOL_TEMPLATE_HASH_ANNOTATION].is_string(),
            "the member's other annotations stay"
        );
        assert_eq!(
            patch[4]["value"][orchard_api::SEAL_ANNOTATION],
            key.seal("Pod", "ns", "py-aaaaa", "sbx-uid"),
            "the member is sealed for the sandbox"
        );
        // Applied as the API server applies it: the Pod is the sandbox's now, and no longer the
        // pool's.
        let mut stored = serde_json::to_value(pod.as_ref()).expect("json");
        json_patch::patch(&mut stored, &claim).expect("the patch applies");
        let claimed: Pod = serde_json::from_value(stored).expect("a pod");
        assert!(sealed_for(&claimed, "sbx-uid", &key));
        assert!(!sealed_for(&claimed, "pool-uid", &key));
        let hash = template_hash(&pool().spec.template);
        assert!(view(&CachedPod::from(&claimed), "pool-uid", &hash, &key).is_none());
    }

    #[test]
    fn a_pod_planted_as_a_member_is_never_claimed() {
        let pool = pool();
        let hash = template_hash(&pool.spec.template);
        // A Ready Pod with everything a member carries, but no seal (or a real member's seal copied
        // onto it): somebody's own Pod, e.g. running a fake agent.
        let genuine = member("py-real1", true, 5);
        let mut unsealed = (*member("py-fake1", true, 1)).clone();
        unsealed
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .remove(orchard_api::SEAL_ANNOTATION);
        let mut copied = (*member("py-fake2", true, 2)).clone();
        copied
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(
                orchard_api::SEAL_ANNOTATION.into(),
                genuine.metadata.annotations.as_ref().expect("annotations")
                    [orchard_api::SEAL_ANNOTATION]
                    .clone(),
            );
        let pods = vec![Arc::new(unsealed), Arc::new(copied), genuine];
        let names: Vec<String> = candidates(&pods, &pool, &hash, &test_token_key(), |_| false)
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, vec!["py-real1"]);
    }

    #[test]
    fn the_claimed_member_is_found_by_its_seal_not_its_controller_reference() {
        let key = test_token_key();
        let mut sandbox = Sandbox::new("task", SandboxSpec::default());
        sandbox.metadata.namespace = Some("ns".into());
        sandbox.metadata.uid = Some("sbx-uid".into());
        sandbox.spec.pool = Some("py".into());
        let owner = sandbox.controller_owner_ref(&()).expect("owner");
        let mut planted = (*member("py-fake1", true, 1)).clone();
        planted.metadata.owner_references = Some(vec![owner.clone()]);
        planted.metadata.labels = Some(claimed_labels(&sandbox, "py", &key));
        let (store, mut writer) = kube::runtime::reflector::store::<CachedPod>();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(planted.clone()));
        assert!(claimed_in_cache(&store, &sandbox, &key).is_none());
        seal(&mut planted, &key);
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(planted));
        assert!(claimed_in_cache(&store, &sandbox, &key).is_some());
    }
}
