//! The size quota on a namespace's snapshots (pure). A ResourceQuota's `spec.hard` may name
//! `orchard.dev/snapshot-bytes` ([`SNAPSHOT_BYTES_QUOTA`]): the most bytes (`status.sizeBytes`, the
//! uncompressed layers) the namespace's SandboxSnapshots may hold together. The API server cannot
//! count it (a snapshot's size is known only once it is committed), so the operator does: a commit
//! starts only while room is left, the committer pushes nothing bigger than the room
//! ([`Budget::room`]), and a snapshot becomes Ready only if it still fits beside the others
//! (`decide`; the controller observes the budget and writes the outcome under one lock per
//! namespace, so two commits finishing together cannot both take the last room). Their number is
//! Kubernetes' own object-count quota, `count/sandboxsnapshots.orchard.dev`, enforced by the API
//! server at creation.

use k8s_openapi::api::core::v1::ResourceQuota;

use crate::plumbing::quantity::bytes;
use orchard_api::{SNAPSHOT_BYTES_QUOTA, SandboxSnapshot, SnapshotPhase};

/// The smallest `orchard.dev/snapshot-bytes` among a namespace's ResourceQuotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Bytes.
    pub bytes: u64,
    /// As written in the quota (`20Gi`).
    pub text: String,
    /// The ResourceQuota's name.
    pub quota: String,
}

/// The limit and what the namespace's other snapshots hold of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The limit.
    pub limit: Limit,
    /// Bytes held by the namespace's Ready snapshots other than the one deciding.
    pub used: u64,
}

impl Budget {
    /// Bytes left for one more snapshot.
    pub fn room(&self) -> u64 {
        self.limit.bytes.saturating_sub(self.used)
    }

    /// `size` more bytes would stay within the limit.
    pub fn fits(&self, size: u64) -> bool {
        self.used.saturating_add(size) <= self.limit.bytes
    }

    /// The budget in words, for messages: `3145728 of 4194304 bytes (ResourceQuota q,
    /// orchard.dev/snapshot-bytes: 4Mi) are held by the namespace's other snapshots`.
    pub fn describe(&self) -> String {
        format!(
            "{} of {} bytes (ResourceQuota {}, {SNAPSHOT_BYTES_QUOTA}: {}) are held by the namespace's other snapshots",
            self.used, self.limit.bytes, self.limit.quota, self.limit.text
        )
    }
}

/// The namespace's snapshot byte limit from its ResourceQuotas (pure): the smallest
/// `orchard.dev/snapshot-bytes` of `spec.hard`, `None` when no quota names it. A value that is not
/// a quantity is an error naming the quota (nothing is committed until it is fixed).
pub fn limit<'a>(
    quotas: impl IntoIterator<Item = &'a ResourceQuota>,
) -> Result<Option<Limit>, String> {
    let mut smallest: Option<Limit> = None;
    for quota in quotas {
        let Some(text) = quota
            .spec
            .as_ref()
            .and_then(|s| s.hard.as_ref())
            .and_then(|h| h.get(SNAPSHOT_BYTES_QUOTA))
        else {
            continue;
        };
        let name = quota.metadata.name.clone().unwrap_or_default();
        let value = bytes(&text.0).map_err(|e| {
            format!("ResourceQuota {name}: {SNAPSHOT_BYTES_QUOTA} is not a byte quantity: {e}")
        })?;
        if smallest.as_ref().is_none_or(|s| value < s.bytes) {
            smallest = Some(Limit {
                bytes: value,
                text: text.0.clone(),
                quota: name,
            });
        }
    }
    Ok(smallest)
}

/// Bytes held by `snapshots` that are Ready, except the one with UID `except` (pure). A snapshot
/// being deleted still counts until it is gone.
pub fn used<'a>(snapshots: impl IntoIterator<Item = &'a SandboxSnapshot>, except: &str) -> u64 {
    snapshots
        .into_iter()
        .filter(|s| s.metadata.uid.as_deref() != Some(except))
        .filter_map(|s| s.status.as_ref())
        .filter(|s| s.phase == Some(SnapshotPhase::Ready))
        .map(|s| s.size_bytes.map_or(0, |b| u64::try_from(b).unwrap_or(0)))
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceQuotaSpec;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use orchard_api::SandboxSnapshotStatus;

    fn quota(name: &str, hard: &[(&str, &str)]) -> ResourceQuota {
        ResourceQuota {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(ResourceQuotaSpec {
                hard: Some(
                    hard.iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn snap(uid: &str, phase: SnapshotPhase, size: Option<i64>) -> SandboxSnapshot {
        let mut s = SandboxSnapshot::new("s", Default::default());
        s.metadata.uid = Some(uid.into());
        s.status = Some(SandboxSnapshotStatus {
            phase: Some(phase),
            size_bytes: size,
            ..Default::default()
        });
        s
    }

    #[test]
    fn the_smallest_snapshot_bytes_of_the_quotas_is_the_limit() {
        let quotas = [
            quota("pods", &[("pods", "10")]),
            quota("big", &[(SNAPSHOT_BYTES_QUOTA, "1Gi")]),
            quota("small", &[(SNAPSHOT_BYTES_QUOTA, "4Mi"), ("pods", "3")]),
        ];
        assert_eq!(
            limit(&quotas),
            Ok(Some(Limit {
                bytes: 4 << 20,
                text: "4Mi".into(),
                quota: "small".into()
            }))
        );
        assert_eq!(limit(&quotas[..1]), Ok(None), "no quota names it");
        assert_eq!(limit([]), Ok(None));
        let bad = limit(&[quota("typo", &[(SNAPSHOT_BYTES_QUOTA, "lots")])]);
        assert!(
            bad.as_ref()
                .is_err_and(|e| e.contains("ResourceQuota typo") && e.contains("lots")),
            "{bad:?}"
        );
    }

    #[test]
    fn only_other_ready_snapshots_count() {
        let snapshots = [
            snap("a", SnapshotPhase::Ready, Some(100)),
            snap("b", SnapshotPhase::Ready, Some(50)),
            snap("self", SnapshotPhase::Ready, Some(1000)),
            snap("c", SnapshotPhase::Failed, Some(7)),
            snap("d", SnapshotPhase::Committing, None),
            snap("e", SnapshotPhase::Ready, None),
        ];
        assert_eq!(used(&snapshots, "self"), 150);
        assert_eq!(used(&snapshots, "none"), 1150);
    }

    #[test]
    fn room_and_fit_are_exact_at_the_limit() {
        let budget = Budget {
            limit: Limit {
                bytes: 100,
                text: "100".into(),
                quota: "q".into(),
            },
            used: 60,
        };
        assert_eq!(budget.room(), 40);
        assert!(budget.fits(40));
        assert!(!budget.fits(41));
        let over = Budget {
            used: 130,
            ..budget
        };
        assert_eq!(over.room(), 0, "already over (the quota was lowered)");
        assert!(!over.fits(0));
        assert!(
            over.describe()
                .contains("130 of 100 bytes (ResourceQuota q")
        );
    }
}
