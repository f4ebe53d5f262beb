//! What `fromSnapshot` means for a Sandbox or a SandboxPool template (pure over the caches): the
//! image it runs, or why it waits or fails; and who names a snapshot (its deletion waits for them).

use std::sync::Arc;

use kube::runtime::reflector::{ObjectRef, Store};

use orchard_api::{
    RolloutGroup, RolloutPhase, Sandbox, SandboxPhase, SandboxPool, SandboxSnapshot, SandboxSpec,
    SnapshotPhase,
};

/// The sandbox's reason while its snapshot is not Ready yet.
pub const SNAPSHOT_NOT_READY: &str = "SnapshotNotReady";
/// The sandbox's failure reason when its snapshot failed or is being deleted.
pub const SNAPSHOT_FAILED: &str = "SnapshotFailed";

/// Where a spec's image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Its own `image` (no `fromSnapshot`).
    Image,
    /// The snapshot's image, digest-pinned.
    Snapshot(String),
    /// The snapshot is not Ready yet (or does not exist yet): wait.
    Wait(String),
    /// The snapshot failed or is being deleted: the sandbox cannot start from it.
    Fail(String),
}

/// Where `spec` (of an object in `namespace`) gets its image, given the snapshot named `name` as
/// the cache shows it (pure).
pub fn source_of(spec: &SandboxSpec, snapshot: Option<&SandboxSnapshot>) -> Source {
    let Some(name) = spec.from_snapshot.as_deref() else {
        return Source::Image;
    };
    let Some(snapshot) = snapshot else {
        return Source::Wait(format!(
            "SandboxSnapshot {name} does not exist (yet); the sandbox starts once it is Ready"
        ));
    };
    if snapshot.metadata.deletion_timestamp.is_some() {
        return Source::Fail(format!(
            "SandboxSnapshot {name} is being deleted: no new sandbox starts from it"
        ));
    }
    let status = snapshot.status.clone().unwrap_or_default();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    match (status.phase, status.image) {
        (Some(SnapshotPhase::Ready), Some(image)) => Source::Snapshot(image),
        (Some(SnapshotPhase::Failed), _) => Source::Fail(format!(
            "SandboxSnapshot {name} failed ({}: {})",
            ready.map_or("Unknown", |c| c.reason.as_str()),
            ready.map_or("", |c| c.message.as_str()),
        )),
        (phase, _) => Source::Wait(format!(
            "SandboxSnapshot {name} is {}{}; the sandbox starts once it is Ready",
            phase.map_or("Pending", SnapshotPhase::as_str),
            ready
                .filter(|c| !c.message.is_empty())
                .map(|c| format!(" ({})", c.message))
                .unwrap_or_default(),
        )),
    }
}

/// The snapshot `spec.fromSnapshot` names in `namespace`, from the cache.
fn lookup(
    snapshots: &Store<SandboxSnapshot>,
    namespace: &str,
    spec: &SandboxSpec,
) -> Option<Arc<SandboxSnapshot>> {
    let name = spec.from_snapshot.as_deref()?;
    snapshots.get(&ObjectRef::new(name).within(namespace))
}

/// `spec` (in `namespace`) with its image resolved from its snapshot when that is Ready, and where
/// its image comes from (pure over the cache).
pub fn resolve(
    snapshots: &Store<SandboxSnapshot>,
    namespace: &str,
    spec: &SandboxSpec,
) -> (SandboxSpec, Source) {
    let snapshot = lookup(snapshots, namespace, spec);
    let source = source_of(spec, snapshot.as_deref());
    let mut resolved = spec.clone();
    if let Source::Snapshot(image) = &source {
        resolved.image = image.clone();
    }
    (resolved, source)
}

/// Whether a Sandbox still needs its snapshot: not deleted, not finished (pure).
fn sandbox_uses(sandbox: &Sandbox) -> bool {
    sandbox.metadata.deletion_timestamp.is_none()
        && !matches!(
            sandbox.status.as_ref().and_then(|s| s.phase),
            Some(SandboxPhase::Failed | SandboxPhase::Expired | SandboxPhase::Succeeded)
        )
}

