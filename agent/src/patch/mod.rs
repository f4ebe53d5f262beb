//! `POST /v1/patch`: applies a unified diff natively (no `git` or `patch` in the image). Every file's new
//! content is computed in memory first; files are written (temp file + rename) only if every hunk of
//! every file applied, so a conflict leaves the tree untouched.

pub mod apply;
pub mod parse;

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
pub use orchard_api::agent::{PatchAction, PatchRequest, PatchResult, PatchedFile};

use self::apply::apply_hunks;
use self::parse::{FilePatch, parse_patch};
use crate::error::{AgentError, FailedHunk, json_response};
use crate::exec::request::resolve_cwd;
use crate::files::directory::{Directory, EntryName, Follow, split_path};
use crate::files::paths::{Access, ProtectedFiles};
use crate::files::regular::{Opened, open_regular};
use crate::files::transfer::{DEFAULT_FILE_MODE, TempFile};
use crate::json_body::JsonBody;
use crate::state::AppState;

pub async fn apply(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<PatchRequest>,
) -> Result<Response, AgentError> {
    let cwd = resolve_cwd(&state.config.root, request.cwd.as_deref())?;
    let strip = request.strip.unwrap_or(1);
    let files = parse_patch(&request.patch, strip)
        .map_err(|message| AgentError::BadRequest(format!("malformed patch: {message}")))?;
    if files.is_empty() {
        return Err(AgentError::BadRequest(
            "malformed patch: no file changes found (expected `--- a/x` / `+++ b/x` headers and `@@` hunks, as `git diff` prints)".into(),
        ));
    }
    let protected = state.config.protected.clone();
    let applied = tokio::task::spawn_blocking(move || apply_patch(&cwd, &files, &protected))
        .await
        .map_err(|error| AgentError::Internal(format!("patch task failed: {error}")))??;
    tracing::debug!(files = applied.len(), "patch applied");
    Ok(json_response(
        StatusCode::OK,
        &PatchResult {
            applied: true,
            files: applied,
        },
    ))
}

/// The state of one touched path while the patch is computed.
#[derive(Debug)]
struct PendingFile {
    /// Name as the diff spells it (after `strip`), for responses.
    name: String,
    existed: bool,
    content: Option<Vec<u8>>,
    mode: Option<u32>,
    /// Changed by the patch (as opposed to only looked at).
    touched: bool,
}

