//! Pods in the states tests need, and the shapes, owner and keys the pod builders' tests use (test
//! only).

use k8s_openapi::api::core::v1::{
    Container, ContainerState, Pod, PodCondition, PodSpec, PodStatus,
};

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use orchard_api::{Sandbox, SandboxSpec, SecurityProfile};

use crate::plumbing::cached_pod::{CachedContainerStatus, CachedPod};
use crate::plumbing::operator_key::OperatorKey;
use crate::pod::cidr::Cidr;
use crate::pod::naming::TASK_CONTAINER;
use crate::pod::policy::PolicyShape;
use crate::pod::policy_canary::PolicyCanaries;
use crate::pod::spec::{AgentInjection, PodShape};
use crate::pod::token::PodCredentials;

/// A sandbox Pod as the cache keeps it: on `node`, at `ip`, `Ready` or not.
pub fn pod(node: Option<&str>, ip: Option<&str>, ready: bool) -> CachedPod {
    CachedPod::from(&Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("s1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(String::from),
            containers: vec![Container {
                name: TASK_CONTAINER.into(),
                image: Some("python:3.11".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(if node.is_some() { "Running" } else { "Pending" }.into()),
            pod_ip: ip.map(String::from),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    })
}

pub fn with_task_state(mut pod: CachedPod, state: ContainerState) -> CachedPod {
    pod.status.as_mut().unwrap().container_statuses = Some(vec![CachedContainerStatus {
        name: TASK_CONTAINER.into(),
        state: Some(state),
        ..Default::default()
    }]);
    pod
}

pub fn with_pod_condition(mut pod: CachedPod, condition: PodCondition) -> CachedPod {
    if let Some(conditions) = pod.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        conditions.push(condition);
    }
    pod
}

pub fn shape() -> PodShape {
    PodShape {
        agent_image: "ghcr.io/orchard-env/orchard-agent:test".into(),
        agent_injection: AgentInjection::InitContainer,
        agent_port: 9090,
        default_cpu: "1".into(),
        default_memory: "2Gi".into(),
        default_ephemeral_storage: None,
        termination_grace_seconds: 5,
        default_security_profile: SecurityProfile::Default,
        policy_canaries: PolicyCanaries::default(),
        egress_proxy_url: None,
        gpu: crate::pod::gpu::GpuShape::default(),
        node_lost_seconds: None,
    }
}

pub fn policy_shape() -> PolicyShape {
    PolicyShape {
        agent_port: 9090,
        operator_namespace: "orchard-system".into(),
        operator_pod_labels: BTreeMap::from([(
            "app.kubernetes.io/name".into(),
            "orchard-operator".into(),
        )]),
        dns_namespace: "kube-system".into(),
        dns_pod_labels: BTreeMap::from([("k8s-app".into(), "kube-dns".into())]),
        protected_cidrs: vec![
            Cidr::parse("169.254.169.254/32").expect("cidr"),
            Cidr::parse("10.250.0.1/32").expect("cidr"),
            Cidr::parse("10.244.0.0/16").expect("cidr"),
        ],
        protect_operator_namespace: true,
        egress_proxy: None,
    }
}

pub fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "orchard.dev/v1alpha1".into(),
        kind: "Sandbox".into(),
        name: "s1".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }
}

pub fn sandbox(spec: SandboxSpec) -> Sandbox {
    let mut s = Sandbox::new("s1", spec);
    s.metadata.namespace = Some("ns".into());
    s.metadata.uid = Some("uid-1".into());
    s
}

pub fn minimal() -> Sandbox {
    sandbox(SandboxSpec {
        image: "python:3.11".into(),
        ..SandboxSpec::default()
    })
}

pub fn key() -> OperatorKey {
    crate::plumbing::mock_api::test_token_key()
}

pub fn credentials() -> PodCredentials {
    PodCredentials {
        nonce: "00".into(),
        key_id: "k".into(),
        verifier: "ab".repeat(32),
    }
}

pub fn env_value(pod: &Pod, key: &str) -> Option<String> {
    pod.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == key)
        .and_then(|e| e.value.clone())
}

/// `s`'s labels on an otherwise minimal Sandbox (no owner).
pub fn minimal_with_labels(s: &Sandbox) -> Sandbox {
    let mut plain = minimal();
    plain.metadata.labels = s.metadata.labels.clone();
    plain
}
