//! Agent tokens without a Secret per sandbox (pure). Each pod's token is
//! `HMAC-SHA256(key, namespace, pod name, nonce)` under the operator's one token key; the pod carries
//! only the nonce and the key's id (annotations) and the SHA-256 of the token (the agent's
//! `ORCHARD_AGENT_TOKEN_SHA256`), none of which lets a reader of the pod compute the token. The
//! gateway, the trajectory runner and the operator derive a pod's token again from its annotations,
//! so nothing is written, read or garbage-collected per sandbox for it.
//!
//! A token is bound to its pod's namespace, name and nonce: handed to any other pod, it opens
//! nothing. A pool member's token follows the member when a Sandbox claims it.
//!
//! The same key seals what the operator creates under an owner ([`TokenKey::seal`], the annotation
//! `orchard.dev/seal`): an HMAC of the object's kind, namespace, name and owner UID under another
//! context string, so no seal is ever a token and no token a seal. `plumbing::ownership` uses it.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use ring::{digest, hmac};

/// Annotation of a sandbox pod: the nonce its token is derived from (32 hex digits).
pub const NONCE_ANNOTATION: &str = "orchard.dev/agent-token-nonce";
/// Annotation of a sandbox pod: the id of the key its token is derived from.
pub const KEY_ID_ANNOTATION: &str = "orchard.dev/agent-token-key";
/// The task container's variable carrying the SHA-256 (hex) of the agent's token.
pub const VERIFIER_VARIABLE: &str = "ORCHARD_AGENT_TOKEN_SHA256";
/// Smallest key the operator accepts, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// The operator's token key. `Debug` never prints it.
#[derive(Clone)]
pub struct TokenKey {
    key: hmac::Key,
    id: String,
}

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenKey").field("id", &self.id).finish()
    }
}

/// Why a key or a pod's token cannot be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The key material is too short.
    #[error("the agent-token key has {0} bytes; at least {MIN_KEY_BYTES} are needed")]
    ShortKey(usize),
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

/// Lower-case hex of `bytes` (a table lookup per nibble: the gateway derives a token per call).
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// The bytes of lower-case hex `text` (`None` for anything else: odd length, other characters).
fn from_hex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// Context string of agent tokens.
const TOKEN_CONTEXT: &str = "orchard-agent-token/v1";
/// Context string of seals: a seal and a token are HMACs of inputs that differ from the first field.
const SEAL_CONTEXT: &str = "orchard-seal/v1";

/// The HMAC input of `parts`: each one length-prefixed (8 bytes, big-endian), so no two different
/// lists of parts give the same input.
fn mac_input(parts: &[&str]) -> Vec<u8> {
    let mut input = Vec::with_capacity(parts.iter().map(|part| 8 + part.len()).sum());
    for part in parts {
        input.extend_from_slice(&(part.len() as u64).to_be_bytes());
        input.extend_from_slice(part.as_bytes());
    }
    input
}

impl TokenKey {
    /// A key from its material (at least [`MIN_KEY_BYTES`]).
    pub fn new(material: &[u8]) -> Result<Self, TokenError> {
        if material.len() < MIN_KEY_BYTES {
            return Err(TokenError::ShortKey(material.len()));
        }
        let mut id_input = b"orchard-agent-token-key-id\0".to_vec();
        id_input.extend_from_slice(material);
        let id = hex(&digest::digest(&digest::SHA256, &id_input).as_ref()[..8]);
        Ok(Self {
            key: hmac::Key::new(hmac::HMAC_SHA256, material),
            id,
        })
    }

    /// The key's id: 16 hex digits of a hash of the key, safe to show.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The token of the pod `namespace/pod` with `nonce`.
    pub fn token(&self, namespace: &str, pod: &str, nonce: &str) -> String {
        let input = mac_input(&[TOKEN_CONTEXT, namespace, pod, nonce]);
        hex(hmac::sign(&self.key, &input).as_ref())
    }

    /// The seal of the object `kind` `namespace/name` created under the owner with UID `owner_uid`
    /// (lower-case hex): what only a holder of the key can compute, so only the operator can make an
    /// object that verifies as its own.
    pub fn seal(&self, kind: &str, namespace: &str, name: &str, owner_uid: &str) -> String {
        let input = mac_input(&[SEAL_CONTEXT, kind, namespace, name, owner_uid]);
        hex(hmac::sign(&self.key, &input).as_ref())
    }

    /// Whether `seal` is the seal of `kind` `namespace/name` under the owner with UID `owner_uid`
    /// (compared in constant time; anything but lower-case hex of the right tag is refused).
    pub fn verify_seal(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        owner_uid: &str,
        seal: &str,
    ) -> bool {
        let Some(tag) = from_hex(seal) else {
            return false;
        };
        let input = mac_input(&[SEAL_CONTEXT, kind, namespace, name, owner_uid]);
        hmac::verify(&self.key, &input, &tag).is_ok()
    }

    /// The credentials of a new pod `namespace/pod` with `nonce` (the caller draws the nonce: this
    /// stays pure).
    pub fn credentials(&self, namespace: &str, pod: &str, nonce: &str) -> PodCredentials {
        PodCredentials {
            nonce: nonce.to_string(),
            key_id: self.id.clone(),
            verifier: verifier(&self.token(namespace, pod, nonce)),
        }
    }

