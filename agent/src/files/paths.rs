//! Path rules of the files and patch APIs: request paths are absolute or relative to `--root`, never
//! empty or NUL-bearing; the agent's executable and token file are off limits, whichever spelling
//! (symlinks, `..`, hard links) a request uses.
//!
//! Two kinds of checks. The `check_*` methods on a path refuse early, before anything is created, and
//! give the message a caller understands; but a path is resolved anew by each system call, so a
//! concurrent symlink swap can make them look at another file than the one acted on. The checks on
//! descriptors decide: `check_opened` on the file a read opened, `check_entry` on the entry in the
//! directory descriptor a write or delete then acts through, and `check_tree`/`check_walked` for
//! recursive deletes. They compare device and inode, so no spelling and no swap gets past them.

use std::collections::VecDeque;
use std::fs::{self, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::directory::{Directory, EntryName, EntryStatus, FileIdentity, Follow};
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

fn identity(path: &Path) -> Option<FileIdentity> {
    fs::metadata(path)
        .ok()
        .map(|metadata| metadata_identity(&metadata))
}

fn metadata_identity(metadata: &Metadata) -> FileIdentity {
    (metadata.dev(), metadata.ino())
}

#[derive(Debug, Clone)]
struct ProtectedFile {
    what: &'static str,
    canonical: Option<PathBuf>,
    identity: Option<FileIdentity>,
    /// The directory holding the file, held open from the start: its identity and name are what a
    /// write or delete through a directory descriptor is compared with, and its current ancestors
    /// (wherever it has been moved since) are what a recursive delete must not start from.
    directory: Option<Arc<Directory>>,
    name: Option<EntryName>,
}

/// Most `..` steps taken from a protected file's directory towards `/` (a cycle guard).
const MAX_DEPTH: usize = 4096;

impl ProtectedFile {
    /// The identities of the directory holding the file and of every directory above it, up to `/`.
    fn ancestors(&self) -> Vec<FileIdentity> {
        let mut identities = Vec::new();
        let Some(directory) = &self.directory else {
            return identities;
        };
        identities.push(directory.identity());
        let mut current = directory.parent();
        while let Ok(directory) = current {
            if identities.contains(&directory.identity()) || identities.len() > MAX_DEPTH {
                break; // `/` is its own parent
            }
            identities.push(directory.identity());
            current = directory.parent();
        }
        identities
    }

    /// Whether the entry `name` of `directory` is this file's name in the directory holding it.
    fn is_named_by(&self, directory: &Directory, name: &EntryName) -> bool {
        self.directory
            .as_ref()
            .is_some_and(|own| own.identity() == directory.identity())
            && self.name.as_ref() == Some(name)
    }

    fn is(&self, identity: FileIdentity) -> bool {
        self.identity == Some(identity)
    }

    fn contained_in(&self, path: &Path) -> AgentError {
        AgentError::Forbidden(match &self.canonical {
            Some(canonical) => format!(
                "refusing to delete `{}`: it contains {} (`{}`)",
                path.display(),
                self.what,
                canonical.display()
            ),
            None => format!(
                "refusing to delete `{}`: it contains {}",
                path.display(),
                self.what
            ),
        })
    }
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
                    return Err(protected.contained_in(path));
                }
            }
        }
        Ok(())
    }

    /// Decides a read (`access` [`Access::Read`]) or a patch (`Access::Write`) on the file actually
    /// opened for it, by the identity of its descriptor (`metadata` from `fstat`).
    pub fn check_opened(
        &self,
        path: &Path,
        metadata: &Metadata,
        access: Access,
    ) -> Result<(), AgentError> {
        let opened = metadata_identity(metadata);
        let refused = match access {
            Access::Read => self.token_file.iter().find(|token| token.is(opened)),
            Access::Write => self.all().find(|protected| protected.is(opened)),
        };
        match refused {
            Some(protected) => Err(forbidden(path, protected)),
            None => Ok(()),
        }
    }

    /// Decides a write or delete of entry `name` of `directory` (which `path` names), acted on through
    /// that descriptor next: refused when it is a protected file's own name in the directory holding
    /// it, or the entry is a protected file (a hard link), or a symlink to one.
    pub fn check_entry(
        &self,
        path: &Path,
        directory: &Directory,
        name: &EntryName,
    ) -> Result<(), AgentError> {
        let entry = directory.status(name, Follow::NoSymlinks).ok();
        let target = directory.status(name, Follow::Symlinks).ok();
        let identities: Vec<FileIdentity> = [entry, target]
            .into_iter()
            .flatten()
            .map(|status| status.identity)
            .collect();
        match self.all().find(|protected| {
            protected.is_named_by(directory, name)
                || identities.iter().any(|identity| protected.is(*identity))
        }) {
            Some(protected) => Err(forbidden(path, protected)),
            None => Ok(()),
        }
    }

    /// Decides whether the directory `top` (which `path` names) may be deleted recursively: refused when
    /// it holds a protected file at any depth, as the protected file's directories are now. The walk
    /// itself checks every directory again ([`ProtectedFiles::check_walked`]), since the tree can
    /// change while it is deleted.
    pub fn check_tree(&self, path: &Path, top: &Directory) -> Result<(), AgentError> {
        match self
            .all()
            .find(|protected| protected.ancestors().contains(&top.identity()))
        {
            Some(protected) => Err(protected.contained_in(path)),
            None => Ok(()),
        }
    }

    /// Decides whether the directory `top` (which `path` names) may be read as a whole (a tar
    /// download): refused when it holds the token file at any depth.
    pub fn check_tree_read(&self, path: &Path, top: &Directory) -> Result<(), AgentError> {
        match self
            .token_file
            .iter()
            .find(|token| token.ancestors().contains(&top.identity()))
        {
            Some(token) => Err(AgentError::Forbidden(format!(
                "refusing to read `{}` as a whole: it contains {}",
                path.display(),
                token.what
            ))),
            None => Ok(()),
        }
    }

    /// During a recursive delete of `path`: refuses to go on when the `directory` about to be emptied
    /// holds a protected file, or the `entry` about to be removed is one.
    pub fn check_walked(
        &self,
        path: &Path,
        directory: &Directory,
        entry: &EntryStatus,
    ) -> Result<(), AgentError> {
        match self.all().find(|protected| {
            protected
                .directory
                .as_ref()
                .is_some_and(|own| own.identity() == directory.identity())
                || protected.is(entry.identity)
        }) {
            Some(protected) => Err(protected.contained_in(path)),
            None => Ok(()),
        }
    }
}

