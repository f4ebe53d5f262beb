//! Running a started command to its end: feeding stdin, pumping both output streams, enforcing the
//! timeout, and killing the process group as soon as the leader exits (so `&` jobs cannot linger and
//! pipes held open by escaped grandchildren cannot hang the request).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::oom;
use super::output::{OutputSink, pump};
use super::spawn::RunningCommand;

/// How long output is still read after the leader exited and its group was killed. Only processes that
/// left the group (e.g. `setsid daemon &`) can keep the pipes open that long.
pub const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// How a command ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Finished {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Killed by the out-of-memory killer (see `oom`).
    pub oom_killed: bool,
}

impl Finished {
    fn from_status(
        status: Option<ExitStatus>,
        timed_out: bool,
        oom_kills_before: Option<u64>,
    ) -> Self {
        let signal = status.and_then(|status| status.signal());
        let oom_killed = signal == Some(libc::SIGKILL)
            && oom::was_oom_killed(signal, timed_out, oom_kills_before, oom::oom_kills());
        Finished {
            exit_code: status.and_then(|status| status.code()),
            signal,
            timed_out,
            oom_killed,
        }
    }
}

/// Drives `command` to completion. If this future is dropped (client disconnect), the command's group is
/// SIGKILLed by the `ProcessGroup` guard it owns.
pub async fn supervise(
    command: Box<RunningCommand>,
    stdin_data: Option<Vec<u8>>,
    stdout_sink: &mut OutputSink,
    stderr_sink: &mut OutputSink,
    timeout: Option<Duration>,
    drain_grace: Duration,
) -> Finished {
    let RunningCommand {
        mut child,
        mut group,
        stdin,
        stdout,
        stderr,
        oom_kills_before,
        ..
    } = *command;
    let feed_stdin = async move {
        if let (Some(mut pipe), Some(data)) = (stdin, stdin_data) {
            // EPIPE just means the command did not read all of it.
            let _ = pipe.write_all(&data).await;
        }
        // The pipe is dropped here: the command sees end of input.
    };
    let output = async {
        tokio::join!(
            pump(stdout, stdout_sink),
            pump(stderr, stderr_sink),
            feed_stdin
        );
    };
    tokio::pin!(output);
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let mut output_done = false;
    let mut timed_out = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.ok(),
            () = sleep_until(deadline), if !timed_out => {
                timed_out = true;
                group.kill();
            }
            () = &mut output, if !output_done => output_done = true,
        }
    };
    group.kill();
    if !output_done {
        let _ = tokio::time::timeout(drain_grace, &mut output).await;
    }
    Finished::from_status(status, timed_out, oom_kills_before)
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
