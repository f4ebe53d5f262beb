//! Authentication (TokenReview) and authorisation (SubjectAccessReview) of gateway callers, with a
//! short cache of decisions keyed by a SHA-256 of the token (never the token itself; tokens are never
//! logged). Accepted and refused tokens are cached apart (`verdict_cache`), and TokenReviews of unknown
//! tokens are budgeted globally and per client IP (`review_budget`): a flood of bogus tokens neither
//! evicts valid callers nor costs the API server more than the budget. With audiences configured, a
//! token is accepted only if the API server confirms one of them. After this check the gateway acts
//! with the operator's identity.

pub mod access;
pub mod revalidate;
pub mod review_budget;
pub mod verdict_cache;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::gateway::auth::access::Access;
use crate::gateway::auth::review_budget::{
    BudgetLimits, KeyedBuckets, ReviewBudget, retry_after_seconds,
};
use crate::gateway::auth::verdict_cache::{Key, Lookup, VerdictCache};
use crate::gateway::http::errors::ApiError;
use crate::gateway::http::metrics::GatewayMetrics;
use orchard_api::GROUP;
use prometheus::IntCounter;

/// How long a decision is reused unless configured (`--gateway-auth-cache-ttl-seconds`).
pub const DECISION_TTL: Duration = Duration::from_secs(10);

/// Most cached accepted tokens, and accepted access decisions; beyond it expired entries are
/// dropped, then everything.
const MAX_ENTRIES: usize = 65_536;

/// Most cached refused tokens, and refused access decisions (their own maps: they never push out
/// accepted ones).
const MAX_REFUSED: usize = 16_384;

/// How the authorizer checks callers.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthSettings {
    /// How long a TokenReview or SubjectAccessReview decision is reused.
    pub ttl: Duration,
    /// Audiences asked of TokenReview; empty sends none (tokens for the API server are accepted).
    pub audiences: Vec<String>,
    /// Budget of TokenReviews for unknown tokens.
    pub budget: BudgetLimits,
    /// SubjectAccessReviews per second one caller may cause (cache misses); 0: unlimited.
    pub access_review_rate: f64,
    /// Burst of each caller's SubjectAccessReviews.
    pub access_review_burst: f64,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            ttl: DECISION_TTL,
            audiences: Vec::new(),
            budget: BudgetLimits {
                rate: 0.0,
                burst: 0.0,
                per_client_rate: 0.0,
                per_client_burst: 0.0,
            },
            access_review_rate: 0.0,
            access_review_burst: 0.0,
        }
    }
}

/// Who is calling, as the API server's TokenReview said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User name (`alice`, `system:serviceaccount:ns:trainer`).
    pub username: String,
    /// User uid, when the authenticator sets one.
    pub uid: Option<String>,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (passed on to SubjectAccessReview unchanged).
    pub extra: BTreeMap<String, Vec<String>>,
}

#[derive(Clone)]
enum TokenDecision {
    Valid(Arc<Identity>),
    Invalid(String),
}

/// Whether a TokenReview answer's `status.audiences` fits the configured audiences (pure): always
/// when none are configured, else when they share one. An empty answer means the token is for the
/// API server itself, which a gateway with audiences refuses.
pub fn audiences_match(configured: &[String], confirmed: Option<&[String]>) -> bool {
    configured.is_empty()
        || confirmed
            .unwrap_or_default()
            .iter()
            .any(|audience| configured.contains(audience))
}

/// What a caller of a gateway with `audiences` needs (pure).
fn audience_hint(audiences: &[String]) -> String {
    format!(
        "this gateway accepts only tokens issued for the audience{} {} (e.g. `kubectl create token <service-account> --audience {}`)",
        if audiences.len() == 1 { "" } else { "s" },
        audiences.join(", "),
        audiences.first().map(String::as_str).unwrap_or_default()
    )
}

/// Checks bearer tokens and permissions against the API server, caching decisions briefly.
pub struct Authorizer {
    client: Client,
    settings: AuthSettings,
    tokens: Mutex<VerdictCache<Arc<Identity>>>,
    budget: Mutex<ReviewBudget>,
    flights: Mutex<HashMap<Key, Arc<Flight>>>,
    decisions: Mutex<VerdictCache<()>>,
    access_budget: Mutex<KeyedBuckets<String>>,
    cache_counts: CacheCounts,
    metrics: GatewayMetrics,
}

