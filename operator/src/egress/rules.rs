//! One sandbox's `spec.network` compiled for the egress proxy (pure): what a client may reach, asked as
//! a [`Target`] (the host name or IP address of a `CONNECT` or an absolute-form URL) and a port.
//!
//! Host patterns match names only and `cidr` ranges match IP addresses only, so an allowed name cannot
//! be sidestepped by writing its address, and `*` does not open the IP space. `deny` wins over every
//! allow. The `rule` of a [`Decision`] is the spec's own text (a pattern, a CIDR or `AllowAll`), so it
//! can label metrics without unbounded cardinality.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use orchard_api::{EgressPolicy, EgressPort, EgressRule, NetworkSpec, PortProtocol};

use crate::pod::cidr::Cidr;

/// Longest host name (RFC 1035, without the trailing dot).
const MAX_NAME_LENGTH: usize = 253;

/// Longest label of a host name.
const MAX_LABEL_LENGTH: usize = 63;

/// Longest piece of client input quoted back in a message.
const MAX_QUOTED: usize = 80;

/// Where a client asks to go: a host name (lowercase, no trailing dot) or an IP address (IPv4-mapped
/// IPv6 addresses become IPv4).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A host name, e.g. `pypi.org`.
    Name(String),
    /// An IP address literal, e.g. `203.0.113.5` or `2001:db8::1`.
    Ip(IpAddr),
}

impl Target {
    /// Parses the host of a `CONNECT` authority or of a URL: lowercases it, strips one trailing dot
    /// and the brackets of `[v6]`. Refuses empty names, names over 253 characters, labels over 63,
    /// characters other than letters, digits, `-`, `_` and `.`, and names that only look like IP
    /// addresses in another notation (`127.1`, `0x7f000001`), which a resolver would turn into one.
    pub fn parse(host: &str) -> Result<Target, String> {
        if let Some(inner) = host.strip_prefix('[') {
            let address = inner
                .strip_suffix(']')
                .and_then(|inner| inner.parse::<Ipv6Addr>().ok())
                .ok_or_else(|| {
                    format!(
                        "{} is not a host: brackets hold an IPv6 address, e.g. [2001:db8::1]",
                        quoted(host)
                    )
                })?;
            return Ok(Target::Ip(IpAddr::V6(address).to_canonical()));
        }
        if let Ok(address) = host.parse::<IpAddr>() {
            return Ok(Target::Ip(address.to_canonical()));
        }
        let lower = host.to_ascii_lowercase();
        let name = lower.strip_suffix('.').unwrap_or(&lower);
        check_name(name).map_err(|why| format!("{} is not a host name: {why}", quoted(host)))?;
        Ok(Target::Name(name.to_string()))
    }

    /// `host:port` as a client writes it: IPv6 addresses in brackets.
    pub fn with_port(&self, port: u16) -> String {
        match self {
            Target::Ip(IpAddr::V6(address)) => format!("[{address}]:{port}"),
            other => format!("{other}:{port}"),
        }
    }

    /// The target as the `Host` header of a request names it (IPv6 addresses in brackets), with the
    /// port when one is given.
    pub fn host_header(&self, port: Option<u16>) -> String {
        match (self, port) {
            (_, Some(port)) => self.with_port(port),
            (Target::Ip(IpAddr::V6(address)), None) => format!("[{address}]"),
            (other, None) => other.to_string(),
        }
    }
}

impl fmt::Display for Target {
    /// The name, or the bare address.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Name(name) => f.write_str(name),
            Target::Ip(address) => write!(f, "{address}"),
        }
    }
}

/// Client input quoted in a message: escaped, and cut short when long.
fn quoted(input: &str) -> String {
    if input.chars().count() > MAX_QUOTED {
        let head: String = input.chars().take(MAX_QUOTED).collect();
        format!("{head:?}...")
    } else {
        format!("{input:?}")
    }
}

