//! From Sandboxes to the proxy's table (pure): each sandbox's rules keyed by the pod IP the operator
//! recorded in `status.podIP` (never something task code can set), and the `status.egress` report
//! the proxy owes it. Rules the proxy cannot compile leave the last good ones in force and say why.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use orchard_api::{EgressStatus, Sandbox};

use super::rules::Rules;
use super::table::{PolicyTable, SandboxPolicy};

/// One sandbox as the proxy enforces it.
#[derive(Debug)]
pub struct Entry {
    /// The pod IP its connections come from.
    pub ip: IpAddr,
    /// The rules in force.
    pub policy: Arc<SandboxPolicy>,
    /// What `status.egress` should say; `None` when the sandbox neither names hosts nor has a
    /// report (most sandboxes: no write at all).
    pub report: Option<EgressStatus>,
}

/// The entry of `sandbox`, given the policy last in force for it (`last_good`); `None` while it has
/// no pod IP, once it is being deleted, or when its IP does not parse (pure).
pub fn entry(sandbox: &Sandbox, last_good: Option<&Arc<SandboxPolicy>>) -> Option<Entry> {
    if sandbox.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = sandbox.status.as_ref()?;
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    let generation = sandbox.metadata.generation.unwrap_or_default();
    let network = sandbox.spec.network.as_ref();
    let wants_report = network.is_some_and(|n| n.names_hosts()) || status.egress.is_some();
    let (policy, message) = match Rules::of(network) {
        Ok(rules) => (
            Arc::new(SandboxPolicy {
                namespace: sandbox.metadata.namespace.clone().unwrap_or_default(),
                name: sandbox.metadata.name.clone().unwrap_or_default(),
                uid: sandbox.metadata.uid.clone().unwrap_or_default(),
                generation,
                rules,
            }),
            None,
        ),
        Err(why) => {
            // The previous generation stays in force; with none, nothing is allowed.
            let fallback = match last_good {
                Some(previous) => previous.clone(),
                None => Arc::new(SandboxPolicy {
                    namespace: sandbox.metadata.namespace.clone().unwrap_or_default(),
                    name: sandbox.metadata.name.clone().unwrap_or_default(),
                    uid: sandbox.metadata.uid.clone().unwrap_or_default(),
                    generation: 0,
                    rules: Rules::of(None).ok()?,
                }),
            };
            (fallback, Some(why))
        }
    };
    let report = wants_report.then(|| EgressStatus {
        observed_generation: policy.generation,
        pod_ip: ip.to_string(),
        message,
    });
    Some(Entry { ip, policy, report })
}

/// The proxy's view of every sandbox, rebuilt from the watch cache; it remembers each sandbox's
/// last good policy (by UID) across rebuilds.
#[derive(Default)]
pub struct TableBuilder {
    last_good: HashMap<String, Arc<SandboxPolicy>>,
}

/// A rebuilt table and the reports that differ from what the sandboxes' statuses say.
pub struct Rebuilt {
    /// Every sandbox's rules by pod IP.
    pub table: PolicyTable,
    /// Sandboxes whose `status.egress` must be written: (namespace, name, uid, report).
    pub reports: Vec<(String, String, String, EgressStatus)>,
}

impl TableBuilder {
    /// The table of `sandboxes` (pure but for the remembered last good policies).
    pub fn rebuild<'a>(&mut self, sandboxes: impl IntoIterator<Item = &'a Sandbox>) -> Rebuilt {
        let mut table = PolicyTable::default();
        let mut reports = Vec::new();
        let mut seen = HashMap::new();
        for sandbox in sandboxes {
            let uid = sandbox.metadata.uid.clone().unwrap_or_default();
            let Some(entry) = entry(sandbox, self.last_good.get(&uid)) else {
                continue;
            };
            let current = sandbox.status.as_ref().and_then(|s| s.egress.as_ref());
            if let Some(report) = entry.report.filter(|r| Some(r) != current) {
                reports.push((
                    entry.policy.namespace.clone(),
                    entry.policy.name.clone(),
                    uid.clone(),
                    report,
                ));
            }
            table.insert(entry.ip, entry.policy.clone());
            seen.insert(uid, entry.policy);
        }
        self.last_good = seen;
        Rebuilt { table, reports }
    }
}

