//! The local test cluster of Orchard Env, shared by the end-to-end tests (`e2e/`, package
//! `orchard-e2e`) and the benchmarks (`bench/`, package `orchard-bench`).
//!
//! There is no container engine on the development machines, so instead of kind or k3d this crate
//! runs the real upstream control plane ([`control_plane`]: etcd, kube-apiserver,
//! kube-controller-manager, built from pinned Go modules) and a node: the hollow node of our own
//! ([`hollow_node`]) that runs each pod's agent as a process on its own loopback address, the real
//! node ([`real_node`]: kubelet, containerd, runc), or many KWOK nodes ([`kwok`]: pods without
//! processes, for the control plane at scale). [`env::TestEnv`] puts it together with the CRDs and
//! the operator process; [`test_support`] holds what several tests use, [`fake_internet`] gives
//! real-node tests outside hosts under names of a DNS server of their own, and `orchard-local-cluster`
//! starts the cluster by hand (`make demo`). See `docs/TESTING.md`.

pub mod binaries;
pub mod chart_install;
pub mod churn;
pub mod cluster_process;
pub mod control_plane;
pub mod crds;
pub mod doc_blocks;
pub mod env;
pub mod error;
pub mod fake_internet;
pub mod hollow_node;
pub mod kwok;
pub mod operator_process;
pub mod port_forward;
pub mod ports;
pub mod proc_stats;
pub mod real_node;
pub mod supervise;
pub mod tcp_proxy;
pub mod test_support;
pub mod wait;

use std::time::Duration;

/// Now as RFC 3339 with whole seconds (the `metav1.Time` format).
pub fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", now)
        .unwrap_or_else(|_| now.to_string())
}

/// How long a pooled connection to the gateway may stay idle before the client drops it: below the
/// gateway's header-read timeout (10 s by default), which closes idle kept-alive connections. A
/// client that keeps them longer can send a request just as the gateway closes the connection and
/// gets `IncompleteMessage` ("error sending request"); httpx, under the Python SDK, drops them after
/// 5 s too.
pub const GATEWAY_POOL_IDLE: Duration = Duration::from_secs(5);

/// An HTTP client builder for calls to the gateway (pooled connections dropped after
/// [`GATEWAY_POOL_IDLE`]).
pub fn gateway_http_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().pool_idle_timeout(GATEWAY_POOL_IDLE)
}

/// `error: cause: cause ...`: an error with its chain of sources (reqwest's own message leaves out
/// what hyper and the socket said).
pub fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// An HTTP client for calls to the gateway (see [`gateway_http_builder`]).
pub fn gateway_http() -> reqwest::Client {
    gateway_http_builder()
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// A plain-HTTP GET (status code and body) for health and metrics endpoints, within 10 s.
pub async fn http_get(address: &str, path: &str) -> std::io::Result<(u16, String)> {
    let response = reqwest::Client::new()
        .get(format!("http://{address}{path}"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(std::io::Error::other)?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(std::io::Error::other)?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_is_shown_with_its_causes() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error sending request")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let error = Outer(std::io::Error::new(
            std::io::ErrorKind::NetworkUnreachable,
            "Network is unreachable",
        ));
        assert_eq!(
            super::with_causes(&error),
            "error sending request: Network is unreachable"
        );
        assert_eq!(super::with_causes(&std::io::Error::other("alone")), "alone");
    }
}
