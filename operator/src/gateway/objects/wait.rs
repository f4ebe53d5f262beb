//! Server-side waits (`.../wait?timeoutSeconds=`), driven by the watch: the waiter subscribes to its
//! object's notes in the change feed, reads the cache, and re-reads it only when told its object
//! changed (or the cache of its kind was re-listed). The API server is read at most once, when the
//! cache does not have the object yet (just created, or the caches are still filling at startup). Never
//! `Store::wait_until_ready()`: in kube-runtime 5.0.0 it keeps one waker per store and the controller
//! already waits on it.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};

use super::lookup::find;
use super::recent_deletes::RecentDeletes;
use crate::gateway::http::errors::ApiError;
use crate::plumbing::change_feed::{Change, ChangeFeed};

/// Default `timeoutSeconds` of wait routes.
pub const DEFAULT_WAIT_SECONDS: u64 = 30;

/// Longest accepted `timeoutSeconds` (clients loop for longer waits).
pub const MAX_WAIT_SECONDS: u64 = 300;

/// How a wait ended.
#[derive(Debug)]
pub enum WaitOutcome<K> {
    /// The condition holds; the object as it was then.
    Done(Arc<K>),
    /// Time ran out; the object as last seen.
    TimedOut(Arc<K>),
    /// The object was deleted while waiting.
    Deleted,
}

/// The effective wait: `timeoutSeconds` clamped to `[0, MAX_WAIT_SECONDS]`, default
/// [`DEFAULT_WAIT_SECONDS`].
pub fn wait_duration(timeout_seconds: Option<f64>) -> Duration {
    let seconds = timeout_seconds
        .filter(|s| s.is_finite())
        .unwrap_or(DEFAULT_WAIT_SECONDS as f64)
        .clamp(0.0, MAX_WAIT_SECONDS as f64);
    Duration::from_secs_f64(seconds)
}

/// What to wait on.
pub struct WaitFor<'a, K: Resource<DynamicType = ()> + 'static> {
    /// Client for the one API read when the cache lacks the object.
    pub client: &'a Client,
    /// The watch cache of `K`.
    pub store: &'a Store<K>,
    /// What this replica deleted that the cache may still show (shown as gone).
    pub deletes: &'a RecentDeletes,
    /// Notes of changes, published after the cache applied them.
    pub changes: &'a ChangeFeed,
    /// `Sandbox` or `RolloutGroup` (the change feed's kind).
    pub kind: &'static str,
    /// Lower-case kind for messages (`sandbox`, `rolloutgroup`).
    pub noun: &'static str,
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
}

impl<K> WaitFor<'_, K>
where
    K: crate::plumbing::writes::Child,
{
    /// Waits up to `timeout` until `done` holds for the object.
    pub async fn until(
        &self,
        timeout: Duration,
        done: impl Fn(&K) -> bool,
    ) -> Result<WaitOutcome<K>, ApiError> {
        // Subscribe before reading, so no change between the read and the subscription is missed.
        let mut notes = self.changes.subscribe(self.kind, self.namespace, self.name);
        let key = ObjectRef::new(self.name).within(self.namespace);
        let mut last = find(
            self.client,
            self.store,
            self.deletes,
            self.noun,
            self.namespace,
            self.name,
        )
        .await?;
        if done(&last) {
            return Ok(WaitOutcome::Done(last));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let change = tokio::select! {
                change = notes.next() => change,
                () = tokio::time::sleep_until(deadline) => return Ok(WaitOutcome::TimedOut(last)),
            };
            let named = change == Change::Named;
            match self.deletes.visible(self.store.get(&key)) {
                Some(object) => {
                    if done(&object) {
                        return Ok(WaitOutcome::Done(object));
                    }
                    last = object;
                }
                // A note naming the object after the cache applied it, and the cache lacks it (or
                // still shows the incarnation this replica deleted): deleted.
                None if named => return Ok(WaitOutcome::Deleted),
                // After a re-list the cache may still be filling: ask once more.
                None => {
                    match find(
                        self.client,
                        self.store,
                        self.deletes,
                        self.noun,
                        self.namespace,
                        self.name,
                    )
                    .await
                    {
                        Ok(object) => {
                            if done(&object) {
                                return Ok(WaitOutcome::Done(object));
                            }
                            last = object;
                        }
                        Err(err) if err.status == 404 => return Ok(WaitOutcome::Deleted),
                        Err(err) => return Err(err),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_durations_default_and_clamp() {
        assert_eq!(
            wait_duration(None),
            Duration::from_secs(DEFAULT_WAIT_SECONDS)
        );
        assert_eq!(wait_duration(Some(1.5)), Duration::from_millis(1500));
        assert_eq!(wait_duration(Some(-3.0)), Duration::ZERO);
        assert_eq!(
            wait_duration(Some(1e9)),
            Duration::from_secs(MAX_WAIT_SECONDS)
        );
        assert_eq!(
            wait_duration(Some(f64::NAN)),
            Duration::from_secs(DEFAULT_WAIT_SECONDS)
        );
    }
}
