//! The proxy's open connections (CONNECT tunnels and plain-HTTP requests in flight), by source
//! address, so that a policy change cuts at once what the new policy no longer allows.
//!
//! Each connection holds an [`Open`] guard for as long as it lasts; dropping it leaves the registry.
//! [`Connections::cut_denied`] checks every entry against a new table: an entry whose sandbox still
//! has the very same policy (`Arc` identity) is skipped, others are decided again, and the denied
//! ones are cancelled (the tunnel closes both sockets) and reported.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use super::audit::Audit;
use super::rules::Target;
use super::table::{PolicyTable, SandboxPolicy};

/// One open connection.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Unique within the registry.
    pub id: u64,
    /// The host asked for (normalised).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// The target asked for.
    pub target: Target,
    /// The policy that allowed it.
    pub policy: Arc<SandboxPolicy>,
    /// Cancelled to cut the connection.
    pub token: CancellationToken,
}

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    count: usize,
    by_source: HashMap<IpAddr, HashMap<u64, Entry>>,
}

/// The registry of open connections.
#[derive(Debug)]
pub struct Connections {
    root: CancellationToken,
    registry: Mutex<Registry>,
}

impl Connections {
    /// An empty registry whose connections are all cut when `root` is cancelled (shutdown).
    pub fn new(root: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            root,
            registry: Mutex::new(Registry::default()),
        })
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a connection from `source` to `target:port` that `policy` allowed; it stays until
    /// the returned guard is dropped or a policy change cuts it.
    pub fn open(
        self: &Arc<Self>,
        source: IpAddr,
        target: Target,
        port: u16,
        policy: Arc<SandboxPolicy>,
    ) -> Open {
        let source = source.to_canonical();
        let token = self.root.child_token();
        let mut registry = self.registry();
        registry.next_id += 1;
        let id = registry.next_id;
        let entry = Entry {
            id,
            host: target.to_string(),
            port,
            target,
            policy,
            token: token.clone(),
        };
        registry
            .by_source
            .entry(source)
            .or_default()
            .insert(id, entry);
        registry.count += 1;
        Open {
            connections: self.clone(),
            source,
            id,
            token,
        }
    }

    fn close(&self, source: IpAddr, id: u64) {
        let mut registry = self.registry();
        let Some(entries) = registry.by_source.get_mut(&source) else {
            return;
        };
        let removed = entries.remove(&id).is_some();
        if entries.is_empty() {
            registry.by_source.remove(&source);
        }
        if removed {
            registry.count -= 1;
        }
    }

    /// Cuts every open connection `table` no longer allows (its source has no policy, or the policy
    /// denies its target and port), reports each to `audit` (with the sandbox's current policy, or
    /// the one that allowed it when the sandbox is gone), and returns how many were cut.
    pub fn cut_denied(&self, table: &PolicyTable, audit: &dyn Audit) -> usize {
        let mut cut: Vec<(Entry, Option<Arc<SandboxPolicy>>)> = Vec::new();
        {
            let mut registry = self.registry();
            registry.by_source.retain(|source, entries| {
                let current = table.lookup(*source);
                entries.retain(|_, entry| {
                    let allowed = still_allows(current, &entry.policy, &entry.target, entry.port);
                    if !allowed {
                        cut.push((entry.clone(), current.cloned()));
                    }
                    allowed
                });
                !entries.is_empty()
            });
            registry.count -= cut.len();
        }
        for (entry, _) in &cut {
            entry.token.cancel();
        }
        for (entry, current) in &cut {
            let sandbox = current.as_ref().unwrap_or(&entry.policy);
            tracing::debug!(%sandbox, host = %entry.host, port = entry.port, "connection cut: the policy no longer allows it");
            audit.cut(sandbox, &entry.host, entry.port);
        }
        cut.len()
    }

    /// How many connections are open.
    pub fn open_count(&self) -> usize {
        self.registry().count
    }
}

/// Whether `current` (a source's policy in a newer table, if it has one) still allows a connection
/// to `target:port` that `allowed_by` allowed (pure): the very same policy does without deciding
/// again.
pub fn still_allows(
    current: Option<&Arc<SandboxPolicy>>,
    allowed_by: &Arc<SandboxPolicy>,
    target: &Target,
    port: u16,
) -> bool {
    current.is_some_and(|policy| {
        Arc::ptr_eq(policy, allowed_by) || policy.rules.decide(target, port).is_allowed()
    })
}

/// A registered connection; dropping it leaves the registry.
#[derive(Debug)]
pub struct Open {
    connections: Arc<Connections>,
    source: IpAddr,
    id: u64,
    token: CancellationToken,
}

