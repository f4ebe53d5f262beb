//! Terse logs to stderr (`tracing`), filtered by `ORCHARD_AGENT_LOG` (or `RUST_LOG`), default `info`.
//! Tokens are never logged: `auth::Token`'s `Debug` is redacted and no handler logs headers.

use std::str::FromStr;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::prelude::*;

/// Installs the global subscriber; `filter` is like `info` or `warn,orchard_agent=debug`.
pub fn init(filter: Option<&str>) {
    let text = filter
        .map(str::to_string)
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".into());
    let targets = Targets::from_str(&text).unwrap_or_else(|error| {
        eprintln!("orchard-agent: ignoring log filter `{text}`: {error}");
        Targets::new().with_default(tracing::Level::INFO)
    });
    let format = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_target(false)
        .compact();
    let _ = tracing_subscriber::registry()
        .with(format.with_filter(targets))
        .try_init();
}
