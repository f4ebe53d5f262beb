//! Background tasks by key: at most one task per key, at most a bound of them running at once (the
//! others queue for a slot), all of them aborted by [`KeyedTasks::stop`]. The trajectory runner
//! drives one run per sandbox UID with it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Semaphore;
use tokio::task::{AbortHandle, JoinSet};

/// The tasks; see the module docs.
pub struct KeyedTasks {
    tasks: Mutex<Tasks>,
    slots: Arc<Semaphore>,
}

#[derive(Default)]
struct Tasks {
    set: JoinSet<()>,
    by_key: HashMap<String, AbortHandle>,
}

impl KeyedTasks {
    /// A set running at most `bound` tasks at once.
    pub fn new(bound: usize) -> Self {
        Self {
            tasks: Mutex::default(),
            slots: Arc::new(Semaphore::new(bound)),
        }
    }

    fn tasks(&self) -> MutexGuard<'_, Tasks> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts `task` under `key` unless a task of that key is going on (queued ones included).
    pub fn start(&self, key: String, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = self.tasks();
        while tasks.set.try_join_next().is_some() {}
        if tasks.by_key.get(&key).is_some_and(|t| !t.is_finished()) {
            return;
        }
        let slots = self.slots.clone();
        let handle = tasks.set.spawn(async move {
            // Closed only at shutdown, when every task is aborted anyway.
            let Ok(_slot) = slots.acquire_owned().await else {
                return;
            };
            task.await;
        });
        tasks.by_key.insert(key, handle);
    }

    /// Tasks going on (queued ones included).
    pub fn running(&self) -> usize {
        let mut tasks = self.tasks();
        while tasks.set.try_join_next().is_some() {}
        tasks.by_key.retain(|_, t| !t.is_finished());
        tasks.by_key.len()
    }

    /// Aborts every task and refuses new ones a slot (shutdown).
    pub fn stop(&self) {
        self.slots.close();
        let mut tasks = self.tasks();
        tasks.set.abort_all();
        tasks.by_key.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Lets every spawned task run until it waits (time is paused: the sleep ends only when
    /// nothing else can run).
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn one_task_per_key_at_a_time_and_stop_ends_them_all() {
        let tasks = KeyedTasks::new(16);
        let started = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let run = |started: Arc<AtomicUsize>, mut released: tokio::sync::watch::Receiver<bool>| async move {
            started.fetch_add(1, Ordering::SeqCst);
            let _ = released.wait_for(|r| *r).await;
        };
        tasks.start("a".into(), run(started.clone(), released.clone()));
        tasks.start("a".into(), run(started.clone(), released.clone()));
        tasks.start("b".into(), run(started.clone(), released.clone()));
        settle().await;
        assert_eq!(
            started.load(Ordering::SeqCst),
            2,
            "a second task of `a` waits"
        );
        assert_eq!(tasks.running(), 2);
        let _ = release.send(true);
        settle().await;
        assert_eq!(tasks.running(), 0);
        let (_hold, held) = tokio::sync::watch::channel(false);
        tasks.start("a".into(), run(started.clone(), held));
        settle().await;
        assert_eq!(
            started.load(Ordering::SeqCst),
            3,
            "a finished task can be started again"
        );
        tasks.stop();
        assert_eq!(tasks.running(), 0, "stop aborts what runs");
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_beyond_the_bound_wait_for_a_slot() {
        let tasks = KeyedTasks::new(1);
        let started = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        for key in ["a", "b"] {
            let (started, mut released) = (started.clone(), released.clone());
            tasks.start(key.into(), async move {
                started.fetch_add(1, Ordering::SeqCst);
                let _ = released.wait_for(|r| *r).await;
            });
        }
        settle().await;
        assert_eq!(started.load(Ordering::SeqCst), 1);
        let _ = release.send(true);
        settle().await;
        assert_eq!(started.load(Ordering::SeqCst), 2);
    }
}
