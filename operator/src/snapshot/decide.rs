//! What one SandboxSnapshot reconcile does, decided without I/O: from the snapshot, its Sandbox and
//! that Sandbox's Pod, its committer Pod and who names it, the plan ([`Plan`]): the finalizer, the
//! committer Pod to create or delete, the status, and whether the snapshot's time is up.
//! `execute::execute` carries it out; every branch is unit-tested in `decide_tests.rs`.

use crate::plumbing::cached_pod::CachedPod;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::committer::{
    CONTAINER, CommitResult, CommitTarget, CommitterSettings, container_id, parse_result,
    target_reference,
};
use super::quota::Budget;
use crate::plumbing::conditions::{self, Desired, Progress};
use crate::plumbing::time::{floor_to_second, until};
use crate::pod::disruption::{NODE_LOST, disruption_failure};
use crate::pod::health::{permanent_pull_error, pod_failure};
use crate::pod::naming::TASK_CONTAINER;
use orchard_api::{
    SNAPSHOT_FINALIZER, Sandbox, SandboxPhase, SandboxSnapshot, SandboxSnapshotStatus,
    SnapshotPhase,
};

/// Condition types of a SandboxSnapshot.
pub mod condition {
    /// The image is pushed (or, False, why not yet or never).
    pub const READY: &str = "Ready";
    /// A Sandbox, SandboxPool or RolloutGroup names the snapshot in `fromSnapshot`.
    pub const IN_USE: &str = "InUse";
}

/// Failure and progress reasons of the `Ready` condition.
pub mod reason {
    /// Ready: the image is pushed.
    pub const COMMITTED: &str = "Committed";
    /// In progress: the committer Pod is starting.
    pub const WAITING_FOR_COMMITTER: &str = "WaitingForCommitter";
    /// In progress: the committer Pod runs.
    pub const COMMITTING: &str = "Committing";
    /// Failed: no Sandbox of that name.
    pub const SANDBOX_NOT_FOUND: &str = "SandboxNotFound";
    /// Failed: the Sandbox is not Ready (or its task container is not running).
    pub const SANDBOX_NOT_READY: &str = "SandboxNotReady";
    /// Failed: the sandbox's node (or the committer with it) was lost.
    pub const NODE_GONE: &str = "NodeGone";
    /// Failed: the registry refused the push (its answer is in the message).
    pub const PUSH_REFUSED: &str = "PushRefused";
    /// Failed: containerd could not pause or diff the container.
    pub const COMMIT_FAILED: &str = "CommitFailed";
    /// Failed: the committer Pod could not run or did not finish.
    pub const COMMITTER_FAILED: &str = "CommitterFailed";
    /// Failed: the operator has no `--snapshot-registry`.
    pub const SNAPSHOTS_DISABLED: &str = "SnapshotsDisabled";
    /// Failed: the namespace's snapshot size quota (`orchard.dev/snapshot-bytes`) has no room for it.
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";
}

/// Extra time past a committer's `activeDeadlineSeconds` the operator waits for it to report
/// before it gives up on it (a Pod that never started has no deadline of its own).
pub const COMMITTER_GRACE: Duration = Duration::from_secs(60);

/// How often a snapshot whose deletion waits for its users, or for its committer Pod to go, looks
/// again (their changes wake it first in the normal case).
pub const DELETION_RECHECK: Duration = Duration::from_secs(10);

/// Everything a snapshot reconcile decides on.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// The Sandbox `spec.sandbox` names, if it exists.
    pub sandbox: Option<&'a Sandbox>,
    /// That Sandbox's Pod, if the operator knows it.
    pub sandbox_pod: Option<&'a CachedPod>,
    /// The snapshot's committer Pod, if it exists.
    pub committer: Option<&'a Pod>,
    /// Who names the snapshot in `fromSnapshot` (`Sandbox a`, `SandboxPool p`, `RolloutGroup g`).
    pub referrers: &'a [String],
    /// How snapshots are committed.
    pub settings: &'a CommitterSettings,
    /// The namespace's snapshot size quota and what the other snapshots hold of it: `None` when no
    /// quota applies or when it was not observed (see [`touches_quota`]).
    pub budget: Option<&'a Budget>,
    /// Current time.
    pub now: Timestamp,
}