/// One TokenReview in flight: every request that brings the same unknown token meanwhile waits for
/// its answer instead of asking (and spending the review budget) again. A trainer's first burst of
/// concurrent calls with a new token costs one review, not one per call.
type Flight = tokio::sync::OnceCell<Result<TokenDecision, ApiError>>;

/// The bearer token of a request, or the 401 to answer.
pub fn bearer_token(headers: &HeaderMap) -> Result<&str, ApiError> {
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        ApiError::unauthorized(
            "missing `Authorization: Bearer <token>` header (a Kubernetes token: a service-account token or any token the API server accepts)",
        )
    })?;
    let text = value
        .to_str()
        .map_err(|_| ApiError::unauthorized("the Authorization header is not valid text"))?;
    let (scheme, token) = text.split_once(' ').unwrap_or((text, ""));
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(ApiError::unauthorized(
            "the Authorization header must be `Bearer <token>`",
        ));
    }
    Ok(token.trim())
}

/// Cache key of a token.
fn token_key(token: &str) -> Key {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// Cache key of one decision: the token's hash and every attribute of the review of `access` on
/// the object `name` (empty: every object of the namespace), each attribute with its length.
fn access_key(token: &Key, access: &Access, name: &str) -> Key {
    let parts = [
        access.verb,
        access.resource.as_str(),
        access.subresource,
        &access.namespace,
        name,
    ];
    let mut material =
        Vec::with_capacity(token.len() + parts.iter().map(|part| 8 + part.len()).sum::<usize>());
    material.extend_from_slice(token);
    for part in parts {
        material.extend_from_slice(&(part.len() as u64).to_le_bytes());
        material.extend_from_slice(part.as_bytes());
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, &material).as_ref());
    key
}

/// `orchard_gateway_auth_cache_total` by cache and result, resolved once.
struct CacheCounts {
    token_hit: IntCounter,
    token_miss: IntCounter,
    access_hit: IntCounter,
    access_miss: IntCounter,
}

impl CacheCounts {
    fn new(metrics: &GatewayMetrics) -> Self {
        let counter =
            |cache: &str, result: &str| metrics.auth_cache.with_label_values(&[cache, result]);
        Self {
            token_hit: counter("token", "hit"),
            token_miss: counter("token", "miss"),
            access_hit: counter("access", "hit"),
            access_miss: counter("access", "miss"),
        }
    }
}

impl Authorizer {
    /// An authorizer asking the API server through `client`.
    pub fn new(client: Client, metrics: GatewayMetrics, settings: AuthSettings) -> Self {
        Self {
            client,
            tokens: Mutex::new(VerdictCache::new(settings.ttl, MAX_ENTRIES, MAX_REFUSED)),
            budget: Mutex::new(ReviewBudget::new(settings.budget, Instant::now())),
            flights: Mutex::default(),
            decisions: Mutex::new(VerdictCache::new(settings.ttl, MAX_ENTRIES, MAX_REFUSED)),
            access_budget: Mutex::new(KeyedBuckets::new(
                settings.access_review_rate,
                settings.access_review_burst,
            )),
            settings,
            cache_counts: CacheCounts::new(&metrics),
            metrics,
        }
    }

    /// How long decisions are reused (streams re-check their caller at least this often).
    pub fn ttl(&self) -> Duration {
        self.settings.ttl
    }

    /// Authenticates the request and checks `access`; the caller's identity on success.
    pub async fn authorize(
        &self,
        headers: &HeaderMap,
        access: &Access,
    ) -> Result<Arc<Identity>, ApiError> {
        let token = bearer_token(headers)?;
        let key = token_key(token);
        let identity = self.authenticate(token, &key).await?;
        crate::gateway::http::in_flight::charge_caller(&identity.username)?;
        // Most Roles grant a verb on every object of a namespace: one namespace-wide review (no name)
        // then covers every sandbox, instead of one review per sandbox name. RBAC allows an unnamed
        // review only through a rule without resourceNames, which grants every name; when it is not
        // allowed, the per-name review below decides (rules restricted to resourceNames still work).
        if !access.name.is_empty() && self.decide(&key, &identity, access, "").await?.is_ok() {
            return Ok(identity);
        }
        let decision = self.decide(&key, &identity, access, &access.name).await?;
        match decision {
            Ok(()) => Ok(identity),
            Err(reason) => Err(ApiError::forbidden(
                access.denied_message(&identity.username, Some(&reason)),
            )),
        }
    }

