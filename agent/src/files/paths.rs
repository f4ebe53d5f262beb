//! Path rules of the files and patch APIs: request paths are absolute or relative to `--root`, never
//! empty or NUL-bearing; the agent's executable and token file are off limits, whichever spelling
//! (symlinks, `..`, hard links) a request uses.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use crate::error::AgentError;

/// Resolves a request path against `root` (absolute paths are used as they are).
pub fn resolve_request_path(root: &Path, raw: &str) -> Result<PathBuf, AgentError> {
    if raw.is_empty() {
        return Err(AgentError::InvalidPath("`path` must not be empty".into()));
    }
    if raw.contains('\0') {
        return Err(AgentError::InvalidPath(
            "`path` must not contain NUL bytes".into(),
        ));
    }
    Ok(root.join(raw))
}

/// Canonicalises the longest existing prefix of `path` and applies the remaining components lexically
/// (they do not exist yet, so they cannot be symlinks). `path` must be absolute.
pub fn canonicalize_lenient(path: &Path) -> PathBuf {
    let components: Vec<Component<'_>> = path.components().collect();
    for split in (1..=components.len()).rev() {
        let prefix: PathBuf = components[..split].iter().collect();
        if let Ok(mut resolved) = fs::canonicalize(&prefix) {
            for component in &components[split..] {
                match component {
                    Component::ParentDir => {
                        resolved.pop();
                    }
                    Component::Normal(name) => resolved.push(name),
                    Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
                }
            }
            return resolved;
        }
    }
    path.to_path_buf()
}

/// The same file under any name: device and inode.
type FileIdentity = (u64, u64);

fn identity(path: &Path) -> Option<FileIdentity> {
    fs::metadata(path)
        .ok()
        .map(|metadata| (metadata.dev(), metadata.ino()))
}

#[derive(Debug, Clone)]
struct ProtectedFile {
    what: &'static str,
    canonical: Option<PathBuf>,
    identity: Option<FileIdentity>,
}

/// Files the API must not touch: the agent's own executable (writes, deletes) and its token file
/// (reads too).
#[derive(Debug, Clone, Default)]
pub struct ProtectedFiles {
    executable: Option<ProtectedFile>,
    token_file: Option<ProtectedFile>,
}

impl ProtectedFiles {
    /// Protects the running executable (`/proc/self/exe`, or `argv[0]` without /proc) and, if given,
    /// the token file.
    pub fn discover(token_file: Option<&Path>) -> Self {
        ProtectedFiles {
            executable: crate::install::own_executable()
                .map(|exe| protect("the agent's own executable", &exe)),
            token_file: token_file.map(|path| protect("the agent's token file", path)),
        }
    }

    fn all(&self) -> impl Iterator<Item = &ProtectedFile> {
        self.executable.iter().chain(self.token_file.iter())
    }

    /// Reading the token file is refused; everything else may be read.
    pub fn check_read(&self, path: &Path) -> Result<(), AgentError> {
        match &self.token_file {
            Some(token) if refers_to(path, token) => Err(forbidden(path, token)),
            _ => Ok(()),
        }
    }

    /// Writing (creating or replacing) either protected file is refused.
    pub fn check_write(&self, path: &Path) -> Result<(), AgentError> {
        match self.all().find(|protected| refers_to(path, protected)) {
            Some(protected) => Err(forbidden(path, protected)),
            None => Ok(()),
        }
    }

    /// Deleting either protected file, or a directory that contains one (recursive), is refused.
    pub fn check_delete(&self, path: &Path, recursive: bool) -> Result<(), AgentError> {
        self.check_write(path)?;
        if recursive {
            let candidates = [
                fs::canonicalize(path).ok(),
                Some(canonicalize_lenient(path)),
            ];
            for protected in self.all() {
                let Some(canonical) = &protected.canonical else {
                    continue;
                };
                if candidates
                    .iter()
                    .flatten()
                    .any(|directory| canonical.starts_with(directory))
                {
                    return Err(AgentError::Forbidden(format!(
                        "refusing to delete `{}`: it contains {} (`{}`)",
                        path.display(),
                        protected.what,
                        canonical.display()
                    )));
                }
            }
        }
        Ok(())
    }
}

fn protect(what: &'static str, path: &Path) -> ProtectedFile {
    ProtectedFile {
        what,
        canonical: fs::canonicalize(path).ok(),
        identity: identity(path),
    }
}

