//! `POST /v1/processes` bodies: the exec request plus a client-chosen `id`, validated like the route
//! does it (`into_spec` for a background process, then `process_id`); and the same bytes as
//! `ORCHARD_AGENT_STARTUP`, which must accept exactly what the route accepts (minus any other id).
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use orchard_agent::exec::request::{IntoSpec, RequestKind};
use orchard_agent::processes::table::{process_id, valid_id};
use orchard_agent::server::startup_spec;
use orchard_agent_fuzz::requests::{BODY_LIMIT, RequestHarness, check_spec};

static HARNESS: LazyLock<RequestHarness> = LazyLock::new(|| RequestHarness::new("process_request"));

/// Safe as one URL path segment of `/v1/processes/{id}` without escaping, and not `.`/`..`.
fn url_safe(id: &str) -> bool {
    id != "."
        && id != ".."
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
}

fuzz_target!(|body: &[u8]| {
    let harness = &*HARNESS;
    let route = match harness.extract("/v1/processes", body) {
        Ok(mut request) => {
            let id = request.id.take();
            let startup_id_ok = id.as_deref().is_none_or(|id| id == "startup");
            let asked_timeout = request.timeout_seconds.is_some();
            match request
                .into_spec(&harness.root, RequestKind::Process)
                .and_then(|spec| Ok((spec, process_id(id)?)))
            {
                Ok((spec, id)) => {
                    check_spec(&spec, RequestKind::Process, Some(asked_timeout));
                    assert!(valid_id(&id) && url_safe(&id) && (1..=63).contains(&id.len()));
                    Some(startup_id_ok)
                }
                Err(error) => {
                    // `into_spec` failed, or the id was refused.
                    harness.check_error(error, &["BadRequest", "InvalidRequest", "InvalidCwd"]);
                    None
                }
            }
        }
        Err(error) => {
            harness.check_error(error, &["BadRequest", "InvalidRequest", "PayloadTooLarge"]);
            None
        }
    };
    // The startup command has no body limit and no HTTP layer, but the same validation.
    if let Ok(text) = std::str::from_utf8(body) {
        let startup = startup_spec(&harness.root, text);
        if let Ok(spec) = &startup {
            check_spec(spec, RequestKind::Process, None);
        }
        if (body.len() as u64) <= BODY_LIMIT {
            // The route accepts it with no id or id `startup` <=> startup accepts it. (An id the route
            // accepts but startup refuses is fine: startup's id is always `startup`.)
            match route {
                Some(true) => assert!(startup.is_ok(), "startup refused what the route accepts"),
                Some(false) => assert!(startup.is_err(), "startup accepted another id"),
                None => assert!(startup.is_err(), "startup accepted what the route refuses"),
            }
        }
    }
});
