//! The pods' one write of their own: the namespace baseline policy every sandbox Pod and pool member
//! sits under (default-deny egress, agent ingress only from the operator).

use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::ObjectRef;

use crate::plumbing::error::Result;
use crate::plumbing::kube_ctx::KubeCtx;
use crate::plumbing::own_writes::namespace_scope;
use crate::plumbing::writes::apply_owned;
use crate::pod::context::PodCtx;
use crate::pod::naming::BASELINE_POLICY;
use crate::pod::policy::baseline_policy;

/// Ensures the namespace baseline policy (default-deny egress, agent ingress only from the operator).
/// One apply per namespace at a time: the others wait for it and then find it done.
pub async fn ensure_baseline(kube: &KubeCtx, pods: &PodCtx, namespace: &str) -> Result<()> {
    let desired = baseline_policy(namespace, &pods.policy_shape());
    let scope = namespace_scope(namespace);
    let current = |p: &NetworkPolicy| p.spec == desired.spec;
    let cached = || {
        kube.caches
            .policies
            .get(&ObjectRef::new(BASELINE_POLICY).within(namespace))
            .is_some_and(|p| current(&p))
    };
    if cached() {
        return Ok(());
    }
    pods.baselines
        .with(namespace, async {
            apply_owned(
                kube,
                &kube.caches.policies,
                &scope,
                &desired,
                "apply",
                current,
            )
            .await
        })
        .await
}
