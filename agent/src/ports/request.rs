//! What a tunnel request must carry: a port in 1–65535 and the `Connection: Upgrade` and `Upgrade: tcp`
//! headers. Pure.

use axum::http::{HeaderMap, header};

/// The port of the path, or why it is not one.
pub fn parse_port(text: &str) -> Result<u16, String> {
    match text.parse::<u32>() {
        Ok(port @ 1..=65535) => Ok(port as u16),
        _ => Err(format!("port `{text}` is not a number from 1 to 65535")),
    }
}

/// Whether `headers` ask for an upgrade to `tcp`: `Connection` lists `upgrade` (case-insensitive,
/// among other tokens) and `Upgrade` names `tcp`.
pub fn asks_for_tcp_upgrade(headers: &HeaderMap) -> bool {
    let lists = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|value| {
            value.to_str().is_ok_and(|value| {
                value
                    .split(',')
                    .any(|item| item.trim().eq_ignore_ascii_case(token))
            })
        })
    };
    lists(header::CONNECTION, "upgrade") && lists(header::UPGRADE, "tcp")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

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
        let mut headers = HeaderMap::new();
        assert!(!asks_for_tcp_upgrade(&headers));
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert!(!asks_for_tcp_upgrade(&headers));
        headers.insert(header::UPGRADE, HeaderValue::from_static("TCP"));
        assert!(asks_for_tcp_upgrade(&headers));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!asks_for_tcp_upgrade(&headers));
        headers.insert(header::UPGRADE, HeaderValue::from_static("tcp"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        assert!(!asks_for_tcp_upgrade(&headers));
    }
}
