//! What one SandboxPool reconcile does, decided without I/O: from the pool, the members the operator
//! knows, the book's memory of its members' last failure and of its claims, and the placement
//! policy, [`decide`] gives a [`PoolPlan`]: the members to delete (and the failure to remember
//! first), how many to start, what to tell, the status and when to come back. `execute::execute`
//! carries it out.
//!
//! One decision suffices: no API answer shapes a later one within the reconcile (a failed delete or
//! create fails the reconcile, which is retried; a member claimed meanwhile refuses its delete's
//! preconditions, which counts as done; a random name that is taken is left for the next reconcile),
//! and the status counts the members the plan keeps, not the answers.
//!
//! Everything here is unit-tested with tables (`decide_tests.rs`).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::members::{MemberView, Plan, Removal, plan};
use crate::plumbing::conditions::{self, Desired, Progress};
use crate::pod::placement::{self, Placement};
use orchard_api::{POOL_LABEL, SandboxPool, SandboxPoolStatus};

/// How long a pool waits after a member failed before it starts replacements (a bad image would
/// otherwise start and fail members in a tight loop).
pub const FAILURE_PAUSE: Duration = Duration::from_secs(5);

/// How long a `Stalled` condition stays after the last member failure.
pub const STALLED_FOR: Duration = Duration::from_secs(60);

/// How often a pool whose template's SandboxSnapshot is not Ready looks again.
pub const SNAPSHOT_RECHECK: Duration = Duration::from_secs(5);

/// Members created at once by one reconcile.
pub const CREATE_BATCH: usize = 16;

/// How often a pool is looked at when nothing else brings it back (its claim counts age).
pub const CLAIM_COUNTS_AGE: Duration = Duration::from_secs(60);

/// What a pool reconcile observes besides the pool.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The members the operator knows (the cache's, its own creates moments ago; its own deletes
    /// moments ago count as terminating).
    pub members: &'a [MemberView],
    /// How long ago a member of the pool last failed, and why (the book's memory).
    pub last_failure: Option<(Duration, String)>,
    /// Claims in the last minute and in total (the book's counts).
    pub claims: (i64, i64),
    /// The operator's placement policy.
    pub placement: &'a Placement,
    /// Why the template's `fromSnapshot` gives no image yet: the snapshot failed (`true`) or is
    /// not Ready, and the message; no member starts meanwhile.
    pub snapshot: Option<(bool, String)>,
    /// Current time.
    pub now: Timestamp,
}

/// A member to delete.
#[derive(Debug, Clone, PartialEq)]
pub struct Deletion {
    /// The member as the plan saw it (the delete is conditional on its UID and resourceVersion).
    pub member: MemberView,
    /// Why.
    pub why: Removal,
    /// A failed member: the failure the book remembers first (to pause replacements, to stall).
    pub failure: Option<String>,
}

/// What one pool reconcile does, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPlan {
    /// Members to delete.
    pub delete: Vec<Deletion>,
    /// Ensure the namespace baseline (members are to be started).
    pub baseline: bool,
    /// Members to start now (at most [`CREATE_BATCH`]).
    pub start: usize,
    /// The `Refilling` Event's note, when members start.
    pub refill: Option<String>,
    /// The pool has just stalled: a warning and an Event (reason, message).
    pub stalled: Option<(String, String)>,
    /// Unclaimed current members kept, Ready (the `ready` members gauge).
    pub ready: i32,
    /// Unclaimed current members kept, not Ready yet (the `starting` members gauge).
    pub starting: i32,
    /// The pool's status.
    pub status: SandboxPoolStatus,
    /// It differs from the one the pool has: write it.
    pub write: bool,
    /// When to reconcile again.
    pub requeue: Duration,
}

