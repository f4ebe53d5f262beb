//! `DELETE /v1/files`: removes one entry through a descriptor of the directory holding it, after
//! checking that very entry, and for `recursive=true` empties directories through descriptors opened
//! without following symlinks, checking each directory and entry just before acting on it. Nothing
//! outside the tree is reached, and no protected file is removed, whatever is swapped meanwhile.

use std::io;
use std::path::Path;

use super::directory::{Directory, EntryName, EntryStatus, Follow, NoEntry, split_path};
use super::paths::ProtectedFiles;
use crate::error::AgentError;

/// Deletes the file, symlink or (empty, or with `recursive` any) directory `path` names.
pub fn delete_entry(
    path: &Path,
    recursive: bool,
    protected: &ProtectedFiles,
) -> Result<(), AgentError> {
    let split = split_path(path).map_err(|reason| no_entry(path, reason))?;
    let cannot = |error| AgentError::io("cannot delete", path, error);
    let parent = Directory::open(&split.parent).map_err(cannot)?;
    let entry = parent
        .status(&split.name, Follow::NoSymlinks)
        .map_err(cannot)?;
    protected.check_entry(path, &parent, &split.name)?;
    if !entry.is_directory() {
        if split.directory_only {
            return Err(AgentError::InvalidPath(format!(
                "`{}` ends in `/` but is not a directory",
                path.display()
            )));
        }
        return parent.unlink(&split.name).map_err(cannot);
    }
    if recursive {
        let top = parent.open_subdirectory(&split.name).map_err(cannot)?;
        protected.check_tree(path, &top)?;
        empty_tree(path, top, protected)?;
    }
    parent.remove_directory(&split.name).map_err(|error| {
        if error.kind() == io::ErrorKind::DirectoryNotEmpty {
            AgentError::conflict(format!(
                "directory `{}` is not empty; pass recursive=true to delete it",
                path.display()
            ))
        } else {
            cannot(error)
        }
    })
}

/// Why a path names nothing to delete, for the 400.
fn no_entry(path: &Path, reason: NoEntry) -> AgentError {
    AgentError::InvalidPath(match reason {
        NoEntry::Root => format!("`{}` is the root directory", path.display()),
        NoEntry::DotComponent => format!(
            "`{}` ends in `.` or `..`; name the entry itself",
            path.display()
        ),
    })
}

/// A directory being emptied: the names still to remove, and its own name in its parent.
struct Level {
    directory: Directory,
    pending: Vec<EntryName>,
    name: Option<EntryName>,
}

impl Level {
    fn new(directory: Directory, name: Option<EntryName>) -> io::Result<Level> {
        Ok(Level {
            pending: directory.names()?,
            directory,
            name,
        })
    }
}

/// Removes everything inside `top` (which `path` names), depth first with an explicit stack (deep
/// trees cannot overflow the thread's stack). An entry that vanished meanwhile is skipped.
fn empty_tree(path: &Path, top: Directory, protected: &ProtectedFiles) -> Result<(), AgentError> {
    let cannot = |error| AgentError::io("cannot delete", path, error);
    let mut stack = vec![Level::new(top, None).map_err(cannot)?];
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.pending.pop() else {
            let done = stack.pop();
            if let (
                Some(parent),
                Some(Level {
                    name: Some(name), ..
                }),
            ) = (stack.last(), done)
            {
                ignore_missing(parent.directory.remove_directory(&name)).map_err(cannot)?;
            }
            continue;
        };
        let entry: EntryStatus = match level.directory.status(&name, Follow::NoSymlinks) {
            Ok(entry) => entry,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(cannot(error)),
        };
        protected.check_walked(path, &level.directory, &entry)?;
        if !entry.is_directory() {
            ignore_missing(level.directory.unlink(&name)).map_err(cannot)?;
            continue;
        }
        match level.directory.open_subdirectory(&name) {
            Ok(child) => {
                protected.check_walked(path, &child, &entry)?;
                stack.push(Level::new(child, Some(name)).map_err(cannot)?);
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            // Replaced by a symlink or a file since the `fstatat`: remove that entry itself.
            Err(error) if error.kind() == io::ErrorKind::NotADirectory => {
                ignore_missing(level.directory.unlink(&name)).map_err(cannot)?;
            }
            Err(error) => return Err(cannot(error)),
        }
    }
    Ok(())
}

