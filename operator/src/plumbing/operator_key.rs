//! The operator's one secret key (pure): HMAC-SHA256 under context strings, so each use (agent
//! tokens in `pod::token`, seals here) signs inputs no other use can produce. The key lives in a
//! Secret of the operator's namespace (`app::token_key` loads or creates it).
//!
//! A seal ([`OperatorKey::seal`], the annotation `orchard.dev/seal`) is an HMAC of an object's
//! kind, namespace, name and owner UID: what only a holder of the key can compute, so only the
//! operator can make an object that verifies as its own (`ownership`).

use std::fmt;

use ring::{digest, hmac};

/// Smallest key the operator accepts, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// Context string of seals.
const SEAL_CONTEXT: &str = "orchard-seal/v1";

/// The operator's key. `Debug` never prints it.
#[derive(Clone)]
pub struct OperatorKey {
    key: hmac::Key,
    id: String,
}

impl fmt::Debug for OperatorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorKey").field("id", &self.id).finish()
    }
}

/// Key material too short to be a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the operator's key has {0} bytes; at least {MIN_KEY_BYTES} are needed")]
pub struct ShortKey(pub usize);

/// Lower-case hex of `bytes` (a table lookup per nibble: the gateway derives a token per call).
pub fn hex(bytes: &[u8]) -> String {
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

impl OperatorKey {
    /// A key from its material (at least [`MIN_KEY_BYTES`]).
    pub fn new(material: &[u8]) -> Result<Self, ShortKey> {
        if material.len() < MIN_KEY_BYTES {
            return Err(ShortKey(material.len()));
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

    /// The HMAC of `parts` under `context` (lower-case hex). Each use has its own context string,
    /// the first part of the input, so no use can produce another's value.
    pub fn sign(&self, context: &str, parts: &[&str]) -> String {
        let mut all = Vec::with_capacity(parts.len() + 1);
        all.push(context);
        all.extend_from_slice(parts);
        hex(hmac::sign(&self.key, &mac_input(&all)).as_ref())
    }

    /// Whether `tag` is [`Self::sign`] of `parts` under `context` (compared in constant time;
    /// anything but lower-case hex of the right tag is refused).
    pub fn verify(&self, context: &str, parts: &[&str], tag: &str) -> bool {
        let Some(tag) = from_hex(tag) else {
            return false;
        };
        let mut all = Vec::with_capacity(parts.len() + 1);
        all.push(context);
        all.extend_from_slice(parts);
        hmac::verify(&self.key, &mac_input(&all), &tag).is_ok()
    }

    /// The seal of the object `kind` `namespace/name` created under the owner with UID `owner_uid`.
    pub fn seal(&self, kind: &str, namespace: &str, name: &str, owner_uid: &str) -> String {
        self.sign(SEAL_CONTEXT, &[kind, namespace, name, owner_uid])
    }

    /// Whether `seal` is the seal of `kind` `namespace/name` under the owner with UID `owner_uid`.
    pub fn verify_seal(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
        owner_uid: &str,
        seal: &str,
    ) -> bool {
        self.verify(SEAL_CONTEXT, &[kind, namespace, name, owner_uid], seal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> OperatorKey {
        OperatorKey::new(&[byte; 32]).unwrap()
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
    fn contexts_separate_uses() {
        let k = key(1);
        assert_ne!(k.sign("a", &["x"]), k.sign("b", &["x"]));
        assert!(!k.verify("b", &["x"], &k.sign("a", &["x"])));
    }

    #[test]
    fn short_keys_are_refused_and_debug_hides_the_key() {
        assert_eq!(OperatorKey::new(&[0; 31]).unwrap_err(), ShortKey(31));
        let shown = format!("{:?}", key(7));
        assert!(
            shown.contains(key(7).id()) && !shown.contains("7, 7"),
            "{shown}"
        );
        assert_ne!(key(1).id(), key(2).id());
    }
}
