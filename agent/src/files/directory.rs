//! A directory held open by descriptor, and the entries in it. Every lookup below a [`Directory`]
//! resolves exactly one name relative to the descriptor (`fstatat`, `openat`, `renameat`, `unlinkat`),
//! never a path, so a check made on an entry is about the entry that is then renamed over, removed or
//! opened: a concurrent swap of a parent directory for a symlink cannot redirect the action elsewhere.
//!
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` is not used: every lookup here is one component
//! opened with `O_NOFOLLOW` where symlinks matter, for which those flags add nothing, and request paths
//! themselves must keep following the user's symlinks.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The same file under any name: device and inode.
pub type FileIdentity = (u64, u64);

/// One name inside a directory: not empty, no `/`, not `.` or `..`, no NUL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryName(CString);

impl EntryName {
    /// `name` as a single entry name, or `None` when it is not one.
    pub fn new(name: &OsStr) -> Option<EntryName> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
            return None;
        }
        CString::new(bytes).ok().map(EntryName)
    }

    fn as_c_str(&self) -> &CStr {
        &self.0
    }

    pub fn as_os_str(&self) -> &OsStr {
        OsStr::from_bytes(self.0.as_bytes())
    }
}

/// A request path split into the directory that holds its entry and the entry's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPath {
    pub parent: PathBuf,
    pub name: EntryName,
    /// The path ended in `/`: the entry must be a directory (as the kernel requires).
    pub directory_only: bool,
}

/// Why a path names no entry a write or delete could act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoEntry {
    /// The path is `/` (or only slashes).
    Root,
    /// The last component is `.` or `..`.
    DotComponent,
}

/// Splits `path` lexically at its last component (trailing slashes noted and removed), without
/// touching the file system: `a/b/` is entry `b` of `a`, directory only; `a/..` names no entry.
pub fn split_path(path: &Path) -> Result<SplitPath, NoEntry> {
    let bytes = path.as_os_str().as_bytes();
    let trimmed_length = bytes
        .iter()
        .rposition(|byte| *byte != b'/')
        .map_or(0, |i| i + 1);
    if trimmed_length == 0 {
        return Err(NoEntry::Root);
    }
    let trimmed = &bytes[..trimmed_length];
    let (parent, name) = match trimmed.iter().rposition(|byte| *byte == b'/') {
        Some(0) => (&b"/"[..], &trimmed[1..]),
        Some(slash) => (&trimmed[..slash], &trimmed[slash + 1..]),
        None => (&b"."[..], trimmed),
    };
    let name = EntryName::new(OsStr::from_bytes(name)).ok_or(NoEntry::DotComponent)?;
    Ok(SplitPath {
        parent: PathBuf::from(OsStr::from_bytes(parent)),
        name,
        directory_only: trimmed_length < bytes.len(),
    })
}

/// What `fstatat` says about an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryStatus {
    pub identity: FileIdentity,
    /// `S_IFMT` bits.
    file_type: u32,
    /// Permission bits (`0o7777`).
    pub mode: u32,
}

impl EntryStatus {
    fn from_stat(stat: &libc::stat) -> EntryStatus {
        EntryStatus {
            identity: (stat.st_dev, stat.st_ino),
            file_type: stat.st_mode & libc::S_IFMT,
            mode: stat.st_mode & 0o7777,
        }
    }

    pub fn is_directory(&self) -> bool {
        self.file_type == libc::S_IFDIR
    }
}

/// Whether a lookup follows a symlink in the final component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    Symlinks,
    NoSymlinks,
}

/// A directory held by an `O_PATH` descriptor (no read permission needed, usable as the base of
/// every `*at` call), with its identity taken from that descriptor.
#[derive(Debug)]
pub struct Directory {
    fd: OwnedFd,
    identity: FileIdentity,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// The result of a libc call that returns -1 and sets errno on failure.
fn check(result: libc::c_int) -> io::Result<libc::c_int> {
    if result == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `fd` is an open descriptor and `stat` points to writable memory of the right size.
    check(unsafe { libc::fstat(fd.as_raw_fd(), stat.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so it filled in `stat`.
    Ok(unsafe { stat.assume_init() })
}

impl Directory {
    /// Opens the directory `path` names, following symlinks (as any request path does).
    pub fn open(path: &Path) -> io::Result<Directory> {
        let path = c_path(path)?;
        // SAFETY: a valid NUL-terminated path; the returned descriptor is owned below.
        let fd = check(unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: `open` returned a fresh descriptor that nothing else owns.
        Directory::from_fd(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn from_fd(fd: OwnedFd) -> io::Result<Directory> {
        let stat = fstat(&fd)?;
        Ok(Directory {
            identity: (stat.st_dev, stat.st_ino),
            fd,
        })
    }

    fn open_at(&self, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
        // SAFETY: `self.fd` is an open directory descriptor and `name` is NUL-terminated; the returned
        // descriptor is owned below.
        let fd = check(unsafe {
            libc::openat(self.fd.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC)
        })?;
        // SAFETY: `openat` returned a fresh descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The device and inode of the directory (of the descriptor, not of any path).
    pub fn identity(&self) -> FileIdentity {
        self.identity
    }

    /// `fstatat` of entry `name`.
    pub fn status(&self, name: &EntryName, follow: Follow) -> io::Result<EntryStatus> {
        let flags = match follow {
            Follow::Symlinks => 0,
            Follow::NoSymlinks => libc::AT_SYMLINK_NOFOLLOW,
        };
        let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: an open directory descriptor, a NUL-terminated name and writable memory for `stat`.
        check(unsafe {
            libc::fstatat(
                self.fd.as_raw_fd(),
                name.as_c_str().as_ptr(),
                stat.as_mut_ptr(),
                flags,
            )
        })?;
        // SAFETY: fstatat succeeded, so it filled in `stat`.
        Ok(EntryStatus::from_stat(&unsafe { stat.assume_init() }))
    }

    /// The subdirectory `name` itself: a symlink there is refused (`ENOTDIR`), not followed.
    pub fn open_subdirectory(&self, name: &EntryName) -> io::Result<Directory> {
        let fd = self.open_at(
            name.as_c_str(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )?;
        Directory::from_fd(fd)
    }

    /// The directory's parent (`..`, as the kernel resolves it: the parent it has now).
    pub fn parent(&self) -> io::Result<Directory> {
        Directory::from_fd(self.open_at(c"..", libc::O_PATH | libc::O_DIRECTORY)?)
    }

    /// The names of the directory's entries (without `.` and `..`), read from a fresh descriptor of
    /// the directory itself.
    pub fn names(&self) -> io::Result<Vec<EntryName>> {
        let fd = self.open_at(c".", libc::O_RDONLY | libc::O_DIRECTORY)?;
        let raw = fd.as_raw_fd();
        // SAFETY: `raw` is an open directory descriptor; on success the stream owns it (closed by
        // `closedir` below), so ownership leaves `fd` first.
        let stream = unsafe { libc::fdopendir(raw) };
        if stream.is_null() {
            return Err(io::Error::last_os_error());
        }
        std::mem::forget(fd);
        let mut names = Vec::new();
        let result = loop {
            // SAFETY: errno is thread-local; readdir reports errors only through it.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `stream` is a valid open directory stream used by this thread only.
            let entry = unsafe { libc::readdir64(stream) };
            if entry.is_null() {
                let error = io::Error::last_os_error();
                break match error.raw_os_error() {
                    Some(0) | None => Ok(names),
                    Some(_) => Err(error),
                };
            }
            // SAFETY: readdir returned a valid entry whose `d_name` is NUL-terminated; it stays valid
            // until the next readdir call, and the name is copied before that.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
            if let Some(name) = EntryName::new(OsStr::from_bytes(name.to_bytes())) {
                names.push(name);
            }
        };
        // SAFETY: `stream` is valid and closed exactly once.
        unsafe { libc::closedir(stream) };
        result
    }

    /// Creates file `name` (`O_EXCL`: never an existing file or a symlink's target) for writing.
    pub fn create_new_file(&self, name: &EntryName, mode: u32) -> io::Result<File> {
        self.create_exclusive(name, mode, libc::O_WRONLY)
    }

    /// Creates file `name` like [`Directory::create_new_file`], open for reading and writing.
    pub fn create_new_read_write_file(&self, name: &EntryName, mode: u32) -> io::Result<File> {
        self.create_exclusive(name, mode, libc::O_RDWR)
    }

    /// Another descriptor of this directory.
    pub fn reopen(&self) -> io::Result<Directory> {
        Directory::from_fd(self.open_at(c".", libc::O_PATH | libc::O_DIRECTORY)?)
    }

    fn create_exclusive(
        &self,
        name: &EntryName,
        mode: u32,
        access: libc::c_int,
    ) -> io::Result<File> {
        // SAFETY: an open directory descriptor and a NUL-terminated name; the returned descriptor is
        // owned by the `File`.
        let fd = check(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                name.as_c_str().as_ptr(),
                access | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: `openat` returned a fresh descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Renames entry `from` over entry `to`, both in this directory.
    pub fn rename(&self, from: &EntryName, to: &EntryName) -> io::Result<()> {
        // SAFETY: an open directory descriptor (twice) and two NUL-terminated names.
        check(unsafe {
            libc::renameat(
                self.fd.as_raw_fd(),
                from.as_c_str().as_ptr(),
                self.fd.as_raw_fd(),
                to.as_c_str().as_ptr(),
            )
        })
        .map(drop)
    }

    /// Moves entry `from` of this directory to entry `to` of `target`; with `no_replace` an existing
    /// `to` is an error (`AlreadyExists`) instead of being replaced.
    pub fn rename_to(
        &self,
        from: &EntryName,
        target: &Directory,
        to: &EntryName,
        no_replace: bool,
    ) -> io::Result<()> {
        let flags = if no_replace {
            libc::RENAME_NOREPLACE
        } else {
            0
        };
        // SAFETY: two open directory descriptors and two NUL-terminated names.
        check(unsafe {
            libc::renameat2(
                self.fd.as_raw_fd(),
                from.as_c_str().as_ptr(),
                target.fd.as_raw_fd(),
                to.as_c_str().as_ptr(),
                flags,
            )
        })
        .map(drop)
    }

    /// Creates the directory `name` with `mode` (less the umask).
    pub fn create_directory(&self, name: &EntryName, mode: u32) -> io::Result<()> {
        // SAFETY: an open directory descriptor and a NUL-terminated name.
        check(unsafe {
            libc::mkdirat(
                self.fd.as_raw_fd(),
                name.as_c_str().as_ptr(),
                mode as libc::mode_t,
            )
        })
        .map(drop)
    }

    /// Creates the symlink `name` pointing to `target` (stored as given, never resolved).
    pub fn create_symlink(&self, target: &Path, name: &EntryName) -> io::Result<()> {
        let target = c_path(target)?;
        // SAFETY: a NUL-terminated target, an open directory descriptor and a NUL-terminated name.
        check(unsafe {
            libc::symlinkat(
                target.as_ptr(),
                self.fd.as_raw_fd(),
                name.as_c_str().as_ptr(),
            )
        })
        .map(drop)
    }

    /// Sets the permission bits of the subdirectory `name` itself (a symlink there is refused).
    pub fn set_subdirectory_mode(&self, name: &EntryName, mode: u32) -> io::Result<()> {
        let fd = self.open_at(
            name.as_c_str(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )?;
        // SAFETY: an open descriptor of the directory.
        check(unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) }).map(drop)
    }

    /// Removes entry `name` when it is not a directory (a symlink itself, never its target).
    pub fn unlink(&self, name: &EntryName) -> io::Result<()> {
        self.unlink_at(name, 0)
    }

    /// Removes the empty directory `name`.
    pub fn remove_directory(&self, name: &EntryName) -> io::Result<()> {
        self.unlink_at(name, libc::AT_REMOVEDIR)
    }

    fn unlink_at(&self, name: &EntryName, flags: libc::c_int) -> io::Result<()> {
        // SAFETY: an open directory descriptor and a NUL-terminated name.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), name.as_c_str().as_ptr(), flags) })
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, symlink};

    fn name(text: &str) -> EntryName {
        EntryName::new(OsStr::new(text)).unwrap()
    }

    fn split(text: &str) -> Result<(String, String, bool), NoEntry> {
        split_path(Path::new(text)).map(|split| {
            (
                split.parent.display().to_string(),
                split.name.as_os_str().to_string_lossy().into_owned(),
                split.directory_only,
            )
        })
    }

    #[test]
    fn paths_split_at_their_last_component() {
        let owned = |parent: &str, name: &str, directory_only| {
            Ok((parent.to_string(), name.to_string(), directory_only))
        };
        assert_eq!(split("/root/a/b"), owned("/root/a", "b", false));
        assert_eq!(split("/b"), owned("/", "b", false));
        assert_eq!(split("/root/a/"), owned("/root", "a", true));
        assert_eq!(split("/root/a//"), owned("/root", "a", true));
        assert_eq!(split("/root/x/../y"), owned("/root/x/..", "y", false));
        assert_eq!(split("relative"), owned(".", "relative", false));
        assert_eq!(split("/"), Err(NoEntry::Root));
        assert_eq!(split("//"), Err(NoEntry::Root));
        assert_eq!(split("/root/."), Err(NoEntry::DotComponent));
        assert_eq!(split("/root/a/.."), Err(NoEntry::DotComponent));
        assert_eq!(split("/root/a/../"), Err(NoEntry::DotComponent));
    }

    #[test]
    fn entry_names_are_single_components() {
        for bad in ["", ".", "..", "a/b", "/"] {
            assert!(EntryName::new(OsStr::new(bad)).is_none(), "{bad:?}");
        }
        assert!(EntryName::new(OsStr::new("a\0b")).is_none());
        assert!(EntryName::new(OsStr::new("...")).is_some());
    }

    #[test]
    fn operations_stay_in_the_directory_that_was_opened() {
        let base = std::env::temp_dir().join(format!(
            "orchard-directory-{}",
            crate::entropy::random_hex()
        ));
        fs::create_dir_all(base.join("held")).unwrap();
        fs::create_dir_all(base.join("elsewhere")).unwrap();
        let held = Directory::open(&base.join("held")).unwrap();
        assert_eq!(held.identity(), {
            let metadata = fs::metadata(base.join("held")).unwrap();
            (metadata.dev(), metadata.ino())
        });
        // The directory moves away and a symlink to another one takes its name: the descriptor
        // still names the directory that was opened.
        fs::rename(base.join("held"), base.join("moved")).unwrap();
        symlink("elsewhere", base.join("held")).unwrap();
        let mut file = held.create_new_file(&name("new"), 0o600).unwrap();
        std::io::Write::write_all(&mut file, b"x").unwrap();
        held.rename(&name("new"), &name("final")).unwrap();
        assert_eq!(fs::read(base.join("moved/final")).unwrap(), b"x");
        assert!(!base.join("elsewhere/final").exists());
        assert!(held.create_new_file(&name("final"), 0o600).is_err());
        assert_eq!(held.names().unwrap(), vec![name("final")]);

        // Symlinks are entries of their own: not followed by unlink, refused as subdirectories.
        symlink("../elsewhere", base.join("moved/link")).unwrap();
        assert!(
            held.status(&name("link"), Follow::Symlinks)
                .unwrap()
                .is_directory()
        );
        assert!(
            !held
                .status(&name("link"), Follow::NoSymlinks)
                .unwrap()
                .is_directory()
        );
        assert!(held.open_subdirectory(&name("link")).is_err());
        held.unlink(&name("link")).unwrap();
        assert!(base.join("elsewhere").is_dir());
        fs::create_dir(base.join("moved/sub")).unwrap();
        let sub = held.open_subdirectory(&name("sub")).unwrap();
        assert_eq!(sub.parent().unwrap().identity(), held.identity());
        held.remove_directory(&name("sub")).unwrap();
        held.unlink(&name("final")).unwrap();
        assert!(held.names().unwrap().is_empty());
        fs::remove_dir_all(base).unwrap();
    }
}