/// What to do about the committer Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitterStep {
    /// Nothing.
    Keep,
    /// Create it for this target.
    Create(CommitTarget),
    /// Delete it (done, or the snapshot is going away).
    Delete,
}

/// A transition worth an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Warning (a failure, a blocked deletion) or Normal.
    pub warning: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// The plan of one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Add the finalizer (a new snapshot).
    pub add_finalizer: bool,
    /// Remove the finalizer (deleted, nothing names it, no committer left).
    pub remove_finalizer: bool,
    /// The committer Pod.
    pub committer: CommitterStep,
    /// The status.
    pub status: SandboxSnapshotStatus,
    /// It differs from the snapshot's: write it.
    pub write: bool,
    /// `ttlSecondsAfterUnused` ran out: delete the snapshot.
    pub delete: bool,
    /// Events to publish after the status write.
    pub notes: Vec<Note>,
    /// When to look again (`None`: on the next change only).
    pub requeue: Option<Duration>,
}

fn has_finalizer(snapshot: &SandboxSnapshot) -> bool {
    snapshot
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == SNAPSHOT_FINALIZER)
}

/// The `InUse` condition for `referrers` (pure): at most five named, then how many more.
fn in_use(referrers: &[String], deleting: bool) -> Desired {
    if referrers.is_empty() {
        return Desired::new(condition::IN_USE, false, "Unused", "");
    }
    let mut named = referrers
        .iter()
        .take(5)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if referrers.len() > 5 {
        named.push_str(&format!(" and {} more", referrers.len() - 5));
    }
    let mut message = format!("named in fromSnapshot by {named}");
    if deleting {
        message.push_str(
            "; the snapshot is deleted once none does (delete or finish them, or remove fromSnapshot from the templates)",
        );
    }
    Desired::new(
        condition::IN_USE,
        true,
        if deleting {
            "DeletionWaits"
        } else {
            "Referenced"
        },
        message,
    )
}

/// `status` with its conditions recomputed: `Ready` from `ready`, `InUse`, and the kstatus pair
/// from the phase (pure).
fn with_conditions(
    snapshot: &SandboxSnapshot,
    mut status: SandboxSnapshotStatus,
    ready: Desired,
    referrers: &[String],
    now: Timestamp,
) -> SandboxSnapshotStatus {
    let deleting = snapshot.metadata.deletion_timestamp.is_some();
    let progress = match status.phase {
        Some(SnapshotPhase::Ready) => Progress::Settled,
        Some(SnapshotPhase::Failed) => {
            Progress::Stalled(ready.reason.clone(), ready.message.clone())
        }
        _ => Progress::Reconciling(ready.reason.clone(), ready.message.clone()),
    };
    let previous = snapshot.status.clone().unwrap_or_default().conditions;
    let desired = [ready, in_use(referrers, deleting)]
        .into_iter()
        .chain(conditions::kstatus(&progress))
        .collect();
    status.conditions = conditions::merge(&previous, desired, snapshot.metadata.generation, now);
    status.observed_generation = snapshot.metadata.generation;
    status
}

/// The `Ready` condition a finished snapshot keeps (pure).
fn kept_ready(previous: &SandboxSnapshotStatus) -> Desired {
    previous
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .map(|c| {
            Desired::new(
                condition::READY,
                c.status == "True",
                c.reason.clone(),
                c.message.clone(),
            )
        })
        .unwrap_or_else(|| Desired::new(condition::READY, false, "Unknown", ""))
}

/// A failed status: terminal (pure).
fn failed(
    previous: &SandboxSnapshotStatus,
    reason: &str,
    message: String,
    now: Timestamp,
) -> (SandboxSnapshotStatus, Desired) {
    let status = SandboxSnapshotStatus {
        phase: Some(SnapshotPhase::Failed),
        completion_time: Some(Time(floor_to_second(now))),
        ..previous.clone()
    };
    (
        status,
        Desired::new(condition::READY, false, reason, message),
    )
}

