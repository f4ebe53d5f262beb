//! Bearer-token authentication of `/v1` routes: loading the token and comparing it in constant time.

use std::fmt;
use std::path::{Path, PathBuf};

use axum::http::{HeaderMap, header};

use crate::cli::TokenSource;

/// The configured bearer token. `Debug` never prints the secret.
#[derive(Clone)]
pub struct Token {
    secret: Vec<u8>,
    /// The file it came from (protected from the files API), if any.
    pub file: Option<PathBuf>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("secret", &"<redacted>")
            .field("file", &self.file)
            .finish()
    }
}

impl Token {
    pub fn new(secret: impl Into<Vec<u8>>) -> Result<Self, String> {
        let secret = secret.into();
        if secret.is_empty() {
            return Err("the bearer token is empty".into());
        }
        Ok(Token { secret, file: None })
    }

    /// Loads the token; a file's trailing whitespace (the newline `echo` adds) is ignored.
    pub fn load(source: &TokenSource) -> Result<Self, String> {
        match source {
            TokenSource::Value(value) => Token::new(value.trim().as_bytes()),
            TokenSource::File(path) => {
                let contents = std::fs::read(path).map_err(|error| {
                    format!("cannot read token file `{}`: {error}", path.display())
                })?;
                let trimmed = contents.trim_ascii();
                let mut token = Token::new(trimmed)
                    .map_err(|_| format!("token file `{}` is empty", path.display()))?;
                token.file = Some(path.clone());
                Ok(token)
            }
        }
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Whether `headers` carry `Authorization: Bearer <this token>`.
    pub fn authorizes(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return false;
        };
        let value = value.as_bytes();
        let scheme_len = b"bearer ".len();
        if value.len() < scheme_len || !value[..scheme_len].eq_ignore_ascii_case(b"bearer ") {
            return false;
        }
        constant_time_eq(value[scheme_len..].trim_ascii(), &self.secret)
    }
}

/// `--consume-token-file`: deletes the token file once it has been read, so the commands the agent runs
/// cannot read it later. Fails closed: an error (naming the path) whenever the file is not certainly
/// gone. A symlink or a file with other hard links is refused without deleting anything, since
/// removing that one name would leave the token readable under another.
pub fn consume_token_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: String| {
        Err(format!(
            "--consume-token-file: cannot remove the token file `{}`: {why}; refusing to start with the token still readable",
            path.display()
        ))
    };
    let metadata = match std::fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) => return refuse(error.to_string()),
    };
    if metadata.file_type().is_symlink() {
        return refuse("it is a symlink (its target would stay)".into());
    }
    if metadata.nlink() > 1 {
        return refuse(format!(
            "it has {} hard links (the others would stay)",
            metadata.nlink()
        ));
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) => refuse(error.to_string()),
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

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abd", b"abc"));
        assert!(!constant_time_eq(b"", b"abc"));
        assert!(!constant_time_eq(b"abcd", b"abc"));
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "orchard-auth-{name}-{}",
            crate::entropy::random_hex()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn consuming_removes_the_token_file() {
        let dir = scratch("consume");
        let path = dir.join("token");
        std::fs::write(&path, "t").unwrap();
        consume_token_file(&path).unwrap();
        assert!(!path.exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn consuming_fails_closed() {
        let dir = scratch("consume-fail");
        // Missing: not certainly consumed by us.
        let error = consume_token_file(&dir.join("missing")).unwrap_err();
        assert!(
            error.contains(&dir.join("missing").display().to_string()),
            "{error}"
        );
        // A symlink: its target would stay readable.
        let target = dir.join("target");
        std::fs::write(&target, "t").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("link")).unwrap();
        let error = consume_token_file(&dir.join("link")).unwrap_err();
        assert!(error.contains("symlink"), "{error}");
        assert!(dir.join("link").exists() && target.exists());
        // A second hard link would keep the token readable.
        std::fs::hard_link(&target, dir.join("hard")).unwrap();
        let error = consume_token_file(&target).unwrap_err();
        assert!(error.contains("hard links"), "{error}");
        assert!(target.exists());
        // A file that cannot be unlinked, even by root (procfs refuses every unlink).
        let error = consume_token_file(Path::new("/proc/version")).unwrap_err();
        assert!(error.contains("`/proc/version`"), "{error}");
        assert!(error.contains("refusing to start"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
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
