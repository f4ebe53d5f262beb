//! `parse_patch` + `apply_patch` on a scratch tree (the `POST /v1/patch` pipeline with `strip` 1): the
//! agent's token file and executable (stand-ins beside the working directory, reachable through
//! symlinks) are never changed, and a patch that fails changes nothing at all (all or nothing).
//! Patches whose names could reach outside the scratch tree are only parsed, never applied.
#![no_main]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use orchard_agent::files::paths::ProtectedFiles;
use orchard_agent::patch::apply_patch;
use orchard_agent::patch::parse::parse_patch;
use orchard_agent_fuzz::resolve::{read_target, written_entry};
use orchard_agent_fuzz::scratch::{scratch_dir, symlink, write_file};

struct Fixture {
    tree: PathBuf,
    work: PathBuf,
    protected: ProtectedFiles,
    guarded: Vec<(PathBuf, Vec<u8>, u64)>,
}

/// The working directory: files, a subdirectory, symlinks to the protected files and their directory.
/// Also clears whatever a patch created beside the stand-ins (allowed, but it must not pile up).
fn build_work(work: &Path) {
    let _ = fs::remove_dir_all(work);
    if let Some(tree) = work.parent() {
        for (directory, keep) in [("secret", "token"), ("bin", "orchard-agent")] {
            for entry in fs::read_dir(tree.join(directory))
                .into_iter()
                .flatten()
                .flatten()
            {
                if entry.file_name() != keep {
                    let path = entry.path();
                    let _ = fs::remove_file(&path).or_else(|_| fs::remove_dir_all(&path));
                }
            }
        }
    }
    write_file(work, "a.txt", b"one\ntwo\nthree\n");
    write_file(work, "sub/b.txt", b"alpha\nbeta\n");
    write_file(work, "crlf.txt", b"x\r\ny\r\n");
    write_file(work, "no-eol.txt", b"last");
    symlink(work, "link-secret", "../secret");
    symlink(work, "link-token", "../secret/token");
    symlink(work, "link-exe", "../bin/orchard-agent");
    symlink(work, "link-sub", "sub");
    let fifo =
        std::ffi::CString::new(work.join("fifo").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0, "mkfifo");
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let tree = scratch_dir("patch_tree");
    write_file(&tree, "bin/orchard-agent", b"\x7fELF stand-in\n");
    write_file(&tree, "secret/token", b"s3cret\n");
    let work = tree.join("work");
    build_work(&work);
    let executable = tree.join("bin/orchard-agent");
    let token = tree.join("secret/token");
    let guarded = [&executable, &token]
        .into_iter()
        .map(|path| {
            (
                path.clone(),
                fs::read(path).unwrap(),
                fs::metadata(path).unwrap().ino(),
            )
        })
        .collect();
    Fixture {
        protected: ProtectedFiles::new(Some(&executable), Some(&token)),
        tree,
        work,
        guarded,
    }
});

/// Everything under `dir`: kind, mode, content or link target.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
    let mut entries = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let Ok(listing) = fs::read_dir(&current) else {
            continue;
        };
        for entry in listing.flatten() {
            let path = entry.path();
            let Ok(metadata) = fs::symlink_metadata(&path) else {
                continue;
            };
            let content = if metadata.file_type().is_symlink() {
                fs::read_link(&path)
                    .map(|target| target.into_os_string().into_encoded_bytes())
                    .unwrap_or_default()
            } else if metadata.is_dir() {
                pending.push(path.clone());
                Vec::new()
            } else if metadata.is_file() {
                fs::read(&path).unwrap_or_default()
            } else {
                Vec::new() // the FIFO: reading it would block
            };
            entries.insert(path, (metadata.mode(), content));
        }
    }
    entries
}

/// Whether every name of the patch stays inside the scratch tree. Every symlink of the fixture points to
/// the same depth below the tree as the link itself, so a relative name whose `..`s never climb above
/// the working directory stays inside; the kernel model double-checks where writes and reads land.
fn stays_inside(tree: &Path, work: &Path, names: &[&str]) -> bool {
    names.iter().all(|name| {
        let mut depth = 0i32;
        for component in Path::new(name).components() {
            match component {
                Component::Normal(_) => depth += 1,
                Component::ParentDir => depth -= 1,
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return false,
            }
            if depth < 0 {
                return false;
            }
        }
        let path = work.join(name);
        written_entry(&path).is_none_or(|entry| entry.starts_with(tree))
            && read_target(&path).is_none_or(|target| target.starts_with(tree))
    })
}

fuzz_target!(|data: &[u8]| {
    let fixture = &*FIXTURE;
    let text = String::from_utf8_lossy(data);
    let Ok(files) = parse_patch(&text, 1) else {
        return;
    };
    let names: Vec<&str> = files
        .iter()
        .flat_map(|file| [file.old_path.as_deref(), file.new_path.as_deref()])
        .flatten()
        .collect();
    if files.is_empty() || !stays_inside(&fixture.tree, &fixture.work, &names) {
        return;
    }
    let before = snapshot(&fixture.tree);
    let result = apply_patch(&fixture.work, &files, &fixture.protected);
    for (path, content, inode) in &fixture.guarded {
        let now = fs::symlink_metadata(path);
        assert!(
            now.as_ref().is_ok_and(|metadata| metadata.ino() == *inode)
                && fs::read(path).ok().as_ref() == Some(content),
            "the patch changed {} ({result:?}):\n{text}",
            path.display()
        );
    }
    let after = snapshot(&fixture.tree);
    if let Err(error) = &result {
        assert_eq!(
            before, after,
            "a failed patch ({error}) changed the tree:\n{text}"
        );
    }
    if before != after {
        build_work(&fixture.work);
    }
});