/// Why a Sandbox cannot be committed now, or the target to commit (pure).
pub fn target_of(
    snapshot: &SandboxSnapshot,
    sandbox: Option<&Sandbox>,
    pod: Option<&CachedPod>,
    registry: &str,
) -> Result<CommitTarget, (&'static str, String)> {
    let wanted = &snapshot.spec.sandbox;
    let Some(sandbox) = sandbox else {
        return Err((
            reason::SANDBOX_NOT_FOUND,
            format!(
                "no Sandbox {wanted} in this namespace: a snapshot is taken of a Ready Sandbox"
            ),
        ));
    };
    let status = sandbox.status.clone().unwrap_or_default();
    if status.reason.as_deref() == Some(NODE_LOST) {
        return Err((
            reason::NODE_GONE,
            format!(
                "Sandbox {wanted} lost its node: {}",
                status.message.unwrap_or_default()
            ),
        ));
    }
    let not_ready = |detail: String| {
        Err((
            reason::SANDBOX_NOT_READY,
            format!(
                "Sandbox {wanted} is not Ready ({detail}): a snapshot is taken of a Ready Sandbox; create the snapshot again once it is"
            ),
        ))
    };
    if sandbox.metadata.deletion_timestamp.is_some() {
        return not_ready("it is being deleted".into());
    }
    if status.phase != Some(SandboxPhase::Ready) {
        let phase = status.phase.map_or("Pending", SandboxPhase::as_str);
        // A sandbox that stopped answering (its node lost) says so in its Ready condition only.
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        let from_ready =
            |field: fn(&Condition) -> &String| ready.map(field).filter(|v| !v.is_empty()).cloned();
        let reason = status.reason.clone().or_else(|| from_ready(|c| &c.reason));
        let message = status
            .message
            .clone()
            .or_else(|| from_ready(|c| &c.message));
        let why = match (reason, message) {
            (Some(reason), Some(message)) => format!("{phase}, {reason}: {message}"),
            (Some(reason), None) => format!("{phase}, {reason}"),
            _ => phase.to_string(),
        };
        return not_ready(why);
    }
    let Some(pod) = pod else {
        return not_ready("its pod is not known".into());
    };
    if let Some(failure) = disruption_failure(pod) {
        let reason = if failure.reason == NODE_LOST {
            reason::NODE_GONE
        } else {
            reason::SANDBOX_NOT_READY
        };
        return Err((reason, failure.message));
    }
    if let Some(failure) = pod_failure(pod) {
        return not_ready(format!("{}: {}", failure.reason, failure.message));
    }
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let uid = pod.metadata.uid.clone();
    let task = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|c| c.name == TASK_CONTAINER));
    let running = task.is_some_and(|t| t.state.as_ref().is_some_and(|s| s.running.is_some()));
    let (Some(node), Some(uid), Some(task), true) = (node, uid, task, running) else {
        return not_ready("its task container is not running".into());
    };
    let Some(id) = task.container_id.as_deref().map(container_id) else {
        return not_ready("its task container has no ID yet".into());
    };
    let spec_image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == TASK_CONTAINER))
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    // The digest the node resolved, when the runtime reports the repository's digest: the layer
    // goes on exactly the layers it was taken against.
    let base_image = [task.image_id.as_str(), task.image.as_str()]
        .into_iter()
        .find(|i| i.contains("@sha256:") && !i.starts_with("sha256:"))
        .map(str::to_string)
        .unwrap_or(spec_image);
    Ok(CommitTarget {
        node_name: node,
        pod_uid: uid,
        container_id: id,
        base_image,
        target: target_reference(
            registry,
            snapshot.metadata.namespace.as_deref().unwrap_or_default(),
            snapshot.metadata.name.as_deref().unwrap_or_default(),
            snapshot.metadata.uid.as_deref().unwrap_or_default(),
        ),
        room: None,
    })
}

/// What the committer Pod says (pure): still at work (its phase), done, or failed.
enum CommitterState {
    Starting(String),
    Running,
    Done(CommitResult),
}