/// Whether `path` names `protected`: the path itself (without following a final symlink), the file it
/// resolves to, or the same inode.
fn refers_to(path: &Path, protected: &ProtectedFile) -> bool {
    if let Some(canonical) = &protected.canonical {
        // Following every symlink, and (for deletes and renames, which act on a final symlink itself)
        // following all but the last component.
        if canonicalize_lenient(path) == *canonical {
            return true;
        }
        if let (Some(parent), Some(name)) = (path.parent(), path.file_name())
            && canonicalize_lenient(parent).join(name) == *canonical
        {
            return true;
        }
    }
    protected.identity.is_some() && identity(path) == protected.identity
}

fn forbidden(path: &Path, protected: &ProtectedFile) -> AgentError {
    AgentError::Forbidden(format!(
        "refusing to touch `{}`: it is {}",
        path.display(),
        protected.what
    ))
}

/// Parses an octal permission string (`0644`, `755`, `0o600`).
pub fn parse_mode(text: &str) -> Result<u32, AgentError> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if !digits.is_empty() && mode <= 0o7777 => Ok(mode),
        _ => Err(AgentError::BadRequest(format!(
            "`mode` must be octal permission bits like 0644, got `{text}`"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "orchard-paths-{name}-{}",
                crate::entropy::random_hex()
            ));
            fs::create_dir_all(&dir).unwrap();
            TempDir(fs::canonicalize(dir).unwrap())
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn request_paths() {
        assert_eq!(
            resolve_request_path(Path::new("/root"), "a/b").unwrap(),
            PathBuf::from("/root/a/b")
        );
        assert_eq!(
            resolve_request_path(Path::new("/root"), "/etc").unwrap(),
            PathBuf::from("/etc")
        );
        assert!(resolve_request_path(Path::new("/"), "").is_err());
        assert!(resolve_request_path(Path::new("/"), "a\0b").is_err());
    }

    #[test]
    fn lenient_canonicalisation() {
        let dir = TempDir::new("lenient");
        fs::create_dir(dir.0.join("real")).unwrap();
        symlink(dir.0.join("real"), dir.0.join("link")).unwrap();
        assert_eq!(
            canonicalize_lenient(&dir.0.join("link/new/file")),
            dir.0.join("real/new/file")
        );
        assert_eq!(
            canonicalize_lenient(&dir.0.join("missing/../real/x")),
            dir.0.join("real/x")
        );
    }

    #[test]
    fn protects_token_file_under_every_spelling() {
        let dir = TempDir::new("protect");
        let token = dir.0.join("secret/token");
        fs::create_dir_all(token.parent().unwrap()).unwrap();
        fs::write(&token, "t").unwrap();
        symlink(&token, dir.0.join("alias")).unwrap();
        fs::hard_link(&token, dir.0.join("hard")).unwrap();
        let protected = ProtectedFiles::discover(Some(&token));
        for spelling in [
            "secret/token",
            "alias",
            "hard",
            "secret/../secret/token",
            "nope/../secret/token",
        ] {
            let path = dir.0.join(spelling);
            assert!(protected.check_read(&path).is_err(), "{spelling}");
            assert!(protected.check_write(&path).is_err(), "{spelling}");
            assert!(protected.check_delete(&path, false).is_err(), "{spelling}");
        }
        assert!(protected.check_delete(&dir.0.join("secret"), true).is_err());
        assert!(protected.check_delete(&dir.0, true).is_err());
        assert!(protected.check_read(&dir.0.join("other")).is_ok());
        assert!(protected.check_write(&dir.0.join("secret/other")).is_ok());
        assert!(
            protected
                .check_delete(&dir.0.join("secret/other"), true)
                .is_ok()
        );
    }

    #[test]
    fn protects_own_executable_from_writes_only() {
        let protected = ProtectedFiles::discover(None);
        let exe = fs::canonicalize("/proc/self/exe").unwrap();
        assert!(protected.check_write(&exe).is_err());
        assert!(protected.check_delete(exe.parent().unwrap(), true).is_err());
        assert!(protected.check_read(&exe).is_ok());
    }

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0644").unwrap(), 0o644);
        assert_eq!(parse_mode("755").unwrap(), 0o755);
        assert_eq!(parse_mode("0o600").unwrap(), 0o600);
        assert!(parse_mode("999").is_err());
        assert!(parse_mode("").is_err());
        assert!(parse_mode("17777").is_err());
    }
}
