//! Agent tokens without a Secret per sandbox (pure). Each pod's token is
//! `HMAC-SHA256(key, namespace, pod name, nonce)` under the operator's key
//! ([`OperatorKey`], context `orchard-agent-token/v1`); the pod carries only the nonce and the key's
//! id (annotations) and the SHA-256 of the token (the agent's `ORCHARD_AGENT_TOKEN_SHA256`), none of
//! which lets a reader of the pod compute the token. The gateway, the trajectory runner and the
//! operator derive a pod's token again from its annotations, so nothing is written, read or
//! garbage-collected per sandbox for it.
//!
//! A token is bound to its pod's namespace, name and nonce: handed to any other pod, it opens
//! nothing. A pool member's token follows the member when a Sandbox claims it.

use std::collections::BTreeMap;

use kube::Resource;
use ring::digest;

use crate::plumbing::operator_key::{OperatorKey, hex};

/// Annotation of a sandbox pod: the nonce its token is derived from (32 hex digits).
pub const NONCE_ANNOTATION: &str = "orchard.dev/agent-token-nonce";
/// Annotation of a sandbox pod: the id of the key its token is derived from.
pub const KEY_ID_ANNOTATION: &str = "orchard.dev/agent-token-key";
/// The task container's variable carrying the SHA-256 (hex) of the agent's token.
pub const VERIFIER_VARIABLE: &str = "ORCHARD_AGENT_TOKEN_SHA256";
/// Context string of agent tokens.
const TOKEN_CONTEXT: &str = "orchard-agent-token/v1";

/// Why a pod's token cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The pod carries no nonce (made by an operator that kept tokens in Secrets, or edited).
    #[error(
        "pod {pod} carries no `{NONCE_ANNOTATION}` annotation, so its agent token cannot be derived (a pod made before agent tokens were derived from the operator's key, or an edited one): delete the sandbox and create it again"
    )]
    NoNonce {
        /// `namespace/name` of the pod.
        pod: String,
    },
    /// The pod's token was derived from another key than the operator's.
    #[error(
        "the agent token of pod {pod} was derived from key {pod_key}, and this operator holds key {ours} (the key Secret was replaced): delete the sandbox and create it again"
    )]
    OtherKey {
        /// `namespace/name` of the pod.
        pod: String,
        /// The pod's key id.
        pod_key: String,
        /// This operator's key id.
        ours: String,
    },
}

/// What a new pod carries for its token: annotations and the agent's verifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCredentials {
    /// The nonce (hex).
    pub nonce: String,
    /// The key's id.
    pub key_id: String,
    /// SHA-256 of the token (hex): the value of [`VERIFIER_VARIABLE`].
    pub verifier: String,
}

impl PodCredentials {
    /// The pod annotations that let the token be derived again.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (NONCE_ANNOTATION.to_string(), self.nonce.clone()),
            (KEY_ID_ANNOTATION.to_string(), self.key_id.clone()),
        ])
    }
}

/// The token of the pod `namespace/pod` with `nonce`.
pub fn agent_token(key: &OperatorKey, namespace: &str, pod: &str, nonce: &str) -> String {
    key.sign(TOKEN_CONTEXT, &[namespace, pod, nonce])
}

/// The credentials of a new pod `namespace/pod` with `nonce` (the caller draws the nonce: this
/// stays pure).
pub fn credentials(key: &OperatorKey, namespace: &str, pod: &str, nonce: &str) -> PodCredentials {
    PodCredentials {
        nonce: nonce.to_string(),
        key_id: key.id().to_string(),
        verifier: verifier(&agent_token(key, namespace, pod, nonce)),
    }
}

