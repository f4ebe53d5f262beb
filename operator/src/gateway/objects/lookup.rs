//! Finding what a request names: sandboxes and groups from the watch caches (one API read only when
//! the cache does not have the object yet, e.g. right after it was created), whether a sandbox's agent
//! can take calls, and the sandbox's agent token, derived from its pod under the operator's key.

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;

use axum::http::uri::{Authority, Scheme};
use axum::http::{HeaderValue, Uri};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};

use super::recent_deletes::RecentDeletes;
use crate::gateway::http::errors::{ApiError, from_kube};
use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::sealed_for;
use crate::pod::agent_target::endpoint_of_own_pod;
use crate::pod::lookup::{cached_pod, own_pod_name};
use crate::pod::token::token_of;
use orchard_api::{Sandbox, SandboxPhase};

/// The agent endpoint of a sandbox that can take calls, from its own Ready pod in the cache (`pod`,
/// sealed for the sandbox under `key`), or the 409 saying why it cannot (pure). `status.agentEndpoint`
/// and a Ready condition in the status are not trusted: whoever may patch the status could forge them,
/// as whoever may create a Pod could forge its controller reference.
pub fn agent_endpoint(
    sandbox: &Sandbox,
    pod: Option<&CachedPod>,
    agent_port: u16,
    key: &OperatorKey,
) -> Result<String, ApiError> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let name = sandbox.name_any();
    if sandbox.meta().deletion_timestamp.is_some() {
        return Err(ApiError::not_ready(&namespace, &name, Some("Terminating")));
    }
    let status = sandbox.status.as_ref();
    let phase = status.and_then(|s| s.phase).map(SandboxPhase::as_str);
    let ready =
        status.is_some_and(|s| crate::plumbing::conditions::is_true(&s.conditions, "Ready"));
    match pod.and_then(|pod| endpoint_of_own_pod(sandbox, pod, agent_port, key)) {
        Some(endpoint) if ready => Ok(endpoint),
        _ => Err(ApiError::not_ready(&namespace, &name, phase)),
    }
}

/// An object from `store`, or from one API read when the cache does not have it (yet), or shows an
/// incarnation this replica deleted (`deletes`); 404 if neither.
pub async fn find<K>(
    client: &Client,
    store: &Store<K>,
    deletes: &RecentDeletes,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<Arc<K>, ApiError>
where
    K: crate::plumbing::writes::Child,
{
    if let Some(object) = deletes.visible(store.get(&ObjectRef::new(name).within(namespace))) {
        return Ok(object);
    }
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(object)) => Ok(Arc::new(object)),
        Ok(None) => Err(ApiError::not_found(kind, namespace, name)),
        Err(err) => Err(from_kube(&err, &format!("{kind} {namespace}/{name}"))),
    }
}

/// The sandbox `namespace/name`.
pub async fn find_sandbox(
    client: &Client,
    store: &Store<Sandbox>,
    deletes: &RecentDeletes,
    namespace: &str,
    name: &str,
) -> Result<Arc<Sandbox>, ApiError> {
    find(client, store, deletes, "sandbox", namespace, name).await
}

/// The sandbox's pod from the cache; for a sandbox that claimed a pool member moments ago, whose
/// claim the pod cache may not show yet (the member still looks like its pool's), one API read.
/// Whichever it returns, [`agent_endpoint`] checks that it is the sandbox's own.
pub async fn own_pod(
    client: &Client,
    pods: &Store<CachedPod>,
    sandbox: &Sandbox,
    key: &OperatorKey,
) -> Option<Arc<CachedPod>> {
    let cached = cached_pod(pods, sandbox, key);
    let uid = sandbox.uid().unwrap_or_default();
    let lagging = sandbox.spec.pool.is_some()
        && cached
            .as_ref()
            .is_some_and(|pod| !sealed_for(pod.as_ref(), &uid, key));
    if !lagging {
        return cached;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &sandbox.namespace().unwrap_or_default());
    match api.get_opt(&own_pod_name(sandbox)).await {
        Ok(Some(pod)) => Some(Arc::new(CachedPod::from(&pod))),
        _ => cached,
    }
}