    /// The agent token of `pod`, derived again from its annotations.
    pub fn token_of(&self, pod: &Pod) -> Result<String, TokenError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let shown = || format!("{namespace}/{name}");
        let annotations = pod.metadata.annotations.as_ref();
        let nonce = annotations
            .and_then(|a| a.get(NONCE_ANNOTATION))
            .filter(|n| !n.is_empty())
            .ok_or_else(|| TokenError::NoNonce { pod: shown() })?;
        let pod_key = annotations
            .and_then(|a| a.get(KEY_ID_ANNOTATION))
            .map_or("", String::as_str);
        if pod_key != self.id {
            return Err(TokenError::OtherKey {
                pod: shown(),
                pod_key: pod_key.to_string(),
                ours: self.id.clone(),
            });
        }
        Ok(self.token(namespace, name, nonce))
    }
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn key(byte: u8) -> TokenKey {
        TokenKey::new(&[byte; 32]).unwrap()
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
        let credentials = k.credentials("team", "s1", "00ff");
        let token = k.token_of(&pod("team", "s1", &credentials)).unwrap();
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
            key(1).token("team", "s1", "00ff"),
            "0413c3db87d1b517dd0f68de9f22a9b1039eb24088ae4804451cde21d2f22024"
        );
    }

    /// Seals are a contract with every object the operator made: a change would make them all
    /// foreign. Known answer computed independently with Python's `hmac` (HMAC-SHA256, key 32 bytes of
    /// 0x01, over the length-prefixed `orchard-seal/v1`, `Pod`, `team`, `s1`, `uid-1`).
    #[test]
    fn the_seal_keeps_its_known_answer() {
        assert_eq!(
            key(1).seal("Pod", "team", "s1", "uid-1"),
            "6046f4ec10a599346117d6301120432d0525c08a24bad26ed0a13564ec643c8f"
        );
    }

    #[test]
    fn a_seal_verifies_only_for_its_kind_namespace_name_owner_and_key() {
        let k = key(1);
        let seal = k.seal("Pod", "team", "s1", "uid-1");
        assert!(k.verify_seal("Pod", "team", "s1", "uid-1", &seal));
        for (kind, namespace, name, uid) in [
            ("NetworkPolicy", "team", "s1", "uid-1"),
            ("Pod", "team2", "s1", "uid-1"),
            ("Pod", "team", "s2", "uid-1"),
            ("Pod", "team", "s1", "uid-2"),
            // Moving a separator between fields changes the seal.
            ("Pod", "tea", "ms1", "uid-1"),
        ] {
            assert!(
                !k.verify_seal(kind, namespace, name, uid, &seal),
                "{kind} {namespace}/{name} {uid}"
            );
        }
        assert!(!key(2).verify_seal("Pod", "team", "s1", "uid-1", &seal));
        for forged in [
            String::new(),
            "00".repeat(32),
            seal.to_uppercase(),
            seal[..62].to_string(),
            format!("{seal}00"),
            "zz".repeat(32),
        ] {
            assert!(
                !k.verify_seal("Pod", "team", "s1", "uid-1", &forged),
                "{forged:?}"
            );
        }
    }

    #[test]
    fn a_token_is_bound_to_namespace_name_nonce_and_key() {
        let k = key(1);
        let base = k.token("team", "s1", "aa");
        for other in [
            k.token("team2", "s1", "aa"),
            k.token("team", "s2", "aa"),
            k.token("team", "s1", "ab"),
            key(2).token("team", "s1", "aa"),
            // Moving a separator between fields changes the token.
            k.token("tea", "ms1", "aa"),
        ] {
            assert_ne!(other, base);
        }
        assert_eq!(k.token("team", "s1", "aa"), base, "deterministic");
    }

    #[test]
    fn copied_annotations_give_another_pod_a_token_its_agent_refuses() {
        let k = key(1);
        let credentials = k.credentials("team", "victim", "aa");
        let copied = k.token_of(&pod("team", "thief", &credentials)).unwrap();
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
        let error = k.token_of(&bare).unwrap_err();
        assert_eq!(
            error,
            TokenError::NoNonce {
                pod: "team/old".into()
            }
        );
        assert!(error.to_string().contains("create it again"), "{error}");

        let theirs = key(2).credentials("team", "s1", "aa");
        let error = k.token_of(&pod("team", "s1", &theirs)).unwrap_err();
        assert!(matches!(error, TokenError::OtherKey { .. }), "{error:?}");
        assert!(error.to_string().contains(key(2).id()), "{error}");
    }

    #[test]
    fn short_keys_are_refused_and_debug_hides_the_key() {
        assert_eq!(
            TokenKey::new(&[0; 31]).unwrap_err(),
            TokenError::ShortKey(31)
        );
        let shown = format!("{:?}", key(7));
        assert!(
            shown.contains(key(7).id()) && !shown.contains("7, 7"),
            "{shown}"
        );
        assert_ne!(key(1).id(), key(2).id());
        assert_eq!(new_nonce().len(), 32);
        assert_ne!(new_nonce(), new_nonce());
    }
}
