//! Prometheus metrics of the egress proxy (its own registry, served on its admin port's `/metrics`;
//! listed in docs/METRICS.md). Per-sandbox series are bounded: at most [`MAX_SANDBOX_SERIES`]
//! sandboxes get their own label values (the rest count under `sandbox="_other"`), the `rule` label
//! is the spec's own pattern or CIDR (never the requested name), and a deleted sandbox's series go.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{Encoder, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

/// Most sandboxes with series of their own.
pub const MAX_SANDBOX_SERIES: usize = 2000;

/// The `sandbox` label of every sandbox beyond [`MAX_SANDBOX_SERIES`].
pub const OTHER: &str = "_other";

/// The `rule` label of a connection no rule allowed.
pub const NO_RULE: &str = "_none";

/// Every metric of the egress proxy.
pub struct EgressMetrics {
    registry: Registry,
    /// `orchard_egress_connections_total{namespace, sandbox, rule, verdict}`: decisions (`allowed`,
    /// `denied`), by the rule that decided.
    pub connections: IntCounterVec,
    /// `orchard_egress_cut_connections_total{namespace, sandbox}`: open connections cut because the
    /// sandbox's rules stopped allowing them.
    pub cut: IntCounterVec,
    /// `orchard_egress_unknown_source_total`: connections from an address no sandbox has.
    pub unknown_source: prometheus::IntCounter,
    /// `orchard_egress_sandboxes`: sandboxes in the proxy's table.
    pub sandboxes: IntGauge,
    /// `orchard_egress_address_conflicts`: pod IPs two sandboxes claim (both refused everything).
    pub conflicts: IntGauge,
    /// `orchard_egress_status_writes_total{outcome}`: `status.egress` reports written (`ok`, `error`).
    pub status_writes: IntCounterVec,
    tracked: Mutex<HashSet<(String, String)>>,
}

impl EgressMetrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let connections = IntCounterVec::new(
            Opts::new(
                "orchard_egress_connections_total",
                "Connections through the egress proxy by sandbox, deciding rule and verdict",
            ),
            &["namespace", "sandbox", "rule", "verdict"],
        )?;
        let cut = IntCounterVec::new(
            Opts::new(
                "orchard_egress_cut_connections_total",
                "Open connections cut because the sandbox's rules stopped allowing them",
            ),
            &["namespace", "sandbox"],
        )?;
        let unknown_source = prometheus::IntCounter::new(
            "orchard_egress_unknown_source_total",
            "Connections from an address no sandbox has (refused)",
        )?;
        let sandboxes =
            IntGauge::new("orchard_egress_sandboxes", "Sandboxes in the proxy's table")?;
        let conflicts = IntGauge::new(
            "orchard_egress_address_conflicts",
            "Pod IPs claimed by two sandboxes (everything from them is refused)",
        )?;
        let status_writes = IntCounterVec::new(
            Opts::new(
                "orchard_egress_status_writes_total",
                "status.egress reports written by the proxy",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(cut.clone()))?;
        registry.register(Box::new(unknown_source.clone()))?;
        registry.register(Box::new(sandboxes.clone()))?;
        registry.register(Box::new(conflicts.clone()))?;
        registry.register(Box::new(status_writes.clone()))?;
        Ok(Self {
            registry,
            connections,
            cut,
            unknown_source,
            sandboxes,
            conflicts,
            status_writes,
            tracked: Mutex::new(HashSet::new()),
        })
    }

    /// The `sandbox` label for `namespace/name`: its name while fewer than [`MAX_SANDBOX_SERIES`]
    /// sandboxes have series, else [`OTHER`].
    pub fn sandbox_label<'a>(&self, namespace: &str, name: &'a str) -> &'a str {
        let Ok(mut tracked) = self.tracked.lock() else {
            return OTHER;
        };
        let key = (namespace.to_string(), name.to_string());
        if tracked.contains(&key) {
            return name;
        }
        if tracked.len() >= MAX_SANDBOX_SERIES {
            return OTHER;
        }
        tracked.insert(key);
        name
    }

    /// Drops the series of sandboxes not in `present` (namespace, name).
    pub fn forget_except(&self, present: &HashSet<(String, String)>) {
        let Ok(mut tracked) = self.tracked.lock() else {
            return;
        };
        let gone: Vec<(String, String)> = tracked.difference(present).cloned().collect();
        for (namespace, name) in gone {
            let labels = std::collections::HashMap::from([
                ("namespace", namespace.as_str()),
                ("sandbox", name.as_str()),
            ]);
            let _ = self.cut.remove(&labels);
            remove_matching(&self.connections, &namespace, &name);
            tracked.remove(&(namespace, name));
        }
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if encoder
            .encode(&self.registry.gather(), &mut buffer)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(buffer).unwrap_or_default()
    }
}

/// Removes every series of `vec` whose `namespace` and `sandbox` labels are these.
fn remove_matching(vec: &IntCounterVec, namespace: &str, sandbox: &str) {
    use prometheus::core::Collector;
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: std::collections::HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|pair| (pair.name(), pair.value()))
                .collect();
            if labels.get("namespace") == Some(&namespace)
                && labels.get("sandbox") == Some(&sandbox)
            {
                let _ = vec.remove(&labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_series_are_bounded_and_forgotten() {
        let metrics = EgressMetrics::new().expect("registry");
        for n in 0..MAX_SANDBOX_SERIES {
            let name = format!("s{n}");
            assert_eq!(metrics.sandbox_label("ns", &name), name);
        }
        assert_eq!(metrics.sandbox_label("ns", "one-too-many"), OTHER);
        metrics
            .connections
            .with_label_values(&["ns", "s1", "pypi.org", "allowed"])
            .inc();
        metrics
            .connections
            .with_label_values(&["ns", "s1", NO_RULE, "denied"])
            .inc();
        assert!(metrics.render().contains("sandbox=\"s1\""));
        metrics.forget_except(&HashSet::from([("ns".to_string(), "s2".to_string())]));
        assert!(!metrics.render().contains("sandbox=\"s1\""));
        assert_eq!(metrics.sandbox_label("ns", "one-too-many"), "one-too-many");
    }
}
