//! Where the proxy's decisions go: Prometheus counters for every one, and a Kubernetes Event on the
//! sandbox for each denial and each cut connection (`EgressDenied`, `EgressCut`), so a task author sees
//! with `kubectl describe sandbox` (or `kubectl get events`) what was refused and why. Events repeat at
//! most once a minute per sandbox and destination, and are sent by one task from a bounded queue: a
//! task hammering a denied host costs counters, not API writes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::audit::{Audit, Record, Via};
use super::metrics::{EgressMetrics, NO_RULE};
use super::rules::Decision;
use super::table::SandboxPolicy;

/// Shortest time between two events about one sandbox and destination.
pub const EVENT_REPEAT: Duration = Duration::from_secs(60);

/// Most remembered (sandbox, destination) pairs before the memory starts over.
const MAX_REMEMBERED: usize = 10_000;

/// Events waiting to be sent; beyond this they are dropped (the counters still count).
const EVENT_QUEUE: usize = 1024;

/// One event to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    /// The sandbox it is about.
    pub object: ObjectReference,
    /// `EgressDenied` or `EgressCut`.
    pub reason: &'static str,
    /// `Connect <host>:<port>` or `Cut <host>:<port>`: the Recorder folds repeats of one (reason,
    /// action) into a series, so each destination keeps an event of its own.
    pub action: String,
    /// One line for humans.
    pub note: String,
}

/// The event text of a refused connection (pure).
pub fn denial_note(via: &Via, host: &str, port: u16, reason: &str) -> String {
    let what = match via {
        Via::Connect => "CONNECT",
        Via::Http => "HTTP request to",
    };
    format!("{what} {host}:{port} refused: {reason}")
}

/// A reference to the sandbox of `policy`.
fn reference(policy: &SandboxPolicy) -> ObjectReference {
    ObjectReference {
        api_version: Some("orchard.dev/v1alpha1".into()),
        kind: Some("Sandbox".into()),
        namespace: Some(policy.namespace.clone()),
        name: Some(policy.name.clone()),
        uid: Some(policy.uid.clone()),
        ..ObjectReference::default()
    }
}

/// Metrics and events of the proxy's decisions.
pub struct Sink {
    metrics: Arc<EgressMetrics>,
    notes: mpsc::Sender<Note>,
    recent: Mutex<HashMap<(String, String, u16), Instant>>,
}

impl Sink {
    /// A sink counting into `metrics` and queueing events for [`publish_notes`].
    pub fn new(metrics: Arc<EgressMetrics>) -> (Self, mpsc::Receiver<Note>) {
        let (notes, receiver) = mpsc::channel(EVENT_QUEUE);
        (
            Self {
                metrics,
                notes,
                recent: Mutex::new(HashMap::new()),
            },
            receiver,
        )
    }

    /// Whether an event about `policy` and `host:port` is due (none in the last [`EVENT_REPEAT`]).
    fn due(&self, policy: &SandboxPolicy, host: &str, port: u16) -> bool {
        let Ok(mut recent) = self.recent.lock() else {
            return false;
        };
        let now = Instant::now();
        let key = (policy.uid.clone(), host.to_string(), port);
        if recent
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < EVENT_REPEAT)
        {
            return false;
        }
        if recent.len() >= MAX_REMEMBERED {
            recent.clear();
        }
        recent.insert(key, now);
        true
    }

    fn queue(&self, policy: &SandboxPolicy, reason: &'static str, action: String, note: String) {
        let note = Note {
            object: reference(policy),
            reason,
            action: action.chars().take(128).collect(),
            note,
        };
        if self.notes.try_send(note).is_err() {
            debug!("egress event queue full; event dropped");
        }
    }
}

impl Audit for Sink {
    fn record(&self, record: &Record<'_>) {
        let Some(policy) = record.sandbox else {
            self.metrics.unknown_source.inc();
            return;
        };
        let (rule, verdict) = match record.decision {
            Decision::Allow { rule } => (rule.as_str(), "allowed"),
            Decision::Deny { rule, .. } => (rule.as_deref().unwrap_or(NO_RULE), "denied"),
        };
        let sandbox = self.metrics.sandbox_label(&policy.namespace, &policy.name);
        self.metrics
            .connections
            .with_label_values(&[policy.namespace.as_str(), sandbox, rule, verdict])
            .inc();
        if let Decision::Deny { reason, .. } = record.decision
            && self.due(policy, record.host, record.port)
        {
            let note = denial_note(&record.via, record.host, record.port, reason);
            let action = format!("Connect {}:{}", record.host, record.port);
            self.queue(policy, "EgressDenied", action, note);
        }
    }

    fn cut(&self, sandbox: &SandboxPolicy, host: &str, port: u16) {
        let label = self
            .metrics
            .sandbox_label(&sandbox.namespace, &sandbox.name);
        self.metrics
            .cut
            .with_label_values(&[sandbox.namespace.as_str(), label])
            .inc();
        let note = format!(
            "open connection to {host}:{port} cut: generation {} of spec.network does not allow it",
            sandbox.generation
        );
        self.queue(sandbox, "EgressCut", format!("Cut {host}:{port}"), note);
    }
}

/// Publishes queued notes as Events until the queue closes.
pub async fn publish_notes(recorder: Recorder, mut notes: mpsc::Receiver<Note>) {
    while let Some(note) = notes.recv().await {
        let event = Event {
            type_: EventType::Warning,
            reason: note.reason.into(),
            note: Some(note.note.chars().take(1024).collect()),
            action: note.action,
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &note.object).await {
            warn!(%error, sandbox = note.object.name.as_deref().unwrap_or(""), "cannot publish egress event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::rules::Rules;

    fn policy() -> SandboxPolicy {
        SandboxPolicy {
            namespace: "ns".into(),
            name: "s".into(),
            uid: "u".into(),
            generation: 3,
            rules: Rules::of(None).expect("deny all"),
        }
    }

    #[test]
    fn denials_count_always_and_raise_an_event_once_a_minute_per_destination() {
        let metrics = Arc::new(EgressMetrics::new().expect("registry"));
        let (sink, mut notes) = Sink::new(metrics.clone());
        let policy = policy();
        let denied = Decision::Deny {
            rule: Some("huggingface.co".into()),
            reason: "matches network.deny huggingface.co".into(),
        };
        for _ in 0..3 {
            sink.record(&Record {
                source: "10.1.0.5".parse().expect("ip"),
                sandbox: Some(&policy),
                host: "huggingface.co",
                port: 443,
                via: Via::Connect,
                decision: &denied,
            });
        }
        let note = notes.try_recv().expect("one event");
        assert_eq!(note.reason, "EgressDenied");
        assert_eq!(
            note.note,
            "CONNECT huggingface.co:443 refused: matches network.deny huggingface.co"
        );
        assert_eq!(note.object.uid.as_deref(), Some("u"));
        assert_eq!(note.action, "Connect huggingface.co:443");
        assert!(
            notes.try_recv().is_err(),
            "repeats within a minute are not events"
        );
        assert!(metrics.render().contains(
            "orchard_egress_connections_total{namespace=\"ns\",rule=\"huggingface.co\",sandbox=\"s\",verdict=\"denied\"} 3"
        ));
        sink.cut(&policy, "pypi.org", 443);
        assert_eq!(notes.try_recv().expect("cut event").reason, "EgressCut");
    }
}
