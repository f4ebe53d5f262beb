//! What a sandbox whose agent waits for its NetworkPolicies to be enforced says (pure): starting;
//! `PolicyEnforcementMissing` once it has waited [`POLICY_WAIT_WARNING`] (stalled: it needs outside
//! help); or `PolicyEnforcementMissing` as soon as its task container runs while the cluster-wide
//! verdict says nothing enforces NetworkPolicies (not stalled: its own agent may still get past the
//! wait, e.g. right after an enforcer was installed).

use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::pod::health::task_running_since;
use crate::pod::policy_canary::awaits_enforcement;
pub use crate::sandbox::enforcement::POLICY_ENFORCEMENT_MISSING;
use crate::sandbox::enforcement::Verdict;

/// How long an agent may wait for its NetworkPolicies, after its container started, before the
/// sandbox says that no enforcer may be programming them.
pub const POLICY_WAIT_WARNING: SignedDuration = SignedDuration::from_secs(30);

/// The advice both `PolicyEnforcementMissing` messages end with.
const ADVICE: &str = "install an enforcer, or set Helm value sandboxEgress.awaitEnforcement=false (--await-policy-enforcement=false) to run sandboxes without network isolation";

/// Where a gated agent's wait stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyWait {
    /// Waiting, nothing to say yet.
    Starting,
    /// `PolicyEnforcementMissing` with this message.
    Missing {
        /// What happened and what to do.
        message: String,
        /// Its own agent waited too long (`Stalled=True`); otherwise the cluster-wide verdict speaks
        /// for it and it keeps `Reconciling`.
        stalled: bool,
    },
}

/// Where the wait of `pod`'s agent (which waits for its policies) stands at `now`, given the
/// cluster-wide `verdict` (pure).
pub fn policy_wait(pod: &CachedPod, now: Timestamp, verdict: &Verdict) -> PolicyWait {
    let Some(running) = task_running_since(pod) else {
        return PolicyWait::Starting;
    };
    if now.duration_since(running) >= POLICY_WAIT_WARNING {
        return PolicyWait::Missing {
            message: own_wait_message(),
            stalled: true,
        };
    }
    match verdict {
        Verdict::Missing { since, sandbox } => PolicyWait::Missing {
            message: verdict_message(*since, sandbox),
            stalled: false,
        },
        Verdict::Unknown | Verdict::Enforced { .. } => PolicyWait::Starting,
    }
}

/// When a sandbox whose agent waits for its NetworkPolicies says that no enforcer may be programming
/// them, if `pod` is such a pod and its task container runs (pure).
pub fn policy_warning_at(pod: &CachedPod) -> Option<Timestamp> {
    if !awaits_enforcement(pod) {
        return None;
    }
    task_running_since(pod)?
        .checked_add(POLICY_WAIT_WARNING)
        .ok()
}

/// The message of a sandbox whose own agent waited too long (the same at every reconcile, so it
/// costs one write).
fn own_wait_message() -> String {
    format!(
        "the agent has waited more than {}s for the sandbox's NetworkPolicies to be enforced: nothing seems to enforce NetworkPolicies in this cluster (EKS without the VPC CNI's network policy agent, GKE without network policy enforcement); {ADVICE}",
        POLICY_WAIT_WARNING.as_secs()
    )
}

/// The message of a sandbox told by the cluster-wide verdict, which `sandbox` gave at `since`.
fn verdict_message(since: Timestamp, sandbox: &str) -> String {
    format!(
        "nothing seems to enforce NetworkPolicies in this cluster (cluster-wide verdict: the agent of sandbox {sandbox} waited more than {}s for its policies, at {since}, and no sandbox's agent has seen its policies enforced since); this sandbox's agent waits for its policies too and serves only once they are enforced; {ADVICE}",
        POLICY_WAIT_WARNING.as_secs()
    )
}
