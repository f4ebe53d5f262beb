//! `wait SANDBOX [--timeout S]`: server-side waits (`GET .../wait`, at most 300 s each) until the
//! sandbox is Ready, in a phase it will not leave, stalled, or out of time.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use crate::cli::WaitArgs;
use crate::error::{CliError, Result};
use crate::gateway::Gateway;

/// The longest wait the gateway takes in one call.
pub const MAX_WAIT_SECONDS: u64 = 300;

/// What one wait answer means.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The sandbox is Ready.
    Ready,
    /// It will not become Ready by itself: why.
    Stuck(String),
    /// Not Ready yet (the call ran out of time): where it is.
    NotYet(String),
}

/// Interprets a wait answer (pure): 200 with the Sandbox, or 504 `WaitTimeout` with `phase`,
/// `reason` and `conditionMessage`; anything else is an error.
pub fn interpret(status: u16, body: &[u8]) -> Result<Outcome> {
    let value: Option<Value> = serde_json::from_slice(body).ok();
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    match (status, &value) {
        (200, Some(sandbox)) => {
            let status = &sandbox["status"];
            let phase = text(status, "phase").unwrap_or_else(|| "Unknown".into());
            if phase == "Ready" {
                return Ok(Outcome::Ready);
            }
            let stalled = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Stalled" && c["status"] == "True");
            let (reason, message) = match stalled {
                Some(condition) => (text(condition, "reason"), text(condition, "message")),
                None => (text(status, "reason"), text(status, "message")),
            };
            Ok(Outcome::Stuck(describe(&phase, reason, message)))
        }
        (504, Some(error)) if error["code"] == "WaitTimeout" => Ok(Outcome::NotYet(describe(
            &text(error, "phase").unwrap_or_else(|| "Unknown".into()),
            text(error, "reason"),
            text(error, "conditionMessage"),
        ))),
        _ => Err(CliError::from_answer(status, body)),
    }
}

/// `phase Starting (Reason): message` (pure).
pub fn describe(phase: &str, reason: Option<String>, message: Option<String>) -> String {
    let mut text = format!("phase {phase}");
    if let Some(reason) = reason.filter(|r| !r.is_empty()) {
        text.push_str(&format!(" ({reason})"));
    }
    if let Some(message) = message.filter(|m| !m.is_empty()) {
        text.push_str(&format!(": {message}"));
    }
    text
}

/// Waits; 0 when Ready.
pub async fn run(gateway: &Gateway, args: WaitArgs) -> Result<u8> {
    let name = format!("{}/{}", gateway.namespace(), args.sandbox);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).as_secs();
        let seconds = left.clamp(1, MAX_WAIT_SECONDS).to_string();
        let request = gateway
            .request(
                Method::GET,
                &args.sandbox,
                &["wait"],
                &[("timeoutSeconds", &seconds)],
            )?
            .timeout(Duration::from_secs(MAX_WAIT_SECONDS + 30));
        let (status, body) = gateway.answer(request).await?;
        match interpret(status, &body)? {
            Outcome::Ready => {
                println!("sandbox {name} is Ready");
                return Ok(0);
            }
            Outcome::Stuck(why) => {
                return Err(CliError::Sandbox(format!(
                    "sandbox {name} will not become Ready: {why}"
                )));
            }
            Outcome::NotYet(why) if Instant::now() >= deadline => {
                return Err(CliError::Sandbox(format!(
                    "sandbox {name} is not Ready after {} s: {why}",
                    args.timeout
                )));
            }
            Outcome::NotYet(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_stuck_and_not_yet() {
        assert_eq!(
            interpret(200, br#"{"status": {"phase": "Ready"}}"#).unwrap(),
            Outcome::Ready
        );
        assert_eq!(
            interpret(
                200,
                br#"{"status": {"phase": "Failed", "reason": "ImagePullBackOff", "message": "no image x"}}"#
            )
            .unwrap(),
            Outcome::Stuck("phase Failed (ImagePullBackOff): no image x".into())
        );
        assert_eq!(
            interpret(
                200,
                br#"{"status": {"phase": "Pending", "conditions": [
                    {"type": "Ready", "status": "False"},
                    {"type": "Stalled", "status": "True", "reason": "PoolNotFound", "message": "no pool p"}]}}"#
            )
            .unwrap(),
            Outcome::Stuck("phase Pending (PoolNotFound): no pool p".into())
        );
        assert_eq!(
            interpret(
                504,
                br#"{"code": "WaitTimeout", "message": "m", "retryable": true, "phase": "Starting",
                     "reason": "ContainersNotReady", "conditionMessage": "pulling"}"#
            )
            .unwrap(),
            Outcome::NotYet("phase Starting (ContainersNotReady): pulling".into())
        );
        let error = interpret(
            404,
            br#"{"code": "NotFound", "message": "no sandbox rl/x"}"#,
        )
        .unwrap_err()
        .line();
        assert_eq!(error, "error: NotFound: no sandbox rl/x");
    }

    #[test]
    fn descriptions() {
        assert_eq!(
            describe("Starting", None, Some(String::new())),
            "phase Starting"
        );
    }
}
