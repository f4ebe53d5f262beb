//! `POST /v1/exec` bodies: arbitrary bytes through the agent's JSON extractor (413/400/422 rules,
//! `deny_unknown_fields`), then `into_spec` against a scratch root. Never panics; every outcome is a
//! spawnable `CommandSpec` or an agent JSON error with a 4xx status.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use orchard_agent::exec::request::{IntoSpec, RequestKind};
use orchard_agent_fuzz::requests::{RequestHarness, check_spec};

static HARNESS: LazyLock<RequestHarness> = LazyLock::new(|| RequestHarness::new("exec_request"));

fuzz_target!(|body: &[u8]| {
    let harness = &*HARNESS;
    let request = match harness.extract("/v1/exec", body) {
        Ok(request) => request,
        Err(error) => {
            return harness
                .check_error(error, &["BadRequest", "InvalidRequest", "PayloadTooLarge"]);
        }
    };
    let asked_timeout = request.timeout_seconds.is_some();
    match request.into_spec(&harness.root, RequestKind::Exec) {
        Ok(spec) => check_spec(&spec, RequestKind::Exec, Some(asked_timeout)),
        Err(error) => harness.check_error(error, &["BadRequest", "InvalidRequest", "InvalidCwd"]),
    }
});
