//! Reaching an allowed target: its addresses (a name resolved by the proxy, an IP literal as it is)
//! with every protected one dropped, then a TCP connection to the first that accepts, each attempt
//! bounded by the connect timeout.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use super::resolve::{Protected, Resolve};
use super::rules::Target;

/// Why a target has no address to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// Every address is protected: the proxy denies the request (403).
    OnlyProtected(String),
    /// The name did not resolve, or to nothing: the proxy answers 502.
    NotResolved(String),
}

/// The addresses of `target` to try, in order: resolved through `resolver` (for a name, within
/// `timeout`), without the protected ones.
pub async fn addresses(
    resolver: &dyn Resolve,
    protected: &Protected,
    target: &Target,
    port: u16,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, Unreachable> {
    let resolved = match target {
        Target::Ip(address) => vec![SocketAddr::new(*address, port)],
        Target::Name(name) => {
            match tokio::time::timeout(timeout, resolver.resolve(name, port)).await {
                Ok(Ok(addresses)) => addresses,
                Ok(Err(error)) => {
                    return Err(Unreachable::NotResolved(format!(
                        "cannot resolve {name}: {error}"
                    )));
                }
                Err(_) => {
                    return Err(Unreachable::NotResolved(format!(
                        "resolving {name} took longer than {}s",
                        timeout.as_secs_f64()
                    )));
                }
            }
        }
    };
    if resolved.is_empty() {
        return Err(Unreachable::NotResolved(format!("{target} has no address")));
    }
    let reachable = protected.reachable(&resolved);
    if reachable.is_empty() {
        return Err(Unreachable::OnlyProtected(match target {
            Target::Name(name) => {
                format!("{name} resolves only to addresses sandboxes never reach")
            }
            Target::Ip(address) => format!("{address} is an address sandboxes never reach"),
        }));
    }
    Ok(reachable)
}

/// A TCP connection to the first of `addresses` that accepts within `timeout` (each); the error
/// names `label` (`host:port`) and the last failure.
pub async fn connect(
    addresses: &[SocketAddr],
    timeout: Duration,
    label: &str,
) -> Result<TcpStream, String> {
    let mut last = None;
    for address in addresses {
        match tokio::time::timeout(timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%error, %address, "cannot set TCP_NODELAY upstream");
                }
                return Ok(stream);
            }
            Ok(Err(error)) => last = Some(format!("{address}: {}", describe(&error))),
            Err(_) => {
                last = Some(format!(
                    "{address}: no answer within {}s",
                    timeout.as_secs_f64()
                ));
            }
        }
    }
    Err(format!(
        "cannot connect to {label} ({})",
        last.unwrap_or_else(|| "no address".into())
    ))
}

/// An I/O error without its OS error number.
fn describe(error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::TimedOut => "timed out".into(),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::resolve::StaticResolver;
    use crate::pod::cidr::Cidr;

    const WAIT: Duration = Duration::from_secs(5);

    fn protected() -> Protected {
        let mut protected = Protected::none();
        protected.extend([Cidr::parse("127.0.0.1/32").expect("cidr")]);
        protected
    }

    #[tokio::test]
    async fn addresses_drop_protected_ones_and_say_why_none_is_left() {
        let ip = |text: &str| text.parse().expect(text);
        let resolver = StaticResolver::default()
            .with("mixed.test", [ip("127.0.0.1"), ip("127.0.0.2")])
            .with("internal.test", [ip("127.0.0.1")])
            .with("empty.test", []);
        let name = |text: &str| Target::Name(text.into());
        let cases = [
            (
                name("mixed.test"),
                Ok(vec![SocketAddr::new(ip("127.0.0.2"), 80)]),
            ),
            (
                name("internal.test"),
                Err(Unreachable::OnlyProtected(
                    "internal.test resolves only to addresses sandboxes never reach".into(),
                )),
            ),
            (
                Target::Ip(ip("127.0.0.1")),
                Err(Unreachable::OnlyProtected(
                    "127.0.0.1 is an address sandboxes never reach".into(),
                )),
            ),
            (
                Target::Ip(ip("127.0.0.3")),
                Ok(vec![SocketAddr::new(ip("127.0.0.3"), 80)]),
            ),
            (
                name("empty.test"),
                Err(Unreachable::NotResolved("empty.test has no address".into())),
            ),
            (
                name("missing.test"),
                Err(Unreachable::NotResolved(
                    "cannot resolve missing.test: no address for missing.test".into(),
                )),
            ),
        ];
        for (target, expected) in cases {
            assert_eq!(
                addresses(&resolver, &protected(), &target, 80, WAIT).await,
                expected,
                "{target}"
            );
        }
    }

    #[tokio::test]
    async fn connect_tries_each_address_in_order() {
        let listener = tokio::net::TcpListener::bind("127.0.0.2:0")
            .await
            .expect("bind");
        let open = listener.local_addr().expect("addr");
        // A port nothing listens on: bind, learn it, close.
        let closed = std::net::TcpListener::bind("127.0.0.3:0")
            .and_then(|l| l.local_addr())
            .expect("free port");
        let stream = connect(&[closed, open], WAIT, "x.test:1")
            .await
            .expect("second address accepts");
        assert_eq!(stream.peer_addr().expect("peer"), open);
        let error = connect(&[closed], WAIT, "x.test:1")
            .await
            .expect_err("refused");
        assert!(
            error.starts_with("cannot connect to x.test:1 (127.0.0.3:")
                && error.ends_with("connection refused)"),
            "{error}"
        );
    }
}