/// What a request does with a file it opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `GET /v1/files`: only the token file is refused.
    Read,
    /// A patch reads a file in order to replace it: both protected files are refused.
    Write,
}

fn protect(what: &'static str, path: &Path) -> ProtectedFile {
    let canonical = fs::canonicalize(path).ok();
    let directory = canonical
        .as_deref()
        .and_then(Path::parent)
        .and_then(|parent| Directory::open(parent).ok())
        .map(Arc::new);
    ProtectedFile {
        what,
        name: canonical
            .as_deref()
            .and_then(Path::file_name)
            .and_then(EntryName::new),
        canonical,
        identity: identity(path),
        directory,
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

    /// The checks on descriptors, which decide: they compare the directory a write or delete acts
    /// through, and the file a read opened, with the protected files by identity.
    #[test]
    fn descriptor_checks_compare_identities_not_spellings() {
        let dir = TempDir::new("descriptors");
        fs::create_dir_all(dir.0.join("secret")).unwrap();
        fs::create_dir_all(dir.0.join("work")).unwrap();
        fs::write(dir.0.join("secret/token"), "t").unwrap();
        fs::write(dir.0.join("bin"), "exe").unwrap();
        fs::write(dir.0.join("work/token"), "decoy").unwrap();
        fs::hard_link(dir.0.join("secret/token"), dir.0.join("work/hard")).unwrap();
        symlink("../secret/token", dir.0.join("work/alias")).unwrap();
        symlink("secret", dir.0.join("link")).unwrap();
        let protected =
            ProtectedFiles::new(Some(&dir.0.join("bin")), Some(&dir.0.join("secret/token")));
        let name = |text: &str| EntryName::new(text.as_ref()).unwrap();
        let refused = |directory: &str, entry: &str| {
            let held = Directory::open(&dir.0.join(directory)).unwrap();
            matches!(
                protected.check_entry(&dir.0.join("x"), &held, &name(entry)),
                Err(AgentError::Forbidden(_))
            )
        };
        assert!(
            refused("link", "token"),
            "the token's directory through a symlink"
        );
        assert!(refused("secret", "token"));
        assert!(refused("work", "hard"), "a hard link");
        assert!(refused("work", "alias"), "a symlink to the token");
        assert!(refused(".", "bin"), "the executable");
        assert!(
            !refused("work", "token"),
            "a file of the same name elsewhere"
        );
        assert!(!refused("secret", "other"), "another name beside the token");

        let opened = |path: &str| {
            fs::File::open(dir.0.join(path))
                .unwrap()
                .metadata()
                .unwrap()
        };
        let read =
            |path: &str, access| protected.check_opened(Path::new(path), &opened(path), access);
        assert!(read("work/hard", Access::Read).is_err());
        assert!(read("link/token", Access::Write).is_err());
        assert!(
            read("bin", Access::Read).is_ok(),
            "the executable may be read"
        );
        assert!(read("bin", Access::Write).is_err(), "but not patched");
        assert!(read("work/token", Access::Write).is_ok());
    }

    #[test]
    fn recursive_deletes_are_refused_from_every_directory_above_a_protected_file() {
        let dir = TempDir::new("ancestors");
        fs::create_dir_all(dir.0.join("a/b/secret")).unwrap();
        fs::create_dir_all(dir.0.join("a/c")).unwrap();
        fs::write(dir.0.join("a/b/secret/token"), "t").unwrap();
        let protected = ProtectedFiles::new(None, Some(&dir.0.join("a/b/secret/token")));
        for above in ["a/b/secret", "a/b", "a", ".", "/"] {
            let held = Directory::open(&dir.0.join(above)).unwrap();
            assert!(
                protected.check_tree(Path::new(above), &held).is_err(),
                "{above}"
            );
        }
        let beside = Directory::open(&dir.0.join("a/c")).unwrap();
        assert!(protected.check_tree(Path::new("a/c"), &beside).is_ok());
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