/// The agent token of `pod`, derived again from its annotations.
pub fn token_of<K: Resource>(key: &OperatorKey, pod: &K) -> Result<String, TokenError> {
    let metadata = pod.meta();
    let namespace = metadata.namespace.as_deref().unwrap_or_default();
    let name = metadata.name.as_deref().unwrap_or_default();
    let shown = || format!("{namespace}/{name}");
    let annotations = metadata.annotations.as_ref();
    let nonce = annotations
        .and_then(|a| a.get(NONCE_ANNOTATION))
        .filter(|n| !n.is_empty())
        .ok_or_else(|| TokenError::NoNonce { pod: shown() })?;
    let pod_key = annotations
        .and_then(|a| a.get(KEY_ID_ANNOTATION))
        .map_or("", String::as_str);
    if pod_key != key.id() {
        return Err(TokenError::OtherKey {
            pod: shown(),
            pod_key: pod_key.to_string(),
            ours: key.id().to_string(),
        });
    }
    Ok(agent_token(key, namespace, name, nonce))
}

/// SHA-256 of `token`, hex: what the agent compares the hash of a bearer value with.
pub fn verifier(token: &str) -> String {
    hex(digest::digest(&digest::SHA256, token.as_bytes()).as_ref())
}

/// A fresh nonce: 16 random bytes, hex.
pub fn new_nonce() -> String {
    let bytes: [u8; 16] = rand::random();
    hex(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn key(byte: u8) -> OperatorKey {
        OperatorKey::new(&[byte; 32]).unwrap()
    }

    fn pod(namespace: &str, name: &str, credentials: &PodCredentials) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                annotations: Some(credentials.annotations()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn a_pods_token_is_derived_again_from_its_annotations_and_matches_its_verifier() {
        let k = key(1);
        let credentials = credentials(&k, "team", "s1", "00ff");
        let token = token_of(&k, &pod("team", "s1", &credentials)).unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(verifier(&token), credentials.verifier);
        assert_ne!(
            credentials.verifier, token,
            "the pod never carries the token"
        );
        assert_eq!(credentials.key_id, k.id());
    }

    /// The derivation is a contract with every running pod: a change would lock the gateway out of
    /// them. Known answer from an independent HMAC-SHA256 (Python's `hmac`) over the length-prefixed
    /// parts.
    #[test]
    fn the_derivation_keeps_its_known_answer() {
        assert_eq!(
            agent_token(&key(1), "team", "s1", "00ff"),
            "0413c3db87d1b517dd0f68de9f22a9b1039eb24088ae4804451cde21d2f22024"
        );
    }

    #[test]
    fn a_token_is_bound_to_namespace_name_nonce_and_key() {
        let k = key(1);
        let base = agent_token(&k, "team", "s1", "aa");
        for other in [
            agent_token(&k, "team2", "s1", "aa"),
            agent_token(&k, "team", "s2", "aa"),
            agent_token(&k, "team", "s1", "ab"),
            agent_token(&key(2), "team", "s1", "aa"),
            // Moving a separator between fields changes the token.
            agent_token(&k, "tea", "ms1", "aa"),
        ] {
            assert_ne!(other, base);
        }
        assert_eq!(agent_token(&k, "team", "s1", "aa"), base, "deterministic");
    }

    #[test]
    fn copied_annotations_give_another_pod_a_token_its_agent_refuses() {
        let k = key(1);
        let credentials = credentials(&k, "team", "victim", "aa");
        let copied = token_of(&k, &pod("team", "thief", &credentials)).unwrap();
        assert_ne!(verifier(&copied), credentials.verifier);
    }

    #[test]
    fn pods_without_a_nonce_or_under_another_key_get_a_clear_error() {
        let k = key(1);
        let bare = Pod {
            metadata: ObjectMeta {
                namespace: Some("team".into()),
                name: Some("old".into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let error = token_of(&k, &bare).unwrap_err();
        assert_eq!(
            error,
            TokenError::NoNonce {
                pod: "team/old".into()
            }
        );
        assert!(error.to_string().contains("create it again"), "{error}");

        let theirs = credentials(&key(2), "team", "s1", "aa");
        let error = token_of(&k, &pod("team", "s1", &theirs)).unwrap_err();
        assert!(matches!(error, TokenError::OtherKey { .. }), "{error:?}");
        assert!(error.to_string().contains(key(2).id()), "{error}");
    }

    #[test]
    fn nonces_are_fresh() {
        assert_eq!(new_nonce().len(), 32);
        assert_ne!(new_nonce(), new_nonce());
    }
}
