//! Which waiting strides a queue admits, and in which order (pure).
//!
//! Strides are admitted whole and strictly in order: the first waiting stride that does not fit stops
//! admission for everyone behind it, so a large stride is never starved by smaller ones. A stride
//! larger than the queue's whole capacity can never fit; it is left out of the order (the group says
//! `StrideExceedsQueue`) instead of blocking the queue.

use k8s_openapi::jiff::Timestamp;

use orchard_api::AdmissionOrder;

/// One group's next stride, waiting for admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The group's UID (one request per group at a time).
    pub uid: String,
    /// The group's name.
    pub group: String,
    /// The group's creation time (FIFO's key, and every order's tie-break).
    pub created: Timestamp,
    /// When the queue last admitted a stride of this group (Fair's key; never admitted goes first).
    pub last_admitted: Option<Timestamp>,
    /// When this stride began to wait.
    pub since: Timestamp,
    /// Trajectories the stride asks for.
    pub count: u32,
}

/// `requests` in admission order, leaving out those larger than `capacity`.
pub fn ordered(requests: &[Request], order: AdmissionOrder, capacity: u32) -> Vec<&Request> {
    let mut fitting: Vec<&Request> = requests.iter().filter(|r| r.count <= capacity).collect();
    fitting.sort_by(|a, b| {
        let by_order = match order {
            AdmissionOrder::Fifo => std::cmp::Ordering::Equal,
            // `None` sorts before every `Some`: never admitted goes first.
            AdmissionOrder::Fair => a.last_admitted.cmp(&b.last_admitted),
        };
        by_order
            .then(a.created.cmp(&b.created))
            .then(a.group.cmp(&b.group))
            .then(a.uid.cmp(&b.uid))
    });
    fitting
}

/// The UIDs of the requests admissible now with `free` slots: the longest prefix of `ordered` that
/// fits, in order.
pub fn admissible<'a>(ordered: &[&'a Request], mut free: u32) -> Vec<&'a str> {
    let mut admitted = Vec::new();
    for request in ordered {
        if request.count > free {
            break;
        }
        free -= request.count;
        admitted.push(request.uid.as_str());
    }
    admitted
}

/// 1-based position of `uid` in `ordered`.
pub fn position(ordered: &[&Request], uid: &str) -> Option<u32> {
    ordered
        .iter()
        .position(|r| r.uid == uid)
        .and_then(|i| u32::try_from(i + 1).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn request(uid: &str, created: i64, last: Option<i64>, count: u32) -> Request {
        Request {
            uid: uid.into(),
            group: format!("g-{uid}"),
            created: at(created),
            last_admitted: last.map(at),
            since: at(100),
            count,
        }
    }

    fn uids(ordered: &[&Request]) -> Vec<String> {
        ordered.iter().map(|r| r.uid.clone()).collect()
    }

    #[test]
    fn fifo_orders_by_creation_and_fair_by_last_admission() {
        let requests = vec![
            request("a", 1, Some(50), 4),
            request("b", 2, None, 4),
            request("c", 3, Some(40), 4),
        ];
        assert_eq!(
            uids(&ordered(&requests, AdmissionOrder::Fifo, 16)),
            ["a", "b", "c"]
        );
        assert_eq!(
            uids(&ordered(&requests, AdmissionOrder::Fair, 16)),
            ["b", "c", "a"],
            "never admitted first, then least recently admitted"
        );
    }

    #[test]
    fn admission_is_a_strict_prefix() {
        let requests = vec![
            request("a", 1, None, 4),
            request("b", 2, None, 8),
            request("c", 3, None, 2),
        ];
        let order = ordered(&requests, AdmissionOrder::Fifo, 16);
        assert_eq!(admissible(&order, 16), ["a", "b", "c"]);
        assert_eq!(admissible(&order, 12), ["a", "b"]);
        assert_eq!(
            admissible(&order, 11),
            ["a"],
            "c fits in the 7 left but waits behind b"
        );
        assert!(admissible(&order, 3).is_empty());
        assert_eq!(position(&order, "c"), Some(3));
        assert_eq!(position(&order, "x"), None);
    }

    #[test]
    fn strides_larger_than_the_queue_do_not_block_it() {
        let requests = vec![request("big", 1, None, 32), request("small", 2, None, 4)];
        let order = ordered(&requests, AdmissionOrder::Fifo, 16);
        assert_eq!(uids(&order), ["small"]);
        assert_eq!(admissible(&order, 16), ["small"]);
    }
}
