//! `orchard-operator`: the Sandbox controller, the RolloutGroup controller, the gateway and the
//! metrics server in one process. Flags: `orchard-operator --help`.

use clap::Parser;
use orchard_operator::app::config::OperatorArgs;
use orchard_operator::app::{self, telemetry};

/// mimalloc instead of glibc's malloc: the operator decodes and drops a stream of watch events and
/// API answers, and with glibc's allocator about a quarter of its CPU went to `malloc`, `free` and
/// `malloc_consolidate` in `perf` during `make bench-scale` (docs/BENCHMARKS.md, "Scale").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let args = OperatorArgs::parse();
    telemetry::init(args.log_format);
    if let Err(err) = app::run(args).await {
        tracing::error!(error = %err, "orchard-operator failed");
        eprintln!("orchard-operator: {err}");
        std::process::exit(1);
    }
}