fn committer_state(pod: &Pod, settings: &CommitterSettings, now: Timestamp) -> CommitterState {
    let status = pod.status.clone().unwrap_or_default();
    let container = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == CONTAINER);
    let terminated = container
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    if let Some(terminated) = terminated {
        let said = terminated.message.as_deref().and_then(parse_result);
        return CommitterState::Done(said.unwrap_or_else(|| CommitResult::Failed {
            reason: reason::COMMITTER_FAILED.into(),
            message: format!(
                "the committer pod {}/{} exited with code {} ({}) without a result; its log has the details",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default(),
                terminated.exit_code,
                terminated.reason.as_deref().unwrap_or("no reason given"),
            ),
        }));
    }
    if let Some(failure) = disruption_failure(&CachedPod::from(pod)) {
        let reason = if failure.reason == NODE_LOST {
            reason::NODE_GONE
        } else {
            reason::COMMITTER_FAILED
        };
        return CommitterState::Done(CommitResult::Failed {
            reason: reason.into(),
            message: format!("the committer pod was taken away: {}", failure.message),
        });
    }
    if status.phase.as_deref() == Some("Failed") {
        return CommitterState::Done(CommitResult::Failed {
            reason: reason::COMMITTER_FAILED.into(),
            message: format!(
                "the committer pod failed ({}): {}",
                status.reason.as_deref().unwrap_or("no reason given"),
                status.message.as_deref().unwrap_or_default()
            ),
        });
    }
    let waiting = container
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref());
    if let Some(waiting) = waiting {
        let why = waiting.reason.clone().unwrap_or_default();
        let detail = waiting.message.clone().unwrap_or_default();
        let permanent = match why.as_str() {
            "ErrImagePull" | "ImagePullBackOff" => permanent_pull_error(&detail),
            "InvalidImageName" | "CreateContainerConfigError" | "CreateContainerError" => true,
            _ => false,
        };
        if permanent {
            return CommitterState::Done(CommitResult::Failed {
                reason: reason::COMMITTER_FAILED.into(),
                message: format!(
                    "the committer pod cannot start ({why}: {detail}); check the operator's --snapshot-committer-image (Helm value snapshots.committerImage)"
                ),
            });
        }
    }
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let limit = SignedDuration::from_secs(settings.timeout_seconds)
        + SignedDuration::try_from(COMMITTER_GRACE).unwrap_or_default();
    if let Some(created) = created
        && now.duration_since(created) >= limit
    {
        return CommitterState::Done(CommitResult::Failed {
            reason: reason::COMMITTER_FAILED.into(),
            message: format!(
                "the committer pod did not finish within {}s (--snapshot-timeout-seconds)",
                settings.timeout_seconds
            ),
        });
    }
    let running = container
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some());
    if running {
        CommitterState::Running
    } else {
        let detail = waiting_detail(container);
        CommitterState::Starting(detail)
    }
}

fn waiting_detail(container: Option<&k8s_openapi::api::core::v1::ContainerStatus>) -> String {
    container
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.clone())
        .map(|r| format!("the committer pod is starting ({r})"))
        .unwrap_or_else(|| "the committer pod is starting".into())
}

/// When the committer Pod gives up at the latest (pure).
fn committer_deadline(pod: &Pod, settings: &CommitterSettings) -> Option<Timestamp> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let limit = SignedDuration::from_secs(settings.timeout_seconds)
        + SignedDuration::try_from(COMMITTER_GRACE).unwrap_or_default();
    created.checked_add(limit).ok()
}

/// Whether `plan` starts a commit or makes the snapshot Ready (pure): then the namespace's size
/// quota matters, and the controller decides again with it observed ([`Observed::budget`]).
pub fn touches_quota(snapshot: &SandboxSnapshot, plan: &Plan) -> bool {
    let was_ready = snapshot
        .status
        .as_ref()
        .is_some_and(|s| s.phase == Some(SnapshotPhase::Ready));
    matches!(plan.committer, CommitterStep::Create(_))
        || (plan.status.phase == Some(SnapshotPhase::Ready) && !was_ready)
}

