//! What every handler shares ([`GatewayState`]), the extractors of a call (the names it targets,
//! checked, and the caller's headers) and the query types.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use kube::runtime::reflector::Store;
use serde::de::DeserializeOwned;
use serde_json::Value;
use utoipa::IntoParams;

use crate::gateway::agent::access_memo::AccessMemo;
use crate::gateway::agent::proxy::AgentProxy;
use crate::gateway::auth::access::{Access, Operation};
use crate::gateway::auth::{Authorizer, Identity};
use crate::gateway::deps::GatewayDeps;
use crate::gateway::http::body::BodyReader;
use crate::gateway::http::errors::ApiError;
use crate::gateway::http::metrics::GatewayMetrics;
use crate::gateway::objects::heartbeat::Heartbeats;
use crate::gateway::objects::lookup::{AgentAccess, agent_access, find, own_pod};
use crate::gateway::objects::names::{check_name, check_namespace};
use crate::gateway::objects::recent_deletes::RecentDeletes;
use crate::plumbing::writes::Child;
use orchard_api::{RolloutGroup, Sandbox, SandboxSnapshot};

/// Route templates (also the `route` label of the request metrics).
pub mod paths {
    /// Sandboxes of a namespace.
    pub const SANDBOXES: &str = "/v1/namespaces/{namespace}/sandboxes";
    /// One sandbox.
    pub const SANDBOX: &str = "/v1/namespaces/{namespace}/sandboxes/{name}";
    /// RolloutGroups of a namespace.
    pub const GROUPS: &str = "/v1/namespaces/{namespace}/rolloutgroups";
    /// One RolloutGroup.
    pub const GROUP: &str = "/v1/namespaces/{namespace}/rolloutgroups/{name}";
    /// SandboxSnapshots of a namespace.
    pub const SNAPSHOTS: &str = "/v1/namespaces/{namespace}/sandboxsnapshots";
    /// One SandboxSnapshot.
    pub const SNAPSHOT: &str = "/v1/namespaces/{namespace}/sandboxsnapshots/{name}";
}

/// Whether the Sandbox and RolloutGroup caches have received their first full list (set from the
/// change feed's `InitDone` notes). Until then, lists are read from the API server.
#[derive(Default)]
pub struct CachesFilled {
    /// Sandboxes.
    pub sandboxes: AtomicBool,
    /// RolloutGroups.
    pub rollout_groups: AtomicBool,
    /// SandboxSnapshots.
    pub snapshots: AtomicBool,
}

impl CachesFilled {
    /// Whether the cache of `kind` (`Sandbox`, `RolloutGroup`) is filled.
    pub fn is_filled(&self, kind: &str) -> bool {
        match kind {
            "Sandbox" => self.sandboxes.load(Ordering::Relaxed),
            "RolloutGroup" => self.rollout_groups.load(Ordering::Relaxed),
            "SandboxSnapshot" => self.snapshots.load(Ordering::Relaxed),
            _ => false,
        }
    }
}

/// Everything a handler needs.
pub struct GatewayState {
    /// The operator's client, caches, change feed and settings.
    pub deps: GatewayDeps,
    /// TokenReview + SubjectAccessReview with a short cache.
    pub auth: Authorizer,
    /// Coalesced heartbeat writes.
    pub heartbeats: Heartbeats,
    /// Pooled client of the agents.
    pub proxy: AgentProxy,
    /// Request metrics.
    pub metrics: GatewayMetrics,
    /// Cache fill flags.
    pub filled: CachesFilled,
    /// Objects this replica deleted that its caches may still show.
    pub recent_deletes: RecentDeletes,
    /// Reads the bodies of authorised create and result requests.
    pub bodies: BodyReader,
    /// A permit per open port-forward tunnel (`--gateway-max-tunnels`).
    pub tunnels: Arc<tokio::sync::Semaphore>,
    /// Agent endpoints and tokens already found, per version of a sandbox and its pod.
    pub access_memo: AccessMemo,
}

/// Shared state of the router.
pub type State = Arc<GatewayState>;

impl GatewayState {
    /// Authorises `operation` on `namespace`/`name` for the caller of `headers`.
    pub async fn authorize(
        &self,
        headers: &HeaderMap,
        operation: Operation,
        namespace: &str,
        name: &str,
    ) -> Result<Arc<Identity>, ApiError> {
        self.auth
            .authorize(headers, &Access::of(operation, namespace, name))
            .await
    }

    /// [`State::authorize`] for the object a route's path names.
    pub async fn authorize_object(
        &self,
        headers: &HeaderMap,
        operation: Operation,
        path: &ObjectPath,
    ) -> Result<Arc<Identity>, ApiError> {
        self.authorize(headers, operation, &path.namespace, &path.name)
            .await
    }

