//! The trajectory run's conversation with a sandbox's agent, from "start the run" to a
//! [`TrajectoryResult`], apart from where the agent is and who may still want the answer (the caller
//! passes an [`RunAgent`] and a `wanted` check), so every transient-failure path is unit-tested
//! against a scripted agent.
//!
//! The rule for errors: what can pass (the agent unreachable, 408, 429, any 5xx) is retried with the
//! runner's backoff until the run's deadline; what cannot (another 4xx, a malformed answer) ends the run
//! at once with a reason saying so. A process the agent no longer knows (404 while waiting) is lost.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tracing::warn;

use super::run_result::{aborted, result_of_run};
use crate::plumbing::backoff::Retry;
use crate::pod::agent_client::AgentCallError;
use orchard_api::agent::ProcessStatus;
use orchard_api::{RunSpec, TrajectoryResult};

/// Extra time the operator allows beyond `timeoutSeconds` before declaring the run lost.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(60);
/// Seconds each long poll waits for the process to exit.
const LONG_POLL_SECONDS: u64 = 20;

/// What the runner asks of a sandbox's agent about its one run process.
pub trait RunAgent: Sync {
    /// Starts the run (or, after a restart, finds it already started: the agent's 409).
    fn start(
        &self,
        run: &RunSpec,
    ) -> impl Future<Output = Result<ProcessStatus, AgentCallError>> + Send;
    /// The run's status, answered as soon as it exits or after `wait_seconds`.
    fn poll(
        &self,
        wait_seconds: u64,
    ) -> impl Future<Output = Result<ProcessStatus, AgentCallError>> + Send;
    /// Kills the run's process group.
    fn kill(&self) -> impl Future<Output = Result<(), AgentCallError>> + Send;
    /// The result file (`None`: it does not exist).
    fn read(
        &self,
        path: &str,
    ) -> impl Future<Output = Result<Option<Bytes>, AgentCallError>> + Send;
}

impl AgentCallError {
    /// Whether the same call may succeed later: the agent unreachable, or an answer that says "not
    /// now" (408 Request Timeout, 429 Too Many Requests, any 5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            AgentCallError::Unreachable(_) => true,
            AgentCallError::Status { status, .. } => {
                matches!(status, 408 | 429) || (500..600).contains(status)
            }
            AgentCallError::Protocol(_) => false,
        }
    }
}

/// Whether `agent` still answers after its run ended without a result: one poll of the run, where
/// any answer, even "no such process", counts and only an unreachable agent does not. A node that
/// dies kills its processes one at a time: an agent can report its run killed and die the next
/// moment, long before the API shows its pod lost. Such an end is the pod's, not the run's.
pub async fn agent_answers(agent: &impl RunAgent) -> bool {
    !matches!(agent.poll(0).await, Err(AgentCallError::Unreachable(_)))
}

