//! Pods in the states tests need (test only).

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStatus, Pod, PodCondition, PodSpec, PodStatus,
};

use crate::pod::build::TASK_CONTAINER;

pub fn pod(node: Option<&str>, ip: Option<&str>, ready: bool) -> Pod {
    Pod {
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
    }
}

pub fn with_task_state(mut pod: Pod, state: ContainerState) -> Pod {
    pod.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
        name: TASK_CONTAINER.into(),
        state: Some(state),
        ..Default::default()
    }]);
    pod
}

pub fn with_pod_condition(mut pod: Pod, condition: PodCondition) -> Pod {
    if let Some(conditions) = pod.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        conditions.push(condition);
    }
    pod
}