/// Why `name` (lowercase, trailing dot stripped) is not a host name.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name.len() > MAX_NAME_LENGTH {
        return Err(format!("it is longer than {MAX_NAME_LENGTH} characters"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "it contains {bad:?} (letters, digits, `-`, `_` and `.` only)"
        ));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("it has an empty label (two dots in a row, or a leading dot)".into());
        }
        if label.len() > MAX_LABEL_LENGTH {
            return Err(format!(
                "a label is longer than {MAX_LABEL_LENGTH} characters"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!("the label `{label}` starts or ends with `-`"));
        }
    }
    let numeric = |label: &str| {
        label.bytes().all(|b| b.is_ascii_digit())
            || label
                .strip_prefix("0x")
                .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    let last_all_digits = name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()));
    if last_all_digits || name.split('.').all(numeric) {
        return Err(
            "it reads as an IP address in a shorthand notation; write the address as a.b.c.d"
                .into(),
        );
    }
    Ok(())
}

/// What the proxy does with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Connect; `rule` is the spec text that allowed it (a host pattern, a CIDR, or `AllowAll`).
    Allow {
        /// The allowing rule, as written in the spec.
        rule: String,
    },
    /// Refuse with 403.
    Deny {
        /// The `deny` pattern that refused it, as written in the spec; `None` when nothing allowed it.
        rule: Option<String>,
        /// One line for the client, e.g. `pypi.org:443 is not in network.allow`.
        reason: String,
    },
}

impl Decision {
    /// Whether this is an [`Decision::Allow`].
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }

    /// A denial by no rule.
    fn unlisted(reason: String) -> Self {
        Decision::Deny { rule: None, reason }
    }
}

/// A host pattern of `allow[].host` or `deny[].host`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// `pypi.org`: that name only.
    Exact(String),
    /// `*.github.com`, kept as `.github.com`: every subdomain at any depth, not the name itself.
    Subdomains(String),
    /// `*`: every name (never an IP address).
    Any,
}

impl HostPattern {
    /// Parses a pattern as the API server's CEL rule admits it: `*`, `name` or `*.name`, lowercase
    /// labels of letters, digits and `-`, not an IP address.
    fn parse(text: &str) -> Result<Self, String> {
        if text == "*" {
            return Ok(HostPattern::Any);
        }
        let (base, subdomains) = match text.strip_prefix("*.") {
            Some(base) => (base, true),
            None => (text, false),
        };
        let labels_ok = text.len() <= MAX_NAME_LENGTH
            && base.split('.').all(|label| {
                (1..=MAX_LABEL_LENGTH).contains(&label.len())
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if !labels_ok || base.parse::<IpAddr>().is_ok() {
            return Err(format!(
                "`{text}` must be a host name such as pypi.org, a wildcard such as *.github.com (its subdomains), or * (any host): lowercase, no scheme, port, path or IP address (write an IP range as cidr)"
            ));
        }
        Ok(if subdomains {
            HostPattern::Subdomains(format!(".{base}"))
        } else {
            HostPattern::Exact(base.to_string())
        })
    }

    /// Whether the (normalised) `name` matches.
    fn matches(&self, name: &str) -> bool {
        match self {
            HostPattern::Exact(exact) => name == exact,
            HostPattern::Subdomains(suffix) => {
                name.len() > suffix.len() && name.ends_with(suffix.as_str())
            }
            HostPattern::Any => true,
        }
    }
}

/// The TCP ports a rule admits.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ports {
    /// No ports listed: every port.
    All,
    /// Only these (possibly none: a `cidr` entry listing only UDP or SCTP ports).
    Only(Vec<u16>),
}

impl Ports {
    /// The TCP ports of a rule. Host entries are carried by the proxy and may name TCP only; a
    /// `cidr` entry's UDP and SCTP ports are reached directly, so the proxy leaves them out.
    fn of(ports: &[EgressPort], entry: &str, host_entry: bool) -> Result<Self, String> {
        if ports.is_empty() {
            return Ok(Ports::All);
        }
        let mut tcp = Vec::with_capacity(ports.len());
        for port in ports {
            let number = u16::try_from(port.port)
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("{entry}: port {} is not 1-65535", port.port))?;
            match port.protocol {
                PortProtocol::TCP => tcp.push(number),
                _ if host_entry => {
                    return Err(format!(
                        "{entry}: host entries are reached through the egress proxy, which carries TCP only"
                    ));
                }
                _ => {}
            }
        }
        Ok(Ports::Only(tcp))
    }

