//! `orchard-pause`: the process that holds a pod's namespaces (the CRI "sandbox" or pause container).
//! Written here because no registry is reachable to pull `registry.k8s.io/pause`; it does what that
//! program does: exit 0 on SIGINT or SIGTERM, reap every child on SIGCHLD (it is PID 1 of the pod's
//! shared PID namespace when a pod asks for one), and otherwise sleep. `-v` prints the version.

use std::mem::MaybeUninit;

fn main() {
    if std::env::args()
        .skip(1)
        .any(|a| a.eq_ignore_ascii_case("-v"))
    {
        println!("orchard-pause {}", env!("CARGO_PKG_VERSION"));
        return;
    }
    if std::process::id() != 1 {
        eprintln!("Warning: pause should be the first process");
    }
    // SAFETY: plain libc signal-set calls on a set we own; the signals are blocked before waiting.
    unsafe {
        let mut set = MaybeUninit::<libc::sigset_t>::zeroed();
        libc::sigemptyset(set.as_mut_ptr());
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGCHLD] {
            libc::sigaddset(set.as_mut_ptr(), signal);
        }
        let set = set.assume_init();
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            std::process::exit(1);
        }
        loop {
            let signal = libc::sigwaitinfo(&set, std::ptr::null_mut());
            match signal {
                libc::SIGINT | libc::SIGTERM => {
                    eprintln!("Shutting down, got signal {signal}");
                    std::process::exit(0);
                }
                libc::SIGCHLD => {
                    while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
                }
                _ => {}
            }
        }
    }
}
