//! `extend SANDBOX SECONDS`: `POST .../timeout`, so a Ready sandbox ends SECONDS from now.

use reqwest::Method;
use serde_json::{Value, json};

use crate::cli::ExtendArgs;
use crate::error::{CliError, Result};
use crate::gateway::Gateway;

/// The line printed for the gateway's answer (pure): when the TTL now ends, and the TTL.
pub fn summary(name: &str, answer: &Value) -> Result<String> {
    let ends = answer["ttlEndsAt"]
        .as_str()
        .ok_or_else(|| CliError::Protocol(format!("no ttlEndsAt in {answer}")))?;
    let ttl = answer["ttlSeconds"]
        .as_u64()
        .map(|s| format!(" (ttlSeconds {s})"))
        .unwrap_or_default();
    Ok(format!("sandbox {name} expires at {ends}{ttl}"))
}

/// Sets the sandbox's end; 0 when done.
pub async fn run(gateway: &Gateway, args: ExtendArgs) -> Result<u8> {
    let answer: Value = gateway
        .json(
            gateway
                .request(Method::POST, &args.sandbox, &["timeout"], &[])?
                .json(&json!({"timeoutSeconds": args.seconds})),
        )
        .await?;
    println!(
        "{}",
        summary(
            &format!("{}/{}", gateway.namespace(), args.sandbox),
            &answer
        )?
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        let answer = json!({"ttlSeconds": 5412, "ttlEndsAt": "2026-05-01T13:30:00Z", "maxTtlSeconds": 86400});
        assert_eq!(
            summary("rl/s1", &answer).unwrap(),
            "sandbox rl/s1 expires at 2026-05-01T13:30:00Z (ttlSeconds 5412)"
        );
        assert!(summary("rl/s1", &json!({})).is_err());
    }
}
