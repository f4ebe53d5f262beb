//! The hollow node's scheduler decision (pure): whether a pod fits the node as its Node object
//! describes it, in kube-scheduler's words when it does not. Checked, like kube-scheduler's filters:
//! `nodeSelector` and required node affinity (`In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`, `Lt`;
//! `matchFields` on `metadata.name`), `NoSchedule`/`NoExecute` taints against the pod's tolerations,
//! and extended resources (a device plugin's, e.g. `nvidia.com/gpu`) against the node's allocatable
//! minus what the pods bound to it hold. CPU, memory and the other native resources are not counted:
//! the node advertises far more than the benchmarks' pods ask.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration,
};

use super::shared::NodeConfig;

/// What the node offers pods: its labels, taints and extended resources.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeOffer {
    /// Node name (`matchFields` on `metadata.name`).
    pub name: String,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    pub taints: Vec<Taint>,
    /// Allocatable extended resources (whole units), e.g. `nvidia.com/gpu: 2`.
    pub extended: BTreeMap<String, i64>,
}

impl NodeOffer {
    /// What the Node object offers.
    pub fn from_node(node: &Node) -> Self {
        let extended = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .into_iter()
            .flatten()
            .filter(|(name, _)| is_extended(name))
            .filter_map(|(name, amount)| Some((name.clone(), whole(&amount.0)?)))
            .collect();
        Self {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
            extended,
        }
    }

    /// What the node offers before its Node object has been seen: its configured labels only.
    pub fn from_config(config: &NodeConfig) -> Self {
        Self {
            name: config.name.clone(),
            labels: config.labels.clone(),
            ..Self::default()
        }
    }
}

/// Whether `name` is an extended resource: one with a domain outside `kubernetes.io` (kube's
/// `IsExtendedResourceName`, less the quota-only `requests.` prefix).
pub fn is_extended(name: &str) -> bool {
    name.split_once('/').is_some_and(|(domain, _)| {
        !domain.is_empty()
            && domain != "kubernetes.io"
            && !domain.ends_with(".kubernetes.io")
            && !name.starts_with("requests.")
    })
}

/// A whole-unit quantity (extended resources are counted in whole units): `2`, `+2`, `1k`.
fn whole(text: &str) -> Option<i64> {
    let text = text.strip_prefix('+').unwrap_or(text);
    let (digits, factor) = match text.strip_suffix('k') {
        Some(digits) => (digits, 1000),
        None => (text, 1),
    };
    digits.parse::<i64>().ok()?.checked_mul(factor)
}

fn container_extended(container: &Container) -> Result<BTreeMap<String, i64>, String> {
    let resources = container.resources.as_ref();
    // A limit alone is the request too (extended resources cannot be overcommitted).
    let amounts = resources
        .and_then(|r| r.requests.as_ref())
        .into_iter()
        .flatten()
        .chain(
            resources
                .and_then(|r| r.limits.as_ref())
                .into_iter()
                .flatten(),
        );
    let mut wanted = BTreeMap::new();
    for (name, amount) in amounts.filter(|(name, _)| is_extended(name)) {
        let units = whole(&amount.0).ok_or_else(|| {
            format!(
                "container {} asks for {} {name:?}: extended resources are whole numbers",
                container.name, amount.0
            )
        })?;
        wanted.entry(name.clone()).or_insert(units);
    }
    Ok(wanted)
}

/// The extended resources `pod` holds on its node: per resource, the larger of its app containers'
/// sum and its largest init container (init containers run before the app containers, one at a time).
pub fn extended_requests(pod: &Pod) -> Result<BTreeMap<String, i64>, String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(BTreeMap::new());
    };
    let mut total: BTreeMap<String, i64> = BTreeMap::new();
    for container in &spec.containers {
        for (name, units) in container_extended(container)? {
            *total.entry(name).or_default() += units;
        }
    }
    for container in spec.init_containers.iter().flatten() {
        for (name, units) in container_extended(container)? {
            let held = total.entry(name).or_default();
            *held = (*held).max(units);
        }
    }
    Ok(total)
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(|v| number(v)),
                values.first().and_then(|v| number(v)),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

/// Whether one node selector term matches (its requirements ANDed; an empty term matches nothing).
fn term_matches(term: &NodeSelectorTerm, offer: &NodeOffer) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|r| requirement_matches(r, offer.labels.get(&r.key)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(&offer.name)))
}

/// Whether the pod's `nodeSelector` and required node affinity select the node.
fn selects(pod: &Pod, offer: &NodeOffer) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(key, value)| offer.labels.get(key) == Some(value));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    // Terms are ORed.
    let affinity_ok =
        required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, offer)));
    selector_ok && affinity_ok
}

/// Whether `toleration` tolerates `taint` (kube's `ToleratesTaint`).
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = toleration.key.as_deref().unwrap_or_default();
    let exists = toleration.operator.as_deref() == Some("Exists");
    let key_ok = (key.is_empty() && exists) || key == taint.key;
    let value_ok = exists
        || toleration.value.as_deref().unwrap_or_default()
            == taint.value.as_deref().unwrap_or_default();
    effect_ok && key_ok && value_ok
}

/// Taints the control plane puts on a node whose heartbeat it lost (`unreachable`, `not-ready`).
/// The hollow node is its own kubelet and scheduler, and its pods are host processes that do not
/// depend on that heartbeat: after a paused node or a restarted API server the taint can outlive
/// the node's recovery until the node lifecycle controller looks again, so these never keep a pod
/// off (as before the hollow node checked taints at all).
const LIFECYCLE_TAINT_PREFIX: &str = "node.kubernetes.io/";

/// The first taint of the node that keeps the pod off (`NoSchedule` or `NoExecute`, not tolerated,
/// not a lifecycle taint).
fn untolerated<'a>(pod: &Pod, offer: &'a NodeOffer) -> Option<&'a Taint> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    offer.taints.iter().find(|taint| {
        !taint.key.starts_with(LIFECYCLE_TAINT_PREFIX)
            && matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|t| tolerates(t, taint))
    })
}

/// Why `pod`, needing `wanted` extended resources, does not fit the node while its other pods hold
/// `in_use`, in kube-scheduler's words ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."); `None`
/// when it fits.
pub fn unfit(
    pod: &Pod,
    wanted: &BTreeMap<String, i64>,
    offer: &NodeOffer,
    in_use: &BTreeMap<String, i64>,
) -> Option<String> {
    let mut reasons = Vec::new();
    if !selects(pod, offer) {
        reasons.push("1 node(s) didn't match Pod's node affinity/selector".to_string());
    }
    if let Some(taint) = untolerated(pod, offer) {
        reasons.push(format!(
            "1 node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.as_deref().unwrap_or_default()
        ));
    }
    for (name, units) in wanted.iter().filter(|(_, units)| **units > 0) {
        let free =
            offer.extended.get(name).copied().unwrap_or(0) - in_use.get(name).copied().unwrap_or(0);
        if *units > free {
            reasons.push(format!("1 Insufficient {name}"));
        }
    }
    (!reasons.is_empty()).then(|| format!("0/1 nodes are available: {}.", reasons.join(", ")))
}

#[cfg(test)]
#[path = "scheduling_tests.rs"]
mod tests;
