//! Sandboxes tests need: a plain one, a trajectory, a forged trajectory (test only).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use orchard_api::{Sandbox, SandboxSpec};

use crate::plumbing::operator_key::OperatorKey;

pub fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

pub const CREATED: &str = "2026-01-01T00:00:00Z";

pub fn sandbox() -> Sandbox {
    let mut s = Sandbox::new(
        "s1",
        SandboxSpec {
            image: "python:3.11".into(),
            ..SandboxSpec::default()
        },
    );
    s.metadata.generation = Some(1);
    s.metadata.creation_timestamp = Some(Time(t(CREATED)));
    s
}

/// The test key, for the `Observed` of the whole test.
pub fn key() -> &'static OperatorKey {
    static KEY: std::sync::LazyLock<OperatorKey> =
        std::sync::LazyLock::new(crate::plumbing::mock_api::test_token_key);
    &KEY
}

/// A trajectory the operator created for group `g`.
pub fn trajectory() -> Sandbox {
    let mut s = forged_trajectory();
    crate::plumbing::ownership::seal(&mut s, key());
    s
}

/// A Sandbox somebody made with a controller reference to group `g`.
pub fn forged_trajectory() -> Sandbox {
    let mut s = sandbox();
    s.metadata.namespace = Some("ns".into());
    s.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            kind: "RolloutGroup".into(),
            name: "g".into(),
            uid: "uid-g".into(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    s
}
