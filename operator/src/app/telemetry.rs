//! Logging: `tracing` with an `EnvFilter` from `RUST_LOG` (default `info`), JSON lines in clusters or
//! human-readable text in terminals.

use tracing_subscriber::EnvFilter;

use crate::app::config::LogFormat;

/// Installs the global subscriber. Call once, at startup.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,kube=warn,tower=warn,hyper=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.compact().try_init(),
    };
    if let Err(err) = result {
        eprintln!("orchard-operator: logging already initialised: {err}");
    }
}