/// What one reconcile of `pool` does (pure). Failed and outdated members go (and a surplus, see
/// `members::plan`); missing ones start unless members failed less than [`FAILURE_PAUSE`] ago,
/// [`CREATE_BATCH`] at a time. The placement policy applies to members as to any Sandbox: a refused
/// template gets no members (and loses those it has), whoever may create pools. The pool is
/// `Stalled` while its template is refused or for [`STALLED_FOR`] after a member failed, and says
/// so once when it becomes so.
pub fn decide(pool: &SandboxPool, observed: &Observed) -> PoolPlan {
    let paused = observed
        .last_failure
        .as_ref()
        .map(|(ago, _)| FAILURE_PAUSE.saturating_sub(*ago))
        .filter(|left| !left.is_zero());
    let refused = placement::check(&pool.spec.template, observed.placement).err();
    let desired = if refused.is_some() || observed.snapshot.is_some() {
        0
    } else {
        pool.spec.replicas
    };
    let snapshot_wait = observed
        .snapshot
        .as_ref()
        .filter(|(failed, _)| !failed)
        .map(|(_, message)| message.clone());
    let members = plan(desired, observed.members, paused.is_none());
    let delete: Vec<Deletion> = members
        .delete
        .iter()
        .map(|(member, why)| Deletion {
            member: member.clone(),
            why: *why,
            failure: (*why == Removal::Failed).then(|| members.failure.clone().unwrap_or_default()),
        })
        .collect();
    let start = members.create.min(CREATE_BATCH);
    // Members are replaced after claims and failures: one event per pass, whatever its size.
    let refill = (start > 0).then(|| {
        format!(
            "starting {start} member(s) to keep {} ({} Ready, claimed members are replaced)",
            pool.spec.replicas, members.ready
        )
    });
    // The failure remembered now is the book's most recent one.
    let failed_now = delete.iter().find_map(|d| d.failure.clone());
    let recent = observed
        .last_failure
        .as_ref()
        .filter(|(ago, _)| *ago < STALLED_FOR)
        .map(|(_, why)| why.clone());
    let problem = match (refused, &observed.snapshot) {
        (Some(why), _) => Some((placement::REASON.to_string(), why)),
        (None, Some((true, why))) => Some((
            crate::snapshot::source::SNAPSHOT_FAILED.to_string(),
            why.clone(),
        )),
        (None, _) => failed_now
            .or(recent)
            .map(|why| ("MemberFailed".to_string(), why)),
    };
    let was_stalled = pool
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, conditions::STALLED));
    let stalled = problem.clone().filter(|_| !was_stalled);
    let status = pool_status(
        pool,
        &members,
        observed.claims,
        problem,
        snapshot_wait.clone(),
        observed.now,
    );
    let requeue = if members.create > CREATE_BATCH {
        Duration::ZERO
    } else if snapshot_wait.is_some() {
        SNAPSHOT_RECHECK
    } else {
        // Come back when replacements may start again; the claim counts age, so look once a minute.
        paused.unwrap_or(CLAIM_COUNTS_AGE)
    };
    PoolPlan {
        delete,
        baseline: members.create > 0,
        start,
        refill,
        stalled,
        ready: members.ready,
        starting: members.replicas - members.ready,
        write: pool.status.as_ref() != Some(&status),
        status,
        requeue,
    }
}

/// The pool's status (pure); `problem` is the reason and message of a `Stalled` pool (its template
/// refused by the placement policy, its members failing, its snapshot failed), `snapshot_wait` why
/// its template's snapshot gives no image yet.
pub fn pool_status(
    pool: &SandboxPool,
    plan: &Plan,
    (claimed_last_minute, claimed_total): (i64, i64),
    problem: Option<(String, String)>,
    snapshot_wait: Option<String>,
    now: Timestamp,
) -> SandboxPoolStatus {
    let previous = pool.status.clone().unwrap_or_default();
    let desired = pool.spec.replicas.max(0);
    let ready = plan.ready;
    let starting = plan.replicas - plan.ready;
    let all_ready = plan.replicas == desired && ready == desired;
    let progress = match &problem {
        Some((reason, message)) => Progress::Stalled(reason.clone(), message.clone()),
        None if snapshot_wait.is_some() => Progress::Reconciling(
            crate::snapshot::source::SNAPSHOT_NOT_READY.into(),
            snapshot_wait.clone().unwrap_or_default(),
        ),
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
#[path = "decide_tests.rs"]
mod tests;
