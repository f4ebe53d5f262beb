//! The hand-written command line and environment parser: arbitrary argv and `ORCHARD_AGENT_*` values
//! never panic, and an accepted `serve` has usable limits. `parse_size`, `parse_duration` and `parse_listen` directly too.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use orchard_agent::cli::{Invocation, parse, parse_duration, parse_listen, parse_size};

const VARIABLES: &[&str] = &[
    "ORCHARD_AGENT_LISTEN",
    "ORCHARD_AGENT_TOKEN_FILE",
    "ORCHARD_AGENT_TOKEN",
    "ORCHARD_AGENT_TOKEN_SHA256",
    "ORCHARD_AGENT_ROOT",
    "ORCHARD_AGENT_MAX_CONCURRENT",
    "ORCHARD_AGENT_MAX_BODY_BYTES",
    "ORCHARD_AGENT_MAX_UPLOAD_BYTES",
    "ORCHARD_AGENT_MAX_OUTPUT_BYTES_TOTAL",
    "ORCHARD_AGENT_HEADER_READ_TIMEOUT",
    "ORCHARD_AGENT_MAX_CONNECTIONS",
    "ORCHARD_AGENT_INSECURE_NO_AUTH",
    "ORCHARD_AGENT_STARTUP",
    "ORCHARD_AGENT_LOG",
];

#[derive(Debug, Arbitrary)]
struct Input {
    args: Vec<String>,
    env: Vec<(u8, String)>,
}

fuzz_target!(|input: Input| {
    let lookup = |name: &str| {
        input
            .env
            .iter()
            .rev()
            .find(|(pick, _)| VARIABLES[*pick as usize % VARIABLES.len()] == name)
            .map(|(_, value)| value.clone())
    };
    if let Ok(Invocation::Serve(options)) = parse(&input.args, &lookup) {
        assert!(options.max_concurrent > 0);
        assert!(options.max_body_bytes > 0 && options.max_upload_bytes > 0);
        assert!(options.max_output_bytes_total > 0);
        assert!(options.max_connections > 0 && !options.header_read_timeout.is_zero());
        // Never without a token unless explicitly insecure; never both.
        assert_eq!(options.token.is_none(), options.insecure_no_auth);
    }
    for text in input
        .args
        .iter()
        .chain(input.env.iter().map(|(_, value)| value))
    {
        if let Ok(size) = parse_size(text) {
            assert!(size > 0);
        }
        let _ = parse_listen(text);
        if let Ok(duration) = parse_duration(text) {
            assert!(!duration.is_zero());
        }
    }
});
