//! The operator as a real process (the built `orchard-operator` binary) against the local cluster:
//! started, SIGKILLed and restarted by tests.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{E2eError, Result};
use crate::ports::free_ports;
use crate::supervise::{Child, Spec};

/// Image reference the operator injects on the hollow node (which maps it to the built agent binary);
/// the real node's environment passes its own registry's agent image instead.
pub const AGENT_IMAGE: &str = "orchard.local/orchard-agent:dev";

/// A running operator process.
pub struct OperatorProcess {
    spec: Spec,
    child: Mutex<Option<Child>>,
    /// Port of the admin server (`/metrics`, `/readyz`).
    pub metrics_port: u16,
    /// Port of the gateway.
    pub gateway_port: u16,
    /// Log file.
    pub log: PathBuf,
}

impl OperatorProcess {
    /// Starts `binary` with `kubeconfig`, logging to `log`, plus `extra_args`; waits for `/readyz`.
    pub async fn start(
        binary: &Path,
        kubeconfig: &Path,
        log: &Path,
        extra_args: &[String],
    ) -> Result<Self> {
        let ports = free_ports(2)?;
        let (metrics_port, gateway_port) = (ports[0], ports[1]);
        let mut args = vec![
            format!("--metrics-listen=127.0.0.1:{metrics_port}"),
            format!("--gateway-listen=127.0.0.1:{gateway_port}"),
            "--log-format=json".to_string(),
        ];
        if !extra_args.iter().any(|a| a.starts_with("--agent-image")) {
            args.push(format!("--agent-image={AGENT_IMAGE}"));
        }
        // An operator outside the cluster reaches agents only where no NetworkPolicy is enforced (the
        // hollow node; the real node without kube-router): sandboxes there would wait for ever.
        if !extra_args
            .iter()
            .any(|a| a.starts_with("--await-policy-enforcement"))
        {
            args.push("--await-policy-enforcement=false".to_string());
        }
        let mut spec = Spec::new("orchard-operator", binary)
            .args(args)
            .args(extra_args.iter().cloned())
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("ORCHARD_E2E_OPERATOR_LOG").unwrap_or_else(|_| "info".into()),
            )
            .log(log);
        spec.cwd = kubeconfig.parent().map(Path::to_path_buf);
        let process = Self {
            spec,
            child: Mutex::new(None),
            metrics_port,
            gateway_port,
            log: log.to_path_buf(),
        };
        process.launch().await?;
        Ok(process)
    }

    async fn launch(&self) -> Result<()> {
        self.launch_within(Duration::from_secs(60)).await
    }

    async fn launch_within(&self, timeout: Duration) -> Result<()> {
        let child = Child::spawn(self.spec.clone())?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        self.wait_ready(timeout).await
    }

    /// Waits for `/readyz` (watch caches filled).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(exit) = self
                .child
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(Child::reap)
            {
                return Err(E2eError::Setup(format!(
                    "orchard-operator exited ({exit:?}) during startup; log: {}",
                    self.log.display()
                )));
            }
            if let Ok((200, _)) =
                crate::http_get(&format!("127.0.0.1:{}", self.metrics_port), "/readyz").await
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(E2eError::NotReady {
            component: "orchard-operator".into(),
            seconds: timeout.as_secs(),
            detail: format!("log: {}", self.log.display()),
        })
    }

    /// SIGKILLs the operator (no graceful shutdown).
    pub fn kill(&self) {
        if let Some(child) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            child.kill_now();
        }
    }

    /// Starts the operator again with the same flags (after [`OperatorProcess::kill`]).
    pub async fn restart(&self) -> Result<()> {
        self.kill();
        self.launch().await
    }

    /// [`OperatorProcess::restart`], waiting up to `timeout` for `/readyz` (a cluster holding tens of
    /// thousands of objects takes longer to list than the usual minute).
    pub async fn restart_within(&self, timeout: Duration) -> Result<()> {
        self.kill();
        self.launch_within(timeout).await
    }

    /// Process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::pid)
    }

    /// `/metrics` text.
    pub async fn metrics(&self) -> Result<String> {
        let (status, body) =
            crate::http_get(&format!("127.0.0.1:{}", self.metrics_port), "/metrics").await?;
        if status != 200 {
            return Err(E2eError::Setup(format!("/metrics answered {status}")));
        }
        Ok(body)
    }

    /// Base URL of the gateway.
    pub fn gateway_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.gateway_port)
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sum of a counter family's samples in Prometheus text whose labels contain every `label=value`.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
