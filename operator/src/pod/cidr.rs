//! CIDR arithmetic for the egress policies (pure): which protected ranges fall inside an allowed one
//! (they become its `except` entries) and which allowed ranges lie wholly inside a protected one (they
//! cannot be allowed at all).

use std::net::IpAddr;

/// A parsed CIDR: network address and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    address: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` or `x::y/n`; a bare address is a /32 or /128. Host bits must be zero, as
    /// NetworkPolicy requires.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr = address
            .trim()
            .parse()
            .map_err(|_| format!("`{text}` is not a CIDR (e.g. 10.0.0.0/8)"))?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("`{text}` has a bad prefix length (0..={bits})"))?,
            None => bits,
        };
        let cidr = Self { address, prefix };
        if cidr.network_bits() != cidr.bits() {
            return Err(format!(
                "`{text}` has host bits set; the network is {}",
                cidr.normalised()
            ));
        }
        Ok(cidr)
    }

    /// Whether this is an IPv4 range.
    pub fn is_ipv4(&self) -> bool {
        self.address.is_ipv4()
    }

    fn bits(&self) -> u128 {
        match self.address {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        }
    }

    fn width(&self) -> u8 {
        if self.is_ipv4() { 32 } else { 128 }
    }

    fn mask(&self) -> u128 {
        let width = u32::from(self.width());
        let host = width - u32::from(self.prefix);
        let all = if width == 128 {
            u128::MAX
        } else {
            (1u128 << width) - 1
        };
        if host == 128 {
            0
        } else {
            all & !((1u128 << host) - 1)
        }
    }

    fn network_bits(&self) -> u128 {
        self.bits() & self.mask()
    }

    fn normalised(&self) -> String {
        let bits = self.network_bits();
        let address = match self.address {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from(
                u32::try_from(bits).unwrap_or_default(),
            )),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(bits)),
        };
        format!("{address}/{}", self.prefix)
    }

    /// Whether `other` lies inside this range (equal counts).
    pub fn contains(&self, other: &Cidr) -> bool {
        self.is_ipv4() == other.is_ipv4()
            && other.prefix >= self.prefix
            && other.network_bits() & self.mask() == self.network_bits()
    }

    /// Whether `ip` lies inside this range. Families must match: an IPv4-mapped IPv6 address is not
    /// inside an IPv4 range (callers canonicalise first when they mean the IPv4 address).
    pub fn contains_ip(&self, ip: IpAddr) -> bool {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        self.contains(&Cidr {
            address: ip,
            prefix,
        })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.normalised())
    }
}

/// The single-address ranges of an EndpointSlice's ready endpoints (the API server's, from
/// `default/kubernetes`); addresses that do not parse are skipped (pure).
pub fn endpoint_cidrs(slice: &k8s_openapi::api::discovery::v1::EndpointSlice) -> Vec<Cidr> {
    ready_addresses(slice)
        .filter_map(|address| Cidr::parse(address).ok())
        .collect()
}

/// The addresses of an EndpointSlice's endpoints that are not marked unready (pure).
pub fn ready_addresses(
    slice: &k8s_openapi::api::discovery::v1::EndpointSlice,
) -> impl Iterator<Item = &String> {
    slice
        .endpoints
        .iter()
        .flatten()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.iter())
}

/// What an allowed range becomes: its `except` entries (the protected ranges strictly inside it), or
/// `None` when it lies wholly inside a protected range and cannot be allowed.
pub fn excepts_within(allowed: &Cidr, protected: &[Cidr]) -> Option<Vec<String>> {
    if protected.iter().any(|p| p.contains(allowed)) {
        return None;
    }
    Some(
        protected
            .iter()
            .filter(|p| allowed.contains(p))
            .map(ToString::to_string)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(text: &str) -> Cidr {
        Cidr::parse(text).expect(text)
    }

    #[test]
    fn cidrs_parse_and_reject_garbage() {
        assert_eq!(c("10.0.0.0/8").to_string(), "10.0.0.0/8");
        assert_eq!(c("169.254.169.254").to_string(), "169.254.169.254/32");
        assert_eq!(c("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert_eq!(c("fd00::/8").to_string(), "fd00::/8");
        assert_eq!(c("::/0").to_string(), "::/0");
        for bad in ["10.0.0.1/8", "10.0.0.0/33", "x/8", "", "10.0.0.0/"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        assert!(
            Cidr::parse("10.0.0.1/8")
                .unwrap_err()
                .contains("10.0.0.0/8")
        );
    }

    #[test]
    fn containment_respects_prefix_and_family() {
        assert!(c("0.0.0.0/0").contains(&c("169.254.169.254/32")));
        assert!(c("10.0.0.0/8").contains(&c("10.244.3.0/24")));
        assert!(c("10.244.3.0/24").contains(&c("10.244.3.0/24")));
        assert!(!c("10.244.3.0/24").contains(&c("10.244.0.0/16")));
        assert!(!c("10.0.0.0/8").contains(&c("11.0.0.0/8")));
        assert!(!c("::/0").contains(&c("10.0.0.0/8")));
        assert!(c("::/0").contains(&c("fd00::1/128")));
    }

    #[test]
    fn addresses_fall_inside_ranges_of_their_own_family() {
        let ip = |text: &str| text.parse::<IpAddr>().expect(text);
        let cases = [
            ("10.0.0.0/8", "10.255.1.2", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("127.0.0.1/32", "127.0.0.1", true),
            ("127.0.0.1/32", "127.0.0.2", false),
            ("0.0.0.0/0", "203.0.113.9", true),
            ("0.0.0.0/0", "::1", false),
            ("fe80::/10", "fe80::1", true),
            ("fe80::/10", "fec0::1", false),
            ("::/0", "2001:db8::1", true),
            ("127.0.0.0/8", "::ffff:127.0.0.1", false),
        ];
        for (range, address, inside) in cases {
            assert_eq!(
                c(range).contains_ip(ip(address)),
                inside,
                "{address} in {range}"
            );
        }
    }

    #[test]
    fn api_server_endpoints_become_single_addresses() {
        let slice: k8s_openapi::api::discovery::v1::EndpointSlice =
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "kubernetes", "namespace": "default"},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["10.250.0.1"], "conditions": {"ready": true}},
                    {"addresses": ["10.250.0.9"], "conditions": {"ready": false}},
                    {"addresses": ["not-an-ip"]},
                ],
            }))
            .expect("slice");
        assert_eq!(endpoint_cidrs(&slice), vec![c("10.250.0.1/32")]);
    }

    #[test]
    fn protected_ranges_inside_an_allowed_one_become_excepts() {
        let protected = [
            c("169.254.169.254/32"),
            c("10.250.0.1/32"),
            c("10.244.0.0/16"),
        ];
        assert_eq!(
            excepts_within(&c("0.0.0.0/0"), &protected),
            Some(vec![
                "169.254.169.254/32".to_string(),
                "10.250.0.1/32".to_string(),
                "10.244.0.0/16".to_string()
            ])
        );
        assert_eq!(
            excepts_within(&c("10.250.0.0/24"), &protected),
            Some(vec!["10.250.0.1/32".to_string()])
        );
        assert_eq!(
            excepts_within(&c("203.0.113.0/24"), &protected),
            Some(vec![])
        );
        assert_eq!(excepts_within(&c("10.244.5.0/24"), &protected), None);
        assert_eq!(excepts_within(&c("169.254.169.254/32"), &protected), None);
    }
}
