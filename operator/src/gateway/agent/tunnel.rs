//! Port forwarding: `GET .../sandboxes/{name}/ports/{port}/tunnel` with `Connection: Upgrade` and
//! `Upgrade: tcp`. The gateway authorises `create sandboxes/portforward`, opens the agent's own tunnel
//! (`GET /v1/ports/{port}/tunnel` on the pod IP, with the sandbox's token), and only once the agent has
//! connected to the port and switched protocols does it answer `101 Switching Protocols` itself and
//! splice the two upgraded connections. An agent that refuses (nothing listens: 502 with the connect
//! error) is passed back unchanged, before anything is upgraded.
//!
//! The tunnel reaches the port on the pod's loopback through the agent's port, so it opens no port in
//! the sandbox's NetworkPolicies. Its caller is checked again like an exec stream's (every half auth
//! cache TTL): a revoked token or RoleBinding closes both connections.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use orchard_api::agent::{NOT_AN_UPGRADE, TUNNEL_PROTOCOL, asks_for_tunnel, parse_port};
use tokio::sync::OwnedSemaphorePermit;
use utoipa::IntoParams;

use super::proxy::{
    AgentFailure, AgentProxy, NotifyOnEnd, Target, agent_error, classify, passed_through,
};
use crate::gateway::auth::access::{Access, Operation};
use crate::gateway::auth::revalidate::Guard;
use crate::gateway::http::errors::{ApiError, ErrorBody};
use crate::gateway::objects::names::{check_name, check_namespace};
use crate::gateway::state::{Call, ObjectPath, PathNames, State};

/// Path parameters of the tunnel route.
#[derive(serde::Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct TunnelPath {
    /// Namespace.
    pub namespace: String,
    /// Name of the sandbox.
    pub name: String,
    /// Port inside the sandbox's network namespace (1–65535); the agent connects to it on 127.0.0.1,
    /// then on [::1].
    pub port: String,
}

impl PathNames for TunnelPath {
    fn check_names(&self) -> Result<(), ApiError> {
        check_namespace(&self.namespace)?;
        check_name(&self.name)
    }
}

/// Whether `headers` ask for a tunnel (`Connection: Upgrade`, `Upgrade: tcp`).
fn asks_for_tcp_upgrade(headers: &HeaderMap) -> bool {
    let values = |name| {
        headers
            .get_all(name)
            .into_iter()
            .filter_map(|value| value.to_str().ok())
    };
    asks_for_tunnel(values(header::CONNECTION), values(header::UPGRADE))
}

/// 503 `Overloaded` when `--gateway-max-tunnels` tunnels are open.
fn too_many_tunnels(state: &State) -> ApiError {
    state
        .metrics
        .throttled
        .with_label_values(&["tunnels"])
        .inc();
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "Overloaded",
        format!(
            "the gateway has its maximum of {} tunnels open (--gateway-max-tunnels, Helm gateway.maxTunnels); retry after the Retry-After delay",
            state.deps.limits.gateway_max_tunnels
        ),
    )
    .retryable(true)
    .retry_after(1)
}

/// Opens a TCP tunnel to a port inside the sandbox (see the module documentation). Once answered
/// `101`, the connection carries raw bytes both ways until either end closes it.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/ports/{port}/tunnel",
    tag = "agent",
    operation_id = "port_tunnel",
    params(
        TunnelPath,
        ("Connection" = String, Header, description = "`Upgrade`"),
        ("Upgrade" = String, Header, description = "`tcp`"),
    ),
    responses(
        (status = 101, description = "Switched to a raw TCP stream to the port"),
        (status = 400, description = "Not an upgrade to `tcp`, or the port is not 1–65535", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `create sandboxes/portforward`", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "`NotReady` with the sandbox's phase", body = ErrorBody),
        (status = 429, description = "The agent has its maximum of tunnels open", body = ErrorBody),
        (status = 502, description = "Nothing accepts connections on the port (the message has the connect errors), or the agent is unreachable", body = ErrorBody),
        (status = 503, description = "`Overloaded`: `--gateway-max-tunnels` tunnels are open (retryable)", body = ErrorBody),
    )
)]
pub async fn tunnel(
    Call(state, path, headers): Call<TunnelPath>,
    mut request: Request,
) -> Result<Response, ApiError> {
    let port = parse_port(&path.port).map_err(ApiError::bad_request)?;
    if !asks_for_tcp_upgrade(&headers) {
        return Err(ApiError::bad_request(NOT_AN_UPGRADE));
    }
    let access = Access::of(Operation::PortForward, &path.namespace, &path.name);
    state.auth.authorize(&headers, &access).await?;
    let object = ObjectPath {
        namespace: path.namespace.clone(),
        name: path.name.clone(),
    };
    let sandbox = state.sandbox(&object).await?;
    let agent = state.agent_access(&sandbox).await?;
    state.heartbeats.activity(&sandbox);
    let Ok(slot) = Arc::clone(&state.tunnels).try_acquire_owned() else {
        return Err(too_many_tunnels(&state));
    };
    let target = Target {
        namespace: &path.namespace,
        name: &path.name,
        agent,
    };
    let agent = match state.proxy.open_tunnel(&target, port).await? {
        Ok(upgraded) => upgraded,
        Err(refused) => return Ok(refused),
    };
    let client = hyper::upgrade::on(&mut request);
    tokio::spawn(splice(state, headers, access, slot, client, agent, port));
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let answer = response.headers_mut();
    answer.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    answer.insert(header::UPGRADE, HeaderValue::from_static(TUNNEL_PROTOCOL));
    Ok(response)
}