    /// The object `path` names, of the kind `store` caches (`noun` for messages): the watch cache,
    /// or one API read if the cache lacks it or shows an incarnation this replica deleted.
    async fn cached<K: Child>(
        &self,
        store: &Store<K>,
        noun: &str,
        path: &ObjectPath,
    ) -> Result<Arc<K>, ApiError> {
        let deletes = &self.recent_deletes;
        find(
            &self.deps.client,
            store,
            deletes,
            noun,
            &path.namespace,
            &path.name,
        )
        .await
    }

    /// The Sandbox a route's path names (see [`GatewayState::cached`]).
    pub async fn sandbox(&self, path: &ObjectPath) -> Result<Arc<Sandbox>, ApiError> {
        self.cached(&self.deps.reads.sandboxes, "sandbox", path)
            .await
    }

    /// The agent endpoint and token of `sandbox`, which must be Ready in a pod of its own (see
    /// [`agent_access`]).
    pub async fn agent_access(&self, sandbox: &Sandbox) -> Result<Arc<AgentAccess>, ApiError> {
        let pod = own_pod(
            &self.deps.client,
            &self.deps.reads.pods,
            sandbox,
            &self.deps.key,
        )
        .await;
        self.access_memo.get_or_find(sandbox, pod.as_deref(), || {
            agent_access(
                sandbox,
                pod.as_deref(),
                self.deps.settings.agent_port,
                &self.deps.key,
            )
        })
    }

    /// The RolloutGroup a route's path names (see [`GatewayState::cached`]).
    pub async fn group(&self, path: &ObjectPath) -> Result<Arc<RolloutGroup>, ApiError> {
        self.cached(&self.deps.reads.rollout_groups, "rolloutgroup", path)
            .await
    }

    /// The SandboxSnapshot a route's path names (see [`GatewayState::cached`]).
    pub async fn snapshot(&self, path: &ObjectPath) -> Result<Arc<SandboxSnapshot>, ApiError> {
        self.cached(&self.deps.reads.snapshots, "sandboxsnapshot", path)
            .await
    }
}

/// What a lifecycle route starts from: the gateway's state, its path parameters (`P`, their names
/// checked: see [`names`](crate::gateway::objects::names)) and the caller's headers (to authorise with).
pub struct Call<P>(pub State, pub P, pub HeaderMap);

impl<P: DeserializeOwned + Send + PathNames> FromRequestParts<State> for Call<P> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &State) -> Result<Self, Self::Rejection> {
        let Path(path) = Path::<P>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?;
        path.check_names().map_err(IntoResponse::into_response)?;
        Ok(Self(state.clone(), path, parts.headers.clone()))
    }
}

/// Path parameters that name a namespace and maybe an object.
pub trait PathNames {
    /// 400 unless every name is one Kubernetes could hold.
    fn check_names(&self) -> Result<(), ApiError>;
}

impl PathNames for NamespacePath {
    fn check_names(&self) -> Result<(), ApiError> {
        check_namespace(&self.namespace)
    }
}

impl PathNames for ObjectPath {
    fn check_names(&self) -> Result<(), ApiError> {
        check_namespace(&self.namespace)?;
        check_name(&self.name)
    }
}

/// Path parameters of collection routes.
#[derive(serde::Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NamespacePath {
    /// Namespace.
    pub namespace: String,
}

/// Path parameters of object routes.
#[derive(serde::Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ObjectPath {
    /// Namespace.
    pub namespace: String,
    /// Name of the object.
    pub name: String,
}

/// `?labelSelector=` of list routes.
#[derive(serde::Deserialize, IntoParams, Default)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Label selector, e.g. `experiment=e1,stage in (a,b)`.
    pub label_selector: Option<String>,
}

/// `?timeoutSeconds=` of wait routes.
#[derive(serde::Deserialize, IntoParams, Default)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Longest wait in seconds (default 30, at most 300; loop for longer waits).
    pub timeout_seconds: Option<f64>,
}

/// A query string, or the 400 naming what is wrong with it.
pub fn query<T: Default>(
    query: Result<axum::extract::Query<T>, QueryRejection>,
) -> Result<T, ApiError> {
    query
        .map(|q| q.0)
        .map_err(|err| ApiError::bad_request(format!("invalid query string: {}", err.body_text())))
}

impl GatewayState {
    /// The JSON object body of an authorised `caller`'s request (see [`BodyReader::read`]).
    pub async fn json_body(
        &self,
        caller: &Identity,
        headers: &HeaderMap,
        body: axum::body::Body,
    ) -> Result<Value, ApiError> {
        let bytes = self.bodies.read(&caller.username, headers, body).await?;
        json_value(&bytes)
    }
}

/// Parses a JSON request body (400 with serde's message otherwise).
pub fn json_value(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request needs a JSON body"));
    }
    serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("invalid JSON body: {err}")))
}
