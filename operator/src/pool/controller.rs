//! The SandboxPool reconcile: keep `replicas` unclaimed members built from the current template
//! (start missing ones, delete failed, outdated and surplus ones), and write the pool's status. A
//! member is one Pod write: its agent token is derived from the Pod's own annotations, so it follows
//! the Pod into a claim. A delete is conditional on the member's UID and resourceVersion, so a member
//! claimed meanwhile is never deleted by its former pool.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{instrument, warn};

use super::book::PoolKey;
use super::members::{MemberView, Plan, Removal, member_name, member_pod, plan, view};
use super::template::template_hash;
use crate::plumbing::conditions::{self, Desired, Progress};
use crate::plumbing::error::{Error, Result};
use crate::plumbing::events::publish;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::own_writes::child_key;
use crate::plumbing::ownership::Owner;
use crate::plumbing::reconcile::Reconcile;
use crate::plumbing::writes::{self, create_owned};
use crate::pod::apply::ensure_baseline;
use crate::pod::placement;
use crate::pod::token::new_nonce;
use crate::pool::context::PoolCtx;
use orchard_api::{POOL_LABEL, SandboxPool, SandboxPoolStatus};

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "sandboxpool";

/// How long a pool waits after a member failed before it starts replacements (a bad image would
/// otherwise start and fail members in a tight loop).
const FAILURE_PAUSE: Duration = Duration::from_secs(5);

/// How long a `Stalled` condition stays after the last member failure.
const STALLED_FOR: Duration = Duration::from_secs(60);

/// Members created at once by one reconcile.
const CREATE_BATCH: usize = 16;

/// The pool as the owner of its members.
fn owner_of(pool: &SandboxPool) -> Owner<'_> {
    Owner {
        kind: "SandboxPool",
        name: pool.meta().name.as_deref().unwrap_or_default(),
        uid: pool.meta().uid.as_deref().unwrap_or_default(),
    }
}

/// The key of `pool` in the book.
pub fn key_of(pool: &SandboxPool) -> PoolKey {
    PoolKey {
        namespace: pool.namespace().unwrap_or_default(),
        name: pool.name_any(),
    }
}

fn reconciler(ctx: &PoolCtx) -> Reconcile<'_, SandboxPool> {
    Reconcile {
        kube: &ctx.kube,
        controller: CONTROLLER,
        store: &ctx.kube.caches.sandbox_pools,
        slots: None,
    }
}

/// Reconciles one SandboxPool: at least every resync (its members' failures age out of the book).
#[instrument(skip_all, fields(pool = %object_key(pool.as_ref())))]
pub async fn reconcile(pool: Arc<SandboxPool>, ctx: Arc<PoolCtx>) -> Result<Action> {
    let work = async {
        let next = reconcile_inner(&pool, &ctx).await?;
        Ok(next.or(Some(ctx.kube.resync)))
    };
    reconciler(&ctx).run(&pool, work).await
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(pool: Arc<SandboxPool>, error: &Error, ctx: Arc<PoolCtx>) -> Action {
    reconciler(&ctx).retry(&pool, error)
}

/// The members of `pool` the operator knows: the cache's, and the ones it created moments ago that
/// the cache does not show yet; members it deleted moments ago count as terminating.
fn members(ctx: &PoolCtx, pool: &SandboxPool, hash: &str) -> Vec<MemberView> {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let uid = pool.uid().unwrap_or_default();
    let mut seen: Vec<MemberView> = ctx
        .kube
        .caches
        .pods
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POOL_LABEL))
                .is_some_and(|v| *v == name)
        })
        .filter_map(|p| view(p, &uid, hash, &ctx.kube.key))
        .collect();
    for created in ctx.kube.own_writes.objects::<Pod>(&uid) {
        if let Some(member) = view(&created, &uid, hash, &ctx.kube.key)
            && !seen.iter().any(|m| m.uid == member.uid)
        {
            seen.push(member);
        }
    }
    for member in &mut seen {
        if ctx
            .kube
            .own_writes
            .recorded(&uid, &child_key("Pod", &member.name), "delete")
        {
            member.terminating = true;
        }
    }
    seen
}