/// Copies bytes between the client's upgraded connection and the agent's until either closes, or
/// until the caller loses access.
async fn splice(
    state: State,
    headers: HeaderMap,
    access: Access,
    slot: OwnedSemaphorePermit,
    client: hyper::upgrade::OnUpgrade,
    agent: Upgraded,
    port: u16,
) {
    let _slot = slot;
    let open = state.metrics.open_tunnels.clone();
    open.inc();
    let copied = async {
        let client = client
            .await
            .map_err(|error| ApiError::internal(format!("the client's upgrade failed: {error}")))?;
        let (mut client, mut agent) = (TokioIo::new(client), TokioIo::new(agent));
        tokio::io::copy_bidirectional(&mut client, &mut agent)
            .await
            .map_err(|error| ApiError::internal(format!("the tunnel broke: {error}")))
    };
    match Guard::new(&state, &headers, &access).run(copied).await {
        Ok((sent, received)) => tracing::debug!(%access, port, sent, received, "tunnel closed"),
        Err(error) if error.body.code == "AccessRevoked" => {
            tracing::info!(%access, port, "tunnel cut: the caller's access was revoked");
        }
        Err(error) => tracing::debug!(%access, port, message = %error.body.message, "tunnel ended"),
    }
    open.dec();
}

impl AgentProxy {
    /// Asks the agent of `target` for a tunnel to `port`: the upgraded connection once it switched
    /// protocols, or its answer to pass back (it refused: nothing listens, too many tunnels), or the
    /// gateway's error when it gave none.
    pub async fn open_tunnel(
        &self,
        target: &Target<'_>,
        port: u16,
    ) -> Result<Result<Upgraded, Response>, ApiError> {
        let uri = target.agent.url(format!("/v1/ports/{port}/tunnel"))?;
        let (body, _sent) = NotifyOnEnd::new(Body::empty());
        let request = axum::http::Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(header::AUTHORIZATION, target.agent.authorization.clone())
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, TUNNEL_PROTOCOL)
            .body(body)
            .map_err(|err| ApiError::internal(format!("cannot build the agent request: {err}")))?;
        let failed = |failure: AgentFailure| {
            self.metrics
                .agent_errors
                .with_label_values(&[failure.label()])
                .inc();
            agent_error(failure, &Method::GET, target)
        };
        // The agent connects to the port (at most 5 s per address) before it answers.
        let answer = tokio::time::timeout(TUNNEL_ANSWER_TIMEOUT, self.client.request(request))
            .await
            .map_err(|_| failed(AgentFailure::Timeout))?
            .map_err(|error| failed(classify(&error)))?;
        if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Ok(Err(passed_through(answer)));
        }
        hyper::upgrade::on(answer)
            .await
            .map(Ok)
            .map_err(|_| failed(AgentFailure::Broken))
    }
}

/// Longest wait for the agent's answer to a tunnel request (it tries 127.0.0.1 and [::1], 5 s each).
const TUNNEL_ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_upgrades_to_tcp_open_tunnels() {
        let mut headers = HeaderMap::new();
        assert!(!asks_for_tcp_upgrade(&headers));
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!asks_for_tcp_upgrade(&headers));
        headers.insert(header::UPGRADE, HeaderValue::from_static("tcp"));
        assert!(asks_for_tcp_upgrade(&headers));
    }
}
