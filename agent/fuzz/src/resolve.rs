//! A model of the kernel's path resolution, written independently of the agent's checks: the oracle of
//! the path-protection targets. It answers "which directory entry would this operation replace, remove
//! or read?", following symlinks the way `openat`/`rename` do, and modelling `create_dir_all` (which the
//! files and patch APIs call before writing) by recording the directories it would create.
//! It only looks (`symlink_metadata`, `read_link`); it never changes the file system.

use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Linux's limit of symlinks followed in one resolution (ELOOP beyond).
const MAX_SYMLINKS: usize = 40;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Root,
    Parent,
    Name(OsString),
}

fn parts(path: &Path) -> VecDeque<Part> {
    path.components()
        .filter_map(|component| match component {
            Component::RootDir | Component::Prefix(_) => Some(Part::Root),
            Component::ParentDir => Some(Part::Parent),
            Component::Normal(name) => Some(Part::Name(name.to_os_string())),
            Component::CurDir => None,
        })
        .collect()
}

/// What is at a resolved location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Directory,
    Symlink,
    Other,
    Missing,
}

/// The file system as seen by the model: the real one plus directories `create_dir_all` would create.
#[derive(Debug, Default)]
pub struct Model {
    created: HashSet<PathBuf>,
}

impl Model {
    fn kind(&self, path: &Path) -> Kind {
        if self.created.contains(path) {
            return Kind::Directory;
        }
        match fs::symlink_metadata(path) {
            Ok(metadata) if metadata.file_type().is_symlink() => Kind::Symlink,
            Ok(metadata) if metadata.is_dir() => Kind::Directory,
            Ok(_) => Kind::Other,
            Err(_) => Kind::Missing,
        }
    }

    /// Resolves an absolute `path` to the canonical location it names; `follow_last` follows a final
    /// symlink. `None` when the kernel would fail (missing directory, not a directory, symlink loop).
    /// A missing final component resolves to where it would be created.
    pub fn resolve(&self, path: &Path, follow_last: bool) -> Option<PathBuf> {
        let mut queue = parts(path);
        let mut current = PathBuf::from("/");
        let mut followed = 0;
        while let Some(part) = queue.pop_front() {
            match part {
                Part::Root => current = PathBuf::from("/"),
                // `current` is canonical, so `..` is its parent (and `/..` is `/`).
                Part::Parent => {
                    current.pop();
                }
                Part::Name(name) => {
                    let last = queue.is_empty();
                    let next = current.join(&name);
                    match self.kind(&next) {
                        Kind::Symlink if !last || follow_last => {
                            followed += 1;
                            if followed > MAX_SYMLINKS {
                                return None;
                            }
                            let target = fs::read_link(&next).ok()?;
                            let mut spliced = parts(&target);
                            spliced.extend(queue);
                            queue = spliced;
                        }
                        Kind::Directory => current = next,
                        _ if last => current = next,
                        Kind::Symlink | Kind::Other | Kind::Missing => return None,
                    }
                }
            }
        }
        Some(current)
    }

    /// `mkdir(path)` as the kernel does it: the parent must resolve to a directory; an existing entry
    /// is fine if it resolves to a directory (that is `create_dir_all`'s `EEXIST` check).
    fn mkdir(&mut self, path: &Path) -> Result<(), bool> {
        let Some(parent) = path.parent() else {
            return Ok(());
        };
        let Some(Part::Name(name)) = parts(path).pop_back() else {
            // `..` or `/` as the last component: it exists if it resolves.
            return if self.resolve(path, true).is_some() {
                Ok(())
            } else {
                Err(true)
            };
        };
        let Some(directory) = self.resolve(parent, true) else {
            return Err(true); // ENOENT or ENOTDIR on the way: `create_dir_all` recurses
        };
        if self.kind(&directory) != Kind::Directory {
            return Err(true);
        }
        let entry = directory.join(name);
        match self.kind(&entry) {
            Kind::Missing => {
                self.created.insert(entry);
                Ok(())
            }
            _ if self
                .resolve(&entry, true)
                .is_some_and(|target| self.kind(&target) == Kind::Directory) =>
            {
                Ok(())
            }
            _ => Err(false),
        }
    }

    /// `std::fs::create_dir_all(path)`, modelled: `true` if it would succeed.
    pub fn create_dir_all(&mut self, path: &Path) -> bool {
        if path.as_os_str().is_empty() {
            return true;
        }
        match self.mkdir(path) {
            Ok(()) => true,
            Err(false) => false,
            Err(true) => {
                let Some(parent) = path.parent() else {
                    return false;
                };
                self.create_dir_all(parent) && self.mkdir(path).is_ok()
            }
        }
    }

    /// The directory entry that `rename(temp, path)` or `unlink(path)` would replace or remove: the
    /// parent resolved, plus the final name (a final symlink is the entry itself).
    pub fn entry(&self, path: &Path) -> Option<PathBuf> {
        let Some(Part::Name(name)) = parts(path).pop_back() else {
            return None; // `..`, `.` or `/`: never a file entry
        };
        let parent = path.parent()?;
        let directory = self.resolve(parent, true)?;
        (self.kind(&directory) == Kind::Directory).then(|| directory.join(name))
    }
}

/// The entry a write to `path` would replace, after `create_dir_all(path.parent())`, as the files and
/// patch APIs do it (temp file beside the target, then rename). `None` if the write cannot happen.
pub fn written_entry(path: &Path) -> Option<PathBuf> {
    let mut model = Model::default();
    if !model.create_dir_all(path.parent()?) {
        return None;
    }
    model.entry(path)
}

/// The file `open(path)` reads (every symlink followed), if it exists.
pub fn read_target(path: &Path) -> Option<PathBuf> {
    let model = Model::default();
    let target = model.resolve(path, true)?;
    fs::symlink_metadata(&target).ok().map(|_| target)
}

/// The existing entry `unlink(path)` or `remove_dir_all(path)` would remove.
pub fn removed_entry(path: &Path) -> Option<PathBuf> {
    let entry = Model::default().entry(path)?;
    fs::symlink_metadata(&entry).ok().map(|_| entry)
}
