//! What one Sandbox reconcile does, decided without I/O. A reconcile has two decisions, because
//! what the API server answers to the children's writes (a quota, an admission rejection, a name
//! held by another object, a claimed member) shapes the status:
//!
//! 1. [`plan_children`]: from the Sandbox and the Pod the operator knows, what to do about its
//!    policies and Pod ([`ChildPlan`]); `execute::ensure_children` does it and reports a
//!    [`ChildOutcome`].
//! 2. [`plan_status`]: from the Sandbox and that outcome, its status, whether to write it now or
//!    later, what to announce, and what comes next ([`StatusPlan`], [`Then`]).
//!
//! [`failed_removal`] and [`expiry`] decide the ends of a sandbox's life. Everything here is
//! unit-tested with tables; the scripted-API tests (`reconcile_tests.rs`) cover the I/O around it.

use crate::plumbing::cached_pod::CachedPod;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::time::until;
use crate::plumbing::writes::ChildState;
use crate::pod::placement::{self, Placement};
use crate::retry::{RetryParams, retry_message};
use crate::sandbox::blocked::Blocked;
use crate::sandbox::claim::is_claimed_member;
use crate::sandbox::coalesce::{first_status_can_wait, hold_back_transient};
use crate::sandbox::context::SandboxSettings;
use crate::sandbox::enforcement::{Evidence, Verdict, evidence_of};
use crate::sandbox::expiry::{ExpiryCause, expiry_deadline, failed_deadline};
use crate::sandbox::identity::{is_trajectory, rollout_group_of};
use crate::sandbox::run_result::aborted;
use crate::sandbox::status::{
    Observed, POLICY_ENFORCEMENT_MISSING, condition, desired_status, expired_status,
    policy_warning_at, startup_clock,
};
use orchard_api::{Lifecycle, Sandbox, SandboxPhase, SandboxStatus};

/// How often a sandbox whose Pod a ResourceQuota refused tries again (quotas are not watched).
pub const QUOTA_RECHECK: Duration = Duration::from_secs(3);

/// How often a sandbox waiting for a previous incarnation's children (or a pool member) looks
/// again, in case the watch misses their deletion (it wakes the reconcile first in the normal case).
pub const PREVIOUS_INCARNATION_RECHECK: Duration = Duration::from_secs(1);

/// How often a sandbox waiting for its SandboxSnapshot to be Ready looks again (the snapshot's
/// change wakes it first in the normal case).
pub const SNAPSHOT_RECHECK: Duration = Duration::from_secs(5);

/// What to do about the sandbox's children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildPlan {
    /// Failed or Expired: free the Pod's resources; the Sandbox stays until [`failed_removal`] says.
    Terminal,
    /// The placement policy refuses the spec ([`Blocked::PlacementRefused`]), or its `retry` cannot
    /// run ([`Blocked::InvalidSpec`]): nothing is created, the sandbox fails.
    Refused(Blocked),
    /// Ensure the namespace baseline and the sandbox's egress policy (before the Pod starts, and
    /// before a claim relabels a pool member into its selector), then get the Pod by `pod`.
    Ensure {
        /// How the Pod is had.
        pod: PodStep,
    },
}

/// How the sandbox's Pod is had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodStep {
    /// The Pod the operator knows is the sandbox's own: use it.
    Known,
    /// The name is held by an object that is not the sandbox's own (this block wins over the
    /// policies').
    Blocked(Blocked),
    /// The status names a Pod the cache does not show: ask the API server before declaring it gone.
    Fetch,
    /// No Pod yet: claim a member of the pool the spec names (the pool decides whether to start
    /// cold instead), or create the sandbox's own. Only when the policies are not blocked.
    Start,
}

/// What [`ChildPlan`] came to.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChildOutcome {
    /// The sandbox's Pod, if it has one.
    pub pod: Option<CachedPod>,
    /// The status named a Pod and a live read confirmed it is gone: the failure it means.
    pub pod_gone: Option<crate::pod::failure::Failure>,
    /// Why the sandbox cannot have a child it needs, if it cannot.
    pub blocked: Option<Blocked>,
}

