//! Which sandbox a connection comes from (pure): the proxy knows a sandbox's connections by their
//! source address, its pod IP. An address two sandboxes claim (a stale pod IP reused before its
//! watch event arrived) is conflicted and belongs to neither: the proxy refuses it until only one
//! holds it.
//!
//! The watch builds a new table for every change and publishes it whole; the proxy reads the latest.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use super::rules::Rules;

/// The egress rules one sandbox has in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPolicy {
    /// Namespace of the sandbox.
    pub namespace: String,
    /// Name of the sandbox.
    pub name: String,
    /// UID of the sandbox (names are reused; the UID is not).
    pub uid: String,
    /// The `metadata.generation` whose `spec.network` [`SandboxPolicy::rules`] were compiled from.
    pub generation: i64,
    /// The compiled rules.
    pub rules: Rules,
}

impl fmt::Display for SandboxPolicy {
    /// `namespace/name`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Who holds an address.
#[derive(Debug, Clone)]
enum Claim {
    /// One sandbox.
    One(Arc<SandboxPolicy>),
    /// More than one sandbox: nobody.
    Conflicted,
}

/// Source address to sandbox policy.
#[derive(Debug, Clone, Default)]
pub struct PolicyTable {
    by_address: HashMap<IpAddr, Claim>,
}

impl PolicyTable {
    /// Records that `policy`'s sandbox has address `ip`. The same sandbox (by UID) inserted again
    /// replaces its earlier policy; a second sandbox makes the address conflicted for good (in this
    /// table).
    pub fn insert(&mut self, ip: IpAddr, policy: Arc<SandboxPolicy>) {
        let claim = self
            .by_address
            .entry(ip.to_canonical())
            .or_insert_with(|| Claim::One(policy.clone()));
        if let Claim::One(held) = claim {
            *claim = if held.uid == policy.uid {
                Claim::One(policy)
            } else {
                Claim::Conflicted
            };
        }
    }

    /// The policy of the sandbox with address `ip` (IPv4-mapped IPv6 addresses are looked up as
    /// IPv4); `None` when no sandbox or more than one claims it.
    pub fn lookup(&self, ip: IpAddr) -> Option<&Arc<SandboxPolicy>> {
        match self.by_address.get(&ip.to_canonical()) {
            Some(Claim::One(policy)) => Some(policy),
            Some(Claim::Conflicted) | None => None,
        }
    }

    /// Whether more than one sandbox claims `ip`.
    pub fn is_conflicted(&self, ip: IpAddr) -> bool {
        matches!(
            self.by_address.get(&ip.to_canonical()),
            Some(Claim::Conflicted)
        )
    }

    /// The addresses more than one sandbox claims, in order.
    pub fn conflicts(&self) -> Vec<IpAddr> {
        let mut conflicts: Vec<IpAddr> = self
            .by_address
            .iter()
            .filter(|(_, claim)| matches!(claim, Claim::Conflicted))
            .map(|(ip, _)| *ip)
            .collect();
        conflicts.sort();
        conflicts
    }

    /// How many addresses the table knows, conflicted ones included.
    pub fn len(&self) -> usize {
        self.by_address.len()
    }

    /// Whether the table knows no address.
    pub fn is_empty(&self) -> bool {
        self.by_address.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(name: &str, uid: &str, generation: i64) -> Arc<SandboxPolicy> {
        Arc::new(SandboxPolicy {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
            generation,
            rules: Rules::default(),
        })
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect(text)
    }

    #[test]
    fn lookups_find_the_one_sandbox_of_an_address() {
        let mut table = PolicyTable::default();
        table.insert(ip("10.244.0.5"), policy("a", "uid-a", 1));
        table.insert(ip("fd00::5"), policy("b", "uid-b", 1));
        table.insert(ip("::ffff:10.244.0.6"), policy("c", "uid-c", 1));
        let name = |address: &str| table.lookup(ip(address)).map(|p| p.to_string());
        let cases = [
            ("10.244.0.5", Some("ns/a")),
            ("::ffff:10.244.0.5", Some("ns/a")),
            ("fd00::5", Some("ns/b")),
            ("10.244.0.6", Some("ns/c")),
            ("10.244.0.7", None),
        ];
        for (address, expected) in cases {
            assert_eq!(name(address).as_deref(), expected, "{address}");
        }
        assert_eq!(table.len(), 3);
        assert!(table.conflicts().is_empty());
    }

    #[test]
    fn the_same_sandbox_inserted_again_replaces_its_policy() {
        let mut table = PolicyTable::default();
        table.insert(ip("10.244.0.5"), policy("a", "uid-a", 1));
        table.insert(ip("10.244.0.5"), policy("a", "uid-a", 2));
        assert_eq!(
            table.lookup(ip("10.244.0.5")).map(|p| p.generation),
            Some(2)
        );
        assert!(!table.is_conflicted(ip("10.244.0.5")));
    }

    #[test]
    fn an_address_two_sandboxes_claim_belongs_to_neither() {
        let mut table = PolicyTable::default();
        table.insert(ip("10.244.0.5"), policy("a", "uid-a", 1));
        table.insert(ip("::ffff:10.244.0.5"), policy("b", "uid-b", 1));
        table.insert(ip("10.244.0.5"), policy("a", "uid-a", 2));
        table.insert(ip("10.244.0.1"), policy("c", "uid-c", 1));
        table.insert(ip("10.244.0.1"), policy("c-again", "uid-c2", 1));
        table.insert(ip("10.244.0.9"), policy("d", "uid-d", 1));
        assert!(table.lookup(ip("10.244.0.5")).is_none());
        assert!(table.is_conflicted(ip("10.244.0.5")));
        assert_eq!(table.conflicts(), vec![ip("10.244.0.1"), ip("10.244.0.5")]);
        assert!(table.lookup(ip("10.244.0.9")).is_some());
        assert_eq!(table.len(), 3);
        assert!(!table.is_empty());
        assert!(PolicyTable::default().is_empty());
    }
}