#[cfg(test)]
mod tests {
    use super::super::rules::{Decision, Target};
    use super::*;
    use orchard_api::{
        EgressPolicy, EgressRule, HostDeny, NetworkSpec, SandboxSpec, SandboxStatus,
    };

    fn sandbox(name: &str, ip: Option<&str>, hosts: &[&str], generation: i64) -> Sandbox {
        let mut sandbox = Sandbox::new(
            name,
            SandboxSpec {
                image: "i".into(),
                network: (!hosts.is_empty()).then(|| NetworkSpec {
                    egress: EgressPolicy::AllowList,
                    allow: hosts
                        .iter()
                        .map(|h| EgressRule {
                            cidr: None,
                            host: Some((*h).into()),
                            ports: vec![],
                        })
                        .collect(),
                    deny: vec![],
                }),
                ..SandboxSpec::default()
            },
        );
        sandbox.metadata.namespace = Some("ns".into());
        sandbox.metadata.uid = Some(format!("uid-{name}"));
        sandbox.metadata.generation = Some(generation);
        sandbox.status = Some(SandboxStatus {
            pod_ip: ip.map(Into::into),
            ..SandboxStatus::default()
        });
        sandbox
    }

    fn allows(table: &PolicyTable, ip: &str, host: &str) -> bool {
        let Some(policy) = table.lookup(ip.parse().expect("ip")) else {
            return false;
        };
        matches!(
            policy
                .rules
                .decide(&Target::parse(host).expect("host"), 443),
            Decision::Allow { .. }
        )
    }

    #[test]
    fn sandboxes_are_keyed_by_their_recorded_pod_ip_and_report_when_they_name_hosts() {
        let mut builder = TableBuilder::default();
        let a = sandbox("a", Some("10.1.0.5"), &["pypi.org"], 1);
        let plain = sandbox("plain", Some("10.1.0.6"), &[], 1);
        let pending = sandbox("pending", None, &["pypi.org"], 1);
        let rebuilt = builder.rebuild([&a, &plain, &pending]);
        assert_eq!(rebuilt.table.len(), 2, "no pod IP, no entry");
        assert!(allows(&rebuilt.table, "10.1.0.5", "pypi.org"));
        assert!(!allows(&rebuilt.table, "10.1.0.5", "github.com"));
        assert!(!allows(&rebuilt.table, "10.1.0.6", "pypi.org"), "Deny");
        assert_eq!(
            rebuilt.reports.len(),
            1,
            "only the sandbox naming hosts: {:?}",
            rebuilt.reports.iter().map(|r| &r.1).collect::<Vec<_>>()
        );
        assert_eq!(
            rebuilt.reports[0].3,
            EgressStatus {
                observed_generation: 1,
                pod_ip: "10.1.0.5".into(),
                message: None
            }
        );
        // Once the status says so, nothing more is written.
        let mut reported = a.clone();
        reported.status.as_mut().expect("status").egress = Some(rebuilt.reports[0].3.clone());
        assert!(builder.rebuild([&reported]).reports.is_empty());
    }

    #[test]
    fn rules_that_do_not_compile_leave_the_last_good_ones_in_force() {
        let mut builder = TableBuilder::default();
        let good = sandbox("a", Some("10.1.0.5"), &["pypi.org"], 1);
        builder.rebuild([&good]);
        let mut bad = sandbox("a", Some("10.1.0.5"), &["pypi.org"], 2);
        bad.spec.network.as_mut().expect("network").deny = vec![HostDeny {
            host: "http://x".into(),
        }];
        let rebuilt = builder.rebuild([&bad]);
        assert!(
            allows(&rebuilt.table, "10.1.0.5", "pypi.org"),
            "generation 1 still in force"
        );
        let report = &rebuilt.reports[0].3;
        assert_eq!(report.observed_generation, 1);
        assert!(report.message.is_some());
        // A sandbox that never compiled gets nothing.
        let mut fresh = TableBuilder::default();
        let rebuilt = fresh.rebuild([&bad]);
        assert!(!allows(&rebuilt.table, "10.1.0.5", "pypi.org"));
        assert_eq!(rebuilt.reports[0].3.observed_generation, 0);
    }

    #[test]
    fn a_sandbox_being_deleted_loses_its_entry() {
        let mut builder = TableBuilder::default();
        let mut gone = sandbox("a", Some("10.1.0.5"), &["pypi.org"], 1);
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(builder.rebuild([&gone]).table.len(), 0);
    }
}
