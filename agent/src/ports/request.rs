//! What a tunnel request must carry: a port in 1–65535 and the `Connection: Upgrade` and `Upgrade: tcp`
//! headers (the checks themselves are `orchard_api::agent`'s, shared with the gateway).

use axum::http::{HeaderMap, header};

pub use orchard_api::agent::parse_port;

/// Whether `headers` ask for an upgrade to `tcp`.
pub fn asks_for_tcp_upgrade(headers: &HeaderMap) -> bool {
    let values = |name| {
        headers
            .get_all(name)
            .into_iter()
            .filter_map(|value| value.to_str().ok())
    };
    orchard_api::agent::asks_for_tunnel(values(header::CONNECTION), values(header::UPGRADE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

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
    }
}
