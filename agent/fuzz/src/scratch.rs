//! Scratch directories of one fuzzing process (`$TMPDIR/orchard-fuzz-<name>-<pid>`), removed when
//! libFuzzer exits normally (a crash leaves them for inspection).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

static CREATED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static REGISTER: Once = Once::new();

extern "C" fn remove_scratch_dirs() {
    if let Ok(dirs) = CREATED.lock() {
        for dir in dirs.iter() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// A fresh, canonical, empty directory for this process.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orchard-fuzz-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create the scratch directory");
    let dir = fs::canonicalize(&dir).expect("canonicalise the scratch directory");
    CREATED.lock().expect("scratch list").push(dir.clone());
    REGISTER.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no captured state.
        unsafe { libc::atexit(remove_scratch_dirs) };
    });
    dir
}

/// Writes `content` to `root/relative`, creating parents.
pub fn write_file(root: &Path, relative: &str, content: &[u8]) {
    let path = root.join(relative);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create parent directories");
    }
    fs::write(&path, content).expect("write a fixture file");
}

/// Creates the symlink `root/relative -> target`.
pub fn symlink(root: &Path, relative: &str, target: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, root.join(relative)).expect("create a fixture symlink");
}