impl Open {
    /// Cancelled when a policy change (or shutdown) cuts the connection.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The entry's id.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.connections.close(self.source, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::audit::{Cut, RecordingAudit};
    use crate::egress::rules::Rules;
    use orchard_api::{EgressPolicy, EgressRule, NetworkSpec};

    fn policy(name: &str, hosts: &[&str]) -> Arc<SandboxPolicy> {
        let network = NetworkSpec {
            egress: EgressPolicy::AllowList,
            allow: hosts
                .iter()
                .map(|host| EgressRule {
                    cidr: None,
                    host: Some((*host).into()),
                    ports: vec![],
                })
                .collect(),
            deny: vec![],
        };
        Arc::new(SandboxPolicy {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            generation: 1,
            rules: Rules::of(Some(&network)).expect("rules"),
        })
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect(text)
    }

    fn name(text: &str) -> Target {
        Target::Name(text.into())
    }

    #[test]
    fn a_new_table_cuts_exactly_what_it_denies() {
        let connections = Connections::new(CancellationToken::new());
        let a = policy("a", &["pypi.org", "*.github.com"]);
        let b = policy("b", &["pypi.org"]);
        let c = policy("c", &["pypi.org"]);
        let pypi_a = connections.open(ip("10.0.0.1"), name("pypi.org"), 443, a.clone());
        let github_a = connections.open(ip("10.0.0.1"), name("api.github.com"), 443, a.clone());
        let pypi_b = connections.open(ip("10.0.0.2"), name("pypi.org"), 443, b.clone());
        let pypi_c = connections.open(ip("::ffff:10.0.0.3"), name("pypi.org"), 443, c.clone());
        assert_eq!(connections.open_count(), 4);

        // a loses github; b keeps its very policy; c is gone from the table.
        let mut table = PolicyTable::default();
        table.insert(ip("10.0.0.1"), policy("a", &["pypi.org"]));
        table.insert(ip("10.0.0.2"), b);
        let audit = RecordingAudit::default();
        assert_eq!(connections.cut_denied(&table, &audit), 2);
        let cut = |open: &Open| open.token().is_cancelled();
        assert_eq!(
            [cut(&pypi_a), cut(&github_a), cut(&pypi_b), cut(&pypi_c)],
            [false, true, false, true]
        );
        let mut cuts = audit.cuts();
        cuts.sort_by(|x, y| x.sandbox.cmp(&y.sandbox));
        assert_eq!(
            cuts,
            vec![
                Cut {
                    sandbox: "ns/a".into(),
                    host: "api.github.com".into(),
                    port: 443
                },
                Cut {
                    sandbox: "ns/c".into(),
                    host: "pypi.org".into(),
                    port: 443
                },
            ]
        );
        assert_eq!(connections.open_count(), 2);
        // Cut entries are gone: the same table cuts nothing more.
        assert_eq!(connections.cut_denied(&table, &audit), 0);
        drop(github_a);
        drop(pypi_c);
        assert_eq!(connections.open_count(), 2);
        drop(pypi_a);
        drop(pypi_b);
        assert_eq!(connections.open_count(), 0);
    }

    #[test]
    fn shutdown_cancels_every_connection() {
        let root = CancellationToken::new();
        let connections = Connections::new(root.clone());
        let open = connections.open(ip("10.0.0.1"), name("pypi.org"), 443, policy("a", &["*"]));
        root.cancel();
        assert!(open.token().is_cancelled());
    }

    #[test]
    fn ten_thousand_connections_are_checked_in_one_pass() {
        let connections = Connections::new(CancellationToken::new());
        let mut table = PolicyTable::default();
        let mut opens = Vec::new();
        for sandbox in 0..100u8 {
            let source = IpAddr::from([10, 0, 1, sandbox]);
            let allowed = policy(&format!("s{sandbox}"), &["*.example.com"]);
            for n in 0..100 {
                let host = name(&format!("h{n}.example.com"));
                opens.push(connections.open(source, host, 443, allowed.clone()));
            }
            // Even sandboxes get a new policy that allows only half their hosts.
            let next = if sandbox % 2 == 0 {
                policy(&format!("s{sandbox}"), &["*.example.com"])
            } else {
                let hosts: Vec<String> = (0..50).map(|n| format!("h{n}.example.com")).collect();
                let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
                policy(&format!("s{sandbox}"), &hosts)
            };
            table.insert(source, next);
        }
        assert_eq!(connections.open_count(), 10_000);
        let audit = RecordingAudit::default();
        let cut = connections.cut_denied(&table, &audit);
        assert_eq!(cut, 50 * 50);
        assert_eq!(audit.cuts().len(), 2500);
        assert_eq!(connections.open_count(), 7500);
        assert_eq!(
            opens.iter().filter(|o| o.token().is_cancelled()).count(),
            2500
        );
    }
}
