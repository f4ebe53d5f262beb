//! Process groups: every command the agent starts leads a process group of its own, so one
//! `kill(-pgid)` reaches it and everything it spawned, `&` background jobs included. Owns the registry
//! of live groups that shutdown signals, and the guard that SIGKILLs a group when its request goes away.
//!
//! A new process group, not a new session (except for a background process started with `pty`, which
//! needs a session to have a controlling terminal: `exec::pty`; its group is its own all the same): std's `Command::process_group(0)` is carried out by
//! `posix_spawn` itself (`POSIX_SPAWN_SETPGROUP`), so starting a command stays on the cheap
//! `posix_spawn` path (a `vfork`-style clone that shares the agent's memory until `exec`). `setsid`
//! has no stable std API; calling it from a `pre_exec` hook forces std onto a full `fork` + `exec`
//! instead (copying the agent's page tables, then a copy-on-write fault per touched page): about 0.1 ms
//! more per command, a sixth of starting `true`. For the kill guarantee both are the same:
//! the command is the leader of group `pgid == pid`, its children and `&` jobs (a non-interactive shell
//! does no job control) inherit the group, and `kill(-pgid, SIGKILL)` reaches all of them. What differs:
//!
//! - the command stays in the agent's session. A container started without a TTY has no controlling
//!   terminal, so nothing changes there; were the agent run from a terminal, a command opening
//!   `/dev/tty` would reach that terminal (as a background group: reading it stops the command with
//!   SIGTTIN) instead of failing with ENXIO. Commands never get the terminal as stdin/stdout/stderr:
//!   those are always pipes;
//! - a command that calls `setsid` itself fails with EPERM as before (a group leader cannot start a
//!   session), and a process it spawns can still leave with `setsid` (`setsid daemon &`), exactly as
//!   before: such a process has left the group and is not killed with it;
//! - `setpgid` only moves a process between groups of the same session, so a process of a command could
//!   now join another command's group (before, each command was a session of its own); the commands
//!   all run as the same user in the same sandbox and can signal each other anyway.

use std::collections::HashSet;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

/// std looks up `posix_spawn_file_actions_addchdir_np` through a weak symbol, and goes back to `fork`
/// for every command with a working directory (all of the agent's) when it is missing. The agent links
/// glibc statically (`crt-static`), where a weak reference pulls nothing out of `libc.a`: without this
/// strong reference the function is not in the binary at all and every exec forks.
#[used]
static LINK_POSIX_SPAWN_ADDCHDIR: unsafe extern "C" fn(
    *mut libc::posix_spawn_file_actions_t,
    *const libc::c_char,
) -> libc::c_int = libc::posix_spawn_file_actions_addchdir_np;

/// Makes the child of `command` the leader of a new process group (`pgid == pid`), without forcing std
/// off its `posix_spawn` path (see the module docs).
pub fn start_in_new_group(command: &mut tokio::process::Command) {
    command.process_group(0);
}

/// Sends `command` down std's `fork` + `execvp` path for its next spawn (a no-op `pre_exec` hook does
/// that). Only for the rare retry of a program `posix_spawn` cannot start but `execvp` can: glibc's
/// `execvp` runs an executable without a `#!` line with `/bin/sh`, its `posix_spawnp` reports ENOEXEC.
pub fn use_fork_exec(command: &mut tokio::process::Command) {
    // SAFETY: the hook does nothing; std still sets the process group (`setpgid`) in the child.
    unsafe {
        command.pre_exec(|| Ok(()));
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