/// The plan for `snapshot` given what is observed (pure).
pub fn decide(snapshot: &SandboxSnapshot, observed: &Observed) -> Plan {
    let previous = snapshot.status.clone().unwrap_or_default();
    let now = observed.now;
    let referrers = observed.referrers;
    let mut plan = Plan {
        add_finalizer: false,
        remove_finalizer: false,
        committer: CommitterStep::Keep,
        status: previous.clone(),
        write: false,
        delete: false,
        notes: Vec::new(),
        requeue: None,
    };

    if snapshot.metadata.deletion_timestamp.is_some() {
        if observed.committer.is_some() {
            plan.committer = CommitterStep::Delete;
        }
        plan.remove_finalizer =
            has_finalizer(snapshot) && referrers.is_empty() && observed.committer.is_none();
        if !plan.remove_finalizer && has_finalizer(snapshot) {
            plan.requeue = Some(DELETION_RECHECK);
        }
        plan.status = with_conditions(
            snapshot,
            previous.clone(),
            kept_ready(&previous),
            referrers,
            now,
        );
        plan.write = !plan.remove_finalizer && Some(&plan.status) != snapshot.status.as_ref();
        if plan.write && !referrers.is_empty() {
            plan.notes.push(Note {
                warning: true,
                reason: "DeletionWaits".into(),
                message: in_use(referrers, true).message,
            });
        }
        return plan;
    }
    plan.add_finalizer = !has_finalizer(snapshot);

    let (mut status, ready) = match previous.phase {
        Some(SnapshotPhase::Ready | SnapshotPhase::Failed) => {
            if observed.committer.is_some() {
                plan.committer = CommitterStep::Delete;
            }
            (previous.clone(), kept_ready(&previous))
        }
        _ => progress(snapshot, observed, &previous, &mut plan),
    };
    if matches!(
        status.phase,
        Some(SnapshotPhase::Ready | SnapshotPhase::Failed)
    ) {
        unused_clock(snapshot, &mut status, referrers, now, &mut plan);
    }
    plan.status = with_conditions(snapshot, status, ready, referrers, now);
    plan.write = Some(&plan.status) != snapshot.status.as_ref();
    if plan.write && plan.status.phase != previous.phase {
        let ready = plan
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == condition::READY);
        match (plan.status.phase, ready) {
            (Some(SnapshotPhase::Ready), Some(c)) => plan.notes.push(Note {
                warning: false,
                reason: "SnapshotReady".into(),
                message: c.message.clone(),
            }),
            (Some(SnapshotPhase::Failed), Some(c)) => plan.notes.push(Note {
                warning: true,
                reason: c.reason.clone(),
                message: c.message.clone(),
            }),
            _ => {}
        }
    }
    plan
}

/// A finished snapshot's `unusedSince` (set while nothing names it, cleared while something does)
/// and its `ttlSecondsAfterUnused`: delete it once that ran out, else look again then (pure).
fn unused_clock(
    snapshot: &SandboxSnapshot,
    status: &mut SandboxSnapshotStatus,
    referrers: &[String],
    now: Timestamp,
    plan: &mut Plan,
) {
    status.unused_since = if referrers.is_empty() {
        status
            .unused_since
            .clone()
            .or_else(|| Some(Time(floor_to_second(now))))
    } else {
        None
    };
    let (Some(ttl), Some(since)) = (
        snapshot.spec.ttl_seconds_after_unused,
        status.unused_since.as_ref(),
    ) else {
        return;
    };
    let from = status
        .completion_time
        .as_ref()
        .map_or(since.0, |done| done.0.max(since.0));
    let deadline = from
        .checked_add(SignedDuration::from_secs(ttl))
        .unwrap_or(from);
    if now >= deadline {
        plan.delete = true;
    } else {
        let next = until(now, deadline);
        plan.requeue = Some(plan.requeue.map_or(next, |r| r.min(next)));
    }
}

