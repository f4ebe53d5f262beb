//! `orchard-operator`: the Sandbox controller, the RolloutGroup controller, the gateway and the
//! metrics server in one process. Flags: `orchard-operator --help`. `orchard-operator egress-proxy`
//! runs the egress proxy instead (`orchard-operator egress-proxy --help`).

use clap::Parser;
use orchard_operator::app::config::OperatorArgs;
use orchard_operator::app::egress_args::EgressArgs;
use orchard_operator::app::{self, telemetry};

/// mimalloc instead of glibc's malloc: the operator decodes and drops a stream of watch events and
/// API answers, and with glibc's allocator about a quarter of its CPU went to `malloc`, `free` and
/// `malloc_consolidate` in `perf` during `make bench-scale` (docs/BENCHMARKS.md, "Scale").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    // `orchard-operator egress-proxy [flags]`: the egress proxy (the chart's second Deployment).
    if std::env::args().nth(1).as_deref() == Some("egress-proxy") {
        let args = EgressArgs::parse_from(std::env::args().skip(1));
        telemetry::init(args.log_format);
        if let Err(err) = app::egress_proxy::run(args).await {
            tracing::error!(error = %err, "orchard-operator egress-proxy failed");
            eprintln!("orchard-operator egress-proxy: {err}");
            std::process::exit(1);
        }
        return;
    }
    let args = OperatorArgs::parse();
    telemetry::init(args.log_format);
    if let Err(err) = app::run(args).await {
        tracing::error!(error = %err, "orchard-operator failed");
        eprintln!("orchard-operator: {err}");
        std::process::exit(1);
    }
}