/// The children's plan for `sandbox` (pure): `known` is the Pod the operator knows (the cache, or
/// its own write moments ago); `invalid_retry` says why its `retry` cannot run, if it cannot;
/// `snapshot` is why its `fromSnapshot` does not give it an image yet (it matters only before it
/// has a Pod).
pub fn plan_children(
    sandbox: &Sandbox,
    known: Option<&ChildState<CachedPod>>,
    placement: &Placement,
    invalid_retry: Option<&str>,
    snapshot: Option<&Blocked>,
) -> ChildPlan {
    let previous = sandbox.status.as_ref();
    if matches!(
        previous.and_then(|s| s.phase),
        Some(SandboxPhase::Failed | SandboxPhase::Expired)
    ) {
        return ChildPlan::Terminal;
    }
    let named = previous.is_some_and(|s| s.pod_name.is_some());
    // The placement policy gates a Pod's creation only (a retry's too): a sandbox whose Pod exists
    // keeps it. A retry policy that cannot run is refused before the first one.
    let creating = known.is_none() && !named;
    if creating && let Err(why) = placement::check(&sandbox.spec, placement) {
        return ChildPlan::Refused(Blocked::PlacementRefused(why));
    }
    if creating
        && previous.is_none_or(|s| s.attempts <= 1)
        && let Some(why) = invalid_retry
    {
        return ChildPlan::Refused(Blocked::InvalidSpec(why.to_string()));
    }
    let pod = match known {
        Some(ChildState::Ours(_)) => PodStep::Known,
        Some(ChildState::Waiting(why)) => {
            PodStep::Blocked(Blocked::PreviousIncarnation(why.clone()))
        }
        Some(ChildState::Conflict(why)) => PodStep::Blocked(Blocked::NameConflict(why.clone())),
        None if named => PodStep::Fetch,
        None => match snapshot {
            Some(waiting) => PodStep::Blocked(waiting.clone()),
            None => PodStep::Start,
        },
    };
    ChildPlan::Ensure { pod }
}

/// When a trajectory Sandbox of a RolloutGroup may get its Pod, if not yet (pure): its
/// `orchard.dev/launch-after` annotation (`plumbing::launch_after`). Only a Sandbox the
/// operator sealed for its group waits; any other starts at once.
pub fn launch_wait(sandbox: &Sandbox, key: &OperatorKey, now: Timestamp) -> Option<Timestamp> {
    rollout_group_of(sandbox, key)?;
    let annotation = sandbox
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(orchard_api::LAUNCH_AFTER_ANNOTATION));
    let created = sandbox.metadata.creation_timestamp.as_ref().map(|t| t.0);
    crate::plumbing::launch_after::launch_after(annotation.map(String::as_str), created, now)
}

/// The first blocked child, a conflict before a wait (pure).
pub fn blocked_by(states: &[&ChildState<()>]) -> Option<Blocked> {
    let conflict = states.iter().find_map(|s| match s {
        ChildState::Conflict(why) => Some(Blocked::NameConflict(why.clone())),
        _ => None,
    });
    conflict.or_else(|| {
        states.iter().find_map(|s| match s {
            ChildState::Waiting(why) => Some(Blocked::PreviousIncarnation(why.clone())),
            _ => None,
        })
    })
}

/// What the status computation needs besides the sandbox and its children.
#[derive(Debug, Clone)]
pub struct StatusInput<'a> {
    /// The Sandbox controller's settings.
    pub settings: &'a SandboxSettings,
    /// Port the agents listen on.
    pub agent_port: u16,
    /// Longest time between two reconciles of a healthy sandbox.
    pub resync: Duration,
    /// The operator's key.
    pub key: &'a OperatorKey,
    /// Current time.
    pub now: Timestamp,
    /// The cluster-wide verdict on NetworkPolicy enforcement.
    pub enforcement: &'a Verdict,
    /// The operator knows an egress proxy.
    pub egress_proxy: bool,
    /// The sandbox's retry policy (`sandbox::retry::policy_of`), if it has one that can run.
    pub retry: Option<&'a RetryParams>,
}