async fn reconcile_inner(cached: &SandboxPool, ctx: &Arc<PoolCtx>) -> Result<Option<Duration>> {
    let key = key_of(cached);
    if cached.meta().deletion_timestamp.is_some() {
        ctx.book.forget(&key);
        return Ok(None);
    }
    let Some(pool) = reconciler(ctx).fresh(cached, |p: &mut SandboxPool, status| {
        p.status = Some(status);
    }) else {
        return Ok(None);
    };
    let namespace = pool.namespace().ok_or(Error::MissingField {
        kind: "SandboxPool",
        field: "metadata.namespace",
    })?;
    let owner = pool.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "SandboxPool",
        field: "metadata.uid",
    })?;
    let hash = template_hash(&pool.spec.template);
    let seen = members(ctx, &pool, &hash);
    let paused = ctx
        .book
        .last_failure(&key)
        .map(|at| FAILURE_PAUSE.saturating_sub(at.elapsed()))
        .filter(|left| !left.is_zero());
    // The operator's placement policy applies to members as to any Sandbox: a refused template gets
    // no members (and loses those it has), whoever may create pools.
    let refused = placement::check(&pool.spec.template, &ctx.pods.settings.placement).err();
    let desired = if refused.is_some() {
        0
    } else {
        pool.spec.replicas
    };
    let plan = plan(desired, &seen, paused.is_none());

    for (member, why) in &plan.delete {
        if *why == Removal::Failed {
            ctx.book
                .member_failed(&key, plan.failure.clone().unwrap_or_default());
        }
        delete_member(ctx, &pool, &namespace, member).await?;
    }
    if plan.create > 0 {
        ensure_baseline(&ctx.kube, &ctx.pods, &namespace).await?;
    }
    let starting = plan.create.min(CREATE_BATCH);
    let starts = (0..starting).map(|_| start_member(ctx, &pool, &owner));
    for started in join_all(starts).await {
        started?;
    }
    if starting > 0 {
        // Members are replaced after claims and failures: one event per pass, whatever its size.
        let note = format!(
            "starting {starting} member(s) to keep {} ({} Ready, claimed members are replaced)",
            pool.spec.replicas, plan.ready
        );
        publish(&ctx.kube, &pool, EventType::Normal, "Refilling", note).await;
    }

    let now = Timestamp::now();
    let problem = match refused {
        Some(why) => Some((placement::REASON.to_string(), why)),
        None => ctx
            .book
            .recent_failure(&key, STALLED_FOR)
            .map(|why| ("MemberFailed".to_string(), why)),
    };
    let was_stalled = pool
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, conditions::STALLED));
    if let Some((reason, message)) = problem.as_ref().filter(|_| !was_stalled) {
        warn!(pool = %object_key(&pool), %reason, %message, "pool stalled");
        publish(
            &ctx.kube,
            &pool,
            EventType::Warning,
            reason,
            message.clone(),
        )
        .await;
    }
    let status = pool_status(&pool, &plan, ctx.book.claim_counts(&key), problem, now);
    let labels = [namespace.as_str(), key.name.as_str()];
    ctx.kube
        .metrics
        .pool_members
        .with_label_values(&[labels[0], labels[1], "ready"])
        .set(i64::from(plan.ready));
    ctx.kube
        .metrics
        .pool_members
        .with_label_values(&[labels[0], labels[1], "starting"])
        .set(i64::from(plan.replicas - plan.ready));
    if pool.status.as_ref() != Some(&status) {
        writes::write_status(
            &ctx.kube,
            &ctx.kube.caches.sandbox_pools,
            &pool,
            pool.status.as_ref(),
            &status,
        )
        .await?;
    }
    if plan.create > CREATE_BATCH {
        return Ok(Some(Duration::ZERO));
    }
    // Come back when replacements may start again; the claim counts age, so look once a minute.
    Ok(Some(paused.unwrap_or(Duration::from_secs(60))))
}

/// Starts one member: its Pod, carrying the credentials of its own agent token.
async fn start_member(
    ctx: &PoolCtx,
    pool: &SandboxPool,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
) -> Result<()> {
    let name = member_name(&pool.name_any(), rand::random());
    let namespace = pool.namespace().unwrap_or_default();
    let credentials =
        crate::pod::token::credentials(&ctx.kube.key, &namespace, &name, &new_nonce());
    let desired = member_pod(
        pool,
        &name,
        owner,
        &ctx.pods.pod_shape(),
        &credentials,
        &ctx.kube.key,
    );
    // A random name that is taken is left alone: the next reconcile picks another.
    create_owned(
        &ctx.kube,
        &ctx.kube.caches.pods,
        &desired,
        owner_of(pool),
        "create",
        true,
    )
    .await?;
    Ok(())
}

