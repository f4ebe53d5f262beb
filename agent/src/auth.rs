//! Bearer-token authentication of `/v1` routes. One mechanism whatever the source: the agent keeps only
//! the SHA-256 digest of the token (hashed from a token file or value, or given as the verifier
//! `ORCHARD_AGENT_TOKEN_SHA256`), hashes the presented bearer value and compares digests in constant time.

use std::fmt;
use std::path::{Path, PathBuf};

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

/// Length of a SHA-256 digest in bytes (64 hex characters).
pub const DIGEST_LEN: usize = 32;

/// Where the bearer token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    File(PathBuf),
    /// Given directly in `ORCHARD_AGENT_TOKEN`.
    Value(String),
    /// Only the token's SHA-256 (`--token-sha256`, `ORCHARD_AGENT_TOKEN_SHA256`): the verifier, not
    /// secret; the token itself never reaches the agent's configuration.
    Sha256([u8; DIGEST_LEN]),
}

/// The SHA-256 digest of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; DIGEST_LEN] {
    Sha256::digest(bytes).into()
}

/// Decodes a token verifier: exactly 64 hex characters (either case; surrounding whitespace ignored).
/// Errors name the rule broken, never the whole value (it might be a token pasted by mistake).
pub fn parse_sha256_hex(text: &str) -> Result<[u8; DIGEST_LEN], String> {
    let hex = text.trim();
    if let Some(bad) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(format!(
            "the token verifier must be the token's SHA-256 in hex, and `{}` is not a hex digit",
            bad.escape_default()
        ));
    }
    if hex.len() != DIGEST_LEN * 2 {
        return Err(format!(
            "the token verifier must be the token's SHA-256 as exactly {} hex characters, got {}",
            DIGEST_LEN * 2,
            hex.len()
        ));
    }
    let mut digest = [0u8; DIGEST_LEN];
    for (byte, pair) in digest.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let (Some(high), Some(low)) = (hex_value(pair[0]), hex_value(pair[1])) else {
            return Err("the token verifier is not hex".into());
        };
        *byte = (high << 4) | low;
    }
    Ok(digest)
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

/// The configured bearer token, kept only as its SHA-256 digest. `Debug` prints neither.
#[derive(Clone)]
pub struct Token {
    digest: [u8; DIGEST_LEN],
    /// The file it came from (protected from the files API), if any.
    pub file: Option<PathBuf>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("sha256", &"<redacted>")
            .field("file", &self.file)
            .finish()
    }
}

impl Token {
    /// The token `secret` (used as given), kept as its digest.
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, String> {
        let secret = secret.as_ref();
        if secret.is_empty() {
            return Err("the bearer token is empty".into());
        }
        Ok(Token {
            digest: sha256(secret),
            file: None,
        })
    }

    /// The token whose SHA-256 is `digest` (the verifier). The digest of the empty string is refused:
    /// no empty bearer value is ever accepted.
    pub fn from_sha256(digest: [u8; DIGEST_LEN]) -> Result<Self, String> {
        if constant_time_eq(&digest, &sha256(b"")) {
            return Err("the token verifier is the SHA-256 of the empty string".into());
        }
        Ok(Token { digest, file: None })
    }

