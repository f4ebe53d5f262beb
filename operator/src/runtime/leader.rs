//! Leader election with a `coordination.k8s.io/v1` Lease, so two replicas never both write.
//!
//! Every replica runs its watches, caches, controllers and gateway; reconciles do nothing unless this
//! replica holds the Lease ([`Leadership::is_leader`]). Keeping the controllers running on standbys
//! matters: their cache subscriptions must be consumed, or the shared watches would stall the
//! gateway's caches. When a replica gains the Lease it reconciles everything at once.
//!
//! Protocol: the holder renews every third of the lease duration; anyone may take the Lease when it
//! is free (no holder) or expired (`renewTime + leaseDurationSeconds` passed). Updates use the
//! Lease's resourceVersion, so two candidates cannot both win. A stopping leader releases the Lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Whether this replica may write, shared by the controllers.
#[derive(Clone, Debug)]
pub struct Leadership {
    leader: Arc<AtomicBool>,
    gained: watch::Sender<u64>,
}

impl Leadership {
    /// Leadership that is always held (leader election off: a single replica).
    pub fn always() -> Self {
        let (gained, _) = watch::channel(1);
        Self {
            leader: Arc::new(AtomicBool::new(true)),
            gained,
        }
    }

    /// Leadership that starts not held; [`run`] acquires it.
    pub fn contended() -> Self {
        let (gained, _) = watch::channel(0);
        Self {
            leader: Arc::new(AtomicBool::new(false)),
            gained,
        }
    }

    /// Whether this replica holds the Lease now.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    fn set(&self, leader: bool) {
        let was = self.leader.swap(leader, Ordering::SeqCst);
        if leader && !was {
            self.gained.send_modify(|n| *n += 1);
        }
    }

    /// A stream yielding once every time leadership is gained (for `Controller::reconcile_all_on`).
    pub fn gained_stream(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let mut rx = self.gained.subscribe();
        rx.mark_unchanged();
        futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

/// What a candidate should do with the Lease it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseDecision {
    /// Create the Lease (it does not exist).
    Create,
    /// Take it over (free or expired).
    Acquire,
    /// Renew it (we hold it).
    Renew,
    /// Someone else holds it until `until`.
    HeldBy {
        /// Holder identity.
        holder: String,
        /// When it expires unless renewed.
        until: Timestamp,
    },
}

/// Decides what `me` should do with `lease` at `now` (pure).
pub fn decide(lease: Option<&LeaseSpec>, me: &str, now: Timestamp) -> LeaseDecision {
    let Some(spec) = lease else {
        return LeaseDecision::Create;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder.is_empty() {
        return LeaseDecision::Acquire;
    }
    if holder == me {
        return LeaseDecision::Renew;
    }
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    let duration =
        SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15).max(1)));
    match renewed.and_then(|r| r.checked_add(duration).ok()) {
        Some(until) if until > now => LeaseDecision::HeldBy { holder, until },
        _ => LeaseDecision::Acquire,
    }
}

/// The Lease spec this replica writes when creating, acquiring or renewing.
pub fn claimed_spec(
    previous: Option<&LeaseSpec>,
    me: &str,
    duration: Duration,
    now: Timestamp,
    acquiring: bool,
) -> LeaseSpec {
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)),
        acquire_time: if acquiring {
            Some(MicroTime(now))
        } else {
            previous
                .and_then(|p| p.acquire_time.clone())
                .or(Some(MicroTime(now)))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if acquiring && previous.is_some() {
            transitions + 1
        } else {
            transitions
        }),
        ..LeaseSpec::default()
    }
}

/// Settings of the election.
#[derive(Debug, Clone)]
pub struct Election {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// Lease duration.
    pub duration: Duration,
}

/// Runs the election until `shutdown`, then releases the Lease if held.
pub async fn run(
    client: Client,
    election: Election,
    leadership: Leadership,
    shutdown: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client, &election.namespace);
    let period = (election.duration / 3).max(Duration::from_millis(200));
    let mut last_renewal: Option<tokio::time::Instant> = None;
    info!(lease = %election.name, identity = %election.identity, "leader election started");
    loop {
        match step(&api, &election).await {
            Ok(true) => {
                if !leadership.is_leader() {
                    info!(identity = %election.identity, "became the leader");
                }
                last_renewal = Some(tokio::time::Instant::now());
                leadership.set(true);
            }
            Ok(false) => {
                if leadership.is_leader() {
                    warn!(identity = %election.identity, "lost the leader lease to another replica");
                }
                leadership.set(false);
            }
            Err(err) => {
                warn!(%err, "leader election: cannot read or write the Lease");
                // Step down once we could not renew for a whole lease duration.
                if last_renewal.is_some_and(|at| at.elapsed() >= election.duration)
                    && leadership.is_leader()
                {
                    warn!(identity = %election.identity, "could not renew the lease in time; stepping down");
                    leadership.set(false);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period) => {},
            _ = shutdown.cancelled() => break,
        }
    }
    if leadership.is_leader() {
        leadership.set(false);
        release(&api, &election).await;
    }
}

