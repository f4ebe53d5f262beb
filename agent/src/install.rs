//! `orchard-agent install DIR`: copies the running executable to `DIR/orchard-agent` (mode 0755, written
//! to a temp file and renamed) so a `FROM scratch` init container can deliver the agent with no shell.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
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
