//! GPUs of a sandbox (pure): the operator's GPU settings (`--gpu-resource`, `--gpu-type`,
//! `--gpu-toleration`) and what they make of a spec's `resources.gpu`: the extended resource's
//! request and limit, a toleration of GPU nodes' taint, a required node affinity with one term per
//! GPU type (terms are ORed: any listed type will do), and the refusal of a type the map does not know.
//!
//! GPU node pools are usually tainted `<resource>:NoSchedule` (GKE taints its GPU node pools
//! `nvidia.com/gpu=present:NoSchedule` itself; on EKS and AKS it is the usual taint of GPU node groups,
//! set by whoever creates them), so a GPU sandbox tolerates that taint by default; the toleration is the
//! operator's own, not the user's, so the toleration allow-list (`--allowed-toleration-keys`) does not
//! apply to it. A pool tainted with another key needs that toleration in the spec.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Toleration,
};
use orchard_api::{GpuRequest, SandboxSpec};

/// The GPU flags of the operator.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct GpuFlags {
    /// Extended resource name the GPU device plugin advertises on GPU nodes; a sandbox's `resources.gpu.count` is requested (and limited) under it.
    #[arg(long, env = "ORCHARD_GPU_RESOURCE", default_value = "nvidia.com/gpu")]
    pub gpu_resource: String,

    /// A GPU type sandboxes may name in `resources.gpu.types`, as `NAME=LABEL=VALUE`: nodes carrying label LABEL=VALUE have GPUs of type NAME (lower-cased; matched case-insensitively), e.g. `h100=nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3` or `l4=cloud.google.com/gke-accelerator=nvidia-l4`. Repeat the flag (or separate entries with commas) for more types; none by default, so only sandboxes without `types` are accepted.
    #[arg(long = "gpu-type", env = "ORCHARD_GPU_TYPES", value_delimiter = ',')]
    pub gpu_types: Vec<String>,

    /// Give every GPU sandbox's Pod a toleration of the GPU resource's taint (`key: <gpu-resource>, operator: Exists, effect: NoSchedule`), which GPU node pools usually carry (GKE adds it itself; EKS and AKS GPU node groups are commonly tainted so). `--gpu-toleration=false` leaves it out.
    #[arg(
        long,
        env = "ORCHARD_GPU_TOLERATION",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub gpu_toleration: bool,
}

impl Default for GpuFlags {
    fn default() -> Self {
        Self {
            gpu_resource: DEFAULT_RESOURCE.to_string(),
            gpu_types: Vec::new(),
            gpu_toleration: true,
        }
    }
}

/// The extended resource of NVIDIA's device plugin.
pub const DEFAULT_RESOURCE: &str = "nvidia.com/gpu";

/// The node label that marks nodes with GPUs of one type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLabel {
    /// Label key, e.g. `nvidia.com/gpu.product`.
    pub key: String,
    /// Label value, e.g. `NVIDIA-H100-80GB-HBM3`.
    pub value: String,
}

/// GPU type names (lower-case) and the node label of each.
pub type GpuTypes = BTreeMap<String, NodeLabel>;

/// How GPU sandboxes' Pods are shaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuShape {
    /// The extended resource requested for each GPU.
    pub resource: String,
    /// Tolerate the resource's `NoSchedule` taint.
    pub toleration: bool,
    /// The GPU type map.
    pub types: GpuTypes,
}

impl Default for GpuShape {
    fn default() -> Self {
        Self {
            resource: DEFAULT_RESOURCE.to_string(),
            toleration: true,
            types: GpuTypes::new(),
        }
    }
}

/// Whether `name` is a GPU type name: 1 to 63 ASCII letters, digits, `-`, `.` or `_`, starting with a
/// letter or digit (the CRD's rule).
pub fn is_type_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    name.len() <= 63
        && bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// Whether `name` is a label name: 1 to 63 characters, alphanumeric at both ends, `-`, `_` or `.`
/// inside.
fn is_label_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Whether `prefix` is a DNS subdomain (a label key's or resource name's prefix).
fn is_dns_subdomain(prefix: &str) -> bool {
    prefix.len() <= 253
        && prefix.split('.').all(|part| {
            let bytes = part.as_bytes();
            !bytes.is_empty()
                && bytes.len() <= 63
                && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
                && (bytes[bytes.len() - 1].is_ascii_lowercase()
                    || bytes[bytes.len() - 1].is_ascii_digit())
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        })
}