/// Deletes a member if it is still exactly the one the plan saw (UID and resourceVersion): a member
/// claimed meanwhile has another resourceVersion and stays. Gone or changed counts as done.
async fn delete_member(
    ctx: &PoolCtx,
    pool: &SandboxPool,
    namespace: &str,
    member: &MemberView,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.kube.client.clone(), namespace);
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: Some(member.uid.clone()),
            resource_version: (!member.resource_version.is_empty())
                .then(|| member.resource_version.clone()),
        }),
        ..DeleteParams::default()
    };
    let answer = api.delete(&member.name, &params).await;
    ctx.kube.metrics.api_write("pods", "delete");
    match answer {
        Ok(_) => {
            ctx.kube.own_writes.record(
                pool.meta().uid.as_deref().unwrap_or_default(),
                &child_key("Pod", &member.name),
                "delete",
                || false,
            );
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.is_not_found() || status.code == 409 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// The pool's status (pure); `problem` is the reason and message of a `Stalled` pool (its template
/// refused by the placement policy, its members failing).
pub fn pool_status(
    pool: &SandboxPool,
    plan: &Plan,
    (claimed_last_minute, claimed_total): (i64, i64),
    problem: Option<(String, String)>,
    now: Timestamp,
) -> SandboxPoolStatus {
    let previous = pool.status.clone().unwrap_or_default();
    let desired = pool.spec.replicas.max(0);
    let ready = plan.ready;
    let starting = plan.replicas - plan.ready;
    let all_ready = plan.replicas == desired && ready == desired;
    let progress = match &problem {
        Some((reason, message)) => Progress::Stalled(reason.clone(), message.clone()),
        None if !all_ready => Progress::Reconciling(
            "Filling".into(),
            format!("{ready} of {desired} members Ready, {starting} starting"),
        ),
        None => Progress::Settled,
    };
    let mut wanted = vec![Desired::new(
        "Ready",
        all_ready,
        if all_ready {
            "AllMembersReady"
        } else {
            "MembersStarting"
        },
        format!("{ready} of {desired} members Ready"),
    )];
    wanted.extend(conditions::kstatus(&progress));
    SandboxPoolStatus {
        replicas: plan.replicas,
        ready_replicas: ready,
        starting_replicas: starting,
        claimed_last_minute,
        claimed_total,
        selector: Some(format!("{POOL_LABEL}={}", pool.name_any())),
        observed_generation: pool.metadata.generation,
        conditions: conditions::merge(&previous.conditions, wanted, pool.metadata.generation, now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::members::fixtures;

    fn pool(replicas: i32) -> SandboxPool {
        let mut pool = fixtures::pool(replicas);
        pool.metadata.generation = Some(3);
        pool
    }

    fn condition<'a>(status: &'a SandboxPoolStatus, type_: &str) -> &'a str {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map_or("absent", |c| c.status.as_str())
    }

    #[test]
    fn a_full_pool_is_ready_and_settled() {
        let plan = Plan {
            replicas: 2,
            ready: 2,
            ..Plan::default()
        };
        let status = pool_status(&pool(2), &plan, (5, 9), None, Timestamp::UNIX_EPOCH);
        assert_eq!(
            (
                status.replicas,
                status.ready_replicas,
                status.starting_replicas
            ),
            (2, 2, 0)
        );
        assert_eq!((status.claimed_last_minute, status.claimed_total), (5, 9));
        assert_eq!(status.selector.as_deref(), Some("orchard.dev/pool=py"));
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(condition(&status, "Ready"), "True");
        assert_eq!(condition(&status, "Reconciling"), "False");
        assert_eq!(condition(&status, "Stalled"), "False");
    }

    #[test]
    fn a_filling_pool_reconciles_and_failing_members_stall_it() {
        let plan = Plan {
            replicas: 2,
            ready: 1,
            ..Plan::default()
        };
        let status = pool_status(&pool(3), &plan, (0, 0), None, Timestamp::UNIX_EPOCH);
        assert_eq!(status.starting_replicas, 1);
        assert_eq!(condition(&status, "Ready"), "False");
        assert_eq!(condition(&status, "Reconciling"), "True");
        let stalled = pool_status(
            &pool(3),
            &plan,
            (0, 0),
            Some((
                "MemberFailed".into(),
                "py-abcde: ErrImagePull: not found".into(),
            )),
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(condition(&stalled, "Stalled"), "True");
        assert!(
            stalled
                .conditions
                .iter()
                .any(|c| c.message.contains("ErrImagePull"))
        );
    }
}