fn ignore_missing(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    struct Tree(std::path::PathBuf);

    impl Tree {
        fn new() -> Tree {
            let dir = std::env::temp_dir()
                .join(format!("orchard-remove-{}", crate::entropy::random_hex()));
            fs::create_dir_all(&dir).unwrap();
            Tree(fs::canonicalize(dir).unwrap())
        }

        fn file(&self, name: &str) {
            let path = self.0.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, name).unwrap();
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn recursive_deletes_remove_the_tree_but_not_what_its_symlinks_name() {
        let tree = Tree::new();
        tree.file("keep/kept.txt");
        tree.file("gone/a/b/c.txt");
        tree.file("gone/d.txt");
        symlink(tree.0.join("keep"), tree.0.join("gone/a/to-keep")).unwrap();
        let none = ProtectedFiles::default();
        assert!(matches!(
            delete_entry(&tree.0.join("gone"), false, &none),
            Err(AgentError::Conflict { .. })
        ));
        delete_entry(&tree.0.join("gone/"), true, &none).unwrap();
        assert!(!tree.0.join("gone").exists());
        assert!(tree.0.join("keep/kept.txt").exists());
    }

    #[test]
    fn deep_trees_do_not_overflow_the_stack() {
        let tree = Tree::new();
        let deep: std::path::PathBuf = std::iter::repeat_n("d", 300).collect();
        fs::create_dir_all(tree.0.join("top").join(&deep)).unwrap();
        delete_entry(&tree.0.join("top"), true, &ProtectedFiles::default()).unwrap();
        assert!(!tree.0.join("top").exists());
    }

    #[test]
    fn trees_holding_a_protected_file_are_refused_before_anything_is_removed() {
        let tree = Tree::new();
        tree.file("top/first.txt");
        tree.file("top/secret/token");
        let protected = ProtectedFiles::new(None, Some(&tree.0.join("top/secret/token")));
        // Moved after the agent started: the directory's current place counts.
        fs::rename(tree.0.join("top/secret"), tree.0.join("top/moved")).unwrap();
        for path in ["top", "top/moved"] {
            let error = delete_entry(&tree.0.join(path), true, &protected).unwrap_err();
            assert!(
                matches!(&error, AgentError::Forbidden(message) if message.contains("it contains the agent's token file")),
                "{path}: {error}"
            );
        }
        assert!(tree.0.join("top/first.txt").exists());
        assert!(matches!(
            delete_entry(&tree.0.join("top/moved/token"), false, &protected),
            Err(AgentError::Forbidden(_))
        ));
        assert!(tree.0.join("top/moved/token").exists());
    }

    #[test]
    fn the_walk_refuses_a_protected_directory_moved_in_after_the_first_check() {
        let tree = Tree::new();
        tree.file("secret/token");
        tree.file("top/a.txt");
        let protected = ProtectedFiles::new(None, Some(&tree.0.join("secret/token")));
        let top = Directory::open(&tree.0.join("top")).unwrap();
        protected.check_tree(&tree.0.join("top"), &top).unwrap();
        fs::rename(tree.0.join("secret"), tree.0.join("top/secret")).unwrap();
        assert!(matches!(
            empty_tree(&tree.0.join("top"), top, &protected),
            Err(AgentError::Forbidden(_))
        ));
        assert!(tree.0.join("top/secret/token").exists());
    }

    #[test]
    fn paths_that_name_no_entry_are_400() {
        let tree = Tree::new();
        tree.file("a/b.txt");
        for path in ["a/.", "a/..", "a/b.txt/"] {
            assert!(
                matches!(
                    delete_entry(&tree.0.join(path), true, &ProtectedFiles::default()),
                    Err(AgentError::InvalidPath(_))
                ),
                "{path}"
            );
        }
        assert!(matches!(
            delete_entry(Path::new("/"), false, &ProtectedFiles::default()),
            Err(AgentError::InvalidPath(_))
        ));
        assert!(tree.0.join("a/b.txt").exists());
    }
}