/// One round: returns whether we hold the Lease afterwards.
async fn step(api: &Api<Lease>, election: &Election) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let current = api.get_opt(&election.name).await?;
    let spec = current.as_ref().and_then(|l| l.spec.as_ref());
    match decide(spec, &election.identity, now) {
        LeaseDecision::HeldBy { .. } => Ok(false),
        LeaseDecision::Create => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(election.name.clone()),
                    namespace: Some(election.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(claimed_spec(
                    None,
                    &election.identity,
                    election.duration,
                    now,
                    true,
                )),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(err) => Err(err),
            }
        }
        decision @ (LeaseDecision::Acquire | LeaseDecision::Renew) => {
            let Some(mut lease) = current.clone() else {
                return Ok(false);
            };
            let acquiring = decision == LeaseDecision::Acquire;
            lease.spec = Some(claimed_spec(
                spec,
                &election.identity,
                election.duration,
                now,
                acquiring,
            ));
            match api
                .replace(&election.name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => Ok(true),
                // Someone else wrote the Lease since we read it: they won this round.
                Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
                Err(err) => Err(err),
            }
        }
    }
}

async fn release(api: &Api<Lease>, election: &Election) {
    let Ok(Some(mut lease)) = api.get_opt(&election.name).await else {
        return;
    };
    let holds = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        == Some(election.identity.as_str());
    if !holds {
        return;
    }
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
        spec.renew_time = None;
    }
    match api
        .replace(&election.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => info!(identity = %election.identity, "released the leader lease"),
        Err(err) => warn!(%err, "could not release the leader lease; it expires on its own"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn held(by: &str, renewed: &str, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(by.into()),
            renew_time: Some(MicroTime(t(renewed))),
            lease_duration_seconds: Some(seconds),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_missing_lease_is_created_and_a_free_one_acquired() {
        assert_eq!(
            decide(None, "a", t("2026-01-01T00:00:00Z")),
            LeaseDecision::Create
        );
        let free = LeaseSpec::default();
        assert_eq!(
            decide(Some(&free), "a", t("2026-01-01T00:00:00Z")),
            LeaseDecision::Acquire
        );
    }

    #[test]
    fn the_holder_renews_and_others_wait_until_expiry() {
        let lease = held("a", "2026-01-01T00:00:00Z", 15);
        assert_eq!(
            decide(Some(&lease), "a", t("2026-01-01T00:00:05Z")),
            LeaseDecision::Renew
        );
        assert_eq!(
            decide(Some(&lease), "b", t("2026-01-01T00:00:14Z")),
            LeaseDecision::HeldBy {
                holder: "a".into(),
                until: t("2026-01-01T00:00:15Z")
            }
        );
        assert_eq!(
            decide(Some(&lease), "b", t("2026-01-01T00:00:15Z")),
            LeaseDecision::Acquire
        );
    }

    #[test]
    fn claims_count_transitions_and_keep_the_acquire_time_on_renewal() {
        let now = t("2026-01-01T00:00:10Z");
        let mut previous = held("a", "2026-01-01T00:00:00Z", 15);
        previous.acquire_time = Some(MicroTime(t("2026-01-01T00:00:00Z")));
        previous.lease_transitions = Some(2);
        let renewed = claimed_spec(Some(&previous), "a", Duration::from_secs(15), now, false);
        assert_eq!(renewed.acquire_time, previous.acquire_time);
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
        assert_eq!(renewed.lease_transitions, Some(2));
        let taken = claimed_spec(Some(&previous), "b", Duration::from_secs(15), now, true);
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.lease_transitions, Some(3));
    }

    #[tokio::test]
    async fn gaining_leadership_is_signalled_once_per_transition() {
        use futures::StreamExt;
        let leadership = Leadership::contended();
        let mut gained = Box::pin(leadership.gained_stream());
        assert!(!leadership.is_leader());
        leadership.set(true);
        leadership.set(true);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), gained.next())
                .await
                .unwrap()
                .is_some()
        );
        leadership.set(false);
        leadership.set(true);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), gained.next())
                .await
                .unwrap()
                .is_some()
        );
        assert!(leadership.is_leader());
    }
}
