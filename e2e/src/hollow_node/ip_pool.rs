//! Pod IPs for the local node: one loopback address per pod (`127.<a>.<b>.<c>`, all routed to `lo` by
//! Linux without configuration). The second octet is derived from the harness pid so concurrent runs
//! rarely overlap, and every address is checked free on the agent port before it is handed out.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};

/// Allocates and releases pod IPs.
#[derive(Debug)]
pub struct IpPool {
    octet: u8,
    next: u32,
    released: BTreeSet<u32>,
    in_use: BTreeSet<u32>,
}

/// Addresses per pool: `127.<octet>.0.1` .. `127.<octet>.255.254`.
const SIZE: u32 = 65_534;

impl IpPool {
    /// A pool in `127.<octet>.0.0/16` (`octet` in 2..=254; 127.0/16 and 127.1/16 are left alone).
    pub fn new(octet: u8) -> Self {
        Self {
            octet: octet.clamp(2, 254),
            next: 0,
            released: BTreeSet::new(),
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

    /// A free address whose `port` can be bound, or `None` when the pool is exhausted.
    pub fn allocate(&mut self, port: u16) -> Option<Ipv4Addr> {
        let mut tried = 0;
        while tried < SIZE {
            let index = match self.released.pop_first() {
                Some(i) => i,
                None => {
                    let i = self.next % SIZE;
                    self.next = self.next.wrapping_add(1);
                    i
                }
            };
            tried += 1;
            if self.in_use.contains(&index) {
                continue;
            }
            let ip = self.address(index);
            if TcpListener::bind(SocketAddrV4::new(ip, port)).is_ok() {
                self.in_use.insert(index);
                return Some(ip);
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
            self.released.insert(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_unique_and_reused_after_release() {
        let mut pool = IpPool::new(200);
        let a = pool.allocate(40_001).unwrap();
        let b = pool.allocate(40_001).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.octets()[..2], [127, 200]);
        pool.release(a);
        assert_eq!(pool.allocate(40_001).unwrap(), a);
    }

    #[test]
    fn busy_addresses_are_skipped() {
        let mut pool = IpPool::new(201);
        let busy = TcpListener::bind("127.201.0.1:40002").unwrap();
        let ip = pool.allocate(40_002).unwrap();
        assert_ne!(ip, Ipv4Addr::new(127, 201, 0, 1));
        drop(busy);
    }
}
