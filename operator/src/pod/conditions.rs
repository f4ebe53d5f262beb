//! A Pod's conditions (pure): the one of a type, and whether it is Ready. Below both `health` and
//! `disruption`, which read them.

use crate::plumbing::cached_pod::CachedPod;

/// The condition `type_` of `pod`, if it has one.
pub fn pod_condition<'a>(
    pod: &'a CachedPod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// Whether `pod`'s `Ready` condition is `True` (pure).
pub fn pod_ready(pod: &CachedPod) -> bool {
    pod_condition(pod, "Ready").is_some_and(|c| c.status == "True")
}