/// Drives `run` through `agent` (in a task container with memory limit `memory_limit`, for the
/// message of an OOM-killed run) until it has a result, or until `wanted()` says nobody needs one any
/// more (`None`: the sandbox is gone, has a result, or this replica stopped leading). `deadline` is
/// when the run must have ended (`timeoutSeconds` after Ready, plus [`DEADLINE_GRACE`]).
pub async fn run_to_result(
    agent: &impl RunAgent,
    run: &RunSpec,
    memory_limit: Option<&str>,
    deadline: Instant,
    wanted: impl Fn() -> bool,
    mut retry: Retry,
) -> Option<TrajectoryResult> {
    let mut process = loop {
        if !wanted() {
            return None;
        }
        match agent.start(run).await {
            Ok(process) => break process,
            Err(err) if !err.is_transient() => {
                return Some(aborted(
                    "RunnerStartFailed",
                    format!("the agent refused to start the run: {err}"),
                    None,
                ));
            }
            Err(err) if Instant::now() < deadline => {
                warn!(%err, "cannot start the run yet; retrying");
                retry.wait().await;
            }
            Err(err) => {
                return Some(aborted(
                    "TimeExceeded",
                    format!("the run could not be started before its deadline: {err}"),
                    None,
                ));
            }
        }
    };
    retry.reset();
    while !process.exited() {
        if !wanted() {
            return None;
        }
        if Instant::now() >= deadline {
            let _ = agent.kill().await;
            return Some(aborted(
                "TimeExceeded",
                format!(
                    "the run did not report its end within timeoutSeconds={} (+{}s grace) and was killed",
                    run.timeout_seconds,
                    DEADLINE_GRACE.as_secs()
                ),
                None,
            ));
        }
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        match agent.poll(LONG_POLL_SECONDS.min(left.max(1))).await {
            Ok(status) => {
                process = status;
                retry.reset();
            }
            Err(AgentCallError::Status { status: 404, .. }) => {
                return Some(aborted(
                    "RunLost",
                    "the agent no longer knows the run's process",
                    None,
                ));
            }
            Err(err) => {
                warn!(%err, "cannot reach the run's agent; retrying");
                retry.wait().await;
            }
        }
    }
    retry.reset();
    let file = loop {
        if !wanted() {
            return None;
        }
        match agent.read(&run.result_path).await {
            Ok(file) => break Ok(file),
            Err(err) if err.is_transient() && Instant::now() < deadline => {
                warn!(%err, "cannot read the run's result file yet; retrying");
                retry.wait().await;
            }
            Err(err) => break Err(err.to_string()),
        }
    };
    let file_ref = file.as_ref().map(|f| f.as_deref()).map_err(Clone::clone);
    Some(result_of_run(
        &process,
        file_ref,
        &run.result_path,
        run.timeout_seconds,
        memory_limit,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use orchard_api::TrajectoryStatus;

    use super::*;

    type Answer<T> = Result<T, AgentCallError>;

    /// An agent that gives scripted answers in order; once a script runs out, its last answer repeats.
    #[derive(Default)]
    struct Scripted {
        starts: Mutex<VecDeque<Answer<ProcessStatus>>>,
        polls: Mutex<VecDeque<Answer<ProcessStatus>>>,
        reads: Mutex<VecDeque<Answer<Option<Bytes>>>>,
        calls: AtomicUsize,
        kills: AtomicUsize,
    }

    fn next<T>(script: &Mutex<VecDeque<Answer<T>>>) -> Answer<T>
    where
        T: Clone,
    {
        let mut script = script.lock().unwrap_or_else(|p| p.into_inner());
        let answer = if script.len() > 1 {
            script.pop_front()
        } else {
            script.front().map(copy)
        };
        answer.unwrap_or_else(|| Err(AgentCallError::Protocol("script ran out".into())))
    }

    fn copy<T: Clone>(answer: &Answer<T>) -> Answer<T> {
        match answer {
            Ok(value) => Ok(value.clone()),
            Err(AgentCallError::Unreachable(m)) => Err(AgentCallError::Unreachable(m.clone())),
            Err(AgentCallError::Status { status, body }) => Err(AgentCallError::Status {
                status: *status,
                body: body.clone(),
            }),
            Err(AgentCallError::Protocol(m)) => Err(AgentCallError::Protocol(m.clone())),
        }
    }

    impl RunAgent for Scripted {
        async fn start(&self, _run: &RunSpec) -> Answer<ProcessStatus> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            next(&self.starts)
        }
        async fn poll(&self, wait_seconds: u64) -> Answer<ProcessStatus> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let answer = next(&self.polls);
            if matches!(&answer, Ok(p) if !p.exited()) {
                // A long poll of a process that keeps running answers after its wait.
                tokio::time::sleep(Duration::from_secs(wait_seconds)).await;
            }
            answer
        }
        async fn kill(&self) -> Answer<()> {
            self.kills.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn read(&self, _path: &str) -> Answer<Option<Bytes>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            next(&self.reads)
        }
    }

    fn process(exited: bool) -> ProcessStatus {
        let mut status: ProcessStatus = serde_json::from_value(serde_json::json!({
            "id": "orchard-run", "pid": 7, "argv": ["run"],
            "state": if exited { "exited" } else { "running" },
            "exitCode": null, "signal": null, "timedOut": false, "oomKilled": false,
            "startedAt": "2026-11-24T00:00:00Z", "finishedAt": null, "durationMs": 0,
            "stdoutTruncated": false, "stderrTruncated": false,
            "stdoutLossy": false, "stderrLossy": false, "outputEncoding": "text"
        }))
        .expect("a valid process status");
        if exited {
            status.exit_code = Some(0);
        }
        status
    }

    fn status(code: u16) -> AgentCallError {
        AgentCallError::Status {
            status: code,
            body: "{}".into(),
        }
    }

    fn run() -> RunSpec {
        serde_json::from_value(serde_json::json!({
            "command": ["run"], "timeoutSeconds": 600, "resultPath": "/tmp/result.json"
        }))
        .expect("a valid run spec")
    }

    fn quick_retry() -> Retry {
        Retry::new(Duration::from_millis(100), Duration::from_secs(1))
    }

    fn reward_file() -> Answer<Option<Bytes>> {
        Ok(Some(Bytes::from_static(br#"{"reward": 1.0}"#)))
    }

    async fn drive(agent: &Scripted, deadline: Duration) -> Option<TrajectoryResult> {
        run_to_result(
            agent,
            &run(),
            Some("64Mi"),
            Instant::now() + deadline,
            || true,
            quick_retry(),
        )
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_and_failing_agents_are_retried_until_the_run_completes() {
        let agent = Scripted::default();
        agent.starts.lock().unwrap().extend([
            Err(status(429)),
            Err(status(503)),
            Err(AgentCallError::Unreachable("connection reset".into())),
            Ok(process(false)),
        ]);
        agent.polls.lock().unwrap().extend([
            Err(status(502)),
            Ok(process(false)),
            Ok(process(true)),
        ]);
        agent.reads.lock().unwrap().extend([
            Err(status(429)),
            Err(AgentCallError::Unreachable("timeout".into())),
            reward_file(),
        ]);
        let result = drive(&agent, Duration::from_secs(600))
            .await
            .expect("a result");
        assert_eq!(result.status, TrajectoryStatus::Completed, "{result:?}");
        assert_eq!(result.reward, Some(1.0));
        assert_eq!(agent.calls.load(Ordering::SeqCst), 4 + 3 + 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_that_cannot_pass_aborts_at_once() {
        for code in [400, 401, 403, 422] {
            let agent = Scripted::default();
            agent.starts.lock().unwrap().push_back(Err(status(code)));
            let result = drive(&agent, Duration::from_secs(600))
                .await
                .expect("a result");
            assert_eq!(
                result.reason.as_deref(),
                Some("RunnerStartFailed"),
                "{code}"
            );
            assert_eq!(agent.calls.load(Ordering::SeqCst), 1, "{code}: no retry");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_throttled_past_the_deadline_is_time_exceeded() {
        let agent = Scripted::default();
        agent.starts.lock().unwrap().push_back(Err(status(429)));
        let started = Instant::now();
        let result = drive(&agent, Duration::from_secs(30))
            .await
            .expect("a result");
        assert_eq!(result.reason.as_deref(), Some("TimeExceeded"));
        assert!(started.elapsed() >= Duration::from_secs(30));
        assert!(agent.calls.load(Ordering::SeqCst) > 3, "retried meanwhile");
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_result_file_is_no_result_and_an_unreadable_one_is_retried_to_the_deadline() {
        let agent = Scripted::default();
        agent.starts.lock().unwrap().push_back(Ok(process(true)));
        agent.reads.lock().unwrap().push_back(Ok(None));
        let result = drive(&agent, Duration::from_secs(600))
            .await
            .expect("a result");
        assert_eq!(result.reason.as_deref(), Some("NoResult"));
        assert_eq!(
            agent.calls.load(Ordering::SeqCst),
            2,
            "a missing file is final"
        );

        let agent = Scripted::default();
        agent.starts.lock().unwrap().push_back(Ok(process(true)));
        agent.reads.lock().unwrap().push_back(Err(status(500)));
        let result = drive(&agent, Duration::from_secs(20))
            .await
            .expect("a result");
        assert_eq!(result.reason.as_deref(), Some("NoResult"));
        assert!(
            agent.calls.load(Ordering::SeqCst) > 3,
            "retried until the deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_past_its_deadline_is_killed_and_a_lost_process_is_reported() {
        let agent = Scripted::default();
        agent.starts.lock().unwrap().push_back(Ok(process(false)));
        agent.polls.lock().unwrap().push_back(Ok(process(false)));
        let result = drive(&agent, Duration::from_secs(90))
            .await
            .expect("a result");
        assert_eq!(result.reason.as_deref(), Some("TimeExceeded"));
        assert_eq!(agent.kills.load(Ordering::SeqCst), 1);

        let agent = Scripted::default();
        agent.starts.lock().unwrap().push_back(Ok(process(false)));
        agent.polls.lock().unwrap().push_back(Err(status(404)));
        let result = drive(&agent, Duration::from_secs(90))
            .await
            .expect("a result");
        assert_eq!(result.reason.as_deref(), Some("RunLost"));
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_returned_once_the_result_is_no_longer_wanted() {
        let agent = Scripted::default();
        agent.starts.lock().unwrap().push_back(Err(status(503)));
        let asked = AtomicUsize::new(0);
        let result = run_to_result(
            &agent,
            &run(),
            None,
            Instant::now() + Duration::from_secs(600),
            || asked.fetch_add(1, Ordering::SeqCst) < 3,
            quick_retry(),
        )
        .await;
        assert!(result.is_none());
        assert_eq!(agent.calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn transient_errors() {
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(status(code).is_transient(), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 413, 422] {
            assert!(!status(code).is_transient(), "{code}");
        }
        assert!(AgentCallError::Unreachable("x".into()).is_transient());
        assert!(!AgentCallError::Protocol("x".into()).is_transient());
    }

    #[tokio::test(start_paused = true)]
    async fn only_an_unreachable_agent_does_not_answer() {
        for (answer, answers) in [
            (Ok(process(true)), true),
            (Err(status(404)), true),
            (Err(status(503)), true),
            (Err(AgentCallError::Protocol("garbled".into())), true),
            (
                Err(AgentCallError::Unreachable("connection refused".into())),
                false,
            ),
        ] {
            let agent = Scripted::default();
            agent.polls.lock().unwrap().push_back(answer);
            assert_eq!(agent_answers(&agent).await, answers);
        }
    }
}
