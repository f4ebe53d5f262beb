//! Pseudo-terminals for background processes started with `pty`: the pair is opened with
//! `posix_openpt` (no `libutil`, nothing the static binary lacks), the child gets the terminal as stdin,
//! stdout and stderr, starts a session of its own with it as controlling terminal, and the agent reads
//! and writes the master side through the runtime (non-blocking, `AsyncFd`).

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, ReadBuf};

/// Rows and columns of a terminal (the shared wire type).
pub use orchard_api::agent::TerminalSize;

/// The agent's side of a pseudo-terminal.
#[derive(Debug)]
pub struct PtyMaster {
    fd: AsyncFd<OwnedFd>,
}

fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

/// Opens a pseudo-terminal of `size`: the master (non-blocking, registered with the runtime) and the
/// child's side, opened without becoming the agent's controlling terminal.
pub fn open_pty(size: TerminalSize) -> io::Result<(PtyMaster, File)> {
    // SAFETY: plain call; the returned descriptor is owned below.
    let raw =
        check(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) })?;
    // SAFETY: `posix_openpt` returned a fresh descriptor nothing else owns.
    let master = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: `master` is an open pseudo-terminal master.
    check(unsafe { libc::grantpt(master.as_raw_fd()) })?;
    // SAFETY: as above.
    check(unsafe { libc::unlockpt(master.as_raw_fd()) })?;
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: the buffer is writable for its length; `ptsname_r` NUL-terminates on success.
    let failed = unsafe { libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) };
    if failed != 0 {
        return Err(io::Error::from_raw_os_error(failed));
    }
    // SAFETY: `ptsname_r` succeeded, so `name` holds a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(&path)?;
    // SAFETY: `master` is open; O_NONBLOCK is needed for `AsyncFd`.
    unsafe {
        let flags = check(libc::fcntl(master.as_raw_fd(), libc::F_GETFL))?;
        check(libc::fcntl(
            master.as_raw_fd(),
            libc::F_SETFL,
            flags | libc::O_NONBLOCK,
        ))?;
    }
    // SAFETY: an `OwnedFd` keeps its descriptor open, and the same one, for as long as it is owned.
    let fd = unsafe { AsyncFd::register(master) }.map_err(io::Error::from)?;
    let master = PtyMaster { fd };
    master.resize(size)?;
    Ok((master, slave))
}

/// Makes the child of `command` the leader of a new session whose controlling terminal is its stdin
/// (the terminal's child side). The session's process group is the child's own (`pgid == pid`), as
/// with every command; `Command::process_group` must not be used with it (a group leader cannot start
/// a session).
pub fn make_controlling_terminal(command: &mut tokio::process::Command) {
    // SAFETY: the hook makes two system calls (async-signal-safe) and touches no memory.
    unsafe {
        command.pre_exec(|| {
            check(libc::setsid())?;
            check(libc::ioctl(0, libc::TIOCSCTTY, 0))?;
            Ok(())
        });
    }
}

impl PtyMaster {
    /// Sets the terminal's size (the foreground process group gets SIGWINCH).
    pub fn resize(&self, size: TerminalSize) -> io::Result<()> {
        let window = libc::winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: an open terminal descriptor and a valid `winsize`.
        check(unsafe { libc::ioctl(self.fd.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &window) })
            .map(drop)
    }

    /// Writes all of `bytes` to the terminal (what the process reads as typed input).
    pub async fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| {
                // SAFETY: an open descriptor and a readable buffer of the given length.
                let written = unsafe {
                    libc::write(fd.get_ref().as_raw_fd(), bytes.as_ptr().cast(), bytes.len())
                };
                if written < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(written as usize)
                }
            }) {
                Ok(Ok(written)) => bytes = &bytes[written..],
                Ok(Err(error)) => return Err(error),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    fn poll_read_into(
        &self,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(context))?;
            let unfilled = buffer.initialize_unfilled();
            match guard.try_io(|fd| {
                // SAFETY: an open descriptor and a writable buffer of the given length.
                let read = unsafe {
                    libc::read(
                        fd.get_ref().as_raw_fd(),
                        unfilled.as_mut_ptr().cast(),
                        unfilled.len(),
                    )
                };
                if read < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(read as usize)
                }
            }) {
                Ok(Ok(read)) => {
                    buffer.advance(read);
                    return Poll::Ready(Ok(()));
                }
                // Every process holding the terminal's child side has closed it: the end.
                Ok(Err(error)) if error.raw_os_error() == Some(libc::EIO) => {
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(error)) => return Poll::Ready(Err(error)),
                Err(_would_block) => continue,
            }
        }
    }
}

/// Reads what the process writes to its terminal.
#[derive(Debug)]
pub struct PtyReader(pub Arc<PtyMaster>);

impl AsyncRead for PtyReader {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.poll_read_into(context, buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_terminal_pair_carries_bytes_and_its_size() {
        let (master, slave) = open_pty(TerminalSize {
            rows: 33,
            cols: 101,
        })
        .unwrap();
        let mut window = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: an open terminal descriptor and a writable `winsize`.
        assert_eq!(
            unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut window) },
            0
        );
        assert_eq!((window.ws_row, window.ws_col), (33, 101));
        let master = Arc::new(master);
        master.write_all(b"typed\n").await.unwrap();
        // The line discipline echoes input back to the master.
        let mut reader = PtyReader(Arc::clone(&master));
        let mut buffer = [0u8; 64];
        let read = reader.read(&mut buffer).await.unwrap();
        assert!(String::from_utf8_lossy(&buffer[..read]).starts_with("typed"));
        drop(slave);
        let mut rest = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            reader.read_to_end(&mut rest),
        )
        .await
        .unwrap()
        .unwrap();
    }
}
