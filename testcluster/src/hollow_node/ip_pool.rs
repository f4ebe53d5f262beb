//! Pod IPs for the local node: one loopback address per pod (`127.<a>.<b>.<c>`, all routed to `lo` by
//! Linux without configuration). The second octet is derived from the harness pid so concurrent runs
//! rarely overlap, and every address is checked free on the agent port before it is handed out.
//!
//! The check binds a socket without listening on it. A listening check socket would be copied into
//! any process the node's spawner thread starts at that moment, and it keeps listening in that
//! process until its `execve` closes it (`O_CLOEXEC`); under load that can be after the pod's own
//! agent tries to listen on the address, which then fails with "Address already in use" (seen once in
//! 3000 sandboxes of `make bench-scale-compare`). A socket that is only bound, with `SO_REUSEADDR`
//! like every Rust listener has, does not stand in a listener's way, yet binding it still fails while
//! something listens on the address.
//!
//! A released address goes back to the end of the line: fresh addresses come first, and released ones
//! are reused oldest first once none is left. Handing a deleted pod's address straight to the next pod
//! made a test that checks the deleted agent is gone reach another test's new agent at the same
//! address (`sandbox_lifecycle`, seen once in the shared hollow cluster).

use std::collections::{BTreeSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use tokio::net::TcpSocket;

/// Whether `address` can be listened on: binding a socket with `SO_REUSEADDR` there works, which it
/// does unless something listens on it. The socket never listens, and is closed on return.
fn can_listen_on(address: SocketAddrV4) -> bool {
    TcpSocket::new_v4()
        .and_then(|socket| {
            socket.set_reuseaddr(true)?;
            socket.bind(SocketAddr::V4(address))
        })
        .is_ok()
}

/// Allocates and releases pod IPs.
#[derive(Debug)]
pub struct IpPool {
    octet: u8,
    size: u32,
    next: u32,
    released: VecDeque<u32>,
    in_use: BTreeSet<u32>,
}

/// Addresses per pool: `127.<octet>.0.1` .. `127.<octet>.255.254`.
const SIZE: u32 = 65_534;

impl IpPool {
    /// A pool in `127.<octet>.0.0/16` (`octet` in 2..=254; 127.0/16 and 127.1/16 are left alone).
    pub fn new(octet: u8) -> Self {
        Self::with_size(octet, SIZE)
    }

    /// A pool of the first `size` addresses of `127.<octet>.0.0/16` (at most [`SIZE`]).
    fn with_size(octet: u8, size: u32) -> Self {
        Self {
            octet: octet.clamp(2, 254),
            size: size.clamp(1, SIZE),
            next: 0,
            released: VecDeque::new(),
            in_use: BTreeSet::new(),
        }
    }

    /// A pool whose octet is derived from the current process id.
    pub fn for_this_process() -> Self {
        Self::new((std::process::id() % 250 + 3) as u8)
    }

    fn address(&self, index: u32) -> Ipv4Addr {
        let host = index + 1; // skip .0.0
        Ipv4Addr::new(127, self.octet, (host >> 8) as u8, (host & 0xff) as u8)
    }

    /// A free address whose `port` can be bound, or `None` when the pool is exhausted: a fresh one
    /// while there are any, else the one released longest ago.
    pub fn allocate(&mut self, port: u16) -> Option<Ipv4Addr> {
        let mut tried = 0;
        while tried < self.size {
            let index = if self.next < self.size {
                self.next += 1;
                self.next - 1
            } else {
                self.released.pop_front()?
            };
            tried += 1;
            if self.in_use.contains(&index) {
                continue;
            }
            let ip = self.address(index);
            if can_listen_on(SocketAddrV4::new(ip, port)) {
                self.in_use.insert(index);
                return Some(ip);
            }
            if self.next >= self.size {
                // Busy for now (another process listens there): try it again later.
                self.released.push_back(index);
            }
        }
        None
    }

    /// Returns an address to the pool.
    pub fn release(&mut self, ip: Ipv4Addr) {
        let [a, b, c, d] = ip.octets();
        if a != 127 || b != self.octet {
            return;
        }
        let index = ((u32::from(c) << 8) | u32::from(d)).saturating_sub(1);
        if self.in_use.remove(&index) {
            self.released.push_back(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn addresses_are_unique_and_a_released_one_is_reused_last_oldest_first() {
        let mut pool = IpPool::with_size(200, 4);
        let a = pool.allocate(40_001).unwrap();
        let b = pool.allocate(40_001).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.octets()[..2], [127, 200]);
        pool.release(b);
        pool.release(a);
        let fresh = [
            pool.allocate(40_001).unwrap(),
            pool.allocate(40_001).unwrap(),
        ];
        assert!(
            !fresh.contains(&a) && !fresh.contains(&b),
            "fresh addresses first: {fresh:?}"
        );
        assert_eq!(
            pool.allocate(40_001),
            Some(b),
            "then the one released first"
        );
        assert_eq!(pool.allocate(40_001), Some(a));
        assert_eq!(pool.allocate(40_001), None, "all four in use");
    }

    #[test]
    fn busy_addresses_are_skipped() {
        let mut pool = IpPool::new(201);
        let busy = TcpListener::bind("127.201.0.1:40002").unwrap();
        let ip = pool.allocate(40_002).unwrap();
        assert_ne!(ip, Ipv4Addr::new(127, 201, 0, 1));
        drop(busy);
    }

    #[test]
    fn a_copy_of_the_check_socket_does_not_keep_the_agent_from_listening() {
        // What a process the spawner started during the check holds until its execve: the same
        // kind of socket the check binds. The agent's listener (std and tokio both set SO_REUSEADDR)
        // must still get the address, and the check must still see that listener.
        let address = SocketAddrV4::new(Ipv4Addr::new(127, 202, 0, 1), 40_003);
        let inherited = TcpSocket::new_v4().unwrap();
        inherited.set_reuseaddr(true).unwrap();
        inherited.bind(SocketAddr::V4(address)).unwrap();
        let agent = TcpListener::bind(address).expect("the agent listens despite the copy");
        assert!(
            !can_listen_on(address),
            "a listening agent makes the address busy"
        );
        drop(agent);
        assert!(can_listen_on(address));
        drop(inherited);
    }
}