    /// The (cached) decision for `access` on the object `name` (empty: every object of the
    /// namespace).
    async fn decide(
        &self,
        key: &Key,
        identity: &Identity,
        access: &Access,
        name: &str,
    ) -> Result<Result<(), String>, ApiError> {
        let decision_key = access_key(key, access, name);
        let cached = self
            .decisions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lookup(&decision_key, Instant::now());
        match cached {
            Lookup::Valid(()) => {
                self.cache_counts.access_hit.inc();
                return Ok(Ok(()));
            }
            Lookup::Invalid(reason) => {
                self.cache_counts.access_hit.inc();
                return Ok(Err(reason));
            }
            Lookup::Known | Lookup::Unknown => self.cache_counts.access_miss.inc(),
        }
        self.spend_access_budget(&identity.username)?;
        let decision = self.review_access(identity, access, name).await?;
        let mut decisions = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
        match &decision {
            Ok(()) => decisions.accept(decision_key, (), Instant::now()),
            Err(reason) => decisions.refuse(decision_key, reason.clone(), Instant::now()),
        }
        Ok(decision)
    }

    /// Spends one SubjectAccessReview of `caller`'s budget, or answers 429: one caller asking about
    /// many names can neither flood the API server nor push others' decisions out of the cache.
    fn spend_access_budget(&self, caller: &str) -> Result<(), ApiError> {
        let spent = self
            .access_budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_take(&caller.to_string(), Instant::now());
        spent.map_err(|wait| {
            self.metrics
                .throttled
                .with_label_values(&["access_review_budget"])
                .inc();
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                format!(
                    "{caller} causes too many permission checks right now (the gateway limits SubjectAccessReviews per caller: --gateway-access-review-rate-per-caller, Helm gateway.accessReview.ratePerCaller); retry after the Retry-After delay"
                ),
            )
            .retryable(true)
            .retry_after(retry_after_seconds(wait))
        })
    }

    async fn authenticate(&self, token: &str, key: &Key) -> Result<Arc<Identity>, ApiError> {
        let known = {
            let cache = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
            match cache.lookup(key, Instant::now()) {
                Lookup::Valid(identity) => {
                    self.cache_counts.token_hit.inc();
                    return Ok(identity);
                }
                Lookup::Invalid(reason) => {
                    self.cache_counts.token_hit.inc();
                    return Err(ApiError::unauthorized(reason));
                }
                Lookup::Known => true,
                Lookup::Unknown => false,
            }
        };
        self.cache_counts.token_miss.inc();
        let flight = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            flights.entry(*key).or_default().clone()
        };
        let outcome = flight
            .get_or_init(|| async {
                if !known {
                    self.spend_review_budget(crate::gateway::http::server::peer_ip())?;
                }
                let decision = self.review_token(token).await?;
                let mut cache = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
                match &decision {
                    TokenDecision::Valid(identity) => {
                        cache.accept(*key, identity.clone(), Instant::now())
                    }
                    TokenDecision::Invalid(reason) => {
                        cache.refuse(*key, reason.clone(), Instant::now())
                    }
                }
                Ok(decision)
            })
            .await
            .clone();
        {
            // The answer is in the cache (or was an error): the next request starts afresh.
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            if flights.get(key).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
                flights.remove(key);
            }
        }
        match outcome? {
            TokenDecision::Valid(identity) => Ok(identity),
            TokenDecision::Invalid(reason) => Err(ApiError::unauthorized(reason)),
        }
    }

    /// Spends one TokenReview of the unknown-token budget for `client`, or answers 429.
    fn spend_review_budget(&self, client: Option<IpAddr>) -> Result<(), ApiError> {
        let spent = self
            .budget
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_spend(client, Instant::now());
        spent.map_err(|wait| {
            self.metrics
                .throttled
                .with_label_values(&["token_review_budget"])
                .inc();
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                "too many unknown bearer tokens to check right now (the gateway limits TokenReviews of tokens it has not seen valid); retry after the Retry-After delay",
            )
            .retryable(true)
            .retry_after(retry_after_seconds(wait))
        })
    }

    fn review_counted(&self, result: &str) {
        self.metrics
            .token_reviews
            .with_label_values(&[result])
            .inc();
    }

    async fn review_token(&self, token: &str) -> Result<TokenDecision, ApiError> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(self.settings.audiences.clone()).filter(|a| !a.is_empty()),
            },
            ..TokenReview::default()
        };
        let params = PostParams::default();
        let answer = on_fresh_connections(|| api.create(&params, &review))
            .await
            .map_err(|err| {
                self.review_counted("failed");
                tracing::warn!(error = %err, "TokenReview failed");
                ApiError::unavailable(format!(
                    "cannot check the bearer token: the Kubernetes API's TokenReview failed ({err})"
                ))
            })?;
        let status = answer.status.unwrap_or_default();
        let user = status.user.unwrap_or_default();
        let audiences_ok = audiences_match(&self.settings.audiences, status.audiences.as_deref());
        match (status.authenticated, user.username) {
            (Some(true), Some(_)) if !audiences_ok => {
                self.review_counted("refused");
                Ok(TokenDecision::Invalid(format!(
                    "the bearer token is not meant for this gateway; {}",
                    audience_hint(&self.settings.audiences)
                )))
            }
            (Some(true), Some(username)) if !username.is_empty() => {
                self.review_counted("accepted");
                Ok(TokenDecision::Valid(Arc::new(Identity {
                    username,
                    uid: user.uid,
                    groups: user.groups.unwrap_or_default(),
                    extra: user.extra.unwrap_or_default(),
                })))
            }
            _ => {
                self.review_counted("refused");
                let detail = status
                    .error
                    .filter(|e| !e.is_empty())
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                let hint = if self.settings.audiences.is_empty() {
                    "use a valid service-account or user token".to_string()
                } else {
                    audience_hint(&self.settings.audiences)
                };
                Ok(TokenDecision::Invalid(format!(
                    "the bearer token was not accepted by the Kubernetes API{detail}; {hint}"
                )))
            }
        }
    }

    async fn review_access(
        &self,
        identity: &Identity,
        access: &Access,
        name: &str,
    ) -> Result<Result<(), String>, ApiError> {
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(identity.username.clone()),
                uid: identity.uid.clone(),
                groups: Some(identity.groups.clone()),
                extra: Some(identity.extra.clone()).filter(|e| !e.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(GROUP.to_string()),
                    resource: Some(access.resource.as_str().to_string()),
                    subresource: Some(access.subresource.to_string()).filter(|s| !s.is_empty()),
                    verb: Some(access.verb.to_string()),
                    namespace: Some(access.namespace.clone()),
                    name: Some(name.to_string()).filter(|n| !n.is_empty()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let params = PostParams::default();
        let answer = on_fresh_connections(|| api.create(&params, &review))
            .await
            .map_err(|err| {
                tracing::warn!(error = %err, "SubjectAccessReview failed");
                ApiError::unavailable(format!(
                    "cannot check permissions: the Kubernetes API's SubjectAccessReview failed ({err})"
                ))
            })?;
        let status = answer.status.unwrap_or_default();
        if let Some(problem) = status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
            tracing::debug!(user = %identity.username, %access, problem, "RBAC evaluation error");
        }
        if status.allowed && status.denied != Some(true) {
            Ok(Ok(()))
        } else {
            Ok(Err(status.reason.unwrap_or_default()))
        }
    }
}

