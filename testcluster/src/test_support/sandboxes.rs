//! Helpers shared by the end-to-end test binaries: Sandbox manifests and checks.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::Api;
use orchard_api::{Sandbox, SandboxPhase};
use orchard_operator::app::token_key::{TOKEN_KEY_SECRET, key_of};
use orchard_operator::plumbing::operator_key::OperatorKey;
use serde_json::json;

use crate::control_plane::OPERATOR_NAMESPACE;

/// A Sandbox object from a spec in JSON.
pub fn sandbox(name: &str, spec: serde_json::Value) -> Sandbox {
    serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("valid sandbox JSON")
}

/// Condition for `wait::until`: `Ready=True`.
pub fn is_ready(s: Option<&Sandbox>) -> bool {
    s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Condition for `wait::until`: phase Failed.
pub fn is_failed(s: Option<&Sandbox>) -> bool {
    s.and_then(|s| s.status.as_ref())
        .is_some_and(|st| st.phase == Some(SandboxPhase::Failed))
}

/// The agent token of a sandbox, derived as the operator derives it: from the key Secret in the
/// operator's namespace and the annotations of the sandbox's pod.
pub async fn token_of(client: &kube::Client, namespace: &str, sandbox: &str) -> String {
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), namespace);
    let pod_name = sandboxes
        .get(sandbox)
        .await
        .expect("sandbox exists")
        .status
        .and_then(|s| s.pod_name)
        .unwrap_or_else(|| sandbox.to_string());
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = pods.get(&pod_name).await.expect("the sandbox's pod exists");
    let key = token_key(client).await.expect("the key Secret exists");
    orchard_operator::pod::token::token_of(&key, &pod).expect("the pod's token can be derived")
}

/// The operator's agent-token key, from its Secret in the operator's namespace (`None` before the
/// operator created it).
pub async fn token_key(client: &kube::Client) -> Option<OperatorKey> {
    let keys: Api<Secret> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let secret = keys
        .get_opt(TOKEN_KEY_SECRET)
        .await
        .expect("get the key Secret")?;
    Some(key_of(&secret).expect("a valid key"))
}