/// An agent's endpoint and token, and the `Authorization` header of calls to it (made once with
/// them, not on every call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentAccess {
    /// Base URL of the agent, `http://<podIP>:<port>`.
    pub endpoint: String,
    /// Its `<podIP>:<port>`, parsed once.
    pub authority: Authority,
    /// The same as the `Host` header of calls to it.
    pub host: HeaderValue,
    /// The sandbox's agent token.
    pub token: String,
    /// `Bearer <token>`, marked sensitive.
    pub authorization: HeaderValue,
}

impl AgentAccess {
    /// The access to the agent at `endpoint` (`http://<host>:<port>`) with `token`; an endpoint of
    /// another form, or a token that is not header text, is a 500.
    pub fn new(endpoint: String, token: String) -> Result<Self, ApiError> {
        let authority = endpoint
            .strip_prefix("http://")
            .and_then(|authority| authority.parse::<Authority>().ok())
            .ok_or_else(|| {
                ApiError::internal(format!(
                    "the sandbox's agent endpoint {endpoint} is not http://<host>:<port>"
                ))
            })?;
        let mut authorization =
            HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                ApiError::internal("the sandbox's agent token is not valid header text")
            })?;
        authorization.set_sensitive(true);
        let host = HeaderValue::from_str(authority.as_str())
            .map_err(|_| ApiError::internal("the sandbox's agent endpoint is not header text"))?;
        Ok(Self {
            endpoint,
            authority,
            host,
            token,
            authorization,
        })
    }

    /// The URL of `path_and_query` (`/v1/exec`, `/v1/files?path=a`) at this agent.
    pub fn url(&self, path_and_query: String) -> Result<Uri, ApiError> {
        Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .map_err(|err| {
                ApiError::internal(format!("invalid agent URL at {}: {err}", self.endpoint))
            })
    }
}

