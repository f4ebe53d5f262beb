//! From a finished run to a trajectory result (pure): the runner's JSON result file decides, and
//! anything that makes it unusable becomes an `aborted` result with a reason and a message saying what
//! the runner must fix.
//!
//! The result file holds one JSON object:
//! `{"reward": 1.0, "status": "completed", "length": 812, "artifact": "s3://bucket/traj-7", "message": "..."}`
//! — `reward` (a finite number) is required unless `status` is `aborted`; `status` defaults to
//! `completed`; `length` is a non-negative integer; other keys are ignored.

use serde_json::Value;

use orchard_api::agent::ProcessStatus;
use orchard_api::{TrajectoryResult, TrajectoryStatus};

/// Longest `artifact` kept (the CRD's limit).
const MAX_ARTIFACT: usize = 4096;
/// Longest `message` kept (the CRD's limit).
const MAX_MESSAGE: usize = 4096;

/// An aborted result with `reason` and `message`.
pub fn aborted(
    reason: &str,
    message: impl Into<String>,
    exit_code: Option<i32>,
) -> TrajectoryResult {
    let message: String = message.into();
    TrajectoryResult {
        reward: None,
        status: TrajectoryStatus::Aborted,
        length: None,
        exit_code,
        artifact: None,
        reason: Some(reason.to_string()),
        message: Some(crate::plumbing::text::cut(&message, MAX_MESSAGE)),
    }
}

fn describe_exit(process: &ProcessStatus) -> String {
    match (process.exit_code, process.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "an unknown status".to_string(),
    }
}

/// Reason of a run whose command the kernel's out-of-memory killer ended before it wrote a valid
/// result (the same word as the Sandbox failure of an OOM-killed task container, `pod/oom.rs`).
pub const RUN_OOM_KILLED: &str = "OOMKilled";

/// The result of a run that ended as `process`, whose result file read as `file` (`Ok(None)`: no
/// file; `Err`: it could not be read), in a task container whose memory limit is `memory_limit` (as
/// its Pod says, e.g. `2Gi`; only used in messages, as is `timeout_seconds`). A command the OOM
/// killer ended without a valid result file is `aborted/OOMKilled`; a valid file still counts.
pub fn result_of_run(
    process: &ProcessStatus,
    file: Result<Option<&[u8]>, String>,
    result_path: &str,
    timeout_seconds: i64,
    memory_limit: Option<&str>,
) -> TrajectoryResult {
    let exit_code = process.exit_code;
    if process.timed_out {
        return aborted(
            "TimeExceeded",
            format!(
                "the run did not finish within timeoutSeconds={timeout_seconds} and was killed"
            ),
            exit_code,
        );
    }
    if process.oom_killed && !matches!(&file, Ok(Some(bytes)) if parse_result(bytes).is_ok()) {
        let limit = match memory_limit {
            Some(limit) => format!("the sandbox's memory limit of {limit}"),
            None => "the memory available to the sandbox".to_string(),
        };
        return aborted(
            RUN_OOM_KILLED,
            format!(
                "the run's command was killed by the kernel's out-of-memory killer (signal 9) before it wrote a valid result file {result_path}: it used more than {limit}; raise `spec.resources.memory` (a RolloutGroup's `retry.onOOM` raises it on retry), or make the task use less memory"
            ),
            exit_code,
        );
    }
    let bytes = match file {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return aborted(
                "NoResult",
                format!(
                    "the run ended with {} without writing its result file {result_path}",
                    describe_exit(process)
                ),
                exit_code,
            );
        }
        Err(err) => {
            return aborted(
                "NoResult",
                format!("cannot read the result file {result_path}: {err}"),
                exit_code,
            );
        }
    };
    match parse_result(bytes) {
        Ok(mut result) => {
            result.exit_code = exit_code;
            result
        }
        Err(problem) => aborted(
            "InvalidResult",
            format!(
                "{result_path} is not a valid result ({problem}); expected e.g. {{\"reward\": 1.0, \"status\": \"completed\", \"length\": 42}}"
            ),
            exit_code,
        ),
    }
}