/// Computes every change, then writes them all, or nothing if any hunk failed.
pub fn apply_patch(
    cwd: &Path,
    files: &[FilePatch],
    protected: &ProtectedFiles,
) -> Result<Vec<PatchedFile>, AgentError> {
    let mut pending: HashMap<PathBuf, PendingFile> = HashMap::new();
    let mut order: Vec<PathBuf> = Vec::new();
    let mut failures: Vec<FailedHunk> = Vec::new();

    if let Some(name) = files
        .iter()
        .flat_map(|file| [file.old_path.as_deref(), file.new_path.as_deref()])
        .flatten()
        .find(|name| !is_file_name(name))
    {
        return Err(AgentError::BadRequest(format!(
            "malformed patch: `{name}` is not a file name (it is empty or ends in `/`, `.` or `..`)"
        )));
    }

    for file in files {
        let fail = |failures: &mut Vec<FailedHunk>, reason: String| {
            failures.push(FailedHunk {
                path: file.display_path().to_string(),
                hunk: 0,
                header: String::new(),
                reason,
            });
        };
        let (source_name, target_name) = match (&file.old_path, &file.new_path) {
            (None, Some(new)) => (None, new.clone()),
            (Some(old), None) => (Some(old.clone()), old.clone()),
            (Some(old), Some(new)) if file.renamed => (Some(old.clone()), new.clone()),
            (Some(old), Some(new)) => {
                // Plain `diff -u old new`: patch whichever of the two names exists, preferring the new one.
                let new_exists = lookup(&mut pending, &mut order, protected, cwd, new)?
                    .content
                    .is_some();
                let name = if new_exists
                    || lookup(&mut pending, &mut order, protected, cwd, old)?
                        .content
                        .is_none()
                {
                    new
                } else {
                    old
                };
                (Some(name.clone()), name.clone())
            }
            (None, None) => continue,
        };
        let target = cwd.join(&target_name);
        protected.check_write(&target)?;
        let original = match &source_name {
            Some(source) => {
                protected.check_write(&cwd.join(source))?;
                match lookup(&mut pending, &mut order, protected, cwd, source)?
                    .content
                    .clone()
                {
                    Some(content) => content,
                    None => {
                        fail(&mut failures, format!("`{source}` does not exist"));
                        continue;
                    }
                }
            }
            None => {
                if lookup(&mut pending, &mut order, protected, cwd, &target_name)?
                    .content
                    .is_some()
                {
                    fail(
                        &mut failures,
                        format!("`{target_name}` already exists; the patch creates it"),
                    );
                    continue;
                }
                Vec::new()
            }
        };
        if file.renamed
            && source_name.as_deref() != Some(target_name.as_str())
            && lookup(&mut pending, &mut order, protected, cwd, &target_name)?
                .content
                .is_some()
        {
            fail(
                &mut failures,
                format!("cannot rename to `{target_name}`: it already exists"),
            );
            continue;
        }
        let content = match apply_hunks(&original, &file.hunks) {
            Ok(content) => content,
            Err(hunk_failures) => {
                failures.extend(hunk_failures.into_iter().map(|failure| FailedHunk {
                    path: file.display_path().to_string(),
                    hunk: failure.hunk,
                    header: failure.header,
                    reason: failure.reason,
                }));
                continue;
            }
        };
        if file.new_path.is_none() {
            if !content.is_empty() {
                fail(
                    &mut failures,
                    format!(
                        "`{target_name}` has content the deletion does not remove; it differs from the patch"
                    ),
                );
                continue;
            }
            let entry = lookup(&mut pending, &mut order, protected, cwd, &target_name)?;
            entry.content = None;
            entry.touched = true;
            continue;
        }
        if let Some(source) = source_name.filter(|source| *source != target_name) {
            let entry = lookup(&mut pending, &mut order, protected, cwd, &source)?;
            entry.content = None;
            entry.touched = true;
        }
        let entry = lookup(&mut pending, &mut order, protected, cwd, &target_name)?;
        entry.content = Some(content);
        entry.touched = true;
        if file.new_mode.is_some() {
            entry.mode = file.new_mode;
        }
    }

    if !failures.is_empty() {
        let count = failures.len();
        return Err(AgentError::PatchConflict {
            message: format!(
                "{count} hunk(s) did not apply; nothing was changed (see failedHunks)"
            ),
            failed_hunks: failures,
        });
    }
    write_changes(&pending, &order, protected)
}

/// Whether `name` can name a file: a rename onto `dir/`, `dir/.` or `..` fails only after the
/// directories of the other files were created, so such names are refused before anything is touched.
fn is_file_name(name: &str) -> bool {
    !name.is_empty()
        && !name.ends_with('/')
        && !name.ends_with("/.")
        && name != "."
        && Path::new(name).file_name().is_some()
}

/// The pending state of `name`, reading it from disk on first use.
fn lookup<'a>(
    pending: &'a mut HashMap<PathBuf, PendingFile>,
    order: &mut Vec<PathBuf>,
    protected: &ProtectedFiles,
    cwd: &Path,
    name: &str,
) -> Result<&'a mut PendingFile, AgentError> {
    let path = cwd.join(name);
    if !pending.contains_key(&path) {
        // Only regular files: reading a FIFO would block forever and a device (`/dev/zero`) never ends.
        // The type is checked before and after opening (non-blocking), so a swap in between is caught.
        let content = match open_regular(&path) {
            Ok(Opened::File(mut file, metadata)) => {
                // Checked on the file opened, before its content is used (a conflict message
                // quotes it), whatever the path resolved to by then.
                protected.check_opened(&path, &metadata, Access::Write)?;
                let mut content = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0));
                file.read_to_end(&mut content)
                    .map_err(|error| AgentError::io("cannot read", &path, error))?;
                Some(content)
            }
            Ok(Opened::Directory | Opened::Special(_)) => {
                return Err(AgentError::InvalidPath(format!(
                    "`{}` is not a regular file; a patch changes regular files only",
                    path.display()
                )));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(AgentError::io("cannot read", &path, error)),
        };
        order.push(path.clone());
        pending.insert(
            path.clone(),
            PendingFile {
                name: name.to_string(),
                existed: content.is_some(),
                content,
                mode: None,
                touched: false,
            },
        );
    }
    pending
        .get_mut(&path)
        .ok_or_else(|| AgentError::Internal("pending file vanished".into()))
}

