//! The local test cluster and end-to-end test harness of Orchard Env.
//!
//! There is no container engine on the development machines, so instead of kind or k3d this crate
//! runs the real upstream control plane ([`control_plane`]: etcd, kube-apiserver,
//! kube-controller-manager, built from pinned Go modules) and a node of our own ([`node`]) that runs
//! each pod's agent as a process on its own loopback address. [`env::TestEnv`] puts it together with
//! the CRDs and the operator process; tests live in `tests/`, and `orchard-local-cluster` serves
//! `make demo`. See `docs/TESTING.md`.

pub mod binaries;
pub mod chart_install;
pub mod churn;
pub mod control_plane;
pub mod crds;
pub mod docs;
pub mod env;
pub mod error;
pub mod hollow_node;
pub mod operator_process;
pub mod port_forward;
pub mod ports;
pub mod proc_stats;
pub mod real_node;
pub mod supervise;
pub mod wait;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Now as RFC 3339 with whole seconds (the `metav1.Time` format).
pub fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", now)
        .unwrap_or_else(|_| now.to_string())
}

/// A minimal HTTP/1.0 GET (status code and body) for health and metrics endpoints.
pub async fn http_get(address: &str, path: &str) -> std::io::Result<(u16, String)> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let text = String::from_utf8_lossy(&response).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other("no HTTP status line"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .map_err(|_| std::io::Error::other("HTTP GET timed out"))?
}
