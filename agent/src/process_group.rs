//! Process groups: every command the agent starts leads its own session (`setsid`), so one `kill(-pgid)`
//! reaches it and everything it spawned, `&` background jobs included. Owns the registry of live groups
//! that shutdown signals, and the guard that SIGKILLs a group when its request goes away.

use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

/// Makes the child of `command` the leader of a new session (and so of a new process group).
pub fn start_in_new_session(command: &mut tokio::process::Command) {
    // SAFETY: the hook runs between fork and exec and calls only the async-signal-safe `setsid`.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sends `signal` to every process of group `pgid`.
pub fn signal_group(pgid: i32, signal: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal process group <= 1",
        ));
    }
    // SAFETY: plain syscall; a negative pid addresses the process group.
    if unsafe { libc::kill(-pgid, signal) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// All process groups started by this agent that may still have members.
#[derive(Debug, Default)]
pub struct ProcessGroups {
    live: Mutex<HashSet<i32>>,
    emptied: Notify,
}

impl ProcessGroups {
    fn live(&self) -> MutexGuard<'_, HashSet<i32>> {
        self.live
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts tracking group `pgid`; the returned guard kills the group when dropped.
    pub fn track(self: &Arc<Self>, pgid: i32) -> ProcessGroup {
        self.live().insert(pgid);
        ProcessGroup {
            pgid,
            groups: Arc::clone(self),
            killed: false,
        }
    }

    pub fn count(&self) -> usize {
        self.live().len()
    }

    /// Signals every tracked group (shutdown).
    pub fn signal_all(&self, signal: i32) {
        for pgid in self.live().iter() {
            let _ = signal_group(*pgid, signal);
        }
    }

    /// Waits until no group is tracked any more, or `timeout` passes; returns whether they all ended.
    pub async fn wait_until_empty(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.emptied.notified();
            if self.count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.count() == 0;
            }
        }
    }

    fn forget(&self, pgid: i32) {
        let mut live = self.live();
        live.remove(&pgid);
        if live.is_empty() {
            self.emptied.notify_waiters();
        }
    }
}

/// A running command's process group. Dropping it SIGKILLs the whole group: that is how a timeout, a
/// client disconnect (the request future is dropped) or a finished command cleans up stray processes.
#[derive(Debug)]
pub struct ProcessGroup {
    pgid: i32,
    groups: Arc<ProcessGroups>,
    killed: bool,
}

impl ProcessGroup {
    pub fn pgid(&self) -> i32 {
        self.pgid
    }

    pub fn signal(&self, signal: i32) -> io::Result<()> {
        signal_group(self.pgid, signal)
    }

    /// SIGKILLs the group now (e.g. right after its leader exited, so lingering `&` jobs die with it).
    pub fn kill(&mut self) {
        if !self.killed {
            let _ = signal_group(self.pgid, libc::SIGKILL);
            self.killed = true;
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
        self.groups.forget(self.pgid);
    }
}
