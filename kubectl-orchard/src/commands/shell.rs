//! `shell SANDBOX`: a persistent shell session (`POST .../sessions`); each line of standard input runs
//! in it (`.../sessions/{id}/run`), so `cd` and `export` carry over. Ends at end of input, `exit`, or
//! Ctrl-C, and deletes the session.

use std::io::{IsTerminal, Write};

use orchard_api::agent::{SessionRequest, SessionRunRequest, SessionRunResponse, SessionStatus};
use reqwest::Method;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::cli::ShellArgs;
use crate::error::{CliError, Result};
use crate::gateway::{ANSWER_TIMEOUT_HEADER, Gateway, answer_timeout};

/// What to do with one line of input.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// Run it.
    Run(String),
    /// Nothing to run (blank).
    Skip,
    /// End the session (`exit`, `exit N`, `logout`).
    Exit(Option<u8>),
}

/// Classifies a line of input (pure).
pub fn classify(line: &str) -> Line {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return Line::Skip;
    }
    let mut words = trimmed.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("exit" | "logout"), None, _) => Line::Exit(None),
        (Some("exit"), Some(code), None) => match code.parse::<u8>() {
            Ok(code) => Line::Exit(Some(code)),
            Err(_) => Line::Run(trimmed.to_string()),
        },
        _ => Line::Run(trimmed.to_string()),
    }
}

/// Runs the session; the exit status of the last command (or of `exit N`).
pub async fn run(gateway: &Gateway, args: ShellArgs) -> Result<u8> {
    let create = SessionRequest {
        user: args.user.clone(),
        ..SessionRequest::default()
    };
    let session: SessionStatus = gateway
        .json(
            gateway
                .request(Method::POST, &args.sandbox, &["sessions"], &[])?
                .json(&create),
        )
        .await?;
    let outcome = tokio::select! {
        outcome = converse(gateway, &args, &session.id) => outcome,
        _ = tokio::signal::ctrl_c() => Ok(130),
    };
    let deleted = gateway
        .send(gateway.request(
            Method::DELETE,
            &args.sandbox,
            &["sessions", &session.id],
            &[],
        )?)
        .await;
    let status = outcome?;
    deleted?;
    Ok(status)
}

/// Reads lines and runs them until the end; the last exit status.
async fn converse(gateway: &Gateway, args: &ShellArgs, id: &str) -> Result<u8> {
    let interactive = std::io::stdin().is_terminal();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut status = 0u8;
    loop {
        if interactive {
            eprint!("{}$ ", args.sandbox);
        }
        let Some(line) = lines
            .next_line()
            .await
            .map_err(|e| CliError::local("reading standard input", e))?
        else {
            return Ok(status);
        };
        let command = match classify(&line) {
            Line::Skip => continue,
            Line::Exit(code) => return Ok(code.unwrap_or(status)),
            Line::Run(command) => command,
        };
        let request = SessionRunRequest {
            command,
            timeout_ms: Some(args.timeout.saturating_mul(1000)),
            output_encoding: None,
        };
        let answer: SessionRunResponse = gateway
            .json(
                gateway
                    .request(Method::POST, &args.sandbox, &["sessions", id, "run"], &[])?
                    .header(ANSWER_TIMEOUT_HEADER, answer_timeout(args.timeout))
                    .json(&request),
            )
            .await?;
        let mut out = std::io::stdout().lock();
        out.write_all(answer.output.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| CliError::local("writing output", e))?;
        if answer.timed_out {
            eprintln!("kubectl-orchard: interrupted after {} s", args.timeout);
        }
        if answer.shell_restarted {
            eprintln!("kubectl-orchard: the shell had exited; this ran in a new one");
        }
        status = answer.exit_code.map_or(1, |code| (code & 0xff) as u8);
        if answer.shell_exited {
            return Ok(status);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        assert_eq!(classify("  "), Line::Skip);
        assert_eq!(classify("exit"), Line::Exit(None));
        assert_eq!(classify(" exit 3 "), Line::Exit(Some(3)));
        assert_eq!(classify("logout"), Line::Exit(None));
        assert_eq!(classify("exit $X"), Line::Run("exit $X".into()));
        assert_eq!(classify("exit 1 2"), Line::Run("exit 1 2".into()));
        assert_eq!(classify("exited=1"), Line::Run("exited=1".into()));
        assert_eq!(classify("cd /tmp\n"), Line::Run("cd /tmp".into()));
    }
}