/// A transition worth an Event, a log line or a metric.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    /// The agent has waited too long for NetworkPolicies nobody seems to enforce.
    PolicyEnforcementMissing(String),
    /// The sandbox became Ready for the first time, `seconds` after its creation (when known).
    Ready(Option<f64>),
    /// The sandbox's pod was lost and a new attempt begins (`spec.retry`).
    Retried {
        /// How the attempt ended (`OOMKilled`, `Evicted`, `PodDeleted`, `NodeLost`).
        reason: String,
        /// What ended, what it ran with, and what the next attempt gets.
        message: String,
    },
    /// The sandbox failed.
    Failed {
        /// CamelCase reason.
        reason: String,
        /// Message.
        message: String,
    },
}

/// What to do after the status.
#[derive(Debug, Clone, PartialEq)]
pub enum Then {
    /// Failed: delete the Pod, then see [`failed_removal`].
    Terminal,
    /// Reconcile again after this long.
    Requeue(Duration),
    /// A deadline passed: end the sandbox (see [`expiry`]); `late` is how far past it, in seconds.
    Expire {
        /// Which deadline.
        cause: ExpiryCause,
        /// Seconds past it.
        late: f64,
    },
}

/// The status and what follows from it.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusPlan {
    /// A transient phase of a young sandbox: write nothing, reconcile again after this long.
    HoldBack(Duration),
    /// Write the status if it changed, and act on it.
    Settle(Box<Settle>),
}

/// The status to settle on.
#[derive(Debug, Clone, PartialEq)]
pub struct Settle {
    /// The status.
    pub status: SandboxStatus,
    /// It differs from the one the Sandbox has: write it (the notes follow the write).
    pub write: bool,
    /// A claimed pool member just became Ready: tell its agent the sandbox's name first.
    pub announce_identity: bool,
    /// What the transition is worth telling (only after a write).
    pub notes: Vec<Note>,
    /// The sandbox runs `spec.run`: make sure its runner runs.
    pub run: bool,
    /// What the status tells about NetworkPolicy enforcement in the cluster.
    pub evidence: Option<Evidence>,
    /// What comes next.
    pub then: Then,
}

/// The status plan of `sandbox` whose children came to `outcome` (pure).
pub fn plan_status(sandbox: &Sandbox, outcome: &ChildOutcome, input: &StatusInput) -> StatusPlan {
    let now = input.now;
    let settings = input.settings;
    let lifecycle = settings.lifecycle(&sandbox.spec);
    let waiting = matches!(
        outcome.blocked,
        Some(Blocked::PreviousIncarnation(_) | Blocked::Pool { .. })
    );
    let over_quota = matches!(outcome.blocked, Some(Blocked::QuotaExceeded(_)));
    let jitter_wait = match outcome.blocked {
        Some(Blocked::LaunchJitter(at)) => Some(until(now, at)),
        _ => None,
    };
    let snapshot_wait = matches!(
        outcome.blocked,
        Some(Blocked::Snapshot { failed: false, .. })
    );
    let observed = Observed {
        pod: outcome.pod.as_ref(),
        pod_gone: outcome.pod_gone.clone(),
        now,
        lifecycle,
        startup_timeout_seconds: settings.startup_timeout_seconds,
        agent_port: input.agent_port,
        blocked: outcome.blocked.clone(),
        key: input.key,
        enforcement: input.enforcement,
        egress_proxy: input.egress_proxy,
        retry: input.retry,
    };
    let status = desired_status(sandbox, &observed);
    let previous = sandbox.status.clone().unwrap_or_default();
    let changed = sandbox.status.as_ref() != Some(&status);
    let created = sandbox.metadata.creation_timestamp.as_ref().map(|t| t.0);
    // A retry is written at once: the new attempt's pod is created only once the status says so.
    let retried = status.attempts > previous.attempts;
    // Nothing enforces its policies: that needs outside help, so it is written at once.
    if changed
        && !retried
        && !ready_reason_is(&status, POLICY_ENFORCEMENT_MISSING)
        && let Some(wait) = hold_back_transient(
            sandbox.status.as_ref(),
            &status,
            created,
            now,
            settings.status_coalesce,
            first_status_can_wait(sandbox, input.key),
        )
    {
        // A young sandbox usually becomes Ready within the window: write once, then.
        let wait = if let Some(jitter) = jitter_wait {
            wait.min(jitter)
        } else if waiting {
            wait.min(PREVIOUS_INCARNATION_RECHECK)
        } else if over_quota {
            wait.min(QUOTA_RECHECK)
        } else if snapshot_wait {
            wait.min(SNAPSHOT_RECHECK)
        } else {
            wait
        };
        return StatusPlan::HoldBack(wait);
    }
    let announce_identity = status.ready_time.is_some()
        && previous.ready_time.is_none()
        && outcome
            .pod
            .as_ref()
            .is_some_and(|p| is_claimed_member(sandbox, p));
    let notes = if changed {
        let mut notes = transition_notes(created, &previous, &status, now);
        notes.extend(retry_notes(&previous, &status, input.retry));
        notes
    } else {
        Vec::new()
    };
    let then = if status.phase == Some(SandboxPhase::Failed) {
        Then::Terminal
    } else if retried {
        // The next reconcile removes the lost pod and creates the new attempt's.
        Then::Requeue(Duration::ZERO)
    } else if let Some(jitter) = jitter_wait {
        Then::Requeue(jitter)
    } else if waiting {
        Then::Requeue(PREVIOUS_INCARNATION_RECHECK)
    } else if over_quota {
        Then::Requeue(QUOTA_RECHECK)
    } else if snapshot_wait {
        Then::Requeue(SNAPSHOT_RECHECK)
    } else {
        next_deadline(sandbox, outcome.pod.as_ref(), &status, lifecycle, input)
    };
    let evidence = evidence_of(&object_key(sandbox), &status, outcome.pod.as_ref());
    StatusPlan::Settle(Box::new(Settle {
        run: sandbox.spec.run.is_some(),
        evidence,
        status,
        write: changed,
        announce_identity,
        notes,
        then,
    }))
}

