//! The wire protocol of the in-pod agent (`orchard-agent`, docs/AGENT.md): the JSON request bodies it
//! accepts and the JSON answers it sends. One definition for the agent (serialises answers,
//! deserialises requests), the operator's agent client and the gateway's OpenAPI document (utoipa
//! schemas behind the `openapi` feature). Serde only: the static agent links this without kube.
//!
//! Requests reject unknown fields (`deny_unknown_fields`). Field order is the order on the wire.
//! Validation beyond the JSON shape (exactly one of `argv` and `command`, signal names, paths, ...)
//! is the agent's.

mod exec;
mod files;
mod health;
mod patch;
mod sessions;
mod tunnel;

pub use exec::*;
pub use files::*;
pub use health::*;
pub use patch::*;
pub use sessions::*;
pub use tunnel::*;

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn exec_events_keep_their_wire_shape() {
        let chunk = ExecEvent::Stdout {
            data: "hi\n".into(),
        };
        assert_eq!(
            serde_json::to_string(&chunk).unwrap(),
            r#"{"type":"stdout","data":"hi\n"}"#
        );
        let started = ExecEvent::Started { pid: 7 };
        assert_eq!(
            serde_json::to_string(&started).unwrap(),
            r#"{"type":"started","pid":7}"#
        );
        let exit: ExecEvent =
            serde_json::from_value(json!({"type": "exit", "exitCode": 0, "signal": null,
            "timedOut": false, "oomKilled": false, "durationMs": 3, "stdoutTruncated": false,
            "stderrTruncated": false, "stdoutLossy": false, "stderrLossy": false}))
            .unwrap();
        assert!(matches!(
            exit,
            ExecEvent::Exit {
                exit_code: Some(0),
                error: None,
                ..
            }
        ));
        assert_eq!(
            serde_json::to_value(&exit).unwrap()["type"],
            json!("exit"),
            "{exit:?}"
        );
    }

    fn status() -> ProcessStatus {
        ProcessStatus {
            id: "p-1".into(),
            pid: Some(7),
            line: CommandLine::Shell {
                command: "echo hi".into(),
                shell: "/bin/sh".into(),
            },
            state: ProcessState::Exited,
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            oom_killed: false,
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: Some("2026-01-01T00:00:01Z".into()),
            duration_ms: 1000,
            stdout: None,
            stderr: Some("".into()),
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_lossy: false,
            stderr_lossy: false,
            output_encoding: OutputEncoding::Text,
            error: None,
            stdin_open: false,
            pty: false,
        }
    }

    #[test]
    fn process_status_flattens_its_command_line_and_skips_absent_output() {
        let text = serde_json::to_string(&status()).unwrap();
        assert_eq!(
            text,
            r#"{"id":"p-1","pid":7,"command":"echo hi","shell":"/bin/sh","state":"exited","exitCode":0,"signal":null,"timedOut":false,"oomKilled":false,"startedAt":"2026-01-01T00:00:00Z","finishedAt":"2026-01-01T00:00:01Z","durationMs":1000,"stderr":"","stdoutTruncated":false,"stderrTruncated":false,"stdoutLossy":false,"stderrLossy":false,"outputEncoding":"text"}"#
        );
        let back: ProcessStatus = serde_json::from_str(&text).unwrap();
        assert_eq!(back, status());
        assert!(back.exited());
        let argv = json!({"id": "a", "pid": null, "argv": ["true"], "state": "running", "exitCode": null,
            "signal": null, "timedOut": false, "oomKilled": false, "startedAt": "x", "finishedAt": null,
            "durationMs": 0, "stdoutTruncated": false, "stderrTruncated": false, "stdoutLossy": false,
            "stderrLossy": false, "outputEncoding": "base64"});
        let parsed: ProcessStatus = serde_json::from_value(argv).unwrap();
        assert_eq!(
            parsed.line,
            CommandLine::Argv {
                argv: vec!["true".into()]
            }
        );
        assert_eq!(parsed.state.as_str(), "running");
    }

    #[test]
    fn terminal_and_stdin_flags_appear_only_when_set() {
        let mut status = status();
        status.stdin_open = true;
        status.pty = true;
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(
            (&value["stdinOpen"], &value["pty"]),
            (&json!(true), &json!(true))
        );
        let request: ExecRequest =
            serde_json::from_str(r#"{"argv":["sh"],"keepStdin":true,"pty":{"rows":24,"cols":80}}"#)
                .unwrap();
        assert_eq!(request.pty, Some(TerminalSize { rows: 24, cols: 80 }));
        assert_eq!(request.keep_stdin, Some(true));
        assert!(serde_json::from_str::<ProcessStdinRequest>(r#"{"data":"x","bogus":1}"#).is_err());
    }

    #[test]
    fn requests_reject_unknown_fields() {
        assert!(serde_json::from_str::<ExecRequest>(r#"{"argv":["a"],"bogus":1}"#).is_err());
        assert!(serde_json::from_str::<SignalRequest>(r#"{"signal":1,"x":2}"#).is_err());
        assert!(serde_json::from_str::<PatchRequest>(r#"{"patch":"","x":2}"#).is_err());
        let signal: SignalRequest = serde_json::from_str(r#"{"signal":"TERM"}"#).unwrap();
        assert_eq!(signal.signal, SignalSpec::Name("TERM".into()));
        let signal: SignalRequest = serde_json::from_str(r#"{"signal":15}"#).unwrap();
        assert_eq!(signal.signal, SignalSpec::Number(15));
        let session: SessionSignalRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(session.signal, None, "the agent sends SIGINT then");
        let session: SessionSignalRequest = serde_json::from_str(r#"{"signal":"KILL"}"#).unwrap();
        assert_eq!(session.signal, Some(SignalSpec::Name("KILL".into())));
        assert!(serde_json::from_str::<SessionSignalRequest>(r#"{"sig":"INT"}"#).is_err());
    }

    #[test]
    fn keep_is_optional_on_the_wire() {
        let request: ExecRequest =
            serde_json::from_str(r#"{"id":"svc","argv":["sleep","1"],"keep":true}"#).unwrap();
        assert_eq!(request.keep, Some(true));
        let request: ExecRequest = serde_json::from_str(r#"{"argv":["true"]}"#).unwrap();
        assert_eq!(request.keep, None);
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"argv": ["true"]}),
            "absent unless given"
        );
    }

    #[test]
    fn requests_serialise_only_given_fields() {
        let request = ExecRequest {
            id: Some("run".into()),
            argv: Some(vec!["true".into()]),
            timeout_seconds: Some(5.0),
            output_encoding: Some(OutputEncoding::Base64),
            ..ExecRequest::default()
        };
        assert_eq!(
            serde_json::to_value(&request).unwrap(),
            json!({"id": "run", "argv": ["true"], "timeoutSeconds": 5.0, "outputEncoding": "base64"})
        );
    }

    #[test]
    fn answers_keep_their_wire_names() {
        let entry = FileEntry {
            name: "a".into(),
            kind: FileKind::Directory,
            size: 1,
            mode: 0o755,
            modified: None,
        };
        assert_eq!(
            serde_json::to_string(&entry).unwrap(),
            r#"{"name":"a","type":"directory","size":1,"mode":493,"modified":null}"#
        );
        let result = PatchResult {
            applied: true,
            files: vec![PatchedFile {
                path: "x".into(),
                action: PatchAction::Created,
            }],
        };
        assert_eq!(
            serde_json::to_string(&result).unwrap(),
            r#"{"applied":true,"files":[{"path":"x","action":"created"}]}"#
        );
        let error = AgentErrorBody {
            code: "PatchConflict".into(),
            message: "m".into(),
            failed_hunks: Some(vec![FailedHunk {
                path: "p".into(),
                hunk: 1,
                header: "@@".into(),
                reason: "r".into(),
            }]),
            process: None,
        };
        assert_eq!(
            serde_json::to_value(&error).unwrap(),
            json!({"code": "PatchConflict", "message": "m", "failedHunks": [{"path": "p", "hunk": 1, "header": "@@", "reason": "r"}]})
        );
    }
}
