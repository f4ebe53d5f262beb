//! Request paths against the files API's resolution and its refusal to touch the agent's own executable
//! and token file. A scratch tree holds stand-ins for both and symlinks of every kind to and around
//! them (relative, absolute, chained, to directories, dangling, looping, a hard link). For every path:
//! never panics, and whenever the kernel model in `resolve` says an operation would replace, remove or
//! read a protected file, the matching check refuses it. `%T` in the input stands for the tree's
//! absolute path; relative paths are resolved against `T/work`, like `--root`.
#![no_main]

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use orchard_agent::error::AgentError;
use orchard_agent::files::paths::{ProtectedFiles, resolve_request_path};
use orchard_agent_fuzz::resolve::{read_target, removed_entry, written_entry};
use orchard_agent_fuzz::scratch::{scratch_dir, symlink, write_file};

struct Fixture {
    tree: PathBuf,
    root: PathBuf,
    executable: PathBuf,
    token: PathBuf,
    token_identity: (u64, u64),
    protected: ProtectedFiles,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let tree = scratch_dir("file_paths");
    write_file(&tree, "bin/orchard-agent", b"\x7fELF stand-in");
    write_file(&tree, "secret/token", b"s3cret\n");
    write_file(&tree, "work/file", b"data\n");
    fs::create_dir_all(tree.join("work/sub/deeper")).unwrap();
    symlink(&tree, "link-exe", "bin/orchard-agent");
    symlink(&tree, "link-token", tree.join("secret/token"));
    symlink(&tree, "link-secret", "secret");
    symlink(&tree, "link-bin", tree.join("bin"));
    symlink(&tree, "chain", "link-secret");
    symlink(&tree, "loop", "loop");
    symlink(&tree, "dangling", "nowhere/else");
    symlink(&tree, "work/up", "..");
    symlink(&tree, "work/top", "/");
    symlink(&tree, "work/secret-dir", "../secret");
    symlink(&tree, "work/sub/back", "../../link-token");
    fs::hard_link(tree.join("secret/token"), tree.join("hard-token")).unwrap();
    let executable = tree.join("bin/orchard-agent");
    let token = tree.join("secret/token");
    let metadata = fs::metadata(&token).unwrap();
    Fixture {
        root: tree.join("work"),
        protected: ProtectedFiles::new(Some(&executable), Some(&token)),
        token_identity: (metadata.dev(), metadata.ino()),
        tree,
        executable,
        token,
    }
});

fn refused(result: &Result<(), AgentError>) -> bool {
    matches!(result, Err(AgentError::Forbidden(_)))
}

fn same_file(path: &Path, identity: (u64, u64)) -> bool {
    fs::metadata(path).is_ok_and(|metadata| (metadata.dev(), metadata.ino()) == identity)
}

fuzz_target!(|data: &[u8]| {
    let fixture = &*FIXTURE;
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let raw = raw.replace("%T", &fixture.tree.to_string_lossy());
    let path = match resolve_request_path(&fixture.root, &raw) {
        Ok(path) => path,
        Err(error) => {
            assert!(
                raw.is_empty() || raw.contains('\0'),
                "refused `{raw}`: {error}"
            );
            assert!(matches!(error, AgentError::InvalidPath(_)));
            return;
        }
    };
    let protected = &fixture.protected;
    let write = protected.check_write(&path);
    let read = protected.check_read(&path);
    let delete = protected.check_delete(&path, false);
    let delete_all = protected.check_delete(&path, true);
    for file in [&fixture.executable, &fixture.token] {
        if written_entry(&path) == Some(file.clone()) {
            assert!(
                refused(&write),
                "PUT `{raw}` would replace {}",
                file.display()
            );
        }
        if let Some(entry) = removed_entry(&path) {
            if entry == *file {
                assert!(
                    refused(&delete),
                    "DELETE `{raw}` would remove {}",
                    file.display()
                );
            }
            let is_directory = fs::symlink_metadata(&entry).is_ok_and(|meta| meta.is_dir());
            if entry == *file || (is_directory && file.starts_with(&entry)) {
                assert!(
                    refused(&delete_all),
                    "recursive DELETE `{raw}` would remove {}",
                    file.display()
                );
            }
        }
    }
    if read_target(&path).as_ref() == Some(&fixture.token)
        || same_file(&path, fixture.token_identity)
    {
        assert!(refused(&read), "GET `{raw}` would read the token");
    }
});