/// Who names the snapshot `namespace/name` in `fromSnapshot` (pure): live Sandboxes, SandboxPools
/// and RolloutGroups that are not finished, as `Kind name`, sorted.
pub fn referrers<'a>(
    namespace: &str,
    name: &str,
    sandboxes: impl IntoIterator<Item = &'a Sandbox>,
    pools: impl IntoIterator<Item = &'a SandboxPool>,
    groups: impl IntoIterator<Item = &'a RolloutGroup>,
) -> Vec<String> {
    let here = |ns: &Option<String>| ns.as_deref() == Some(namespace);
    let names = |spec: &SandboxSpec| spec.from_snapshot.as_deref() == Some(name);
    let mut found: Vec<String> = sandboxes
        .into_iter()
        .filter(|s| here(&s.metadata.namespace) && names(&s.spec) && sandbox_uses(s))
        .map(|s| format!("Sandbox {}", s.metadata.name.as_deref().unwrap_or_default()))
        .chain(
            pools
                .into_iter()
                .filter(|p| {
                    here(&p.metadata.namespace)
                        && p.metadata.deletion_timestamp.is_none()
                        && names(&p.spec.template)
                })
                .map(|p| {
                    format!(
                        "SandboxPool {}",
                        p.metadata.name.as_deref().unwrap_or_default()
                    )
                }),
        )
        .chain(
            groups
                .into_iter()
                .filter(|g| {
                    here(&g.metadata.namespace)
                        && g.metadata.deletion_timestamp.is_none()
                        && names(&g.spec.template.spec)
                        && !matches!(
                            g.status.as_ref().and_then(|s| s.phase),
                            Some(RolloutPhase::Complete | RolloutPhase::Failed)
                        )
                })
                .map(|g| {
                    format!(
                        "RolloutGroup {}",
                        g.metadata.name.as_deref().unwrap_or_default()
                    )
                }),
        )
        .collect();
    found.sort();
    found
}

/// The snapshot `spec` (of an object in `namespace`) names, as a reference (pure).
fn named_by(namespace: Option<&str>, spec: &SandboxSpec) -> Vec<ObjectRef<SandboxSnapshot>> {
    match (namespace, spec.from_snapshot.as_deref()) {
        (Some(namespace), Some(name)) => vec![ObjectRef::new(name).within(namespace)],
        _ => Vec::new(),
    }
}

/// The snapshot a Sandbox starts from (its change may change who uses the snapshot).
pub fn snapshot_of_sandbox(sandbox: &Sandbox) -> Vec<ObjectRef<SandboxSnapshot>> {
    named_by(sandbox.metadata.namespace.as_deref(), &sandbox.spec)
}

/// The snapshot a SandboxPool's template starts from.
pub fn snapshot_of_pool(pool: &SandboxPool) -> Vec<ObjectRef<SandboxSnapshot>> {
    named_by(pool.metadata.namespace.as_deref(), &pool.spec.template)
}

/// The snapshot a RolloutGroup's template starts from.
pub fn snapshot_of_group(group: &RolloutGroup) -> Vec<ObjectRef<SandboxSnapshot>> {
    named_by(
        group.metadata.namespace.as_deref(),
        &group.spec.template.spec,
    )
}

/// The snapshot a committer Pod works for (its `orchard.dev/snapshot` annotation, `namespace/name`).
pub fn snapshot_of_committer(
    pod: &k8s_openapi::api::core::v1::Pod,
) -> Vec<ObjectRef<SandboxSnapshot>> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(orchard_api::SNAPSHOT_ANNOTATION))
        .and_then(|v| v.split_once('/'))
        .map(|(namespace, name)| vec![ObjectRef::new(name).within(namespace)])
        .unwrap_or_default()
}