/// Most attempts at a review whose request never got an answer.
const REVIEW_ATTEMPTS: usize = 3;

/// Runs `review` again, up to [`REVIEW_ATTEMPTS`] in all, while it fails without an answer from the API
/// server (a transport error: first seen in bursts after about 90 s idle, when pooled keep-alive
/// connections met kube-apiserver's idle time-out; `plumbing::api_client` now drops idle connections
/// before the server does, and this covers the transport failures left). Reviews are not stored, so
/// asking again is always safe; the client drops the broken connection, so the next attempt goes
/// out on another. An answer, even an error status, is final.
async fn on_fresh_connections<T, F, Fut>(mut review: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 1;
    loop {
        match review().await {
            Err(err @ (kube::Error::Service(_) | kube::Error::HyperError(_)))
                if attempt < REVIEW_ATTEMPTS =>
            {
                tracing::info!(error = %err, attempt, "review sent on a broken connection; asking again");
                attempt += 1;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::auth::access::Operation;
    use axum::http::HeaderValue;

    #[tokio::test]
    async fn a_review_without_an_answer_is_asked_again_and_an_answer_is_final() {
        let broken = || kube::Error::Service("client error (SendRequest)".into());
        let mut calls = 0;
        let answer = on_fresh_connections(|| {
            calls += 1;
            let result = if calls < 3 { Err(broken()) } else { Ok(calls) };
            async move { result }
        })
        .await;
        assert_eq!(
            answer.ok(),
            Some(3),
            "two broken connections, then an answer"
        );

        let mut calls = 0;
        let gone = on_fresh_connections(|| {
            calls += 1;
            async { Err::<(), _>(broken()) }
        })
        .await;
        assert!(gone.is_err());
        assert_eq!(calls, REVIEW_ATTEMPTS, "bounded");

        let mut calls = 0;
        let refused = on_fresh_connections(|| {
            calls += 1;
            async {
                Err::<(), _>(kube::Error::Api(Box::new(
                    kube::core::Status::failure("too many requests", "TooManyRequests")
                        .with_code(429),
                )))
            }
        })
        .await;
        assert!(refused.is_err());
        assert_eq!(calls, 1, "the API server answered: no second attempt");
    }

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn bearer_tokens_are_parsed_and_garbage_is_401() {
        assert_eq!(bearer_token(&headers("Bearer abc")).unwrap(), "abc");
        assert_eq!(bearer_token(&headers("bearer  abc ")).unwrap(), "abc");
        for bad in ["Basic abc", "Bearer", "Bearer   ", "abc"] {
            let err = bearer_token(&headers(bad)).unwrap_err();
            assert_eq!(err.status, 401, "{bad}");
        }
        let err = bearer_token(&HeaderMap::new()).unwrap_err();
        assert!(err.body.message.contains("missing"), "{err}");
    }

    #[test]
    fn cache_keys_separate_tokens_and_every_attribute() {
        let a = token_key("token-a");
        let b = token_key("token-b");
        assert_ne!(a, b);
        let exec = Access::of(Operation::Exec, "ns", "s");
        let files = Access::of(Operation::ReadFiles, "ns", "s");
        let other_ns = Access::of(Operation::Exec, "ns2", "s");
        let other_name = Access::of(Operation::Exec, "ns", "t");
        let keys = [
            access_key(&a, &exec, &exec.name),
            access_key(&b, &exec, &exec.name),
            access_key(&a, &files, &files.name),
            access_key(&a, &other_ns, &other_ns.name),
            access_key(&a, &other_name, &other_name.name),
            access_key(&a, &exec, ""),
        ];
        for (i, x) in keys.iter().enumerate() {
            for y in &keys[i + 1..] {
                assert_ne!(x, y);
            }
        }
        assert_eq!(
            access_key(&a, &exec, "s"),
            access_key(&token_key("token-a"), &exec, "s")
        );
    }

    #[test]
    fn audiences_must_intersect_when_configured() {
        let none: Vec<String> = Vec::new();
        let ours = vec!["orchard-gateway".to_string(), "other".to_string()];
        assert!(audiences_match(&none, None));
        assert!(audiences_match(
            &none,
            Some(&["https://kubernetes.default.svc".into()])
        ));
        assert!(audiences_match(&ours, Some(&["other".into()])));
        assert!(
            !audiences_match(&ours, None),
            "an empty answer means the API server's audience"
        );
        assert!(!audiences_match(&ours, Some(&[])));
        assert!(!audiences_match(
            &ours,
            Some(&["https://kubernetes.default.svc".into()])
        ));
    }

    #[test]
    fn one_callers_denials_never_push_out_anothers_decisions() {
        let now = Instant::now();
        let mut decisions: VerdictCache<()> =
            VerdictCache::new(Duration::from_secs(10), MAX_ENTRIES, MAX_REFUSED);
        let alice = access_key(
            &token_key("alice"),
            &Access::of(Operation::Exec, "ns", "s"),
            "s",
        );
        decisions.accept(alice, (), now);
        let mallory = token_key("mallory");
        for n in 0..MAX_ENTRIES {
            let name = format!("random-{n}");
            let key = access_key(&mallory, &Access::of(Operation::Exec, "ns", &name), &name);
            decisions.refuse(key, "no".into(), now);
        }
        assert_eq!(decisions.lookup(&alice, now), Lookup::Valid(()));
        let (_, refused) = decisions.sizes();
        assert!(refused <= MAX_REFUSED, "{refused}");
    }

    #[test]
    fn a_callers_access_reviews_are_budgeted_apart_from_others() {
        let now = Instant::now();
        let mut budget: KeyedBuckets<String> = KeyedBuckets::new(1.0, 3.0);
        let mallory = "mallory".to_string();
        let spent = (0..100)
            .filter(|_| budget.try_take(&mallory, now).is_ok())
            .count();
        assert_eq!(spent, 3);
        assert!(budget.try_take(&"alice".to_string(), now).is_ok());
        let mut off: KeyedBuckets<String> = KeyedBuckets::new(0.0, 0.0);
        assert!((0..1000).all(|_| off.try_take(&mallory, now).is_ok()));
    }
}
