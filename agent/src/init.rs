//! PID 1 duty. In a container the agent is often PID 1: orphaned processes are re-parented to it and
//! must be reaped, and SIGTERM from the runtime must reach the work. When started as PID 1 the agent
//! forks before any thread exists: the parent stays a tiny init (reaps every child, forwards signals to
//! the server, exits with its status), the child runs the server.

use std::process::ExitCode;

/// Signals the init forwards to the server process.
const FORWARDED: [i32; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// Runs `serve` in a child process and acts as init in this one. Must be called before any thread
/// (the tokio runtime) is started.
pub fn run_as_init(serve: impl FnOnce() -> ExitCode) -> ExitCode {
    // SAFETY: sigset manipulation and fork on a single-threaded process; the child only restores its
    // signal mask before continuing as a normal program.
    unsafe {
        let mut handled: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut handled);
        libc::sigaddset(&mut handled, libc::SIGCHLD);
        for signal in FORWARDED {
            libc::sigaddset(&mut handled, signal);
        }
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, &handled, &mut previous);
        match libc::fork() {
            -1 => {
                libc::sigprocmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
                eprintln!(
                    "orchard-agent: fork failed ({}); serving as PID 1 without a reaper",
                    std::io::Error::last_os_error()
                );
                serve()
            }
            0 => {
                libc::sigprocmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
                serve()
            }
            server => supervise_server(server, &handled),
        }
    }
}

/// The init loop: wait for signals; reap on SIGCHLD; forward the rest; exit when the server exits.
fn supervise_server(server: libc::pid_t, handled: &libc::sigset_t) -> ExitCode {
    loop {
        let mut signal: libc::c_int = 0;
        // SAFETY: `handled` is a valid, initialised signal set blocked in this thread.
        if unsafe { libc::sigwait(handled, &mut signal) } != 0 {
            continue;
        }
        if signal != libc::SIGCHLD {
            // SAFETY: plain syscall.
            unsafe { libc::kill(server, signal) };
            continue;
        }
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: plain syscall with a valid out-pointer.
            let reaped = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if reaped <= 0 {
                break;
            }
            if reaped == server {
                return exit_code_of(status);
            }
        }
    }
}

/// The shell convention: the exit code, or 128 + the signal that killed the process.
fn exit_code_of(status: libc::c_int) -> ExitCode {
    if libc::WIFEXITED(status) {
        ExitCode::from(libc::WEXITSTATUS(status) as u8)
    } else if libc::WIFSIGNALED(status) {
        ExitCode::from((128 + libc::WTERMSIG(status)) as u8)
    } else {
        ExitCode::FAILURE
    }
}
