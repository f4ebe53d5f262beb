//! `orchard-agent install DIR`: copies the running executable to `DIR/orchard-agent` (mode 0755, written
//! to a temp file and renamed) so a `FROM scratch` init container can deliver the agent with no shell.
//! With `--token-from SRC --token-to DST` it also hands the bearer token over: the Secret is mounted in
//! the init container only, and the copy lands in a memory volume the task container's agent reads and
//! deletes (`serve --consume-token-file`) before it accepts a connection.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

static INVOKED_AS: OnceLock<OsString> = OnceLock::new();

/// Records `argv[0]` (call first thing in `main`): the fallback for finding the executable without /proc.
pub fn remember_invocation(argv0: Option<OsString>) {
    if let Some(argv0) = argv0 {
        let _ = INVOKED_AS.set(argv0);
    }
}

/// The running executable: `/proc/self/exe`, or, where `/proc` is not mounted (an empty chroot),
/// `argv[0]` when it is a path or names a program in `PATH`.
pub fn own_executable() -> Option<PathBuf> {
    let proc_exe = Path::new("/proc/self/exe");
    if fs::metadata(proc_exe).is_ok() {
        return Some(proc_exe.to_path_buf());
    }
    let argv0 = PathBuf::from(
        INVOKED_AS
            .get()
            .cloned()
            .or_else(|| std::env::args_os().next())?,
    );
    if argv0.components().count() > 1 {
        return fs::metadata(&argv0).is_ok().then_some(argv0);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(&argv0))
        .find(|candidate| candidate.is_file())
}

/// Installs the running executable into `dir`; returns the installed path.
pub fn install(dir: &Path) -> Result<PathBuf, String> {
    fs::create_dir_all(dir)
        .map_err(|error| format!("cannot create `{}`: {error}", dir.display()))?;
    let target = dir.join("orchard-agent");
    let temp = dir.join(format!(".orchard-agent.tmp-{}", std::process::id()));
    let source = own_executable()
        .ok_or("cannot find the running executable (no /proc/self/exe, argv[0] unusable)")?;
    let source = source.as_path();
    let copied = fs::copy(source, &temp)
        .map_err(|error| {
            format!(
                "cannot copy {} to `{}`: {error}",
                source.display(),
                temp.display()
            )
        })
        .and_then(|_| {
            fs::set_permissions(&temp, fs::Permissions::from_mode(0o755))
                .map_err(|error| format!("cannot chmod `{}`: {error}", temp.display()))
        })
        .and_then(|()| {
            fs::rename(&temp, &target).map_err(|error| {
                format!(
                    "cannot move `{}` to `{}`: {error}",
                    temp.display(),
                    target.display()
                )
            })
        });
    if copied.is_err() {
        let _ = fs::remove_file(&temp);
    }
    copied.map(|()| target)
}

/// Mode of the handed-over token: readable by any uid (the task container's agent may run as any user;
/// the init container runs as another), writable by none. The agent deletes it once read.
pub const TOKEN_COPY_MODE: u32 = 0o444;

/// Mode of a directory [`copy_token`] creates for the token: writable by every uid and without the
/// sticky bit, so that the agent, whatever uid it runs as, may delete the file the init container's uid
/// owns. A memory `emptyDir` is a tmpfs whose root has the sticky bit (mode 1777): a file directly in
/// it could be deleted only by its owner or root.
pub const HANDOVER_DIR_MODE: u32 = 0o777;

/// Copies the token file `from` to `to` atomically: a temp file in `to`'s directory is written, fsynced,
/// given mode 0444 and renamed over `to` (the directory is fsynced too, best effort), so a reader sees
/// either no file or the whole token. Refuses an empty token.
pub fn copy_token(from: &Path, to: &Path) -> Result<(), String> {
    let token = fs::read(from)
        .map_err(|error| format!("cannot read the token file `{}`: {error}", from.display()))?;
    if token.trim_ascii().is_empty() {
        return Err(format!("the token file `{}` is empty", from.display()));
    }
    let directory = match to.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = to
        .file_name()
        .ok_or_else(|| format!("--token-to `{}` does not name a file", to.display()))?;
    if !directory.is_dir() {
        fs::create_dir_all(directory)
            .and_then(|()| {
                fs::set_permissions(directory, fs::Permissions::from_mode(HANDOVER_DIR_MODE))
            })
            .map_err(|error| format!("cannot create `{}`: {error}", directory.display()))?;
    }
    let temp = directory.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = write_synced(&temp, &token)
        .and_then(|()| fs::set_permissions(&temp, fs::Permissions::from_mode(TOKEN_COPY_MODE)))
        .and_then(|()| fs::rename(&temp, to))
        .map_err(|error| {
            format!(
                "cannot write the token to `{}` (through `{}`): {error}",
                to.display(),
                temp.display()
            )
        });
    if written.is_err() {
        let _ = fs::remove_file(&temp);
        return written;
    }
    // Makes the rename durable; a memory volume has nothing to sync, so failures are ignored.
    if let Ok(directory) = fs::File::open(directory) {
        let _ = directory.sync_all();
    }
    Ok(())
}

/// Creates `path` (mode 0600, must not exist), writes `bytes` and fsyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "orchard-install-{name}-{}",
            crate::entropy::random_hex()
        ));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn token_is_copied_atomically_with_mode_0444() {
        let dir = scratch("copy");
        let from = dir.join("secret/token");
        fs::create_dir_all(from.parent().unwrap()).unwrap();
        fs::write(&from, "s3cret\n").unwrap();
        let to = dir.join("shared/token");
        copy_token(&from, &to).unwrap();
        assert_eq!(fs::read(&to).unwrap(), b"s3cret\n");
        assert_eq!(fs::metadata(&to).unwrap().mode() & 0o7777, TOKEN_COPY_MODE);
        assert_eq!(
            fs::metadata(dir.join("shared")).unwrap().mode() & 0o7777,
            HANDOVER_DIR_MODE,
            "a directory it creates lets any uid delete the token (no sticky bit, whatever the umask)"
        );
        // Replacing an existing (read-only) copy works too: rename, not open-for-write.
        fs::write(&from, "next").unwrap();
        copy_token(&from, &to).unwrap();
        assert_eq!(fs::read(&to).unwrap(), b"next");
        // No temp file is left behind.
        let names: Vec<_> = fs::read_dir(dir.join("shared"))
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("token")]);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn token_copy_failures_are_reported() {
        let dir = scratch("fail");
        let error = copy_token(&dir.join("missing"), &dir.join("out")).unwrap_err();
        assert!(error.contains("cannot read the token file"), "{error}");
        fs::write(dir.join("empty"), "\n").unwrap();
        let error = copy_token(&dir.join("empty"), &dir.join("out")).unwrap_err();
        assert!(error.contains("is empty"), "{error}");
        assert!(!dir.join("out").exists());
        fs::remove_dir_all(dir).unwrap();
    }
}
