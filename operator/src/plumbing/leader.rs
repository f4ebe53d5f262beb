//! Leader election with a `coordination.k8s.io/v1` Lease, so two replicas never both write.
//!
//! Every replica runs its watches, caches, controllers and gateway; reconciles do nothing unless this
//! replica holds the Lease ([`Leadership::is_leader`]). Keeping the controllers running on standbys
//! matters: their cache subscriptions must be consumed, or the shared watches would stall the
//! gateway's caches. When a replica gains the Lease it reconciles everything at once.
//!
//! Protocol: anyone may take the Lease when it is free (no holder) or expired (`renewTime +
//! leaseDurationSeconds` passed). Updates use the Lease's resourceVersion, so two candidates cannot
//! both win. A stopping leader releases the Lease.
//!
//! Timing ([`Timing`]): the holder tries to renew every sixth of the lease duration, and steps down as
//! soon as it has not renewed successfully within the renew deadline (two thirds of the duration),
//! counted from the start of its last successful renew request, which is no later than the
//! `renewTime` it wrote. Every election step runs under a timeout, so a hung request cannot keep a
//! replica "leader". A standby takes over only a whole lease duration after that `renewTime`, so the
//! old leader has stopped writing at least a third of the duration (the margin) before.
//!
//! Leadership is also a cancellation signal: each term has a [`CancellationToken`], cancelled on
//! step-down. Work that runs across a step-down races it ([`Leadership::while_leader`]), and the
//! controllers' client refuses and aborts writes outside a term and bounds each write by a
//! per-call timeout shorter than the margin ([`WriteGate`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use hyper::{Method, Request, Response};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::{BoxError, Layer, Service};
use tracing::{info, warn};

/// Whether this replica may write, shared by the controllers.
#[derive(Clone, Debug)]
pub struct Leadership {
    leader: Arc<AtomicBool>,
    /// The current term's token while leader (cancelled when the term ends).
    term: Arc<Mutex<Option<CancellationToken>>>,
    gained: watch::Sender<u64>,
}

impl Leadership {
    /// Leadership that is always held (leader election off: a single replica).
    pub fn always() -> Self {
        let (gained, _) = watch::channel(1);
        Self {
            leader: Arc::new(AtomicBool::new(true)),
            term: Arc::new(Mutex::new(Some(CancellationToken::new()))),
            gained,
        }
    }

    /// Leadership that starts not held; [`run`] acquires it.
    pub fn contended() -> Self {
        let (gained, _) = watch::channel(0);
        Self {
            leader: Arc::new(AtomicBool::new(false)),
            term: Arc::new(Mutex::new(None)),
            gained,
        }
    }

