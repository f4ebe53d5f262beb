//! Port tunnels (`GET /v1/ports/{port}/tunnel` on the agent, `.../sandboxes/{name}/ports/{port}/tunnel`
//! on the gateway): an HTTP/1.1 request upgraded to a raw TCP stream to a port on the pod's loopback.
//! The checks both ends make on such a request, pure.

/// The `Upgrade` protocol of a tunnel.
pub const TUNNEL_PROTOCOL: &str = "tcp";

/// The port of a tunnel's path, or why it is not one.
pub fn parse_port(text: &str) -> Result<u16, String> {
    match text.parse::<u32>() {
        Ok(port @ 1..=65535) => Ok(port as u16),
        _ => Err(format!("port `{text}` is not a number from 1 to 65535")),
    }
}

/// Whether a request with these `Connection` and `Upgrade` header values asks for a tunnel:
/// `Connection` lists `upgrade` (case-insensitive, among other tokens) and `Upgrade` names `tcp`.
pub fn asks_for_tunnel<'a>(
    connection: impl IntoIterator<Item = &'a str>,
    upgrade: impl IntoIterator<Item = &'a str>,
) -> bool {
    fn lists<'a>(values: impl IntoIterator<Item = &'a str>, token: &str) -> bool {
        values.into_iter().any(|value| {
            value
                .split(',')
                .any(|item| item.trim().eq_ignore_ascii_case(token))
        })
    }
    lists(connection, "upgrade") && lists(upgrade, TUNNEL_PROTOCOL)
}

/// The answer to a tunnel request that is not an upgrade (400).
pub const NOT_AN_UPGRADE: &str =
    "a tunnel is an upgrade: send `Connection: Upgrade` and `Upgrade: tcp`";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports() {
        assert_eq!(parse_port("1"), Ok(1));
        assert_eq!(parse_port("65535"), Ok(65535));
        for bad in ["0", "65536", "-1", "http", "", "80.0"] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn upgrade_headers() {
        assert!(!asks_for_tunnel([], []));
        assert!(!asks_for_tunnel(["keep-alive, Upgrade"], []));
        assert!(asks_for_tunnel(["keep-alive, Upgrade"], ["TCP"]));
        assert!(!asks_for_tunnel(["keep-alive, Upgrade"], ["websocket"]));
        assert!(asks_for_tunnel(["keep-alive", "upgrade"], ["h2c", "tcp"]));
        assert!(!asks_for_tunnel(["close"], ["tcp"]));
    }
}
