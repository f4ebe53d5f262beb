//! The bookkeeping of the connection cap, without I/O: which connections are open, which of them are
//! waiting for a request head (fresh, or kept alive between requests) and since when, and which to
//! close to make room.
//!
//! Why "waiting for a request head" and not "never sent a request": anyone who reaches the port can
//! send `GET /healthz` (no token needed) and then keep the connection idle; counting such connections
//! as untouchable would let them fill the cap again. A connection with a request in progress is never
//! chosen: without the token, no request lasts (401 at once, `/healthz` within a second), so only
//! authorised work holds a connection busy.

use std::collections::{BTreeMap, BTreeSet};

/// One connection, numbered in the order it was accepted.
pub type ConnectionId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// When (on the table's clock) the connection started waiting for a request head; `None` while a
    /// request is in progress.
    waiting_since: Option<u64>,
    /// Chosen to make room: it no longer counts towards the cap, and closes at once if waiting, or
    /// after its request otherwise.
    evicted: bool,
}

/// What [`ConnectionTable::admit`] decided for a connection just accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Serve it as `id`; close `evict` first to make room.
    Open {
        id: ConnectionId,
        evict: Option<ConnectionId>,
    },
    /// Every connection has a request in progress: wait until one finishes or closes.
    Full,
}

/// Open connections, capped; see the module documentation for the eviction rule.
#[derive(Debug)]
pub struct ConnectionTable {
    cap: usize,
    next_id: ConnectionId,
    /// Ticks on every change, ordering the waits (a logical clock: deterministic, no time source).
    clock: u64,
    entries: BTreeMap<ConnectionId, Entry>,
    /// Connections waiting for a request head and not evicted, by `(waiting_since, id)`.
    waiting: BTreeSet<(u64, ConnectionId)>,
    /// Entries not evicted.
    live: usize,
}

impl ConnectionTable {
    /// A table admitting `cap` connections (at least one).
    pub fn new(cap: usize) -> ConnectionTable {
        ConnectionTable {
            cap: cap.max(1),
            next_id: 0,
            clock: 0,
            entries: BTreeMap::new(),
            waiting: BTreeSet::new(),
            live: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Admits a connection just accepted (it waits for its first request head), evicting the
    /// connection that has waited longest when the cap is reached; [`Admission::Full`] when every
    /// connection has a request in progress.
    pub fn admit(&mut self) -> Admission {
        let evict = if self.live >= self.cap {
            match self.evict_longest_waiting() {
                Some(victim) => Some(victim),
                None => return Admission::Full,
            }
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        let since = self.tick();
        self.entries.insert(
            id,
            Entry {
                waiting_since: Some(since),
                evicted: false,
            },
        );
        self.waiting.insert((since, id));
        self.live += 1;
        Admission::Open { id, evict }
    }

    /// Evicts the connection that has waited longest for a request head, if any waits.
    pub fn evict_longest_waiting(&mut self) -> Option<ConnectionId> {
        let (_, victim) = self.waiting.pop_first()?;
        if let Some(entry) = self.entries.get_mut(&victim) {
            entry.evicted = true;
            self.live -= 1;
        }
        Some(victim)
    }

    /// A request head arrived on `id`.
    pub fn request_started(&mut self, id: ConnectionId) {
        if let Some(entry) = self.entries.get_mut(&id)
            && let Some(since) = entry.waiting_since.take()
        {
            self.waiting.remove(&(since, id));
        }
    }

    /// The response on `id` is done: it waits for its next request head.
    pub fn request_finished(&mut self, id: ConnectionId) {
        let since = self.tick();
        if let Some(entry) = self.entries.get_mut(&id)
            && entry.waiting_since.is_none()
        {
            entry.waiting_since = Some(since);
            if !entry.evicted {
                self.waiting.insert((since, id));
            }
        }
    }

    /// Whether `id` is waiting for a request head (no request in progress): then it can be closed at
    /// once without cutting a response.
    pub fn is_waiting(&self, id: ConnectionId) -> bool {
        self.entries
            .get(&id)
            .is_some_and(|entry| entry.waiting_since.is_some())
    }

    /// `id` closed.
    pub fn close(&mut self, id: ConnectionId) {
        if let Some(entry) = self.entries.remove(&id) {
            if let Some(since) = entry.waiting_since {
                self.waiting.remove(&(since, id));
            }
            if !entry.evicted {
                self.live -= 1;
            }
        }
    }

    /// Connections counted towards the cap.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Whether no connection is open (evicted ones still closing included).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(table: &mut ConnectionTable) -> (ConnectionId, Option<ConnectionId>) {
        match table.admit() {
            Admission::Open { id, evict } => (id, evict),
            Admission::Full => panic!("full"),
        }
    }

    #[test]
    fn below_the_cap_nothing_is_evicted() {
        let mut table = ConnectionTable::new(3);
        for expected in 0..3 {
            assert_eq!(open(&mut table), (expected, None));
        }
        assert_eq!(table.live(), 3);
    }

    #[test]
    fn at_the_cap_the_longest_waiting_connection_is_evicted() {
        let mut table = ConnectionTable::new(3);
        let (busy, _) = open(&mut table);
        let (silent, _) = open(&mut table);
        let (kept_alive, _) = open(&mut table);
        table.request_started(busy);
        table.request_started(kept_alive);
        table.request_finished(kept_alive);
        // `silent` waits since it was accepted, `kept_alive` only since its response.
        let (fourth, evicted) = open(&mut table);
        assert_eq!(evicted, Some(silent));
        assert!(
            table.is_waiting(silent),
            "closed at once: no request in progress"
        );
        let (_, evicted) = open(&mut table);
        assert_eq!(evicted, Some(kept_alive));
        let (_, evicted) = open(&mut table);
        assert_eq!(evicted, Some(fourth));
        assert_eq!(table.live(), 3);
        // Evicted connections still closing do not count; closing them frees nothing more.
        table.close(silent);
        table.close(kept_alive);
        assert_eq!(table.live(), 3);
        assert!(!table.is_waiting(busy));
    }

    #[test]
    fn when_every_connection_is_busy_the_table_is_full_until_one_finishes() {
        let mut table = ConnectionTable::new(2);
        let (first, _) = open(&mut table);
        let (second, _) = open(&mut table);
        table.request_started(first);
        table.request_started(second);
        assert_eq!(table.admit(), Admission::Full);
        table.request_finished(second);
        assert_eq!(open(&mut table), (2, Some(second)));
        table.request_started(2);
        assert_eq!(table.admit(), Admission::Full);
        table.close(first);
        assert_eq!(open(&mut table), (3, None));
    }

    #[test]
    fn a_request_arriving_on_an_evicted_connection_lets_it_finish() {
        let mut table = ConnectionTable::new(1);
        let (first, _) = open(&mut table);
        assert_eq!(open(&mut table), (1, Some(first)));
        // The head was parsed before the connection saw it was evicted: serve, then close.
        table.request_started(first);
        assert!(!table.is_waiting(first));
        table.request_finished(first);
        assert_eq!(table.evict_longest_waiting(), Some(1), "never chosen twice");
        table.close(first);
        table.close(1);
        assert!(table.is_empty());
        assert_eq!(table.live(), 0);
    }
}
