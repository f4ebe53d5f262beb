//! Authentication (TokenReview) and authorisation (SubjectAccessReview) of gateway callers, with a
//! short cache of both positive and negative decisions keyed by a SHA-256 of the token (never the token
//! itself; tokens are never logged). After this check the gateway acts with the operator's identity.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

use super::access::Access;
use super::errors::ApiError;
use super::metrics::GatewayMetrics;
use orchard_api::GROUP;

/// How long a decision is reused.
pub const DECISION_TTL: Duration = Duration::from_secs(10);

/// Most cached entries per cache; beyond it expired entries are dropped, then everything.
const MAX_ENTRIES: usize = 65_536;

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

type Key = [u8; 32];

#[derive(Clone)]
enum TokenDecision {
    Valid(Arc<Identity>),
    Invalid(String),
}

/// A small TTL cache.
struct TtlCache<V> {
    entries: Mutex<HashMap<Key, (Instant, V)>>,
    ttl: Duration,
}

impl<V: Clone> TtlCache<V> {
    fn new(ttl: Duration) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    fn get(&self, key: &Key) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(at, _)| at.elapsed() < self.ttl)
            .map(|(_, v)| v.clone())
    }

    fn insert(&self, key: Key, value: V) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= MAX_ENTRIES {
            let ttl = self.ttl;
            entries.retain(|_, (at, _)| at.elapsed() < ttl);
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (Instant::now(), value));
    }
}

/// Checks bearer tokens and permissions against the API server, caching decisions briefly.
pub struct Authorizer {
    client: Client,
    tokens: TtlCache<TokenDecision>,
    decisions: TtlCache<Result<(), String>>,
    metrics: GatewayMetrics,
}

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

fn token_key(token: &str) -> Key {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// Cache key of one decision: the token's hash and every attribute of the review.
fn access_key(token: &Key, access: &Access) -> Key {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(token);
    for part in [
        access.verb,
        access.resource.as_str(),
        access.subresource,
        &access.namespace,
        &access.name,
    ] {
        context.update(&(part.len() as u64).to_le_bytes());
        context.update(part.as_bytes());
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(context.finish().as_ref());
    key
}

impl Authorizer {
    /// An authorizer asking the API server through `client`.
    pub fn new(client: Client, metrics: GatewayMetrics) -> Self {
        Self {
            client,
            tokens: TtlCache::new(DECISION_TTL),
            decisions: TtlCache::new(DECISION_TTL),
            metrics,
        }
    }

    fn count(&self, cache: &str, hit: bool) {
        self.metrics
            .auth_cache
            .with_label_values(&[cache, if hit { "hit" } else { "miss" }])
            .inc();
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
        // Most Roles grant a verb on every object of a namespace: one namespace-wide review (no name)
        // then covers every sandbox, instead of one review per sandbox name. RBAC allows an unnamed
        // review only through a rule without resourceNames, which grants every name; when it is not
        // allowed, the per-name review below decides (rules restricted to resourceNames still work).
        if !access.name.is_empty() {
            let namespace_wide = Access {
                name: String::new(),
                ..access.clone()
            };
            if self.decide(&key, &identity, &namespace_wide).await?.is_ok() {
                return Ok(identity);
            }
        }
        let decision = self.decide(&key, &identity, access).await?;
        match decision {
            Ok(()) => Ok(identity),
            Err(reason) => Err(ApiError::forbidden(
                access.denied_message(&identity.username, Some(&reason)),
            )),
        }
    }

    /// The (cached) decision for `access`.
    async fn decide(
        &self,
        key: &Key,
        identity: &Identity,
        access: &Access,
    ) -> Result<Result<(), String>, ApiError> {
        let decision_key = access_key(key, access);
        if let Some(decision) = self.decisions.get(&decision_key) {
            self.count("access", true);
            return Ok(decision);
        }
        self.count("access", false);
        let decision = self.review_access(identity, access).await?;
        self.decisions.insert(decision_key, decision.clone());
        Ok(decision)
    }

    async fn authenticate(&self, token: &str, key: &Key) -> Result<Arc<Identity>, ApiError> {
        let decision = match self.tokens.get(key) {
            Some(decision) => {
                self.count("token", true);
                decision
            }
            None => {
                self.count("token", false);
                let decision = self.review_token(token).await?;
                self.tokens.insert(*key, decision.clone());
                decision
            }
        };
        match decision {
            TokenDecision::Valid(identity) => Ok(identity),
            TokenDecision::Invalid(reason) => Err(ApiError::unauthorized(reason)),
        }
    }

    async fn review_token(&self, token: &str) -> Result<TokenDecision, ApiError> {
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| {
                tracing::warn!(error = %err, "TokenReview failed");
                ApiError::unavailable(format!(
                    "cannot check the bearer token: the Kubernetes API's TokenReview failed ({err})"
                ))
            })?;
        let status = answer.status.unwrap_or_default();
        let user = status.user.unwrap_or_default();
        match (status.authenticated, user.username) {
            (Some(true), Some(username)) if !username.is_empty() => {
                Ok(TokenDecision::Valid(Arc::new(Identity {
                    username,
                    uid: user.uid,
                    groups: user.groups.unwrap_or_default(),
                    extra: user.extra.unwrap_or_default(),
                })))
            }
            _ => {
                let detail = status
                    .error
                    .filter(|e| !e.is_empty())
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                Ok(TokenDecision::Invalid(format!(
                    "the bearer token was not accepted by the Kubernetes API{detail}; use a valid service-account or user token"
                )))
            }
        }
    }

    async fn review_access(
        &self,
        identity: &Identity,
        access: &Access,
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
                    name: Some(access.name.clone()).filter(|n| !n.is_empty()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
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

#[cfg(test)]
mod tests {
    use super::super::access::Operation;
    use super::*;
    use axum::http::HeaderValue;

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
            access_key(&a, &exec),
            access_key(&b, &exec),
            access_key(&a, &files),
            access_key(&a, &other_ns),
            access_key(&a, &other_name),
        ];
        for (i, x) in keys.iter().enumerate() {
            for y in &keys[i + 1..] {
                assert_ne!(x, y);
            }
        }
        assert_eq!(
            access_key(&a, &exec),
            access_key(&token_key("token-a"), &exec)
        );
    }

    #[test]
    fn ttl_cache_expires_entries() {
        let cache = TtlCache::new(Duration::from_millis(30));
        cache.insert([1; 32], 5);
        assert_eq!(cache.get(&[1; 32]), Some(5));
        assert_eq!(cache.get(&[2; 32]), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.get(&[1; 32]), None);
    }
}