/// The agent endpoint and token of `sandbox` (and the header made from it), which must be Ready in
/// `pod`, its own: the token derived from the pod's annotations under the operator's key (a pod
/// without them, or made under another key, cannot be called: 409 saying so).
pub fn agent_access(
    sandbox: &Sandbox,
    pod: Option<&CachedPod>,
    agent_port: u16,
    key: &OperatorKey,
) -> Result<AgentAccess, ApiError> {
    // Only the sandbox's own Ready pod gives an endpoint (its seal checked once, there).
    let endpoint = agent_endpoint(sandbox, pod, agent_port, key)?;
    let pod = pod.ok_or_else(|| {
        ApiError::not_ready(
            &sandbox.namespace().unwrap_or_default(),
            &sandbox.name_any(),
            None,
        )
    })?;
    let token = token_of(key, pod).map_err(|err| ApiError::conflict(err.to_string()))?;
    AgentAccess::new(endpoint, token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::mock_api::test_token_key;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use orchard_api::{SandboxSpec, SandboxStatus};

    fn sandbox(status: Option<SandboxStatus>) -> Sandbox {
        let mut s = Sandbox::new("s", SandboxSpec::default());
        s.metadata.namespace = Some("ns".into());
        s.metadata.uid = Some("uid-s".into());
        s.status = status;
        s
    }

    /// A Ready pod at 10.0.0.5 with a controller reference to the sandbox, as anyone who may create
    /// Pods can make one.
    fn planted_pod(s: &Sandbox) -> CachedPod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s", "namespace": "ns", "ownerReferences": [{
                "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox", "name": "s",
                "uid": s.metadata.uid, "controller": true}]},
            "status": {"podIP": "10.0.0.5", "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .expect("a pod")
    }

    /// The sandbox's own Ready pod at 10.0.0.5: the planted pod sealed by the operator.
    fn own_pod(s: &Sandbox) -> CachedPod {
        let mut pod = planted_pod(s);
        crate::plumbing::ownership::seal(&mut pod, &test_token_key());
        pod
    }

    fn endpoint(s: &Sandbox, pod: Option<&CachedPod>) -> Result<String, ApiError> {
        agent_endpoint(s, pod, 9090, &test_token_key())
    }

    fn ready_condition(status: &str) -> Condition {
        Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: "AgentReady".into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    #[test]
    fn ready_sandboxes_give_their_endpoint() {
        let s = sandbox(Some(SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            conditions: vec![ready_condition("True")],
            agent_endpoint: Some("http://169.254.169.254:80".into()),
            ..SandboxStatus::default()
        }));
        let pod = own_pod(&s);
        assert_eq!(
            endpoint(&s, Some(&pod)).unwrap(),
            "http://10.0.0.5:9090",
            "from the pod, whatever the status says"
        );
        assert_eq!(
            endpoint(&s, None).unwrap_err().status,
            409,
            "no pod, no calls"
        );
        let mut foreign = own_pod(&s);
        foreign.metadata.owner_references = None;
        assert_eq!(
            endpoint(&s, Some(&foreign)).unwrap_err().status,
            409,
            "a pod that is not the sandbox's own is never called"
        );
        assert_eq!(
            endpoint(&s, Some(&planted_pod(&s))).unwrap_err().status,
            409,
            "a pod planted with the sandbox's controller reference but no seal is never called"
        );
        let mut forged = planted_pod(&s);
        forged.metadata.annotations = Some(std::collections::BTreeMap::from([(
            orchard_api::SEAL_ANNOTATION.to_string(),
            test_token_key().seal("Pod", "ns", "other", "uid-s"),
        )]));
        assert_eq!(
            endpoint(&s, Some(&forged)).unwrap_err().status,
            409,
            "nor one carrying another pod's seal"
        );
        let mut not_ready = own_pod(&s);
        not_ready
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".into();
        assert_eq!(endpoint(&s, Some(&not_ready)).unwrap_err().status, 409);
    }

    #[test]
    fn sandboxes_not_ready_are_409_with_their_phase() {
        let pending = endpoint(&sandbox(None), None).unwrap_err();
        assert_eq!(pending.status, 409);
        assert_eq!(pending.body.phase.as_deref(), Some("Pending"));
        let starting = endpoint(
            &sandbox(Some(SandboxStatus {
                phase: Some(SandboxPhase::Starting),
                conditions: vec![ready_condition("False")],
                agent_endpoint: Some("http://10.0.0.5:9090".into()),
                ..SandboxStatus::default()
            })),
            None,
        )
        .unwrap_err();
        assert_eq!(starting.body.phase.as_deref(), Some("Starting"));
        assert!(starting.body.retryable);
        let failed = endpoint(
            &sandbox(Some(SandboxStatus {
                phase: Some(SandboxPhase::Failed),
                ..SandboxStatus::default()
            })),
            None,
        )
        .unwrap_err();
        assert_eq!(failed.body.phase.as_deref(), Some("Failed"));
        assert!(!failed.body.retryable);
        let mut deleting = sandbox(Some(SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            conditions: vec![ready_condition("True")],
            agent_endpoint: Some("http://10.0.0.5:9090".into()),
            ..SandboxStatus::default()
        }));
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let pod = own_pod(&deleting);
        assert_eq!(
            endpoint(&deleting, Some(&pod))
                .unwrap_err()
                .body
                .phase
                .as_deref(),
            Some("Terminating")
        );
    }

    #[test]
    fn an_agent_access_carries_its_bearer_header_marked_sensitive() {
        let made =
            AgentAccess::new("http://10.0.0.1:9090".into(), "token-1".into()).expect("access");
        assert_eq!(made.authorization, "Bearer token-1");
        assert!(made.authorization.is_sensitive());
        let refused = AgentAccess::new("http://10.0.0.1:9090".into(), "a\nb".into());
        assert_eq!(refused.unwrap_err().status, 500, "not header text");
    }

    #[test]
    fn an_agent_access_makes_urls_at_its_endpoint() {
        let v4 = AgentAccess::new("http://10.0.0.1:9090".into(), "t".into()).expect("access");
        assert_eq!(v4.host, "10.0.0.1:9090");
        let url = v4.url("/v1/files?path=a%20b".into()).expect("url");
        assert_eq!(url.to_string(), "http://10.0.0.1:9090/v1/files?path=a%20b");
        let v6 = AgentAccess::new("http://[fd00::7]:9090".into(), "t".into()).expect("access");
        assert_eq!(
            v6.url("/v1/exec".into()).expect("url").to_string(),
            "http://[fd00::7]:9090/v1/exec"
        );
        assert_eq!(v4.url("/v1/a b".into()).unwrap_err().status, 500);
        for endpoint in [
            "https://10.0.0.1:9090",
            "10.0.0.1:9090",
            "http://10.0.0.1:9090/x",
        ] {
            let refused = AgentAccess::new(endpoint.into(), "t".into());
            assert_eq!(refused.unwrap_err().status, 500, "{endpoint}");
        }
    }
}