    fn admits(&self, port: u16) -> bool {
        match self {
            Ports::All => true,
            Ports::Only(ports) => ports.contains(&port),
        }
    }

    /// `ports 80, 443` for a message.
    fn describe(&self) -> String {
        match self {
            Ports::All => "every port".into(),
            Ports::Only(ports) if ports.is_empty() => "no TCP port".into(),
            Ports::Only(ports) => {
                let list: Vec<String> = ports.iter().map(u16::to_string).collect();
                format!("ports {}", list.join(", "))
            }
        }
    }
}

/// An `allow[].host` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostRule {
    text: String,
    pattern: HostPattern,
    ports: Ports,
}

/// An `allow[].cidr` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RangeRule {
    text: String,
    range: Cidr,
    ports: Ports,
}

/// A `deny[].host` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DenyRule {
    text: String,
    pattern: HostPattern,
}

/// The compiled policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum Compiled {
    /// `egress: Deny`, or no `network` at all.
    #[default]
    DenyAll,
    /// `egress: AllowAll`.
    AllowAll,
    /// `egress: AllowList`.
    AllowList {
        hosts: Vec<HostRule>,
        ranges: Vec<RangeRule>,
        deny: Vec<DenyRule>,
    },
}

/// One sandbox's egress rules, compiled; the default denies everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    compiled: Compiled,
}

impl Rules {
    /// Compiles `spec.network` (`None`: everything denied). Refuses, with a message naming the entry,
    /// what the API server's CEL rules refuse: `allow` or `deny` outside `AllowList`, an empty
    /// `AllowList`, an entry with both or neither of `cidr` and `host`, a bad host pattern, a port
    /// outside 1-65535, a non-TCP port on a host entry, `deny` without a host entry. A `cidr` that
    /// does not parse as a network address (host bits set) is skipped, as the NetworkPolicies skip it.
    pub fn of(network: Option<&NetworkSpec>) -> Result<Rules, String> {
        let Some(network) = network else {
            return Ok(Rules::default());
        };
        let compiled = match network.egress {
            EgressPolicy::Deny | EgressPolicy::AllowAll => {
                let name = if network.egress == EgressPolicy::Deny {
                    "Deny"
                } else {
                    "AllowAll"
                };
                if !network.allow.is_empty() {
                    return Err(format!(
                        "network.allow may only be set when network.egress is AllowList, not {name}"
                    ));
                }
                if !network.deny.is_empty() {
                    return Err(format!(
                        "network.deny needs network.egress AllowList with at least one allow[].host entry, not {name}"
                    ));
                }
                if network.egress == EgressPolicy::Deny {
                    Compiled::DenyAll
                } else {
                    Compiled::AllowAll
                }
            }
            EgressPolicy::AllowList => compile_allow_list(network)?,
        };
        Ok(Rules { compiled })
    }

    /// Whether a connection to `target` on TCP `port` is allowed, and by which rule.
    pub fn decide(&self, target: &Target, port: u16) -> Decision {
        match &self.compiled {
            Compiled::DenyAll => Decision::unlisted("network.egress is Deny".into()),
            Compiled::AllowAll => Decision::Allow {
                rule: "AllowAll".into(),
            },
            Compiled::AllowList {
                hosts,
                ranges,
                deny,
            } => match target {
                Target::Name(name) => decide_name(hosts, deny, name, target, port),
                Target::Ip(address) => decide_address(ranges, hosts, *address, target, port),
            },
        }
    }
}