    /// Whether this replica holds the Lease now.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::SeqCst)
    }

    /// The current term's cancellation token (`None` unless leader): cancelled when this replica
    /// steps down; a later term gets a new token.
    pub fn term(&self) -> Option<CancellationToken> {
        self.term.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Runs `work` only while this replica leads: `None` at once if it does not, or as soon as the
    /// current term ends (`work` is dropped, which aborts whatever request it has in flight).
    pub async fn while_leader<F: Future>(&self, work: F) -> Option<F::Output> {
        let term = self.term()?;
        tokio::select! {
            biased;
            _ = term.cancelled() => None,
            out = work => Some(out),
        }
    }

    fn set(&self, leader: bool) {
        let mut term = self.term.lock().unwrap_or_else(|p| p.into_inner());
        if leader {
            if term.is_none() {
                *term = Some(CancellationToken::new());
                self.leader.store(true, Ordering::SeqCst);
                self.gained.send_modify(|n| *n += 1);
            }
        } else if let Some(ended) = term.take() {
            // Not leader first, so work woken by the cancellation sees it.
            self.leader.store(false, Ordering::SeqCst);
            ended.cancel();
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

/// The timing of the election, all derived from the lease duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a Lease blocks others after its `renewTime`.
    pub lease_duration: Duration,
    /// The leader steps down when it has not renewed successfully for this long (counted from the
    /// start of its last successful renew request): two thirds of the lease duration.
    pub renew_deadline: Duration,
    /// Time between election steps (and the timeout of a candidate's step): a sixth of the duration.
    pub retry_period: Duration,
    /// Timeout of each write the controllers send while leading: three quarters of the margin
    /// (lease duration minus renew deadline).
    pub call_timeout: Duration,
}

impl Timing {
    /// The timing for a lease of `lease_duration` (at least one second).
    pub fn for_lease(lease_duration: Duration) -> Self {
        let lease_duration = lease_duration.max(Duration::from_secs(1));
        let renew_deadline = lease_duration * 2 / 3;
        let margin = lease_duration - renew_deadline;
        Self {
            lease_duration,
            renew_deadline,
            retry_period: lease_duration / 6,
            call_timeout: margin * 3 / 4,
        }
    }

    /// The timeout of the next step: for the leader, what is left of its renew deadline (at most half
    /// of it, so a hung request leaves time for a retry on a new connection); for a candidate, one
    /// retry period.
    pub fn step_timeout(&self, last_renew_start: Option<Instant>, now: Instant) -> Duration {
        match last_renew_start {
            Some(start) => self
                .renew_deadline
                .saturating_sub(now.saturating_duration_since(start))
                .min(self.renew_deadline / 2),
            None => self.retry_period,
        }
    }
}

/// Whether a leader whose last successful renew request started at `last_renew_start` still leads at
/// `now` (pure): strictly less than `renew_deadline` has passed.
pub fn still_leader(last_renew_start: Instant, now: Instant, renew_deadline: Duration) -> bool {
    now.saturating_duration_since(last_renew_start) < renew_deadline
}

/// Why the controllers' client refused or abandoned a write ([`WriteGate`]).
#[derive(thiserror::Error, Debug)]
pub enum WriteRefused {
    /// Sent outside a term.
    #[error("not the leader: write refused")]
    NotLeader,
    /// The term ended while the write was in flight (the request was aborted).
    #[error("leadership lost while the write was in flight: write aborted")]
    LeadershipLost,
    /// No answer within the per-call timeout (the request was aborted).
    #[error("write timed out after {0:?} (the per-call timeout of leader election)")]
    TimedOut(Duration),
}

/// A client layer that lets writes (POST, PUT, PATCH, DELETE) through only during a term: a write
/// sent outside one fails at once, a write in flight when the term ends is aborted (its request
/// future dropped), and each write is bounded by a per-call timeout. Reads (watches included) pass
/// untouched.
#[derive(Clone, Debug)]
pub struct WriteGate {
    leadership: Leadership,
    call_timeout: Duration,
}

impl WriteGate {
    /// A gate on `leadership` with `call_timeout` per write.
    pub fn new(leadership: Leadership, call_timeout: Duration) -> Self {
        Self {
            leadership,
            call_timeout,
        }
    }
}

impl<S> Layer<S> for WriteGate {
    type Service = WriteGateService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        WriteGateService {
            inner,
            gate: self.clone(),
        }
    }
}

/// The service of [`WriteGate`].
#[derive(Clone, Debug)]
pub struct WriteGateService<S> {
    inner: S,
    gate: WriteGate,
}

type BoxedResponse<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl<S, B> Service<Request<kube::client::Body>> for WriteGateService<S>
where
    S: Service<Request<kube::client::Body>, Response = Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = BoxedResponse<Response<B>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let write = matches!(
            *request.method(),
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        if !write {
            let response = self.inner.call(request);
            return Box::pin(async move { response.await.map_err(Into::into) });
        }
        let Some(term) = self.gate.leadership.term() else {
            return Box::pin(std::future::ready(Err(WriteRefused::NotLeader.into())));
        };
        let timeout = self.gate.call_timeout;
        let response = self.inner.call(request);
        Box::pin(async move {
            tokio::select! {
                biased;
                _ = term.cancelled() => Err(WriteRefused::LeadershipLost.into()),
                answered = tokio::time::timeout(timeout, response) => match answered {
                    Ok(result) => result.map_err(Into::into),
                    Err(_) => Err(WriteRefused::TimedOut(timeout).into()),
                },
            }
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
    let timing = Timing::for_lease(election.duration);
    // Start of the last successful create/acquire/renew request of the current term.
    let mut last_renew_start: Option<Instant> = None;
    info!(
        lease = %election.name,
        identity = %election.identity,
        renew_deadline_ms = timing.renew_deadline.as_millis() as u64,
        call_timeout_ms = timing.call_timeout.as_millis() as u64,
        "leader election started"
    );
    // Steps down once the renew deadline passed without a successful renew.
    let deadline_check = |last: &mut Option<Instant>| {
        if let Some(start) = *last
            && !still_leader(start, Instant::now(), timing.renew_deadline)
        {
            warn!(identity = %election.identity, "could not renew the lease within the renew deadline; stepping down");
            *last = None;
            leadership.set(false);
        }
    };
    loop {
        deadline_check(&mut last_renew_start);
        let started = Instant::now();
        let timeout = timing.step_timeout(last_renew_start, started);
        match tokio::time::timeout(timeout, step(&api, &election)).await {
            Ok(Ok(true)) => {
                if !leadership.is_leader() {
                    info!(identity = %election.identity, "became the leader");
                }
                last_renew_start = Some(started);
                leadership.set(true);
            }
            Ok(Ok(false)) => {
                if leadership.is_leader() {
                    warn!(identity = %election.identity, "lost the leader lease to another replica");
                }
                last_renew_start = None;
                leadership.set(false);
            }
            Ok(Err(err)) => warn!(%err, "leader election: cannot read or write the Lease"),
            Err(_) => warn!(
                timeout_ms = timeout.as_millis() as u64,
                "leader election: the Lease request did not answer in time"
            ),
        }
        deadline_check(&mut last_renew_start);
        // The next step, or the renew deadline if earlier (to step down on time).
        let mut next = started + timing.retry_period;
        if let Some(start) = last_renew_start {
            next = next.min(start + timing.renew_deadline);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {},
            _ = shutdown.cancelled() => break,
        }
    }
    if leadership.is_leader() {
        leadership.set(false);
        if tokio::time::timeout(timing.renew_deadline, release(&api, &election))
            .await
            .is_err()
        {
            warn!("could not release the leader lease in time; it expires on its own");
        }
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

    #[test]
    fn the_leader_leads_strictly_less_than_the_renew_deadline_after_its_last_renew_started() {
        let start = Instant::now();
        let deadline = Duration::from_secs(10);
        assert!(still_leader(start, start, deadline));
        assert!(still_leader(
            start,
            start + Duration::from_millis(9_999),
            deadline
        ));
        assert!(!still_leader(start, start + deadline, deadline));
        assert!(!still_leader(
            start,
            start + Duration::from_secs(30),
            deadline
        ));
        // A clock read before the renew started (cannot happen with a monotonic clock) still leads.
        assert!(still_leader(
            start + Duration::from_secs(1),
            start,
            deadline
        ));
    }

    #[test]
    fn the_timing_leaves_a_margin_that_the_per_call_timeout_fits_in() {
        for seconds in [1, 2, 3, 15, 60, 137] {
            let timing = Timing::for_lease(Duration::from_secs(seconds));
            let margin = timing.lease_duration - timing.renew_deadline;
            assert!(timing.renew_deadline < timing.lease_duration, "{timing:?}");
            assert!(timing.retry_period < timing.renew_deadline, "{timing:?}");
            assert!(!timing.call_timeout.is_zero(), "{timing:?}");
            assert!(timing.call_timeout < margin, "{timing:?}");
        }
        let default = Timing::for_lease(Duration::from_secs(15));
        assert_eq!(default.renew_deadline, Duration::from_secs(10));
        assert_eq!(default.retry_period, Duration::from_millis(2_500));
        assert_eq!(default.call_timeout, Duration::from_millis(3_750));
        assert_eq!(
            Timing::for_lease(Duration::ZERO).lease_duration,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_step_never_outlives_the_renew_deadline() {
        let timing = Timing::for_lease(Duration::from_secs(3));
        let start = Instant::now();
        assert_eq!(timing.step_timeout(None, start), timing.retry_period);
        assert_eq!(
            timing.step_timeout(Some(start), start),
            Duration::from_secs(1)
        );
        assert_eq!(
            timing.step_timeout(Some(start), start + Duration::from_millis(1_500)),
            Duration::from_millis(500)
        );
        assert_eq!(
            timing.step_timeout(Some(start), start + Duration::from_secs(5)),
            Duration::ZERO
        );
    }

    #[tokio::test]
    async fn work_stops_when_its_term_ends_and_nothing_runs_outside_a_term() {
        let leadership = Leadership::contended();
        assert!(leadership.term().is_none());
        assert_eq!(leadership.while_leader(async { 1 }).await, None);
        leadership.set(true);
        let term = leadership.term().unwrap();
        assert_eq!(leadership.while_leader(async { 2 }).await, Some(2));
        let lead = leadership.clone();
        let work =
            tokio::spawn(async move { lead.while_leader(futures::future::pending::<()>()).await });
        tokio::task::yield_now().await;
        leadership.set(false);
        assert!(term.is_cancelled());
        assert!(!leadership.is_leader());
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(1), work)
                .await
                .unwrap()
                .unwrap(),
            None
        );
        leadership.set(true);
        let next = leadership.term().unwrap();
        assert!(!next.is_cancelled(), "a new term gets a new token");
        assert!(Leadership::always().term().is_some());
    }

    #[tokio::test]
    async fn the_write_gate_refuses_aborts_and_times_out_writes_but_passes_reads() {
        use tower::ServiceExt;
        let leadership = Leadership::contended();
        let slow = tower::service_fn(|request: Request<kube::client::Body>| async move {
            if request.method() == Method::PUT {
                futures::future::pending::<()>().await;
            }
            Ok::<_, BoxError>(Response::new(()))
        });
        let gate = WriteGate::new(leadership.clone(), Duration::from_millis(200)).layer(slow);
        let request = |method: Method| {
            Request::builder()
                .method(method)
                .uri("/api/v1/namespaces/default/pods")
                .body(kube::client::Body::from(Vec::new()))
                .unwrap()
        };
        let refusal = |method: Method| {
            let gate = gate.clone();
            async move {
                let error = gate.oneshot(request(method)).await.unwrap_err();
                error
                    .downcast_ref::<WriteRefused>()
                    .map(|r| format!("{r:?}"))
            }
        };
        assert!(gate.clone().oneshot(request(Method::GET)).await.is_ok());
        let refused = refusal(Method::POST).await.unwrap_or_default();
        assert!(refused.starts_with("NotLeader"), "{refused}");
        leadership.set(true);
        assert!(gate.clone().oneshot(request(Method::POST)).await.is_ok());
        let timed_out = refusal(Method::PUT).await.unwrap_or_default();
        assert!(timed_out.starts_with("TimedOut"), "{timed_out}");
        let in_flight = tokio::spawn(gate.clone().oneshot(request(Method::PUT)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        leadership.set(false);
        let lost = in_flight.await.unwrap().unwrap_err();
        assert!(matches!(
            lost.downcast_ref(),
            Some(WriteRefused::LeadershipLost)
        ));
    }
}
