//! `metrics SANDBOX`: the agent's usage figures (`GET .../metrics`) as indented JSON.

use reqwest::Method;
use serde_json::Value;

use crate::cli::MetricsArgs;
use crate::error::{CliError, Result};
use crate::gateway::Gateway;

/// Prints the metrics; 0 when done.
pub async fn run(gateway: &Gateway, args: MetricsArgs) -> Result<u8> {
    let metrics: Value = gateway
        .json(gateway.request(Method::GET, &args.sandbox, &["metrics"], &[])?)
        .await?;
    let text =
        serde_json::to_string_pretty(&metrics).map_err(|e| CliError::Protocol(e.to_string()))?;
    println!("{text}");
    Ok(0)
}
