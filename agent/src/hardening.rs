//! Keeping the agent's secrets out of reach of the commands it runs (same uid, no `CAP_SYS_PTRACE`):
//! the token given in `ORCHARD_AGENT_TOKEN` (and the verifier in `ORCHARD_AGENT_TOKEN_SHA256`) is wiped
//! from the process' original environment block (what `/proc/<pid>/environ` shows), and the process is made non-dumpable, so `/proc/<pid>/{environ,mem,fd}`
//! of the agent are closed to its children. Both run at `serve` start, before any thread exists.

use std::ffi::CStr;
use std::ops::Range;

/// Where the value of `name` sits in one `NAME=value` environment entry, if the entry is `name`'s (pure).
pub fn value_range(entry: &[u8], name: &str) -> Option<Range<usize>> {
    let name = name.as_bytes();
    (entry.len() > name.len() && entry.starts_with(name) && entry[name.len()] == b'=')
        .then(|| name.len() + 1..entry.len())
}

/// Overwrites with NUL bytes, in place, the value of every `name=...` entry of the environment block
/// (`environ`, whose strings the kernel shows in `/proc/<pid>/environ` for the original ones, between
/// `mm->env_start` and `env_end`). The entries stay in `environ`: remove them afterwards with
/// `std::env::remove_var`. Returns how many values were wiped.
///
/// # Safety
///
/// No other thread may read or change the environment meanwhile (call it while single-threaded), and
/// nothing may hold a `&str` into an environment string (std copies values out, so it does not).
pub unsafe fn wipe_environment_value(name: &str) -> usize {
    let mut wiped = 0;
    // SAFETY: `environ` is a NULL-terminated array of NUL-terminated strings owned by the C library;
    // the caller guarantees nobody else touches it now. Each string is writable memory: the initial
    // stack block or a heap copy made by setenv/putenv of an owned buffer.
    unsafe {
        let mut entry = libc::environ;
        if entry.is_null() {
            return 0;
        }
        while !(*entry).is_null() {
            let start = *entry;
            let bytes = CStr::from_ptr(start).to_bytes();
            if let Some(range) = value_range(bytes, name) {
                for offset in range {
                    std::ptr::write_volatile(start.add(offset), 0);
                }
                wiped += 1;
            }
            entry = entry.add(1);
        }
    }
    wiped
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE 0`): its `/proc/<pid>` files then belong to root
/// and only a process with `CAP_SYS_PTRACE` may read its memory, environment or file descriptors. The
/// flag is inherited by fork and reset by execve of an ordinary program, so commands are unaffected.
pub fn make_non_dumpable() -> Result<(), String> {
    // SAFETY: prctl(PR_SET_DUMPABLE) has no memory-safety preconditions.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(format!(
            "cannot make the agent non-dumpable: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Whether this process is dumpable (`PR_GET_DUMPABLE`); `None` if the kernel does not say.
pub fn is_dumpable() -> Option<bool> {
    // SAFETY: prctl(PR_GET_DUMPABLE) has no memory-safety preconditions.
    match unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) } {
        0 => Some(false),
        value if value > 0 => Some(true),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_value_of_the_named_entry_only() {
        assert_eq!(
            value_range(b"ORCHARD_AGENT_TOKEN=abc", "ORCHARD_AGENT_TOKEN"),
            Some(20..23)
        );
        assert_eq!(
            value_range(b"ORCHARD_AGENT_TOKEN=", "ORCHARD_AGENT_TOKEN"),
            Some(20..20),
            "nothing to wipe"
        );
        assert_eq!(
            value_range(b"ORCHARD_AGENT_TOKEN_FILE=/t", "ORCHARD_AGENT_TOKEN"),
            None
        );
        assert_eq!(
            value_range(b"ORCHARD_AGENT_TOKEN", "ORCHARD_AGENT_TOKEN"),
            None
        );
        assert_eq!(
            value_range(b"X=ORCHARD_AGENT_TOKEN=1", "ORCHARD_AGENT_TOKEN"),
            None
        );
    }
}