/// When to come back to a sandbox that is neither failed nor waiting (pure): at its expiry
/// deadline once Ready; before, at its startup deadline (or when it should say that nothing enforces
/// its NetworkPolicies); never later than `resync`.
fn next_deadline(
    sandbox: &Sandbox,
    pod: Option<&CachedPod>,
    status: &SandboxStatus,
    lifecycle: Lifecycle,
    input: &StatusInput,
) -> Then {
    let now = input.now;
    let ready_time = status.ready_time.as_ref().map(|t| t.0);
    let heartbeat = status
        .last_heartbeat_time
        .as_ref()
        .map(|t| t.0)
        .or(ready_time);
    if let Some((deadline, cause)) = expiry_deadline(ready_time, heartbeat, lifecycle) {
        if now >= deadline {
            let late = now.duration_since(deadline).as_secs_f64().max(0.0);
            return Then::Expire { cause, late };
        }
        return Then::Requeue(until(now, deadline).min(input.resync));
    }
    // Not Ready yet: come back when the startup timeout would fail it (watch events usually come
    // first; a trajectory not scheduled yet has no startup deadline, its pod's scheduling wakes it).
    let Some(started) = startup_clock(sandbox, pod, input.key) else {
        return Then::Requeue(input.resync);
    };
    let startup_deadline = started
        .saturating_add(SignedDuration::from_secs(
            input.settings.startup_timeout_seconds,
        ))
        .unwrap_or(now);
    // A sandbox still waiting for its NetworkPolicies says so once that has lasted too long.
    let next = pod
        .and_then(policy_warning_at)
        .filter(|at| *at > now)
        .map_or(startup_deadline, |at| at.min(startup_deadline));
    Then::Requeue(until(now, next).min(input.resync))
}

/// Whether `status`'s Ready condition has `reason` (pure).
fn ready_reason_is(status: &SandboxStatus, reason: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == condition::READY && c.reason == reason)
}

/// What a written transition from `previous` to `status` is worth telling (pure).
fn transition_notes(
    created: Option<Timestamp>,
    previous: &SandboxStatus,
    status: &SandboxStatus,
    now: Timestamp,
) -> Vec<Note> {
    let ready = |s: &SandboxStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == condition::READY)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let mut notes = Vec::new();
    let missing = |s: &SandboxStatus| ready_reason_is(s, POLICY_ENFORCEMENT_MISSING);
    if missing(status) && !missing(previous) {
        let message = ready(status).map(|(_, m)| m).unwrap_or_default();
        notes.push(Note::PolicyEnforcementMissing(message));
    }
    if previous.phase == status.phase {
        return notes;
    }
    match status.phase {
        Some(SandboxPhase::Ready) if previous.ready_time.is_none() => {
            let seconds = created.map(|c| now.duration_since(c).as_secs_f64().max(0.0));
            notes.push(Note::Ready(seconds));
        }
        Some(SandboxPhase::Failed) => notes.push(Note::Failed {
            reason: status.reason.clone().unwrap_or_else(|| "Failed".into()),
            message: status.message.clone().unwrap_or_default(),
        }),
        _ => {}
    }
    notes
}