/// Writes every new content to a temp file first, then renames them all into place, then deletes. If
/// staging fails, the directories it created for new files are removed again (the temp files remove
/// themselves), so a failed patch leaves the tree as it was. Each file is written and deleted through
/// a descriptor of its directory, after checking the entry there.
fn write_changes(
    pending: &HashMap<PathBuf, PendingFile>,
    order: &[PathBuf],
    protected: &ProtectedFiles,
) -> Result<Vec<PatchedFile>, AgentError> {
    let mut created = Vec::new();
    let result = stage_and_persist(pending, order, protected, &mut created);
    if result.is_err() {
        for directory in created.iter().rev() {
            let _ = fs::remove_dir(directory);
        }
    }
    result
}

/// The directory (held by descriptor, checked) holding `path`'s entry, and the entry's name.
fn checked_entry(
    path: &Path,
    protected: &ProtectedFiles,
    created: &mut Vec<PathBuf>,
) -> Result<(Directory, EntryName), AgentError> {
    let split = match split_path(path) {
        Ok(split) if !split.directory_only => split,
        _ => {
            return Err(AgentError::InvalidPath(format!(
                "`{}` is not a file name",
                path.display()
            )));
        }
    };
    let missing: Vec<PathBuf> = split
        .parent
        .ancestors()
        .take_while(|ancestor| fs::symlink_metadata(ancestor).is_err())
        .map(Path::to_path_buf)
        .collect();
    let made = fs::create_dir_all(&split.parent);
    created.extend(missing.into_iter().rev());
    made.map_err(|error| AgentError::io("cannot create parent directories of", path, error))?;
    let directory = Directory::open(&split.parent)
        .map_err(|error| AgentError::io("cannot open the directory of", path, error))?;
    protected.check_entry(path, &directory, &split.name)?;
    Ok((directory, split.name))
}

