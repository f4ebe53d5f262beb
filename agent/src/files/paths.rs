//! Path rules of the files and patch APIs: request paths are absolute or relative to `--root`, never
//! empty or NUL-bearing; the agent's executable and token file are off limits, whichever spelling
//! (symlinks, `..`, hard links) a request uses.

use std::collections::VecDeque;
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

/// Linux's limit of symlinks followed in one lookup (ELOOP beyond).
const MAX_SYMLINKS: usize = 40;

/// Where `path` leads once its missing directories exist (the files and patch APIs create parents before
/// writing): every existing symlink is followed, components that do not exist yet are taken as the
/// directories a write would create, and `..` steps back from where the path has got to, as the kernel
/// does, not lexically (`missing/../link/x` is `link`'s target, not `link/x`). `path` must be absolute.
pub fn canonicalize_lenient(path: &Path) -> PathBuf {
    let mut pending: VecDeque<PathBuf> = path
        .components()
        .map(|component| PathBuf::from(component.as_os_str()))
        .collect();
    let mut resolved = PathBuf::from("/");
    let mut followed = 0;
    while let Some(part) = pending.pop_front() {
        match part.components().next() {
            Some(Component::RootDir | Component::Prefix(_)) => resolved = PathBuf::from("/"),
            Some(Component::ParentDir) => {
                resolved.pop();
            }
            Some(Component::Normal(name)) => {
                let next = resolved.join(name);
                let link = fs::symlink_metadata(&next)
                    .is_ok_and(|metadata| metadata.file_type().is_symlink());
                match fs::read_link(&next) {
                    Ok(target) if link && followed < MAX_SYMLINKS => {
                        followed += 1;
                        for component in target.components().rev() {
                            pending.push_front(PathBuf::from(component.as_os_str()));
                        }
                    }
                    _ => resolved = next,
                }
            }
            Some(Component::CurDir) | None => {}
        }
    }
    resolved
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
        ProtectedFiles::new(crate::install::own_executable().as_deref(), token_file)
    }

    /// Protects the given files (the fuzz targets and tests use stand-ins for the real executable).
    pub fn new(executable: Option<&Path>, token_file: Option<&Path>) -> Self {
        ProtectedFiles {
            executable: executable.map(|exe| protect("the agent's own executable", exe)),
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

    /// Found with the `file_paths` fuzz target's kernel model: `..` after a directory that does not
    /// exist yet was applied lexically, so `missing/../link-secret/token` passed the check, and a PUT (which
    /// creates `missing` first) then replaced the token through the symlink.
    #[test]
    fn dot_dot_after_a_missing_directory_resolves_like_the_kernel() {
        let dir = TempDir::new("dotdot");
        let token = dir.0.join("secret/token");
        fs::create_dir_all(dir.0.join("secret")).unwrap();
        fs::create_dir_all(dir.0.join("work")).unwrap();
        fs::write(&token, "t").unwrap();
        symlink("secret", dir.0.join("link-secret")).unwrap();
        let protected = ProtectedFiles::new(None, Some(&token));
        for spelling in [
            "missing/../link-secret/token",
            "work/missing/../../link-secret/token",
            "a/b/../../link-secret/token",
            "missing/../link-secret/../link-secret/./token",
        ] {
            let path = dir.0.join(spelling);
            assert!(protected.check_write(&path).is_err(), "{spelling}");
            assert!(protected.check_delete(&path, false).is_err(), "{spelling}");
        }
        assert_eq!(
            canonicalize_lenient(&dir.0.join("missing/../link-secret/x")),
            dir.0.join("secret/x")
        );
        assert!(
            protected
                .check_write(&dir.0.join("missing/../link-secret/other"))
                .is_ok()
        );
    }

    #[test]
    fn symlink_loops_do_not_hang() {
        let dir = TempDir::new("loop");
        symlink("loop", dir.0.join("loop")).unwrap();
        symlink("b", dir.0.join("a")).unwrap();
        symlink("a", dir.0.join("b")).unwrap();
        assert!(canonicalize_lenient(&dir.0.join("loop/x")).starts_with(&dir.0));
        assert!(canonicalize_lenient(&dir.0.join("a/x")).starts_with(&dir.0));
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
