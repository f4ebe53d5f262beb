//! Binding the listen address. `[::]:PORT` (the default) is dual-stack: one IPv6 socket with
//! `IPV6_V6ONLY` off, so it takes IPv4 connections too (as IPv4-mapped addresses) whatever the
//! `net.ipv6.bindv6only` sysctl says, and no other process can take the port for either family. Where
//! the kernel or the network namespace has no IPv6, it falls back to `0.0.0.0:PORT` and says so.
//! Any other address is bound exactly as given.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;

use tokio::net::{TcpListener, TcpSocket};

/// Connections the kernel queues before the agent accepts them (what `TcpListener::bind` uses).
const BACKLOG: u32 = 1024;

/// One way to bind a listen address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// An IPv6 socket on `[::]:PORT` with `IPV6_V6ONLY` off: both families.
    DualStack(SocketAddr),
    /// The address as given.
    Exact(SocketAddr),
}

/// How to bind `address`: what to try first, and what to fall back to when IPv6 is missing.
pub fn binding_plan(address: SocketAddr) -> (Binding, Option<Binding>) {
    match address {
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => (
            Binding::DualStack(address),
            Some(Binding::Exact(SocketAddr::from((
                Ipv4Addr::UNSPECIFIED,
                v6.port(),
            )))),
        ),
        _ => (Binding::Exact(address), None),
    }
}

/// Whether `error`, from creating or binding an IPv6 socket, means there is no IPv6 here (so the
/// IPv4 fallback applies) rather than a problem with the address (the port in use, say).
pub fn means_no_ipv6(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EPROTONOSUPPORT | libc::EADDRNOTAVAIL | libc::ENOPROTOOPT)
    )
}

/// A bound listener, and the IPv6 error that made it fall back to IPv4 (for the log).
#[derive(Debug)]
pub struct Listening<L> {
    pub listener: L,
    pub ipv6_unavailable: Option<io::Error>,
}

/// Binds `address` by its [`binding_plan`] with `bind` (the socket calls; tests pass a stand-in).
pub fn bind_with<L>(
    address: SocketAddr,
    bind: impl Fn(Binding) -> io::Result<L>,
) -> io::Result<Listening<L>> {
    let (first, fallback) = binding_plan(address);
    match (bind(first), fallback) {
        (Ok(listener), _) => Ok(Listening {
            listener,
            ipv6_unavailable: None,
        }),
        (Err(error), Some(fallback)) if means_no_ipv6(&error) => Ok(Listening {
            listener: bind(fallback)?,
            ipv6_unavailable: Some(error),
        }),
        (Err(error), _) => Err(error),
    }
}

/// Binds and listens on `address` (within the Tokio runtime); see the module documentation.
pub fn bind(address: SocketAddr) -> io::Result<Listening<TcpListener>> {
    bind_with(address, bind_socket)
}

fn bind_socket(binding: Binding) -> io::Result<TcpListener> {
    let (address, dual_stack) = match binding {
        Binding::DualStack(address) => (address, true),
        Binding::Exact(address) => (address, false),
    };
    let socket = match address {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if dual_stack {
        set_ipv6_only(&socket, false)?;
    }
    // As `TcpListener::bind` does: a restarted agent can bind while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(BACKLOG)
}

fn set_ipv6_only(socket: &impl AsRawFd, only: bool) -> io::Result<()> {
    let value = libc::c_int::from(only);
    // SAFETY: a valid socket descriptor, and a pointer to a c_int with its size.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `socket` is IPv6-only (`IPV6_V6ONLY`).
pub fn is_ipv6_only(socket: &impl AsRawFd) -> io::Result<bool> {
    let mut value: libc::c_int = 0;
    let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid socket descriptor, and pointers to a c_int and its size.
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            std::ptr::from_mut(&mut value).cast(),
            &mut length,
        )
    };
    if result == 0 {
        Ok(value != 0)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn only_the_ipv6_wildcard_is_dual_stack_with_an_ipv4_fallback() {
        assert_eq!(
            binding_plan(address("[::]:9090")),
            (
                Binding::DualStack(address("[::]:9090")),
                Some(Binding::Exact(address("0.0.0.0:9090")))
            )
        );
        for exact in ["0.0.0.0:9090", "127.0.0.1:0", "[::1]:9090", "[fd00::5]:80"] {
            assert_eq!(
                binding_plan(address(exact)),
                (Binding::Exact(address(exact)), None)
            );
        }
    }

    #[test]
    fn without_ipv6_the_wildcard_falls_back_to_ipv4() {
        let no_ipv6 = |binding: Binding| match binding {
            Binding::DualStack(_) => Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT)),
            Binding::Exact(address) => Ok(address),
        };
        let listening = bind_with(address("[::]:9090"), no_ipv6).unwrap();
        assert_eq!(listening.listener, address("0.0.0.0:9090"));
        assert_eq!(
            listening
                .ipv6_unavailable
                .and_then(|error| error.raw_os_error()),
            Some(libc::EAFNOSUPPORT)
        );
        // Other failures are reported, not papered over; addresses without a fallback fail as is.
        let in_use = |_: Binding| -> io::Result<SocketAddr> {
            Err(io::Error::from_raw_os_error(libc::EADDRINUSE))
        };
        assert!(bind_with(address("[::]:9090"), in_use).is_err());
        assert!(bind_with(address("[::1]:9090"), no_ipv6).is_ok());
        let unavailable = |_: Binding| -> io::Result<SocketAddr> {
            Err(io::Error::from_raw_os_error(libc::EADDRNOTAVAIL))
        };
        assert!(bind_with(address("[fd00::5]:80"), unavailable).is_err());
    }

    /// IPv4 on the IPv6 wildcard (whatever `net.ipv6.bindv6only` says); the IPv6 half is in the
    /// integration tests (`api::dual_stack_listen_answers_on_ipv4_and_ipv6_loopback`).
    #[tokio::test]
    async fn the_wildcard_socket_is_not_ipv6_only() {
        let listening = bind(address("[::]:0")).unwrap();
        if let Some(error) = &listening.ipv6_unavailable {
            eprintln!(
                "skipping: this machine has no IPv6 ({error}); the agent listens on IPv4 only"
            );
            return;
        }
        assert!(!is_ipv6_only(&listening.listener).unwrap());
        let port = listening.listener.local_addr().unwrap().port();
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let (connected, accepted) = tokio::join!(
            tokio::net::TcpStream::connect(target),
            listening.listener.accept()
        );
        assert!(connected.is_ok(), "{connected:?}");
        let (_, peer) = accepted.unwrap();
        assert_eq!(
            peer.ip().to_canonical(),
            std::net::IpAddr::from(Ipv4Addr::LOCALHOST)
        );
    }
}
