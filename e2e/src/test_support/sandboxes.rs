//! Helpers shared by the end-to-end test binaries: Sandbox manifests and checks.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use orchard_api::{Sandbox, SandboxPhase};
use serde_json::json;

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

/// The agent token of a sandbox.
pub async fn token_of(client: &kube::Client, namespace: &str, sandbox: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get(&format!("{sandbox}-agent-token"))
        .await
        .expect("token secret exists");
    String::from_utf8(secret.data.expect("secret has data")["token"].0.clone())
        .expect("token is text")
}
