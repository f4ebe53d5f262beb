//! The cluster-wide verdict on NetworkPolicy enforcement (pure): whether the agents' policy gates
//! (agent/src/policy_gate.rs) open in this cluster, learnt from the sandboxes themselves.
//!
//! Evidence comes from a sandbox's status and Pod ([`evidence_of`]): a sandbox whose agent waited
//! past the policy wait warning (30 s, `sandbox::status::POLICY_WAIT_WARNING`) for its policies
//! (`Stalled=True`, reason `PolicyEnforcementMissing`) says they are `Missing`; one whose gated agent
//! became Ready says they are `Enforced`. The latest evidence wins ([`next`]), so the verdict follows
//! an enforcer installed or removed while the operator runs. Sandboxes told early by the verdict
//! itself (`Stalled=False`) are no evidence, so the verdict never feeds on itself. [`shared`] keeps it
//! for the controller, the log and the `orchard_network_policy_enforcement` gauge.

use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::jiff::Timestamp;

use crate::plumbing::conditions::STALLED;
use crate::pod::policy_canary::awaits_enforcement;
use orchard_api::SandboxStatus;

/// Reason of a sandbox whose agent waits for NetworkPolicies nothing seems to enforce.
pub const POLICY_ENFORCEMENT_MISSING: &str = "PolicyEnforcementMissing";

pub mod shared;

/// Whether NetworkPolicies are enforced in the cluster, as far as the sandboxes tell.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Verdict {
    /// No sandbox has told yet (at start, or no sandbox's agent waits for its policies).
    #[default]
    Unknown,
    /// A sandbox's agent waited too long for its policies, and none has passed its wait since.
    Missing {
        /// When that sandbox said so (its `Stalled` condition's transition).
        since: Timestamp,
        /// That sandbox, `namespace/name`.
        sandbox: String,
    },
    /// A sandbox's agent passed its wait, and none has waited too long since.
    Enforced {
        /// When the latest such sandbox became Ready.
        since: Timestamp,
    },
}

impl Verdict {
    /// Every value of [`Verdict::state`], the gauge's `state` label.
    pub const STATES: [&'static str; 3] = ["unknown", "missing", "enforced"];

    /// The verdict's kind, in lower case: `unknown`, `missing` or `enforced`.
    pub fn state(&self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Missing { .. } => "missing",
            Self::Enforced { .. } => "enforced",
        }
    }
}

/// What one sandbox tells about enforcement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// Its agent waited too long for its policies.
    Missing {
        /// When it said so.
        at: Timestamp,
        /// The sandbox, `namespace/name`.
        sandbox: String,
    },
    /// Its agent, which waited for its policies, became Ready.
    Enforced {
        /// When it became Ready.
        at: Timestamp,
    },
}

impl Evidence {
    /// When the evidence was seen.
    pub fn at(&self) -> Timestamp {
        match self {
            Self::Missing { at, .. } | Self::Enforced { at } => *at,
        }
    }

    /// The sandbox that waited too long, for `Missing`.
    fn sandbox(&self) -> Option<&str> {
        match self {
            Self::Missing { sandbox, .. } => Some(sandbox),
            Self::Enforced { .. } => None,
        }
    }
}

/// What the status (and Pod) of the sandbox `name` (`namespace/name`) tells about enforcement (pure).
/// The same function reads a status the controller just computed and one in the watch cache.
pub fn evidence_of(
    name: &str,
    status: &SandboxStatus,
    pod: Option<&CachedPod>,
) -> Option<Evidence> {
    let stalled_missing = status.conditions.iter().find(|c| {
        c.type_ == STALLED && c.status == "True" && c.reason == POLICY_ENFORCEMENT_MISSING
    });
    if let Some(condition) = stalled_missing {
        return Some(Evidence::Missing {
            at: condition.last_transition_time.0,
            sandbox: name.to_string(),
        });
    }
    let ready = status.ready_time.as_ref()?.0;
    pod.is_some_and(awaits_enforcement)
        .then_some(Evidence::Enforced { at: ready })
}

/// The verdict after `evidence` (pure): the latest evidence wins; a second `Missing` keeps the first
/// (its time and sandbox), a second `Enforced` moves the time forward.
pub fn next(current: &Verdict, evidence: &Evidence) -> Verdict {
    let from = |e: &Evidence| match e {
        Evidence::Missing { at, sandbox } => Verdict::Missing {
            since: *at,
            sandbox: sandbox.clone(),
        },
        Evidence::Enforced { at } => Verdict::Enforced { since: *at },
    };
    match (current, evidence) {
        (Verdict::Unknown, e) => from(e),
        (Verdict::Missing { .. }, Evidence::Missing { .. }) => current.clone(),
        (Verdict::Missing { since, .. }, e @ Evidence::Enforced { at }) if at >= since => from(e),
        (Verdict::Enforced { since }, Evidence::Enforced { at }) => Verdict::Enforced {
            since: (*since).max(*at),
        },
        (Verdict::Enforced { since }, e @ Evidence::Missing { at, .. }) if at > since => from(e),
        _ => current.clone(),
    }
}

/// The verdict after all of `evidence`, taken in the order it was seen (pure): what a fold over the
/// watch cache gives whatever order the cache lists the sandboxes in.
pub fn after_all(current: &Verdict, mut evidence: Vec<Evidence>) -> Verdict {
    evidence.sort_by(|a, b| {
        a.at()
            .cmp(&b.at())
            .then_with(|| a.sandbox().cmp(&b.sandbox()))
    });
    evidence
        .iter()
        .fold(current.clone(), |verdict, e| next(&verdict, e))
}

#[cfg(test)]
mod tests;
