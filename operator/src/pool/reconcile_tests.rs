//! The exact requests one SandboxPool reconcile sends, against a scripted API server
//! (`plumbing::mock_api`): a short pool starts its members, a failed member is deleted exactly as
//! seen and stalls the pool, a refused template loses its members. The decisions themselves are
//! tabled in `decide_tests.rs`.

use crate::plumbing::cached_pod::CachedPod;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::Resource;
use serde_json::{Value, json};

use super::controller::{CONTROLLER, key_of, reconcile};
use super::members::{fixtures, member_pod};
use crate::plumbing::mock_api::{
    Expect, Scripted, TestCaches, cache, default_settings, scripted, test_token_key,
};
use crate::pod::cluster_ranges::ClusterRanges;
use crate::pod::context::PodCtx;
use crate::pod::policy::baseline_policy;
use crate::pool::context::PoolCtx;
use orchard_api::{POOL_LABEL, SandboxPool};

const PODS: &str = "/api/v1/namespaces/ns/pods";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";
const STATUS: &str = "/apis/orchard.dev/v1alpha1/namespaces/ns/sandboxpools/py/status";

fn pool(replicas: i32) -> SandboxPool {
    let mut pool = fixtures::pool(replicas);
    pool.metadata.generation = Some(1);
    pool.metadata.resource_version = Some("30".into());
    pool
}

/// Caches with `pool`, the namespace baseline and `members`.
fn caches(pool: &SandboxPool, members: Vec<Pod>) -> TestCaches {
    let settings = default_settings();
    let mut caches = TestCaches::default();
    cache(&mut caches.sandbox_pools, pool.clone());
    cache(
        &mut caches.policies,
        baseline_policy("ns", &settings.pod.policy),
    );
    for member in members {
        cache(&mut caches.pods, CachedPod::from(&member));
    }
    caches
}

/// Member `name` of `pool` as the operator built it, with UID `uid-<name>` and resourceVersion 7.
fn member(pool: &SandboxPool, name: &str) -> Pod {
    let owner = pool.controller_owner_ref(&()).expect("owner");
    let credentials = crate::pod::token::credentials(&test_token_key(), "ns", name, "00");
    let mut pod = member_pod(
        pool,
        name,
        &owner,
        &default_settings().pod.pod,
        &credentials,
        &test_token_key(),
    );
    pod.metadata.uid = Some(format!("uid-{name}"));
    pod.metadata.resource_version = Some("7".into());
    pod
}

fn evicted(mut pod: Pod) -> Pod {
    pod.status = Some(PodStatus {
        phase: Some("Failed".into()),
        reason: Some("Evicted".into()),
        message: Some("the node ran out of memory".into()),
        ..PodStatus::default()
    });
    pod
}

fn member_create() -> Expect {
    Expect::create(PODS, "uid-new").body(|pod| {
        assert_eq!(pod["metadata"]["labels"][POOL_LABEL], "py");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "pool-uid");
    })
}

fn member_delete(name: &'static str) -> Expect {
    Expect::delete(format!("{PODS}/{name}")).body(move |delete| {
        assert_eq!(delete["preconditions"]["uid"], format!("uid-{name}"));
        assert_eq!(delete["preconditions"]["resourceVersion"], "7");
    })
}

fn event(reason: &'static str, kind: &'static str) -> Expect {
    Expect::create(EVENTS, "uid-event").body(move |event| {
        assert_eq!(event["reason"], reason);
        assert_eq!(event["type"], kind);
    })
}

fn status_write(pool: &SandboxPool, check: impl Fn(&Value) + Send + 'static) -> Expect {
    let mut written = pool.clone();
    written.metadata.resource_version = Some("31".into());
    Expect::new(
        "PATCH",
        STATUS,
        200,
        serde_json::to_value(&written).expect("json"),
    )
    .body(move |patch| {
        assert_eq!(
            patch.as_array().and_then(|ops| ops.first()),
            Some(&json!({"op": "test", "path": "/metadata/uid", "value": "pool-uid"})),
            "the status write is guarded by the pool's UID: {patch}"
        );
        check(patch);
    })
}

