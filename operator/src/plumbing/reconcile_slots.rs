//! How many reconciles of one controller run at once, admitted first come, first served.
//!
//! Why not kube-runtime's own limit (`controller::Config::concurrency`): in kube-runtime 5.0.0, while a
//! controller is at its limit, every due request is parked in a `HashSet` and a freed slot takes the
//! first one in *hash order*. Under sustained load, objects that are requeued again and again (and land
//! in the same place of that order) are taken every time, and an object later in the order waits until
//! the load ends: measured here as Sandboxes that got no reconcile at all for four minutes of name churn
//! while the controller kept reconciling 50 objects a second (`make soak`). The canary test below
//! reproduces it with kube-runtime's scheduler alone, so we notice when it is fixed upstream.
//!
//! So the controllers run with kube-runtime's limit off (it still never runs one object twice at once)
//! and every reconcile first takes a permit of a FIFO semaphore: bounded work, served in arrival order.

use tokio::sync::{Semaphore, SemaphorePermit};

/// A FIFO bound on concurrent reconciles of one controller.
#[derive(Debug)]
pub struct ReconcileSlots {
    permits: Semaphore,
}

impl ReconcileSlots {
    /// At most `limit` reconciles at once (at least one).
    pub fn new(limit: u16) -> Self {
        Self {
            permits: Semaphore::new(usize::from(limit.max(1))),
        }
    }

    /// Waits for a slot, in arrival order. The semaphore is never closed, so this cannot fail; a
    /// closed one would mean shutdown, where running without a permit is harmless.
    pub async fn acquire(&self) -> Option<SemaphorePermit<'_>> {
        self.permits.acquire().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::Poll;
    use std::time::Duration;

    use futures::channel::mpsc;
    use futures::{StreamExt, poll};
    use kube::runtime::scheduler::{ScheduleRequest, scheduler};
    use tokio::time::Instant;

    use super::*;

    #[tokio::test]
    async fn slots_are_granted_in_arrival_order() {
        let slots = std::sync::Arc::new(ReconcileSlots::new(1));
        let first = slots.acquire().await;
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..5 {
            let (slots, order) = (slots.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let _permit = slots.acquire().await;
                order.lock().unwrap().push(i);
            }));
            // Each waiter is queued before the next one starts.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }

    /// Canary for the kube-runtime behaviour this module works around: a controller at its limit keeps
    /// due requests in a hash set and serves the first in hash order, so an object that is re-requested
    /// after every reconcile is served every time while others wait indefinitely. When this fails,
    /// kube-runtime serves parked requests fairly and its own limit can come back.
    #[tokio::test]
    async fn kube_runtime_serves_parked_requests_in_hash_order_and_starves_some() {
        let (requests, incoming) = mpsc::unbounded::<ScheduleRequest<u32>>();
        let mut scheduler = pin!(scheduler(incoming));
        let now = Instant::now();
        for object in 0..64u32 {
            requests
                .unbounded_send(ScheduleRequest {
                    message: object,
                    run_at: now,
                })
                .unwrap();
        }
        // At the limit: everything due is parked.
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(matches!(
            poll!(scheduler.as_mut().hold().next()),
            Poll::Pending
        ));
        let mut served = std::collections::BTreeSet::new();
        for _ in 0..500 {
            // A slot frees and takes one parked request...
            let Poll::Ready(Some(object)) = poll!(scheduler.as_mut().hold_unless(|_| true).next())
            else {
                panic!("a parked request is due");
            };
            served.insert(object);
            // ...which reconciles, is requested again at once (a busy object), and the controller is at
            // its limit again.
            requests
                .unbounded_send(ScheduleRequest {
                    message: object,
                    run_at: Instant::now(),
                })
                .unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
            let _ = poll!(scheduler.as_mut().hold().next());
        }
        println!("served {} of 64 objects in 500 turns", served.len());
        assert!(
            served.len() < 64,
            "kube-runtime served all 64 parked objects in 500 turns: parked requests are fair now"
        );
    }
}