    /// Loads the token; a value's or file's surrounding whitespace (the newline `echo` adds) is ignored.
    pub fn load(source: &TokenSource) -> Result<Self, String> {
        match source {
            TokenSource::Value(value) => Token::new(value.trim().as_bytes()),
            TokenSource::Sha256(digest) => Token::from_sha256(*digest),
            TokenSource::File(path) => {
                let contents = std::fs::read(path).map_err(|error| {
                    format!("cannot read token file `{}`: {error}", path.display())
                })?;
                let mut token = Token::new(contents.trim_ascii())
                    .map_err(|_| format!("token file `{}` is empty", path.display()))?;
                token.file = Some(path.clone());
                Ok(token)
            }
        }
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Whether `headers` carry `Authorization: Bearer <token>` with a token whose SHA-256 is this
    /// token's digest (compared in constant time). An empty bearer value never authorizes.
    pub fn authorizes(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes();
        let scheme_len = b"bearer ".len();
        if value.len() < scheme_len || !value[..scheme_len].eq_ignore_ascii_case(b"bearer ") {
            return false;
        }
        let presented = value[scheme_len..].trim_ascii();
        if presented.is_empty() {
            return false;
        }
        constant_time_eq(&sha256(presented), &self.digest)
    }
}

/// Compares two byte strings in time that depends only on their lengths, not on where they differ.
pub fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut difference = given.len() ^ expected.len();
    for (index, expected_byte) in expected.iter().enumerate() {
        let given_byte = given.get(index).copied().unwrap_or(0);
        difference |= usize::from(given_byte ^ expected_byte);
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn bearer_checks() {
        let token = Token::new("s3cret").unwrap();
        assert!(token.authorizes(&headers("Bearer s3cret")));
        assert!(token.authorizes(&headers("bearer s3cret")));
        assert!(!token.authorizes(&headers("Bearer s3cre")));
        assert!(!token.authorizes(&headers("Bearer s3cret!")));
        assert!(!token.authorizes(&headers("Basic s3cret")));
        assert!(!token.authorizes(&HeaderMap::new()));
        assert!(Token::new("").is_err());
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// SHA-256 of `abc` (FIPS 180-2 example).
    const ABC_SHA256: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn verifier_authorizes_only_the_token_it_hashes() {
        let digest = parse_sha256_hex(ABC_SHA256).unwrap();
        assert_eq!(hex(&digest), ABC_SHA256);
        assert_eq!(digest, sha256(b"abc"));
        let token = Token::load(&TokenSource::Sha256(digest)).unwrap();
        assert_eq!(token.file(), None);
        assert!(token.authorizes(&headers("Bearer abc")));
        assert!(token.authorizes(&headers("bearer  abc ")));
        assert!(!token.authorizes(&headers("Bearer abd")));
        assert!(!token.authorizes(&headers("Bearer abcd")));
        assert!(!token.authorizes(&headers("Bearer ")));
        assert!(!token.authorizes(&headers("Bearer")));
        assert!(!token.authorizes(&headers("Basic abc")));
        assert!(!token.authorizes(&headers("abc")));
        assert!(!token.authorizes(&HeaderMap::new()));
        // The verifier is public: presenting it is not presenting the token.
        assert!(!token.authorizes(&headers(&format!("Bearer {ABC_SHA256}"))));
        // Same mechanism as a token given by value: both accept the same header.
        let by_value = Token::load(&TokenSource::Value("abc\n".into())).unwrap();
        assert!(by_value.authorizes(&headers("Bearer abc")));
        assert!(!by_value.authorizes(&headers("Bearer ")));
    }

    #[test]
    fn verifier_must_be_64_hex_characters() {
        let upper = parse_sha256_hex(&ABC_SHA256.to_ascii_uppercase()).unwrap();
        assert_eq!(upper, sha256(b"abc"), "upper-case hex is accepted");
        assert_eq!(
            parse_sha256_hex(&format!(" {ABC_SHA256}\n")).unwrap(),
            sha256(b"abc")
        );
        for (bad, why) in [
            ("", "got 0"),
            (&ABC_SHA256[1..], "got 63"),
            (&format!("{ABC_SHA256}0"), "got 65"),
            (&format!("g{}", &ABC_SHA256[1..]), "`g` is not a hex digit"),
            (
                &format!("{} {}", &ABC_SHA256[..32], &ABC_SHA256[32..]),
                "` ` is not",
            ),
            (&format!("0x{}", &ABC_SHA256[2..]), "`x` is not"),
            (&format!("é{}", &ABC_SHA256[2..]), "is not a hex digit"),
        ] {
            let error = parse_sha256_hex(bad).unwrap_err();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
        // The SHA-256 of the empty string would stand for an empty token: refused.
        let error = Token::from_sha256(sha256(b"")).unwrap_err();
        assert!(error.contains("empty"), "{error}");
    }

    #[test]
    fn debug_prints_neither_token_nor_digest() {
        for source in [
            TokenSource::Value("s3cret-value".into()),
            TokenSource::Sha256(sha256(b"s3cret-value")),
        ] {
            let printed = format!("{:?}", Token::load(&source).unwrap());
            assert!(!printed.contains("s3cret"), "{printed}");
            assert!(
                !printed.contains(&hex(&sha256(b"s3cret-value"))),
                "{printed}"
            );
            let first_byte = sha256(b"s3cret-value")[0].to_string();
            assert!(!printed.contains(&format!("[{first_byte},")), "{printed}");
        }
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abd", b"abc"));
        assert!(!constant_time_eq(b"", b"abc"));
        assert!(!constant_time_eq(b"abcd", b"abc"));
    }

    #[test]
    fn token_file_is_trimmed_and_debug_redacts() {
        let dir = std::env::temp_dir().join(format!("orchard-auth-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "tok\n").unwrap();
        let token = Token::load(&TokenSource::File(path.clone())).unwrap();
        assert!(token.authorizes(&headers("Bearer tok")));
        assert!(!format!("{token:?}").contains("tok\""));
        std::fs::write(&path, "\n").unwrap();
        assert!(Token::load(&TokenSource::File(path)).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