/// Parses a result file's JSON object.
pub fn parse_result(bytes: &[u8]) -> Result<TrajectoryResult, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let object = value.as_object().ok_or("not a JSON object")?;
    let status = match object.get("status") {
        None | Some(Value::Null) => TrajectoryStatus::Completed,
        Some(Value::String(s)) => match s.as_str() {
            "completed" => TrajectoryStatus::Completed,
            "truncated" => TrajectoryStatus::Truncated,
            "aborted" => TrajectoryStatus::Aborted,
            other => {
                return Err(format!(
                    "status must be completed, truncated or aborted, not {other:?}"
                ));
            }
        },
        Some(other) => return Err(format!("status must be a string, not {other}")),
    };
    let reward = match object.get("reward") {
        None | Some(Value::Null) if status == TrajectoryStatus::Aborted => None,
        None | Some(Value::Null) => return Err("reward is missing".into()),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(r) if r.is_finite() => Some(r),
            _ => return Err(format!("reward {n} is not a finite number")),
        },
        Some(other) => return Err(format!("reward must be a number, not {other}")),
    };
    let length = match object.get("length") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_i64() {
            Some(l) if l >= 0 => Some(l),
            _ => return Err(format!("length must be a non-negative integer, not {n}")),
        },
        Some(other) => return Err(format!("length must be an integer, not {other}")),
    };
    let artifact = match object.get("artifact") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= MAX_ARTIFACT => Some(s.clone()),
        Some(Value::String(_)) => {
            return Err(format!("artifact is longer than {MAX_ARTIFACT} bytes"));
        }
        Some(other) => return Err(format!("artifact must be a string, not {other}")),
    };
    let message = match object.get("message") {
        Some(Value::String(s)) => Some(crate::plumbing::text::cut(s, MAX_MESSAGE)),
        _ => None,
    };
    Ok(TrajectoryResult {
        reward,
        status,
        length,
        exit_code: None,
        artifact,
        reason: (status == TrajectoryStatus::Aborted).then(|| "RunnerAborted".to_string()),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32) -> ProcessStatus {
        serde_json::from_value(serde_json::json!({
            "id": "orchard-run", "pid": 7, "argv": ["/bin/run"], "state": "exited",
            "exitCode": code, "signal": null, "timedOut": false, "oomKilled": false,
            "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z",
            "durationMs": 1000, "stdoutTruncated": false, "stderrTruncated": false,
            "stdoutLossy": false, "stderrLossy": false, "outputEncoding": "text"
        }))
        .expect("a process status as the agent sends it")
    }

    #[test]
    fn a_valid_result_file_is_recorded_with_the_exit_code() {
        let body = br#"{"reward": 0.5, "status": "truncated", "length": 812, "artifact": "s3://b/t7", "extra": 1}"#;
        let result = result_of_run(&exited(0), Ok(Some(body)), "/r.json", 60, None);
        assert_eq!(result.reward, Some(0.5));
        assert_eq!(result.status, TrajectoryStatus::Truncated);
        assert_eq!(result.length, Some(812));
        assert_eq!(result.artifact.as_deref(), Some("s3://b/t7"));
        assert_eq!(result.exit_code, Some(0));
        assert_eq!(result.reason, None);
    }

    #[test]
    fn status_defaults_to_completed_and_a_nonzero_exit_with_a_result_counts() {
        let result = result_of_run(
            &exited(3),
            Ok(Some(br#"{"reward": 1}"#)),
            "/r.json",
            60,
            None,
        );
        assert_eq!(result.status, TrajectoryStatus::Completed);
        assert_eq!(result.reward, Some(1.0));
        assert_eq!(result.exit_code, Some(3));
    }

    #[test]
    fn a_missing_file_is_aborted_no_result() {
        let result = result_of_run(&exited(1), Ok(None), "/r.json", 60, None);
        assert_eq!(result.status, TrajectoryStatus::Aborted);
        assert_eq!(result.reason.as_deref(), Some("NoResult"));
        assert!(result.message.unwrap().contains("exit code 1"));
    }

    #[test]
    fn a_timeout_is_aborted_time_exceeded() {
        let mut process = exited(137);
        process.timed_out = true;
        let result = result_of_run(&process, Ok(Some(br#"{"reward": 1}"#)), "/r.json", 5, None);
        assert_eq!(result.reason.as_deref(), Some("TimeExceeded"));
        assert!(result.message.unwrap().contains("timeoutSeconds=5"));
    }

    #[test]
    fn invalid_results_are_aborted_with_the_problem() {
        for (body, problem) in [
            (&b"not json"[..], "not JSON"),
            (b"[1]", "not a JSON object"),
            (b"{}", "reward is missing"),
            (br#"{"reward": "high"}"#, "reward must be a number"),
            (
                br#"{"reward": 1, "status": "done"}"#,
                "status must be completed",
            ),
            (
                br#"{"reward": 1, "length": -4}"#,
                "length must be a non-negative integer",
            ),
            (
                br#"{"reward": 1, "length": 2.5}"#,
                "length must be a non-negative integer",
            ),
        ] {
            let result = result_of_run(&exited(0), Ok(Some(body)), "/r.json", 60, None);
            assert_eq!(result.reason.as_deref(), Some("InvalidResult"), "{body:?}");
            let message = result.message.unwrap();
            assert!(message.contains(problem), "{message}");
        }
    }

    #[test]
    fn an_oom_killed_command_without_a_valid_result_is_aborted_oom_killed() {
        let mut killed = exited(137);
        killed.exit_code = None;
        killed.signal = Some(9);
        killed.oom_killed = true;
        for file in [Ok(None), Ok(Some(&b"{\"rew"[..]))] {
            let result = result_of_run(&killed, file, "/r.json", 60, Some("64Mi"));
            assert_eq!(result.status, TrajectoryStatus::Aborted);
            assert_eq!(result.reason.as_deref(), Some("OOMKilled"));
            let message = result.message.unwrap();
            for part in [
                "out-of-memory killer",
                "memory limit of 64Mi",
                "/r.json",
                "spec.resources.memory",
            ] {
                assert!(message.contains(part), "{part}: {message}");
            }
        }
        let unknown = result_of_run(&killed, Ok(None), "/r.json", 60, None);
        assert!(
            unknown
                .message
                .unwrap()
                .contains("the memory available to the sandbox")
        );
        // The task wrote its verdict before something it ran was killed: the verdict stands.
        let written = result_of_run(
            &killed,
            Ok(Some(br#"{"reward": 1}"#)),
            "/r.json",
            60,
            Some("64Mi"),
        );
        assert_eq!(written.status, TrajectoryStatus::Completed);
        // Not OOM-killed: no result file is NoResult, as before.
        let plain = result_of_run(&exited(137), Ok(None), "/r.json", 60, Some("64Mi"));
        assert_eq!(plain.reason.as_deref(), Some("NoResult"));
    }

    #[test]
    fn a_runner_may_abort_without_a_reward() {
        let result = parse_result(br#"{"status": "aborted", "message": "env crashed"}"#).unwrap();
        assert_eq!(result.status, TrajectoryStatus::Aborted);
        assert_eq!(result.reward, None);
        assert_eq!(result.reason.as_deref(), Some("RunnerAborted"));
    }
}