fn compile_allow_list(network: &NetworkSpec) -> Result<Compiled, String> {
    if network.allow.is_empty() {
        return Err("network.egress AllowList needs at least one network.allow rule".into());
    }
    let mut hosts = Vec::new();
    let mut ranges = Vec::new();
    for (index, rule) in network.allow.iter().enumerate() {
        let entry = format!("network.allow[{index}]");
        match rule {
            EgressRule {
                host: Some(host),
                cidr: None,
                ports,
            } => hosts.push(HostRule {
                text: host.clone(),
                pattern: HostPattern::parse(host).map_err(|why| format!("{entry}.host {why}"))?,
                ports: Ports::of(ports, &entry, true)?,
            }),
            EgressRule {
                cidr: Some(cidr),
                host: None,
                ports,
            } => {
                if let Ok(range) = Cidr::parse(cidr) {
                    ranges.push(RangeRule {
                        text: cidr.clone(),
                        range,
                        ports: Ports::of(ports, &entry, false)?,
                    });
                }
            }
            _ => {
                return Err(format!(
                    "{entry} must name exactly one of cidr (an address range) or host (a host name)"
                ));
            }
        }
    }
    let deny = network
        .deny
        .iter()
        .enumerate()
        .map(|(index, deny)| {
            Ok(DenyRule {
                text: deny.host.clone(),
                pattern: HostPattern::parse(&deny.host)
                    .map_err(|why| format!("network.deny[{index}].host {why}"))?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if !deny.is_empty() && hosts.is_empty() {
        return Err("network.deny needs at least one network.allow[].host entry".into());
    }
    Ok(Compiled::AllowList {
        hosts,
        ranges,
        deny,
    })
}

fn decide_name(
    hosts: &[HostRule],
    deny: &[DenyRule],
    name: &str,
    target: &Target,
    port: u16,
) -> Decision {
    if let Some(denied) = deny.iter().find(|rule| rule.pattern.matches(name)) {
        return Decision::Deny {
            rule: Some(denied.text.clone()),
            reason: format!("{name} matches network.deny entry {}", denied.text),
        };
    }
    let mut named = hosts.iter().filter(|rule| rule.pattern.matches(name));
    if let Some(allowed) = named.clone().find(|rule| rule.ports.admits(port)) {
        return Decision::Allow {
            rule: allowed.text.clone(),
        };
    }
    let hint = named
        .next()
        .map(|rule| format!(" ({} allows {})", rule.text, rule.ports.describe()))
        .unwrap_or_default();
    Decision::unlisted(format!(
        "{} is not in network.allow{hint}",
        target.with_port(port)
    ))
}

fn decide_address(
    ranges: &[RangeRule],
    hosts: &[HostRule],
    address: IpAddr,
    target: &Target,
    port: u16,
) -> Decision {
    let address = address.to_canonical();
    let mut inside = ranges.iter().filter(|rule| rule.range.contains_ip(address));
    if let Some(allowed) = inside.clone().find(|rule| rule.ports.admits(port)) {
        return Decision::Allow {
            rule: allowed.text.clone(),
        };
    }
    let hint = match inside.next() {
        Some(rule) => format!(" ({} allows {})", rule.text, rule.ports.describe()),
        None if !hosts.is_empty() => {
            " (an IP address matches only cidr entries, never host names: ask for the name)".into()
        }
        None => String::new(),
    };
    Decision::unlisted(format!(
        "{} is not in network.allow{hint}",
        target.with_port(port)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::HostDeny;

    fn name(text: &str) -> Target {
        Target::Name(text.into())
    }

    fn ip(text: &str) -> Target {
        Target::Ip(text.parse().expect(text))
    }

    fn host(pattern: &str, ports: &[u16]) -> EgressRule {
        EgressRule {
            cidr: None,
            host: Some(pattern.into()),
            ports: tcp(ports),
        }
    }

    fn cidr(range: &str, ports: &[u16]) -> EgressRule {
        EgressRule {
            cidr: Some(range.into()),
            host: None,
            ports: tcp(ports),
        }
    }

    fn tcp(ports: &[u16]) -> Vec<EgressPort> {
        ports
            .iter()
            .map(|port| EgressPort {
                port: i32::from(*port),
                protocol: PortProtocol::TCP,
            })
            .collect()
    }

    fn allow_list(allow: Vec<EgressRule>, deny: &[&str]) -> NetworkSpec {
        NetworkSpec {
            egress: EgressPolicy::AllowList,
            allow,
            deny: deny
                .iter()
                .map(|host| HostDeny {
                    host: (*host).into(),
                })
                .collect(),
        }
    }

    fn rules(network: &NetworkSpec) -> Rules {
        Rules::of(Some(network)).expect("rules compile")
    }

    #[test]
    fn targets_are_normalised() {
        let cases = [
            ("pypi.org", name("pypi.org")),
            ("PyPI.Org", name("pypi.org")),
            ("pypi.org.", name("pypi.org")),
            ("my_bucket.s3.example.com", name("my_bucket.s3.example.com")),
            ("localhost", name("localhost")),
            ("203.0.113.5", ip("203.0.113.5")),
            ("[2001:db8::1]", ip("2001:db8::1")),
            ("2001:DB8::1", ip("2001:db8::1")),
            ("[::ffff:203.0.113.5]", ip("203.0.113.5")),
        ];
        for (input, expected) in cases {
            assert_eq!(Target::parse(input), Ok(expected), "{input}");
        }
    }

    #[test]
    fn bad_targets_are_refused_with_a_reason() {
        let long = format!("{}.example.com", "a.".repeat(130));
        let long_label = format!("{}.com", "a".repeat(64));
        let cases = [
            ("", "empty"),
            (".", "empty"),
            ("pypi.org..", "empty label"),
            ("a..b", "empty label"),
            (".pypi.org", "empty label"),
            ("pypi.org:443", "contains ':'"),
            ("pypi org", "contains ' '"),
            ("pypi.org/simple", "contains '/'"),
            ("ünicode.de", "contains 'ü'"),
            ("-bad.example", "starts or ends with `-`"),
            (long.as_str(), "longer than 253"),
            (long_label.as_str(), "longer than 63"),
            ("127.1", "IP address in a shorthand"),
            ("2130706433", "IP address in a shorthand"),
            ("0x7f000001", "IP address in a shorthand"),
            ("1.2.3.4.5", "IP address in a shorthand"),
            ("[::1", "brackets hold an IPv6 address"),
            ("[pypi.org]", "brackets hold an IPv6 address"),
        ];
        for (input, expected) in cases {
            let error = Target::parse(input).expect_err(input);
            assert!(error.contains(expected), "{input}: {error}");
        }
        assert_eq!(Target::parse("0x7f.0x1.a0"), Ok(name("0x7f.0x1.a0")));
    }

    #[test]
    fn targets_print_as_clients_write_them() {
        assert_eq!(name("pypi.org").with_port(443), "pypi.org:443");
        assert_eq!(ip("2001:db8::1").with_port(443), "[2001:db8::1]:443");
        assert_eq!(ip("2001:db8::1").to_string(), "2001:db8::1");
        assert_eq!(ip("2001:db8::1").host_header(None), "[2001:db8::1]");
        assert_eq!(name("pypi.org").host_header(None), "pypi.org");
        assert_eq!(name("pypi.org").host_header(Some(8080)), "pypi.org:8080");
    }

    #[test]
    fn allow_list_decisions() {
        let network = allow_list(
            vec![
                host("pypi.org", &[443]),
                host("*.github.com", &[]),
                host("files.example.com", &[80, 443]),
                cidr("203.0.113.0/24", &[443]),
                cidr("2001:db8::/32", &[]),
            ],
            &["gist.github.com", "*.evil.github.com"],
        );
        let rules = rules(&network);
        let allowed = |rule: &str| Decision::Allow { rule: rule.into() };
        let unlisted = |reason: &str| Decision::Deny {
            rule: None,
            reason: reason.into(),
        };
        let cases = [
            (name("pypi.org"), 443, allowed("pypi.org")),
            (
                name("pypi.org"),
                80,
                unlisted("pypi.org:80 is not in network.allow (pypi.org allows ports 443)"),
            ),
            (
                name("www.pypi.org"),
                443,
                unlisted("www.pypi.org:443 is not in network.allow"),
            ),
            (name("api.github.com"), 443, allowed("*.github.com")),
            (name("a.b.c.github.com"), 22, allowed("*.github.com")),
            (
                name("github.com"),
                443,
                unlisted("github.com:443 is not in network.allow"),
            ),
            (
                name("notgithub.com"),
                443,
                unlisted("notgithub.com:443 is not in network.allow"),
            ),
            (
                name("gist.github.com"),
                443,
                Decision::Deny {
                    rule: Some("gist.github.com".into()),
                    reason: "gist.github.com matches network.deny entry gist.github.com".into(),
                },
            ),
            (
                name("x.evil.github.com"),
                443,
                Decision::Deny {
                    rule: Some("*.evil.github.com".into()),
                    reason: "x.evil.github.com matches network.deny entry *.evil.github.com".into(),
                },
            ),
            (name("evil.github.com"), 443, allowed("*.github.com")),
            (name("files.example.com"), 80, allowed("files.example.com")),
            (ip("203.0.113.9"), 443, allowed("203.0.113.0/24")),
            (
                ip("203.0.113.9"),
                80,
                unlisted(
                    "203.0.113.9:80 is not in network.allow (203.0.113.0/24 allows ports 443)",
                ),
            ),
            (
                ip("198.51.100.1"),
                443,
                unlisted(
                    "198.51.100.1:443 is not in network.allow (an IP address matches only cidr entries, never host names: ask for the name)",
                ),
            ),
            (ip("2001:db8::5"), 8443, allowed("2001:db8::/32")),
            (ip("::ffff:203.0.113.9"), 443, allowed("203.0.113.0/24")),
        ];
        for (target, port, expected) in cases {
            assert_eq!(
                rules.decide(&target, port),
                expected,
                "{}",
                target.with_port(port)
            );
        }
    }

    #[test]
    fn any_host_matches_every_name_but_no_address() {
        let rules = rules(&allow_list(vec![host("*", &[])], &["huggingface.co"]));
        let cases = [
            (name("pypi.org"), true),
            (name("localhost"), true),
            (name("huggingface.co"), false),
            (name("cdn.huggingface.co"), true),
            (ip("203.0.113.5"), false),
            (ip("::1"), false),
        ];
        for (target, allowed) in cases {
            assert_eq!(rules.decide(&target, 443).is_allowed(), allowed, "{target}");
        }
        let everything_denied = rules_with_deny_star();
        assert_eq!(
            everything_denied.decide(&name("pypi.org"), 443),
            Decision::Deny {
                rule: Some("*".into()),
                reason: "pypi.org matches network.deny entry *".into()
            }
        );
    }

    fn rules_with_deny_star() -> Rules {
        rules(&allow_list(vec![host("pypi.org", &[])], &["*"]))
    }

    #[test]
    fn deny_and_allow_all_policies() {
        let denied = Decision::Deny {
            rule: None,
            reason: "network.egress is Deny".into(),
        };
        let all = Decision::Allow {
            rule: "AllowAll".into(),
        };
        let deny_spec = NetworkSpec::default();
        let allow_all = NetworkSpec {
            egress: EgressPolicy::AllowAll,
            ..NetworkSpec::default()
        };
        let cases = [
            (Rules::of(None), name("pypi.org"), denied.clone()),
            (Rules::of(Some(&deny_spec)), ip("203.0.113.5"), denied),
            (Rules::of(Some(&allow_all)), name("pypi.org"), all.clone()),
            (Rules::of(Some(&allow_all)), ip("203.0.113.5"), all),
        ];
        for (rules, target, expected) in cases {
            assert_eq!(rules.expect("compiles").decide(&target, 443), expected);
        }
    }

    #[test]
    fn udp_ports_of_a_cidr_entry_are_left_to_the_network_policy() {
        let mut range = cidr("203.0.113.0/24", &[]);
        range.ports = vec![EgressPort {
            port: 53,
            protocol: PortProtocol::UDP,
        }];
        let rules = rules(&allow_list(vec![range], &[]));
        assert_eq!(
            rules.decide(&ip("203.0.113.1"), 53),
            Decision::Deny {
                rule: None,
                reason:
                    "203.0.113.1:53 is not in network.allow (203.0.113.0/24 allows no TCP port)"
                        .into()
            }
        );
    }

    #[test]
    fn a_cidr_with_host_bits_is_skipped_like_the_network_policy_skips_it() {
        let rules = rules(&allow_list(
            vec![cidr("10.0.0.1/8", &[]), host("pypi.org", &[])],
            &[],
        ));
        assert!(!rules.decide(&ip("10.0.0.1"), 443).is_allowed());
        assert!(rules.decide(&name("pypi.org"), 443).is_allowed());
    }

    #[test]
    fn what_cel_refuses_does_not_compile() {
        let both = EgressRule {
            cidr: Some("10.0.0.0/8".into()),
            host: Some("pypi.org".into()),
            ports: vec![],
        };
        let neither = EgressRule {
            cidr: None,
            host: None,
            ports: vec![],
        };
        let mut udp_host = host("pypi.org", &[]);
        udp_host.ports = vec![EgressPort {
            port: 53,
            protocol: PortProtocol::UDP,
        }];
        let mut port_zero = host("pypi.org", &[]);
        port_zero.ports = vec![EgressPort {
            port: 0,
            protocol: PortProtocol::TCP,
        }];
        let allow_all_with_deny = NetworkSpec {
            egress: EgressPolicy::AllowAll,
            deny: vec![HostDeny {
                host: "pypi.org".into(),
            }],
            ..NetworkSpec::default()
        };
        let deny_with_allow = NetworkSpec {
            egress: EgressPolicy::Deny,
            allow: vec![host("pypi.org", &[])],
            ..NetworkSpec::default()
        };
        let cases = [
            (allow_list(vec![], &[]), "at least one network.allow rule"),
            (
                allow_list(vec![both], &[]),
                "network.allow[0] must name exactly one",
            ),
            (allow_list(vec![neither], &[]), "exactly one of cidr"),
            (
                allow_list(vec![host("PyPI.org", &[])], &[]),
                "network.allow[0].host `PyPI.org` must be",
            ),
            (
                allow_list(vec![host("https://pypi.org", &[])], &[]),
                "must be a host name",
            ),
            (
                allow_list(vec![host("pypi.org:443", &[])], &[]),
                "must be a host name",
            ),
            (
                allow_list(vec![host("*.*.org", &[])], &[]),
                "must be a host name",
            ),
            (
                allow_list(vec![host("pypi.org.", &[])], &[]),
                "must be a host name",
            ),
            (
                allow_list(vec![host("10.0.0.1", &[])], &[]),
                "must be a host name",
            ),
            (
                allow_list(vec![host("*.10.0.0.1", &[])], &[]),
                "must be a host name",
            ),
            (allow_list(vec![host("", &[])], &[]), "must be a host name"),
            (allow_list(vec![udp_host], &[]), "carries TCP only"),
            (allow_list(vec![port_zero], &[]), "port 0 is not 1-65535"),
            (
                allow_list(vec![host("pypi.org", &[])], &["bad pattern"]),
                "network.deny[0].host",
            ),
            (
                allow_list(vec![cidr("10.0.0.0/8", &[])], &["pypi.org"]),
                "needs at least one network.allow[].host",
            ),
            (allow_all_with_deny, "not AllowAll"),
            (deny_with_allow, "not Deny"),
        ];
        for (network, expected) in cases {
            let error = Rules::of(Some(&network)).expect_err(expected);
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }
}