/// The retries `status` records that `previous` did not (pure), each told with what ended, what it
/// ran with, and what the next attempt gets under `retry`.
fn retry_notes(
    previous: &SandboxStatus,
    status: &SandboxStatus,
    retry: Option<&RetryParams>,
) -> Vec<Note> {
    let known = previous.previous_attempts.len();
    status
        .previous_attempts
        .iter()
        .enumerate()
        .skip(known)
        .map(|(position, ended)| {
            let next = retry.and_then(|policy| policy.after(ended));
            Note::Retried {
                reason: ended.reason.clone(),
                message: format!(
                    "{}; the sandbox's files are lost with its pod",
                    retry_message(position + 1, ended, next)
                ),
            }
        })
        .collect()
}

/// What becomes of a terminal sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Not the operator's to remove now: an Expired sandbox was deleted already, a RolloutGroup's
    /// trajectories are removed by their group.
    NotOurs,
    /// A standalone Failed sandbox whose TTL has not ended: come back then.
    After(Duration),
    /// Its TTL ended: delete it.
    Now,
}

/// When a terminal `sandbox` with `status` is removed (pure): a standalone Failed one when its TTL
/// ends ([`failed_deadline`]).
pub fn failed_removal(
    sandbox: &Sandbox,
    status: &SandboxStatus,
    settings: &SandboxSettings,
    resync: Duration,
    key: &OperatorKey,
    now: Timestamp,
) -> Removal {
    if status.phase != Some(SandboxPhase::Failed) || rollout_group_of(sandbox, key).is_some() {
        return Removal::NotOurs;
    }
    let lifecycle = settings.lifecycle(&sandbox.spec);
    let created = sandbox
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let ready = status.ready_time.as_ref().map(|t| t.0);
    let deadline = failed_deadline(created, ready, lifecycle);
    if now < deadline {
        Removal::After(until(now, deadline).min(resync))
    } else {
        Removal::Now
    }
}

/// How an expired sandbox ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Expiry {
    /// The status to write first, so the outcome is not lost: a trajectory's (aborted when it had no
    /// result), and every trajectory of a RolloutGroup's.
    pub last_status: Option<SandboxStatus>,
    /// Only the Pod is deleted (a RolloutGroup's trajectory: its group removes the Sandbox);
    /// otherwise the Sandbox.
    pub pod_only: bool,
    /// The Event's note.
    pub note: String,
}

/// How `sandbox`, whose status is `status`, ends at its `cause` deadline (pure). A standalone
/// sandbox is deleted. A trajectory of a RolloutGroup keeps its Sandbox object (phase Expired, with
/// an aborted result if it had none) so the group cannot lose its outcome; only its Pod is deleted.
pub fn expiry(
    sandbox: &Sandbox,
    status: &SandboxStatus,
    cause: ExpiryCause,
    key: &OperatorKey,
    now: Timestamp,
) -> Expiry {
    let cause = cause.as_str();
    let in_group = rollout_group_of(sandbox, key).is_some();
    let last_status =
        (in_group || (is_trajectory(sandbox, key) && status.result.is_none())).then(|| {
            let mut expired = expired_status(sandbox, cause, now);
            if expired.result.is_none() {
                expired.result = Some(aborted(
                    "Expired",
                    format!(
                        "the sandbox reached its {cause} deadline before the trajectory finished"
                    ),
                    None,
                ));
            }
            expired
        });
    let note = if in_group {
        format!("the {cause} deadline passed; pod deleted, the RolloutGroup removes the sandbox")
    } else {
        format!("the {cause} deadline passed; sandbox deleted")
    };
    Expiry {
        last_status,
        pod_only: in_group,
        note,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
