//! `kubectl port-forward` as a test helper: started on a free local port (kubectl picks it and says
//! which), stopped when dropped.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::error::{E2eError, Result};

/// A running `kubectl port-forward`.
pub struct PortForward {
    child: tokio::process::Child,
    /// The local port (on 127.0.0.1).
    pub local_port: u16,
}

impl PortForward {
    /// Starts `kubectl port-forward <target> :<remote>` and waits until it says where it listens.
    pub async fn start(
        kubeconfig: &Path,
        namespace: &str,
        target: &str,
        remote: u16,
    ) -> Result<Self> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new("kubectl")
            .args([
                "port-forward",
                "--namespace",
                namespace,
                "--address",
                "127.0.0.1",
                target,
                &format!(":{remote}"),
            ])
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| E2eError::Setup(format!("cannot run kubectl port-forward: {e}")))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| E2eError::Setup("kubectl port-forward has no stdout".into()))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let line = tokio::time::timeout_at(deadline.into(), lines.next_line())
                .await
                .map_err(|_| E2eError::Setup("kubectl port-forward did not start in 30 s".into()))?
                .map_err(|e| E2eError::Setup(format!("kubectl port-forward: {e}")))?
                .ok_or_else(|| E2eError::Setup("kubectl port-forward exited".into()))?;
            if let Some(port) = forwarded_port(&line) {
                // Keep draining its output so that it never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                return Ok(Self {
                    child,
                    local_port: port,
                });
            }
        }
    }

    /// `http://127.0.0.1:<local port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.local_port)
    }

    /// Stops the forward.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The local port of kubectl's `Forwarding from 127.0.0.1:PORT -> REMOTE` line (pure).
pub fn forwarded_port(line: &str) -> Option<u16> {
    let rest = line.strip_prefix("Forwarding from 127.0.0.1:")?;
    rest.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarded_port_is_read_from_kubectl() {
        assert_eq!(
            forwarded_port("Forwarding from 127.0.0.1:41234 -> 8080"),
            Some(41234)
        );
        assert_eq!(forwarded_port("Handling connection for 41234"), None);
    }
}