/// A snapshot that is not finished: start, follow or conclude its commit (pure).
fn progress(
    snapshot: &SandboxSnapshot,
    observed: &Observed,
    previous: &SandboxSnapshotStatus,
    plan: &mut Plan,
) -> (SandboxSnapshotStatus, Desired) {
    let now = observed.now;
    let Some(registry) = observed.settings.registry.as_deref() else {
        return failed(
            previous,
            reason::SNAPSHOTS_DISABLED,
            "this operator has no snapshot registry: set Helm value snapshots.registry (--snapshot-registry) to a repository prefix nodes can pull from and the committer may push to".into(),
            now,
        );
    };
    if let Some(pod) = observed.committer {
        return match committer_state(pod, observed.settings, now) {
            CommitterState::Done(CommitResult::Pushed {
                image,
                size_bytes,
                paused_milliseconds,
            }) => {
                plan.committer = CommitterStep::Delete;
                let size = size_bytes.map_or(0, |b| u64::try_from(b).unwrap_or(0));
                if let Some(budget) = observed.budget.filter(|b| !b.fits(size)) {
                    return failed(
                        previous,
                        reason::QUOTA_EXCEEDED,
                        format!(
                            "the committed layer ({size} bytes) does not fit: {} (others were committed meanwhile); {image} was pushed but will not be used (the registry's retention removes it)",
                            budget.describe()
                        ),
                        now,
                    );
                }
                let message = format!(
                    "pushed {image}: {} bytes of changes on {}; the sandbox was paused {} ms",
                    size_bytes.map_or("?".into(), |s| s.to_string()),
                    previous.base_image.as_deref().unwrap_or("its image"),
                    paused_milliseconds.map_or("?".into(), |s| s.to_string()),
                );
                let status = SandboxSnapshotStatus {
                    phase: Some(SnapshotPhase::Ready),
                    image: Some(image),
                    size_bytes,
                    paused_milliseconds,
                    completion_time: Some(Time(floor_to_second(now))),
                    ..previous.clone()
                };
                (
                    status,
                    Desired::new(condition::READY, true, reason::COMMITTED, message),
                )
            }
            CommitterState::Done(CommitResult::Failed { reason, message }) => {
                plan.committer = CommitterStep::Delete;
                failed(previous, &reason, message, now)
            }
            CommitterState::Starting(detail) => {
                plan.requeue = committer_deadline(pod, observed.settings).map(|d| until(now, d));
                let status = SandboxSnapshotStatus {
                    phase: Some(SnapshotPhase::Pending),
                    ..previous.clone()
                };
                (
                    status,
                    Desired::new(
                        condition::READY,
                        false,
                        reason::WAITING_FOR_COMMITTER,
                        detail,
                    ),
                )
            }
            CommitterState::Running => {
                plan.requeue = committer_deadline(pod, observed.settings).map(|d| until(now, d));
                let status = SandboxSnapshotStatus {
                    phase: Some(SnapshotPhase::Committing),
                    ..previous.clone()
                };
                (
                    status,
                    Desired::new(
                        condition::READY,
                        false,
                        reason::COMMITTING,
                        "the sandbox is paused while its changes are read, then the layer is pushed",
                    ),
                )
            }
        };
    }
    if previous.pod_uid.is_some() {
        // A committer was started (the status names the pod it acts on) and is gone without a word.
        let node = previous.node_name.as_deref().unwrap_or("its node");
        let lost = observed
            .sandbox
            .and_then(|s| s.status.as_ref())
            .is_some_and(|s| s.reason.as_deref() == Some(NODE_LOST));
        return if lost {
            failed(
                previous,
                reason::NODE_GONE,
                format!("node {node} was lost while the snapshot was being committed"),
                now,
            )
        } else {
            failed(
                previous,
                reason::COMMITTER_FAILED,
                format!(
                    "the committer pod on node {node} disappeared before it reported a result (deleted, or its node is gone)"
                ),
                now,
            )
        };
    }
    match target_of(snapshot, observed.sandbox, observed.sandbox_pod, registry) {
        Err((reason, message)) => failed(previous, reason, message, now),
        Ok(_) if observed.budget.is_some_and(|b| b.room() == 0) => {
            let described = observed.budget.map(Budget::describe).unwrap_or_default();
            failed(
                previous,
                reason::QUOTA_EXCEEDED,
                format!(
                    "no room for another snapshot: {described}; delete snapshots, or ask for a larger quota"
                ),
                now,
            )
        }
        Ok(mut target) => {
            target.room = observed.budget.map(|b| (b.room(), b.limit.quota.clone()));
            let status = SandboxSnapshotStatus {
                phase: Some(SnapshotPhase::Pending),
                node_name: Some(target.node_name.clone()),
                pod_uid: Some(target.pod_uid.clone()),
                base_image: Some(target.base_image.clone()),
                ..previous.clone()
            };
            let message = format!("starting the committer pod on node {}", target.node_name);
            plan.committer = CommitterStep::Create(target);
            (
                status,
                Desired::new(
                    condition::READY,
                    false,
                    reason::WAITING_FOR_COMMITTER,
                    message,
                ),
            )
        }
    }
}