/// Whether `key` is a label key: `[prefix/]name`.
fn is_label_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(key),
    }
}

/// Whether `value` is a label value (empty, or a label name).
fn is_label_value(value: &str) -> bool {
    value.is_empty() || is_label_name(value)
}

/// One `--gpu-type` entry, `NAME=LABEL=VALUE`, as the type's lower-case name and its node label.
pub fn parse_type(entry: &str) -> Result<(String, NodeLabel), String> {
    let entry = entry.trim();
    let wrong = |why: &str| {
        format!(
            "--gpu-type (env ORCHARD_GPU_TYPES, Helm value gpu.types) `{entry}`: {why}; write NAME=LABEL=VALUE, e.g. h100=nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
        )
    };
    let Some((name, selector)) = entry.split_once('=') else {
        return Err(wrong("no `=`"));
    };
    let Some((key, value)) = selector.split_once('=') else {
        return Err(wrong("no LABEL=VALUE after the name"));
    };
    let (name, key, value) = (name.trim(), key.trim(), value.trim());
    if !is_type_name(name) {
        return Err(wrong(&format!(
            "`{name}` is not a GPU type name (1 to 63 letters, digits, `-`, `.` or `_`, starting with a letter or digit)"
        )));
    }
    if !is_label_key(key) {
        return Err(wrong(&format!("`{key}` is not a label key")));
    }
    if !is_label_value(value) {
        return Err(wrong(&format!("`{value}` is not a label value")));
    }
    Ok((
        name.to_ascii_lowercase(),
        NodeLabel {
            key: key.to_string(),
            value: value.to_string(),
        },
    ))
}

/// The GPU settings the flags describe, or what is wrong with them (names the flag and Helm value).
pub fn shape_from_flags(flags: &GpuFlags) -> Result<GpuShape, String> {
    let resource = flags.gpu_resource.trim();
    let resource_ok = resource.split_once('/').is_some_and(|(prefix, name)| {
        is_dns_subdomain(prefix) && is_label_name(name) && !prefix.ends_with("kubernetes.io")
    });
    if !resource_ok {
        return Err(format!(
            "--gpu-resource (env ORCHARD_GPU_RESOURCE, Helm value gpu.resource) `{resource}` is not an extended resource name such as nvidia.com/gpu or amd.com/gpu (DOMAIN/NAME, outside kubernetes.io)"
        ));
    }
    let mut types = GpuTypes::new();
    for entry in flags.gpu_types.iter().filter(|e| !e.trim().is_empty()) {
        let (name, label) = parse_type(entry)?;
        if types.insert(name.clone(), label).is_some() {
            return Err(format!(
                "--gpu-type (env ORCHARD_GPU_TYPES, Helm value gpu.types) names GPU type `{name}` twice (names are case-insensitive)"
            ));
        }
    }
    Ok(GpuShape {
        resource: resource.to_string(),
        toleration: flags.gpu_toleration,
        types,
    })
}

/// The spec's GPU request, if it asks for GPUs.
pub fn request_of(spec: &SandboxSpec) -> Option<&GpuRequest> {
    spec.resources.as_ref()?.gpu.as_ref()
}

/// Why the spec's GPU types are refused, if they are: every type the map does not know, the known
/// ones, and the setting that adds one.
pub fn refusal(spec: &SandboxSpec, types: &GpuTypes) -> Option<String> {
    let wanted = request_of(spec)?.type_names();
    let unknown: Vec<String> = wanted
        .iter()
        .filter(|name| !types.contains_key(*name))
        .map(|name| format!("{name:?}"))
        .collect();
    if unknown.is_empty() {
        return None;
    }
    let known = if types.is_empty() {
        "none".to_string()
    } else {
        types.keys().cloned().collect::<Vec<_>>().join(", ")
    };
    let plural = if unknown.len() == 1 { "" } else { "s" };
    Some(format!(
        "spec.resources.gpu.types: unknown GPU type{plural} {} (known: {known}); the operator's GPU type map gets a type with --gpu-type NAME=LABEL=VALUE (env ORCHARD_GPU_TYPES, Helm value gpu.types)",
        unknown.join(", ")
    ))
}