/// The condition `type_` a JSON patch of the whole status (or of its conditions) sets.
fn condition(patch: &Value, type_: &str) -> Option<(String, String)> {
    let ops = patch.as_array()?;
    ops.iter().find_map(|op| {
        let conditions = if op["path"] == "/status" {
            &op["value"]["conditions"]
        } else if op["path"] == "/status/conditions" {
            &op["value"]
        } else {
            return None;
        };
        conditions.as_array()?.iter().find_map(|c| {
            (c["type"] == type_).then(|| {
                (
                    c["status"].as_str().unwrap_or_default().to_string(),
                    c["reason"].as_str().unwrap_or_default().to_string(),
                )
            })
        })
    })
}

/// The SandboxPool controller's context on a script, with the default settings.
fn ctx(script: &Scripted) -> Arc<PoolCtx> {
    let settings = default_settings();
    let ranges = tokio::sync::watch::channel(ClusterRanges::default()).1;
    Arc::new(PoolCtx {
        kube: script.kube.clone(),
        pods: Arc::new(PodCtx::new(settings.pod, ranges)),
        book: Arc::default(),
    })
}

#[tokio::test]
async fn a_short_pool_starts_its_members_says_so_once_and_writes_its_status() {
    let p = pool(2);
    let script = scripted(
        &caches(&p, vec![]),
        vec![
            member_create(),
            member_create(),
            Expect::create(EVENTS, "uid-event").body(|event| {
                assert_eq!(event["reason"], "Refilling");
                assert_eq!(
                    event["note"],
                    "starting 2 member(s) to keep 2 (0 Ready, claimed members are replaced)"
                );
            }),
            status_write(&p, |patch| {
                assert_eq!(
                    condition(patch, "Reconciling"),
                    Some(("True".into(), "Filling".into())),
                    "{patch}"
                );
            }),
        ],
    );
    reconcile(Arc::new(p), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_pass_right_after_another_is_held_off_and_is_not_counted_as_a_reconcile() {
    let p = pool(2);
    let script = scripted(
        &caches(&p, vec![]),
        vec![
            member_create(),
            member_create(),
            event("Refilling", "Normal"),
            status_write(&p, |_| {}),
        ],
    );
    let ctx = ctx(&script);
    let ok = || {
        ctx.kube
            .metrics
            .reconciles
            .with_label_values(&[CONTROLLER, "ok"])
            .get()
    };
    reconcile(Arc::new(p.clone()), ctx.clone())
        .await
        .expect("the first pass");
    assert_eq!(ok(), 1);
    // At once again (a claim's events): no call to the API (the script has none left), requeued
    // within the hold-off, and not a reconcile in the metrics.
    let held = reconcile(Arc::new(p), ctx.clone()).await.expect("held off");
    let shown = format!("{held:?}");
    assert!(shown.contains("requeue_after: Some("), "{shown}");
    assert_eq!(ok(), 1, "a held-off pass is not counted");
    script.finish().await;
}

#[tokio::test]
async fn a_failed_member_is_deleted_as_seen_replaced_and_stalls_the_pool() {
    let p = pool(1);
    let script = scripted(
        &caches(&p, vec![evicted(member(&p, "py-bbbbb"))]),
        vec![
            member_delete("py-bbbbb"),
            member_create(),
            event("Refilling", "Normal"),
            Expect::create(EVENTS, "uid-event").body(|event| {
                assert_eq!(event["reason"], "MemberFailed");
                assert_eq!(event["type"], "Warning");
                assert_eq!(
                    event["note"],
                    "py-bbbbb: Evicted: the node ran out of memory"
                );
            }),
            status_write(&p, |patch| {
                assert_eq!(
                    condition(patch, "Stalled"),
                    Some(("True".into(), "MemberFailed".into())),
                    "{patch}"
                );
            }),
        ],
    );
    let ctx = ctx(&script);
    reconcile(Arc::new(p.clone()), ctx.clone())
        .await
        .expect("reconcile");
    script.finish().await;
    let (_, why) = ctx.book.last_failure(&key_of(&p)).expect("remembered");
    assert_eq!(why, "py-bbbbb: Evicted: the node ran out of memory");
}

#[tokio::test]
async fn a_refused_template_loses_its_members_and_starts_none() {
    let mut p = pool(1);
    p.spec.template.priority_class_name = Some("vip".into());
    let script = scripted(
        &caches(&p, vec![member(&p, "py-ccccc")]),
        vec![
            member_delete("py-ccccc"),
            event("PlacementRefused", "Warning"),
            status_write(&p, |patch| {
                assert_eq!(
                    condition(patch, "Stalled"),
                    Some(("True".into(), "PlacementRefused".into())),
                    "{patch}"
                );
            }),
        ],
    );
    reconcile(Arc::new(p), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}
