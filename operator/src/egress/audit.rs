//! Where the egress proxy reports what it decided: every request's decision, and every open
//! connection a policy change cut. Metrics and Kubernetes Events implement [`Audit`] elsewhere;
//! here are the no-op [`NoAudit`] and the [`RecordingAudit`] tests read back.

use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

use super::rules::Decision;
use super::table::SandboxPolicy;

/// How the client asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    /// `CONNECT host:port`: a tunnel (TLS, usually).
    Connect,
    /// An absolute-form plain-HTTP request, `GET http://host/path`.
    Http,
}

impl Via {
    /// Metric label: `connect` or `http`.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Connect => "connect",
            Via::Http => "http",
        }
    }
}

/// One decision of the proxy.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The client's address (IPv4-mapped IPv6 addresses as IPv4).
    pub source: IpAddr,
    /// The sandbox that has that address; `None` when none (or more than one) has it.
    pub sandbox: Option<&'a SandboxPolicy>,
    /// The host asked for, normalised (lowercase name, or bare IP address).
    pub host: &'a str,
    /// The port asked for.
    pub port: u16,
    /// How the client asked.
    pub via: Via,
    /// What the proxy decided.
    pub decision: &'a Decision,
}

/// Receives the proxy's decisions. Called on the request path: implementations must not block
/// (count, or queue for later).
pub trait Audit: Send + Sync + 'static {
    /// A request was allowed or denied.
    fn record(&self, record: &Record<'_>);
    /// An open connection of `sandbox` to `host:port` was cut because its policy no longer allows
    /// it (or the sandbox no longer has the connection's source address).
    fn cut(&self, sandbox: &SandboxPolicy, host: &str, port: u16);
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoAudit;

impl Audit for NoAudit {
    fn record(&self, _record: &Record<'_>) {}
    fn cut(&self, _sandbox: &SandboxPolicy, _host: &str, _port: u16) {}
}

/// A [`Record`] kept by [`RecordingAudit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The client's address.
    pub source: IpAddr,
    /// `namespace/name` of the sandbox, if one has the address.
    pub sandbox: Option<String>,
    /// The host asked for.
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// How the client asked.
    pub via: Via,
    /// What the proxy decided.
    pub decision: Decision,
}

/// A cut kept by [`RecordingAudit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    /// `namespace/name` of the sandbox.
    pub sandbox: String,
    /// The host of the connection.
    pub host: String,
    /// The port of the connection.
    pub port: u16,
}

/// Keeps every decision and cut, for tests.
#[derive(Debug, Default)]
pub struct RecordingAudit {
    records: Mutex<Vec<Recorded>>,
    cuts: Mutex<Vec<Cut>>,
    cut_seen: Notify,
}

impl RecordingAudit {
    /// The decisions so far, in order.
    pub fn records(&self) -> Vec<Recorded> {
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The cuts so far, in order.
    pub fn cuts(&self) -> Vec<Cut> {
        self.cuts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until at least `count` cuts were reported, and returns them all.
    pub async fn wait_for_cuts(&self, count: usize) -> Vec<Cut> {
        loop {
            let seen = self.cut_seen.notified();
            tokio::pin!(seen);
            // Registered before the check, so a cut between the check and the wait is not missed.
            seen.as_mut().enable();
            let cuts = self.cuts();
            if cuts.len() >= count {
                return cuts;
            }
            seen.await;
        }
    }
}

impl Audit for RecordingAudit {
    fn record(&self, record: &Record<'_>) {
        let kept = Recorded {
            source: record.source,
            sandbox: record.sandbox.map(ToString::to_string),
            host: record.host.to_string(),
            port: record.port,
            via: record.via,
            decision: record.decision.clone(),
        };
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(kept);
    }

    fn cut(&self, sandbox: &SandboxPolicy, host: &str, port: u16) {
        self.cuts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Cut {
                sandbox: sandbox.to_string(),
                host: host.to_string(),
                port,
            });
        self.cut_seen.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::rules::Rules;

    #[tokio::test]
    async fn recording_audit_keeps_decisions_and_wakes_cut_waiters() {
        let audit = std::sync::Arc::new(RecordingAudit::default());
        let sandbox = SandboxPolicy {
            namespace: "ns".into(),
            name: "s".into(),
            uid: "u".into(),
            generation: 1,
            rules: Rules::default(),
        };
        let decision = Decision::Allow {
            rule: "pypi.org".into(),
        };
        audit.record(&Record {
            source: "10.0.0.1".parse().expect("ip"),
            sandbox: Some(&sandbox),
            host: "pypi.org",
            port: 443,
            via: Via::Connect,
            decision: &decision,
        });
        assert_eq!(audit.records()[0].sandbox.as_deref(), Some("ns/s"));
        assert_eq!(audit.records()[0].via.as_str(), "connect");
        let waiter = tokio::spawn({
            let audit = audit.clone();
            async move { audit.wait_for_cuts(1).await }
        });
        audit.cut(&sandbox, "pypi.org", 443);
        let cuts = tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .expect("joined");
        assert_eq!(
            cuts,
            vec![Cut {
                sandbox: "ns/s".into(),
                host: "pypi.org".into(),
                port: 443
            }]
        );
        NoAudit.cut(&sandbox, "pypi.org", 443);
    }
}