fn stage_and_persist(
    pending: &HashMap<PathBuf, PendingFile>,
    order: &[PathBuf],
    protected: &ProtectedFiles,
    created: &mut Vec<PathBuf>,
) -> Result<Vec<PatchedFile>, AgentError> {
    let mut staged: Vec<(TempFile, &Path, u32)> = Vec::new();
    let mut report = Vec::new();
    for path in order {
        let Some(file) = pending.get(path).filter(|file| file.touched) else {
            continue;
        };
        let Some(content) = &file.content else {
            continue;
        };
        let (directory, name) = checked_entry(path, protected, created)?;
        let existing_mode = directory
            .status(&name, Follow::Symlinks)
            .ok()
            .map(|status| status.mode);
        let (mut handle, temp) = TempFile::create(Arc::new(directory), &name)
            .map_err(|error| AgentError::io("cannot create a temp file beside", path, error))?;
        handle
            .write_all(content)
            .map_err(|error| AgentError::io("cannot write", path, error))?;
        let mode = file.mode.or(existing_mode).unwrap_or(DEFAULT_FILE_MODE);
        staged.push((temp, path, mode));
        report.push(PatchedFile {
            path: file.name.clone(),
            action: if file.existed {
                PatchAction::Modified
            } else {
                PatchAction::Created
            },
        });
    }
    // Deletions are checked before anything is renamed into place, like the writes.
    let mut deletions = Vec::new();
    for path in order {
        let Some(file) = pending.get(path).filter(|file| file.touched) else {
            continue;
        };
        if file.content.is_none() && file.existed {
            let (directory, name) = checked_entry(path, protected, created)?;
            deletions.push((directory, name, path, file));
        }
    }
    for (temp, path, mode) in staged {
        temp.persist(mode).map_err(|error| {
            AgentError::io("cannot move patched file into place at", path, error)
        })?;
    }
    for (directory, name, path, file) in deletions {
        directory
            .unlink(&name)
            .map_err(|error| AgentError::io("cannot delete", path, error))?;
        report.push(PatchedFile {
            path: file.name.clone(),
            action: PatchAction::Deleted,
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    struct Tree(PathBuf);

    impl Tree {
        fn new() -> Self {
            let dir = std::env::temp_dir()
                .join(format!("orchard-patch-{}", crate::entropy::random_hex()));
            fs::create_dir_all(&dir).unwrap();
            Tree(dir)
        }

        fn write(&self, name: &str, content: &str) {
            let path = self.0.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, content).unwrap();
        }

        fn read(&self, name: &str) -> Option<String> {
            fs::read_to_string(self.0.join(name)).ok()
        }

        fn apply(&self, diff: &str) -> Result<Vec<PatchedFile>, AgentError> {
            apply_patch(
                &self.0,
                &parse_patch(diff, 1).unwrap(),
                &ProtectedFiles::default(),
            )
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn creates_modifies_and_deletes_together() {
        let tree = Tree::new();
        tree.write("src/a.txt", "one\ntwo\n");
        tree.write("gone.txt", "bye\n");
        let diff = "\
--- a/src/a.txt
+++ b/src/a.txt
@@ -1,2 +1,2 @@
 one
-two
+TWO
--- /dev/null
+++ b/deep/new.txt
@@ -0,0 +1,2 @@
+fresh
+file
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
";
        let report = tree.apply(diff).unwrap();
        assert_eq!(tree.read("src/a.txt").as_deref(), Some("one\nTWO\n"));
        assert_eq!(tree.read("deep/new.txt").as_deref(), Some("fresh\nfile\n"));
        assert_eq!(tree.read("gone.txt"), None);
        let actions: Vec<_> = report
            .iter()
            .map(|file| (file.path.as_str(), file.action))
            .collect();
        assert_eq!(
            actions,
            vec![
                ("src/a.txt", PatchAction::Modified),
                ("deep/new.txt", PatchAction::Created),
                ("gone.txt", PatchAction::Deleted)
            ]
        );
    }

    #[test]
    fn conflict_changes_nothing() {
        let tree = Tree::new();
        tree.write("a.txt", "one\n");
        tree.write("b.txt", "other\n");
        let diff = "\
--- a/a.txt
+++ b/a.txt
@@ -1 +1 @@
-one
+ONE
--- a/b.txt
+++ b/b.txt
@@ -1 +1 @@
-not what is there
+x
--- /dev/null
+++ b/c.txt
@@ -0,0 +1 @@
+c
";
        match tree.apply(diff) {
            Err(AgentError::PatchConflict { failed_hunks, .. }) => {
                assert_eq!(failed_hunks.len(), 1);
                assert_eq!(failed_hunks[0].path, "b.txt");
                assert_eq!(failed_hunks[0].hunk, 1);
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(tree.read("a.txt").as_deref(), Some("one\n"));
        assert_eq!(tree.read("c.txt"), None);
    }

    #[test]
    fn creating_an_existing_file_or_patching_a_missing_one_conflicts() {
        let tree = Tree::new();
        tree.write("exists.txt", "x\n");
        assert!(matches!(
            tree.apply("--- /dev/null\n+++ b/exists.txt\n@@ -0,0 +1 @@\n+y\n"),
            Err(AgentError::PatchConflict { .. })
        ));
        assert!(matches!(
            tree.apply("--- a/missing.txt\n+++ b/missing.txt\n@@ -1 +1 @@\n-a\n+b\n"),
            Err(AgentError::PatchConflict { .. })
        ));
    }

    #[test]
    fn renames_and_mode_changes() {
        let tree = Tree::new();
        tree.write("old.sh", "echo hi\n");
        let diff = "\
diff --git a/old.sh b/new.sh
old mode 100644
new mode 100755
similarity index 50%
rename from old.sh
rename to new.sh
--- a/old.sh
+++ b/new.sh
@@ -1 +1 @@
-echo hi
+echo hello
";
        let report = tree.apply(diff).unwrap();
        assert_eq!(tree.read("old.sh"), None);
        assert_eq!(tree.read("new.sh").as_deref(), Some("echo hello\n"));
        let mode = fs::metadata(tree.0.join("new.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o755);
        assert_eq!(report.len(), 2);
    }

    /// Found by the `patch_tree` fuzz target: `+++ b/sub/new/c.txt/` failed only at the rename, after
    /// `sub/new` had been created, so a failed patch left directories behind.
    #[test]
    fn names_that_cannot_be_files_are_refused_before_anything_is_created() {
        let tree = Tree::new();
        for name in ["sub/new/c.txt/", "sub/new/.", "sub/..", "."] {
            let diff = format!("--- /dev/null\n+++ {name}\n@@ -0,0 +1 @@\n+x\n");
            let files = parse_patch(&diff, 0).unwrap();
            assert!(
                matches!(
                    apply_patch(&tree.0, &files, &ProtectedFiles::default()),
                    Err(AgentError::BadRequest(_))
                ),
                "{name}"
            );
        }
        assert!(!tree.0.join("sub").exists());
    }

    #[test]
    fn failed_writes_remove_the_directories_they_created() {
        let tree = Tree::new();
        let path = tree.0.join("sub/new/c.txt/");
        let pending = HashMap::from([(
            path.clone(),
            PendingFile {
                name: "sub/new/c.txt/".into(),
                existed: false,
                content: Some(b"x\n".to_vec()),
                mode: None,
                touched: true,
            },
        )]);
        assert!(write_changes(&pending, &[path], &ProtectedFiles::default()).is_err());
        assert!(!tree.0.join("sub").exists());
    }

    /// Found while writing the `patch_tree` fuzz target: the patch read any file it named, so a FIFO
    /// blocked the request forever and `/dev/zero` read until memory ran out.
    #[test]
    fn only_regular_files_are_patched() {
        let tree = Tree::new();
        let fifo =
            std::ffi::CString::new(tree.0.join("fifo").into_os_string().into_encoded_bytes())
                .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        for diff in [
            "--- a/fifo\n+++ b/fifo\n@@ -1 +1 @@\n-a\n+b\n",
            "--- /dev/zero\n+++ /dev/zero\n@@ -1 +1 @@\n-a\n+b\n",
        ] {
            let strip = usize::from(diff.starts_with("--- a/"));
            let files = parse_patch(diff, strip).unwrap();
            assert!(matches!(
                apply_patch(&tree.0, &files, &ProtectedFiles::default()),
                Err(AgentError::InvalidPath(_))
            ));
        }
    }

    /// Found with the `file_paths` fuzz target's kernel model (see `files::paths`): a new file named
    /// `missing/../link-secret/token` replaced the token, because `missing` is created before the write.
    #[test]
    fn a_patch_cannot_reach_the_token_through_a_missing_directory() {
        let tree = Tree::new();
        tree.write("secret/token", "s3cret\n");
        std::os::unix::fs::symlink("secret", tree.0.join("link-secret")).unwrap();
        let protected = ProtectedFiles::new(None, Some(&tree.0.join("secret/token")));
        let diff = "--- /dev/null\n+++ b/missing/../link-secret/token\n@@ -0,0 +1 @@\n+mine\n";
        assert!(matches!(
            apply_patch(&tree.0, &parse_patch(diff, 1).unwrap(), &protected),
            Err(AgentError::Forbidden(_))
        ));
        assert_eq!(tree.read("secret/token").as_deref(), Some("s3cret\n"));
        assert!(!tree.0.join("missing").exists());
    }

    #[test]
    fn protected_targets_are_refused() {
        let tree = Tree::new();
        tree.write("token", "secret\n");
        let protected = ProtectedFiles::discover(Some(&tree.0.join("token")));
        let files =
            parse_patch("--- a/token\n+++ b/token\n@@ -1 +1 @@\n-secret\n+mine\n", 1).unwrap();
        assert!(matches!(
            apply_patch(&tree.0, &files, &protected),
            Err(AgentError::Forbidden(_))
        ));
        assert_eq!(tree.read("token").as_deref(), Some("secret\n"));
    }
}
