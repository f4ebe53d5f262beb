//! Async locks by key (one baseline-policy apply per namespace at a time, for instance).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Async locks by key, created on first use and dropped when nobody holds or waits for them.
#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    /// Runs `work` while holding the lock of `key`.
    pub async fn with<T>(&self, key: &str, work: impl std::future::Future<Output = T>) -> T {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(key.to_string()).or_default().clone()
        };
        let result = {
            let _held = lock.lock().await;
            work.await
        };
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Ours and the map's: nobody else holds or waits for it.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(key);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_holder_per_key_and_nothing_kept_after() {
        let locks = Arc::new(KeyedLocks::default());
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (locks, inside, most) = (locks.clone(), inside.clone(), most.clone());
                tokio::spawn(async move {
                    locks
                        .with("ns", async {
                            let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                            most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        })
                        .await
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(locks.locks.lock().unwrap().is_empty());
    }
}