/// The toleration a GPU sandbox's Pod gets for GPU nodes' taint.
pub fn toleration(shape: &GpuShape) -> Toleration {
    Toleration {
        key: Some(shape.resource.clone()),
        operator: Some("Exists".to_string()),
        effect: Some("NoSchedule".to_string()),
        ..Toleration::default()
    }
}

/// The Pod's tolerations: the spec's, plus the GPU toleration for a GPU sandbox (unless turned off or
/// the spec has it already). `None` when there are none.
pub fn tolerations(spec: &SandboxSpec, shape: &GpuShape) -> Option<Vec<Toleration>> {
    let mut all = spec.tolerations.clone();
    if request_of(spec).is_some() && shape.toleration {
        let gpu = toleration(shape);
        if !all.contains(&gpu) {
            all.push(gpu);
        }
    }
    (!all.is_empty()).then_some(all)
}

/// The node selector term of GPU type `name`. A name the map does not know (only if the map changed
/// between the placement check and the Pod's build) selects a label no node is given, so the Pod
/// waits rather than landing on any GPU node.
fn type_term(name: &str, types: &GpuTypes) -> NodeSelectorTerm {
    let (key, value) = match types.get(name) {
        Some(label) => (label.key.clone(), label.value.clone()),
        None => ("orchard.dev/unknown-gpu-type".to_string(), name.to_string()),
    };
    NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key,
            operator: "In".to_string(),
            values: Some(vec![value]),
        }]),
        ..NodeSelectorTerm::default()
    }
}

/// The required node selector terms of the spec's GPU types (one per type, in name order; ORed by
/// Kubernetes); empty when it names none.
pub fn type_terms(spec: &SandboxSpec, types: &GpuTypes) -> Vec<NodeSelectorTerm> {
    request_of(spec)
        .map(|gpu| gpu.type_names())
        .unwrap_or_default()
        .iter()
        .map(|name| type_term(name, types))
        .collect()
}

/// `left` AND `right`: one term with both terms' requirements.
fn and_terms(left: &NodeSelectorTerm, right: &NodeSelectorTerm) -> NodeSelectorTerm {
    let join = |a: &Option<Vec<NodeSelectorRequirement>>,
                b: &Option<Vec<NodeSelectorRequirement>>| {
        let both: Vec<NodeSelectorRequirement> =
            a.iter().chain(b.iter()).flatten().cloned().collect();
        (!both.is_empty()).then_some(both)
    };
    NodeSelectorTerm {
        match_expressions: join(&left.match_expressions, &right.match_expressions),
        match_fields: join(&left.match_fields, &right.match_fields),
    }
}

/// `affinity` with `terms` (ORed among themselves) required as well (pure). Kubernetes ORs a required
/// node affinity's terms, so requiring "any existing term AND any GPU term" takes every pair of them
/// (the existing terms' requirements joined with each GPU term's); without existing terms the GPU terms
/// are the required ones. Preferred terms and pod (anti-)affinity stay as they are; `nodeSelector` is
/// separate and ANDed by Kubernetes anyway.
pub fn require_any(affinity: Option<Affinity>, terms: Vec<NodeSelectorTerm>) -> Option<Affinity> {
    if terms.is_empty() {
        return affinity;
    }
    let mut affinity = affinity.unwrap_or_default();
    let mut node = affinity.node_affinity.take().unwrap_or_default();
    let existing = node
        .required_during_scheduling_ignored_during_execution
        .take()
        .map(|selector| selector.node_selector_terms)
        .unwrap_or_default();
    let required = if existing.is_empty() {
        terms
    } else {
        existing
            .iter()
            .flat_map(|old| terms.iter().map(move |new| and_terms(old, new)))
            .collect()
    };
    node.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: required,
    });
    affinity.node_affinity = Some(node);
    Some(affinity)
}

/// What a GPU sandbox whose Pod is not scheduled adds to the scheduler's message: how many GPUs of
/// which types it waits for (pure); `None` without GPUs.
pub fn unschedulable_hint(spec: &SandboxSpec) -> Option<String> {
    let gpu = request_of(spec)?;
    let count = match gpu.count {
        1 => "1 GPU".to_string(),
        n => format!("{n} GPUs"),
    };
    let names = gpu.type_names();
    Some(if names.is_empty() {
        format!("the sandbox asks for {count} on one node (any type)")
    } else {
        format!(
            "the sandbox asks for {count} on one node of GPU type {}",
            names.into_iter().collect::<Vec<_>>().join(" or ")
        )
    })
}

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod tests;
