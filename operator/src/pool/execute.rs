//! The I/O half of a SandboxPool reconcile: carry out a [`PoolPlan`] (see `decide`): deletes
//! conditional on what the plan saw, member creates, the Events, the gauges and the status write.

use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::warn;

use super::book::PoolKey;
use super::decide::PoolPlan;
use super::members::{MemberView, Removal, member_name, member_pod};
use crate::plumbing::error::Result;
use crate::plumbing::events::publish;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::own_writes::child_key;
use crate::plumbing::ownership::Owner;
use crate::plumbing::writes::{self, create_owned};
use crate::pod::apply::ensure_baseline;
use crate::pod::token::new_nonce;
use crate::pool::context::PoolCtx;
use orchard_api::SandboxPool;

/// The pool as the owner of its members.
fn owner_of(pool: &SandboxPool) -> Owner<'_> {
    Owner {
        kind: "SandboxPool",
        name: pool.meta().name.as_deref().unwrap_or_default(),
        uid: pool.meta().uid.as_deref().unwrap_or_default(),
    }
}

/// Carries out `plan` for `pool` (book key `key`, controlling its members as `owner`); returns when
/// to reconcile again.
pub async fn execute(
    ctx: &PoolCtx,
    pool: &SandboxPool,
    key: &PoolKey,
    owner: &OwnerReference,
    plan: PoolPlan,
) -> Result<Duration> {
    let namespace = key.namespace.as_str();
    for deletion in &plan.delete {
        if let Some(failure) = &deletion.failure {
            ctx.book.member_failed(key, failure.clone());
        }
        let grace = (deletion.why == Removal::LostNode).then_some(0);
        delete_member(ctx, pool, namespace, &deletion.member, grace).await?;
    }
    if plan.baseline {
        ensure_baseline(&ctx.kube, &ctx.pods, namespace).await?;
    }
    let starts = (0..plan.start).map(|_| start_member(ctx, pool, owner));
    for started in join_all(starts).await {
        started?;
    }
    if let Some(note) = plan.refill {
        publish(&ctx.kube, pool, EventType::Normal, "Refilling", note).await;
    }
    if let Some((reason, message)) = &plan.stalled {
        warn!(pool = %object_key(pool), %reason, %message, "pool stalled");
        publish(&ctx.kube, pool, EventType::Warning, reason, message.clone()).await;
    }
    let members = &ctx.kube.metrics.pool_members;
    let labels = [namespace, key.name.as_str()];
    members
        .with_label_values(&[labels[0], labels[1], "ready"])
        .set(i64::from(plan.ready));
    members
        .with_label_values(&[labels[0], labels[1], "starting"])
        .set(i64::from(plan.starting));
    if plan.write {
        writes::write_status(
            &ctx.kube,
            &ctx.kube.caches.sandbox_pools,
            pool,
            pool.status.as_ref(),
            &plan.status,
        )
        .await?;
    }
    Ok(plan.requeue)
}

/// Starts one member: its Pod, carrying the credentials of its own agent token.
async fn start_member(ctx: &PoolCtx, pool: &SandboxPool, owner: &OwnerReference) -> Result<()> {
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
/// `grace_period_seconds` 0 removes a member its lost node will never finish deleting.
async fn delete_member(
    ctx: &PoolCtx,
    pool: &SandboxPool,
    namespace: &str,
    member: &MemberView,
    grace_period_seconds: Option<u32>,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.kube.client.clone(), namespace);
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(Preconditions {
            uid: Some(member.uid.clone()),
            resource_version: (!member.resource_version.is_empty())
                .then(|| member.resource_version.clone()),
        }),
        grace_period_seconds,
        ..DeleteParams::default()
    };
    let answer = api.delete(&member.name, &params).await;
    let verb = if grace_period_seconds == Some(0) {
        "force_delete"
    } else {
        "delete"
    };
    ctx.kube.metrics.api_write("pods", verb);
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
