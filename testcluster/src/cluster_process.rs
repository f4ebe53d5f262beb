//! The local cluster in a process of its own (`orchard-local-cluster`), for the benchmarks: each
//! component's CPU is then its own, apart from the driver's. Stopped (SIGTERM, then waited for) when
//! dropped (its info file removed).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// A running `orchard-local-cluster` and what it wrote to its info file (kubeconfig, gateway URL,
/// metrics URL, admin token, pids, node images).
pub struct ClusterProcess {
    child: Child,
    info_file: PathBuf,
    /// The info file's JSON.
    pub info: Value,
}

impl ClusterProcess {
    /// Starts `orchard-local-cluster` from the directory of the running executable (the hollow node, or
    /// the real one with `real_node`), passing `operator_args` to the operator, and waits for its info.
    pub async fn start(
        name: &str,
        real_node: bool,
        operator_args: &[String],
    ) -> std::io::Result<Self> {
        Self::start_with(name, real_node, false, operator_args).await
    }

    /// [`ClusterProcess::start`], with the API server's audit log of writes (`logs/audit.log` under the
    /// info file's `logs`) when `audit_log`.
    pub async fn start_with(
        name: &str,
        real_node: bool,
        audit_log: bool,
        operator_args: &[String],
    ) -> std::io::Result<Self> {
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("."));
        let info_file = std::env::temp_dir().join(format!("{name}-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&info_file);
        let mut command = Command::new(exe_dir.join("orchard-local-cluster"));
        command.arg("--info-file").arg(&info_file);
        if real_node {
            command.arg("--real-node");
        }
        if audit_log {
            command.arg("--audit-log");
        }
        command.arg("--").args(operator_args);
        command.stdout(Stdio::null());
        let mut child = command.spawn()?;
        let info = loop {
            if let Ok(text) = std::fs::read_to_string(&info_file)
                && let Ok(info) = serde_json::from_str(&text)
            {
                break info;
            }
            if let Ok(Some(exit)) = child.try_wait() {
                return Err(std::io::Error::other(format!(
                    "orchard-local-cluster exited ({exit}) before it was ready"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        Ok(Self {
            child,
            info_file,
            info,
        })
    }

    /// A string field of the info file (empty when absent).
    pub fn field(&self, key: &str) -> String {
        self.info[key].as_str().unwrap_or_default().to_string()
    }
}

impl Drop for ClusterProcess {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.info_file);
    }
}

/// The 1-minute load average (`/proc/loadavg`), for benchmark reports.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