/// The Sandboxes in the cache that start from `snapshot` (its change may let them start).
pub fn sandboxes_of(
    sandboxes: &Store<Sandbox>,
    snapshot: &SandboxSnapshot,
) -> Vec<ObjectRef<Sandbox>> {
    let namespace = snapshot.metadata.namespace.as_deref();
    let name = snapshot.metadata.name.as_deref();
    sandboxes
        .state()
        .iter()
        .filter(|s| {
            s.metadata.namespace.as_deref() == namespace && s.spec.from_snapshot.as_deref() == name
        })
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use orchard_api::{SandboxSnapshotSpec, SandboxSnapshotStatus, SandboxStatus};

    fn spec(from: Option<&str>) -> SandboxSpec {
        SandboxSpec {
            from_snapshot: from.map(str::to_string),
            ..SandboxSpec::default()
        }
    }

    fn snapshot(phase: Option<SnapshotPhase>, image: Option<&str>) -> SandboxSnapshot {
        let mut s = SandboxSnapshot::new(
            "prepared",
            SandboxSnapshotSpec {
                sandbox: "prep".into(),
                ..SandboxSnapshotSpec::default()
            },
        );
        s.metadata.namespace = Some("ns".into());
        s.status = Some(SandboxSnapshotStatus {
            phase,
            image: image.map(str::to_string),
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "PushRefused".into(),
                message: "registry said no".into(),
                observed_generation: None,
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            }],
            ..SandboxSnapshotStatus::default()
        });
        s
    }

    #[test]
    fn a_sandbox_runs_its_snapshots_image_once_it_is_ready() {
        assert_eq!(source_of(&spec(None), None), Source::Image);
        let ready = snapshot(Some(SnapshotPhase::Ready), Some("r/ns/prepared@sha256:aa"));
        assert_eq!(
            source_of(&spec(Some("prepared")), Some(&ready)),
            Source::Snapshot("r/ns/prepared@sha256:aa".into())
        );
        let Source::Wait(why) = source_of(&spec(Some("prepared")), None) else {
            panic!("a missing snapshot is waited for")
        };
        assert!(why.contains("does not exist"), "{why}");
        let Source::Wait(why) = source_of(
            &spec(Some("prepared")),
            Some(&snapshot(Some(SnapshotPhase::Committing), None)),
        ) else {
            panic!("a committing snapshot is waited for")
        };
        assert!(why.contains("is Committing (registry said no)"), "{why}");
        let Source::Fail(why) = source_of(
            &spec(Some("prepared")),
            Some(&snapshot(Some(SnapshotPhase::Failed), None)),
        ) else {
            panic!("a failed snapshot fails the sandbox")
        };
        assert_eq!(
            why,
            "SandboxSnapshot prepared failed (PushRefused: registry said no)"
        );
        let mut deleting = ready.clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        assert!(matches!(
            source_of(&spec(Some("prepared")), Some(&deleting)),
            Source::Fail(_)
        ));
    }

    #[test]
    fn live_users_in_the_namespace_are_referrers() {
        let sandbox = |name: &str, ns: &str, from: &str, phase: Option<SandboxPhase>| {
            let mut s = Sandbox::new(name, spec(Some(from)));
            s.metadata.namespace = Some(ns.into());
            s.status = Some(SandboxStatus {
                phase,
                ..SandboxStatus::default()
            });
            s
        };
        let sandboxes = [
            sandbox("fork-1", "ns", "prepared", Some(SandboxPhase::Ready)),
            sandbox("fork-0", "ns", "prepared", None),
            sandbox("done", "ns", "prepared", Some(SandboxPhase::Failed)),
            sandbox("other-ns", "elsewhere", "prepared", None),
            sandbox("other-snapshot", "ns", "older", None),
        ];
        let mut pool = SandboxPool::new(
            "warm",
            orchard_api::SandboxPoolSpec {
                replicas: 1,
                template: spec(Some("prepared")),
            },
        );
        pool.metadata.namespace = Some("ns".into());
        let found = referrers("ns", "prepared", &sandboxes, [&pool], []);
        assert_eq!(
            found,
            vec!["Sandbox fork-0", "Sandbox fork-1", "SandboxPool warm"]
        );
    }
}
