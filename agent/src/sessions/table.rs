//! The table of shell sessions, by id, with its cap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::process::ShellLaunch;
use super::session::{Session, SessionContext};
use crate::entropy::random_hex;
use crate::error::AgentError;

/// Most sessions open at once (429 beyond).
pub const MAX_SESSIONS: usize = 64;

/// All open sessions.
#[derive(Debug)]
pub struct SessionTable {
    entries: Mutex<HashMap<String, Arc<Session>>>,
    /// Sessions being started, counted against the cap before their shell runs.
    starting: Mutex<usize>,
    sequence: AtomicU64,
    capacity: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SessionTable {
    pub fn new(capacity: usize) -> Self {
        SessionTable {
            entries: Mutex::default(),
            starting: Mutex::new(0),
            sequence: AtomicU64::new(0),
            capacity: capacity.max(1),
        }
    }

    /// Starts a session; 429 when `capacity` sessions are open.
    pub async fn start(
        &self,
        launch: ShellLaunch,
        context: SessionContext,
    ) -> Result<Arc<Session>, AgentError> {
        {
            let entries = lock(&self.entries);
            let mut starting = lock(&self.starting);
            if entries.len() + *starting >= self.capacity {
                return Err(AgentError::TooManyRequests(format!(
                    "{} sessions are open; end one first (DELETE /v1/sessions/{{id}})",
                    self.capacity
                )));
            }
            *starting += 1;
        }
        let id = format!("s-{}", random_hex());
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let started = Session::start(id.clone(), sequence, launch, context).await;
        let mut entries = lock(&self.entries);
        *lock(&self.starting) -= 1;
        let session = Arc::new(started?);
        entries.insert(id, Arc::clone(&session));
        Ok(session)
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.entries).get(id).cloned()
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.entries).remove(id)
    }

    /// Every session, oldest first.
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<_> = lock(&self.entries).values().cloned().collect();
        all.sort_by_key(|session| session.sequence);
        all
    }

    /// Ends every session (shutdown): SIGKILLs each shell's group and forgets the session.
    pub fn end_all(&self) -> usize {
        let all: Vec<_> = lock(&self.entries)
            .drain()
            .map(|(_, session)| session)
            .collect();
        for session in &all {
            session.kill();
        }
        all.len()
    }
}
