//! Host names to addresses, and the addresses a sandbox never reaches through the proxy.
//!
//! The proxy resolves names itself (a client's own resolution is never trusted) and drops every
//! [`Protected`] address from the answer: a name that resolves to `127.0.0.1` or the cloud metadata
//! address cannot carry a sandbox there.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};

use futures::future::BoxFuture;

use crate::pod::cidr::Cidr;

/// Resolves a host name to socket addresses.
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `host` (a name, never an IP literal), with `port`, in preference order.
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>>;
}

/// The system resolver (`getaddrinfo` on a blocking thread, through `tokio::net::lookup_host`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        let host = host.to_string();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    }
}

/// A DNS stub resolver in Rust (hickory) configured from `/etc/resolv.conf` (nameservers, search
/// domains, `ndots`) and `/etc/hosts`: what the egress proxy runs with. The operator's image is a
/// static binary in an empty root, where glibc's `getaddrinfo` has no NSS modules to load.
#[derive(Clone)]
pub struct DnsResolver {
    inner: hickory_resolver::TokioResolver,
}

impl DnsResolver {
    /// The resolver the system configuration describes, or why there is none.
    pub fn from_system() -> Result<Self, String> {
        let inner = hickory_resolver::TokioResolver::builder_tokio()
            .and_then(|builder| builder.build())
            .map_err(|err| {
                format!("cannot read the DNS configuration (/etc/resolv.conf): {err}")
            })?;
        Ok(Self { inner })
    }
}

impl Resolve for DnsResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        let (resolver, host) = (self.inner.clone(), host.to_string());
        Box::pin(async move {
            let found = resolver
                .lookup_ip(host.as_str())
                .await
                .map_err(|err| io::Error::new(io::ErrorKind::NotFound, err.to_string()))?;
            Ok(found.iter().map(|ip| SocketAddr::new(ip, port)).collect())
        })
    }
}

/// A fixed map of names to addresses, for tests; other names do not resolve.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    names: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    /// Adds `name` with `addresses` (in this order).
    pub fn with(mut self, name: &str, addresses: impl IntoIterator<Item = IpAddr>) -> Self {
        self.names
            .insert(name.to_string(), addresses.into_iter().collect());
        self
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Vec<SocketAddr>>> {
        let answer = match self.names.get(host) {
            Some(addresses) => Ok(addresses
                .iter()
                .map(|address| SocketAddr::new(*address, port))
                .collect()),
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no address for {host}"),
            )),
        };
        Box::pin(async move { answer })
    }
}

/// The ranges [`Protected::defaults`] holds: loopback, link-local (the cloud metadata address
/// among them), "this network", the unspecified address, multicast.
const DEFAULT_RANGES: &[&str] = &[
    "127.0.0.0/8",
    "::1/128",
    "169.254.0.0/16",
    "fe80::/10",
    "0.0.0.0/8",
    "::/128",
    "224.0.0.0/4",
    "ff00::/8",
];

/// Address ranges the proxy never connects to, whatever the policy says. IPv4-mapped IPv6
/// addresses (`::ffff:127.0.0.1`) are checked as the IPv4 address they reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protected(Vec<Cidr>);

impl Protected {
    /// No protected range at all (tests on loopback).
    pub fn none() -> Self {
        Self(Vec::new())
    }

    /// Loopback, link-local, `0.0.0.0/8`, `::/128` and multicast.
    pub fn defaults() -> Self {
        Self(
            DEFAULT_RANGES
                .iter()
                .filter_map(|range| Cidr::parse(range).ok())
                .collect(),
        )
    }

    /// Adds `ranges` (the cluster's pod and service ranges, the API server's addresses, ...).
    pub fn extend(&mut self, ranges: impl IntoIterator<Item = Cidr>) {
        self.0.extend(ranges);
    }

    /// The protected ranges.
    pub fn ranges(&self) -> &[Cidr] {
        &self.0
    }

    /// Whether `ip` lies in a protected range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|range| range.contains_ip(ip))
    }

    /// The addresses of `addresses` outside every protected range, in order.
    pub fn reachable(&self, addresses: &[SocketAddr]) -> Vec<SocketAddr> {
        addresses
            .iter()
            .filter(|address| !self.contains(address.ip()))
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect(text)
    }

    #[test]
    fn default_ranges_all_parse() {
        assert_eq!(Protected::defaults().ranges().len(), DEFAULT_RANGES.len());
    }

    #[test]
    fn defaults_protect_local_and_special_addresses() {
        let protected = Protected::defaults();
        let cases = [
            ("127.0.0.1", true),
            ("127.255.0.9", true),
            ("::1", true),
            ("::ffff:127.0.0.1", true),
            ("169.254.169.254", true),
            ("::ffff:169.254.169.254", true),
            ("fe80::1", true),
            ("0.0.0.0", true),
            ("::", true),
            ("224.0.0.1", true),
            ("ff02::1", true),
            ("203.0.113.5", false),
            ("::ffff:203.0.113.5", false),
            ("10.0.0.1", false),
            ("2001:db8::1", false),
        ];
        for (address, expected) in cases {
            assert_eq!(protected.contains(ip(address)), expected, "{address}");
        }
    }

    #[test]
    fn extended_ranges_are_protected_and_filtered_out() {
        let mut protected = Protected::none();
        assert!(!protected.contains(ip("127.0.0.1")));
        protected.extend([Cidr::parse("10.96.0.0/12").expect("cidr")]);
        let addresses = [
            SocketAddr::new(ip("10.96.0.1"), 443),
            SocketAddr::new(ip("203.0.113.5"), 443),
            SocketAddr::new(ip("::ffff:10.96.0.10"), 443),
            SocketAddr::new(ip("2001:db8::1"), 443),
        ];
        assert_eq!(
            protected.reachable(&addresses),
            vec![addresses[1], addresses[3]]
        );
    }

    #[tokio::test]
    async fn static_resolver_answers_known_names_only() {
        let resolver = StaticResolver::default().with("a.test", [ip("127.0.0.2"), ip("::1")]);
        assert_eq!(
            resolver.resolve("a.test", 80).await.expect("resolves"),
            vec![
                SocketAddr::new(ip("127.0.0.2"), 80),
                SocketAddr::new(ip("::1"), 80)
            ]
        );
        let missing = resolver.resolve("b.test", 80).await.expect_err("unknown");
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }
}
