//! `exec SANDBOX -- CMD ARGS...`: one command through `POST .../exec`, its output on the matching
//! streams, its exit status as ours.

use std::io::Write;

use base64::Engine;
use orchard_api::agent::{ExecRequest, ExecResponse, OutputEncoding};
use reqwest::Method;

use crate::cli::ExecArgs;
use crate::error::{CliError, Result};
use crate::gateway::{ANSWER_TIMEOUT_HEADER, Gateway, answer_timeout};

/// The exit status `timeout(1)` gives a command it stopped.
pub const TIMED_OUT_STATUS: u8 = 124;

/// The request for `args` (pure): argv, exact bytes back (base64).
pub fn request(args: &ExecArgs) -> ExecRequest {
    ExecRequest {
        argv: Some(args.command.clone()),
        cwd: args.cwd.clone(),
        env: (!args.env.is_empty()).then(|| args.env.iter().cloned().collect()),
        user: args.user.clone(),
        timeout_seconds: args.timeout.map(|s| s as f64),
        output_encoding: Some(OutputEncoding::Base64),
        ..ExecRequest::default()
    }
}

/// Our exit status for the command's answer (pure): 124 when it timed out, its exit code, 128 plus
/// the signal that killed it (as a shell reports it), else 1.
pub fn exit_status(answer: &ExecResponse) -> u8 {
    if answer.timed_out {
        return TIMED_OUT_STATUS;
    }
    match (answer.exit_code, answer.signal) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(signal)) => (128 + (signal & 0x7f)) as u8,
        (None, None) => 1,
    }
}

/// The bytes of an output field (pure): base64-decoded when the answer is base64.
pub fn output_bytes(text: &str, encoding: OutputEncoding) -> Result<Vec<u8>> {
    match encoding {
        OutputEncoding::Text => Ok(text.as_bytes().to_vec()),
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| CliError::Protocol(format!("output is not base64: {e}"))),
    }
}

/// Runs the command; its exit status.
pub async fn run(gateway: &Gateway, args: ExecArgs) -> Result<u8> {
    let mut builder = gateway
        .request(Method::POST, &args.sandbox, &["exec"], &[])?
        .json(&request(&args));
    if let Some(seconds) = args.timeout {
        builder = builder.header(ANSWER_TIMEOUT_HEADER, answer_timeout(seconds));
    }
    let answer: ExecResponse = gateway.json(builder).await?;
    let stdout = output_bytes(&answer.stdout, answer.output_encoding)?;
    let stderr = output_bytes(&answer.stderr, answer.output_encoding)?;
    write_all(&mut std::io::stdout().lock(), &stdout)?;
    let mut err = std::io::stderr().lock();
    write_all(&mut err, &stderr)?;
    if let Some(error) = &answer.error {
        write_all(&mut err, format!("kubectl-orchard: {error}\n").as_bytes())?;
    }
    if answer.stdout_truncated || answer.stderr_truncated {
        write_all(
            &mut err,
            b"kubectl-orchard: output truncated by the agent's maxOutputBytes\n",
        )?;
    }
    if answer.timed_out {
        write_all(&mut err, b"kubectl-orchard: the command timed out\n")?;
    }
    Ok(exit_status(&answer))
}

fn write_all(out: &mut impl Write, bytes: &[u8]) -> Result<()> {
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| CliError::local("writing output", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(exit_code: Option<i32>, signal: Option<i32>, timed_out: bool) -> ExecResponse {
        serde_json::from_value(serde_json::json!({
            "exitCode": exit_code, "signal": signal, "timedOut": timed_out, "oomKilled": false,
            "stdout": "", "stderr": "", "stdoutTruncated": false, "stderrTruncated": false,
            "stdoutLossy": false, "stderrLossy": false, "durationMs": 1, "outputEncoding": "text"
        }))
        .expect("exec answer")
    }

    #[test]
    fn exit_statuses() {
        assert_eq!(exit_status(&answer(Some(0), None, false)), 0);
        assert_eq!(exit_status(&answer(Some(3), None, false)), 3);
        assert_eq!(exit_status(&answer(Some(256 + 7), None, false)), 7);
        assert_eq!(exit_status(&answer(None, Some(9), true)), 124);
        assert_eq!(exit_status(&answer(None, Some(15), false)), 143);
        assert_eq!(exit_status(&answer(None, None, false)), 1);
    }

    #[test]
    fn requests_carry_argv_and_options() {
        let args = ExecArgs {
            sandbox: "s".into(),
            user: Some("1000".into()),
            timeout: Some(5),
            cwd: Some("/tmp".into()),
            env: vec![("A".into(), "1".into())],
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
        };
        let body = serde_json::to_value(request(&args)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"argv": ["sh", "-c", "echo hi"], "cwd": "/tmp", "env": {"A": "1"},
                               "user": "1000", "timeoutSeconds": 5.0, "outputEncoding": "base64"})
        );
    }

    #[test]
    fn outputs_decode() {
        assert_eq!(
            output_bytes("aGkK", OutputEncoding::Base64).unwrap(),
            b"hi\n"
        );
        assert_eq!(output_bytes("hi", OutputEncoding::Text).unwrap(), b"hi");
        assert!(output_bytes("***", OutputEncoding::Base64).is_err());
    }
}
