//! `orchard-operator`: the Sandbox controller, the RolloutGroup controller, the gateway and the
//! metrics server in one process. Flags: `orchard-operator --help`.

use clap::Parser;
use orchard_operator::runtime::config::OperatorArgs;
use orchard_operator::runtime::{self, telemetry};

#[tokio::main]
async fn main() {
    let args = OperatorArgs::parse();
    telemetry::init(args.log_format);
    if let Err(err) = runtime::run(args).await {
        tracing::error!(error = %err, "orchard-operator failed");
        eprintln!("orchard-operator: {err}");
        std::process::exit(1);
    }
}
