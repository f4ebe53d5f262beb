//! Deciding whether a tar archive may be extracted into a directory, before anything is written.
//! Pure: the archive's entries come as (components, kind) and the directory's current content through
//! a lookup function.
//!
//! Refused: an absolute entry path, a `..` component, an entry below a symlink (one the archive
//! creates, or one already in the directory: whatever it points to, even inside the directory, since
//! `tar` itself never writes an entry below one), an entry below a file, a file or symlink where a
//! directory is (or the reverse), and an entry whose type changes within the archive.

use std::collections::HashMap;

/// What an archive entry creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Directory,
    File,
    Symlink,
}

/// What is already in the directory at a path (not following symlinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDisk {
    Directory,
    Symlink,
    /// A regular file or anything else that is not a directory.
    Other,
}

/// The components of an archive entry's path: relative, without `..`, `.` dropped, no NUL. Empty for
/// the archive's root (`./`).
pub fn archive_components(raw: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let shown = String::from_utf8_lossy(raw);
    if raw.first() == Some(&b'/') {
        return Err(format!("entry `{shown}` has an absolute path"));
    }
    if raw.contains(&0) {
        return Err(format!("entry `{shown}` has a NUL byte in its path"));
    }
    let mut components = Vec::new();
    for component in raw.split(|byte| *byte == b'/') {
        match component {
            b"" | b"." => {}
            b".." => return Err(format!("entry `{shown}` has a `..` component")),
            name => components.push(name.to_vec()),
        }
    }
    Ok(components)
}

fn shown(components: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(&components.join(&b'/')).into_owned()
}

/// Checks every entry against the ones before it and against `disk` (what is at a relative path in
/// the target directory now); the first refusal, described for the caller.
pub fn check_entries(
    entries: &[(Vec<Vec<u8>>, EntryKind)],
    disk: impl Fn(&[Vec<u8>]) -> Option<OnDisk>,
) -> Result<(), String> {
    let mut archive: HashMap<&[Vec<u8>], EntryKind> = HashMap::new();
    for (components, kind) in entries {
        if components.is_empty() {
            if *kind != EntryKind::Directory {
                return Err("an entry without a name that is not a directory".into());
            }
            continue;
        }
        let path = shown(components);
        for depth in 1..components.len() {
            let prefix = &components[..depth];
            let below = |what: &str| {
                format!(
                    "entry `{path}` lies below {what} `{}`; nothing was written",
                    shown(prefix)
                )
            };
            match archive.get(prefix) {
                Some(EntryKind::Symlink) => return Err(below("the archive's symlink")),
                Some(EntryKind::File) => return Err(below("the archive's file")),
                Some(EntryKind::Directory) | None => {}
            }
            match disk(prefix) {
                Some(OnDisk::Symlink) => return Err(below("the symlink")),
                Some(OnDisk::Other) => return Err(below("the file")),
                Some(OnDisk::Directory) | None => {}
            }
        }
        if let Some(earlier) = archive.get(components.as_slice())
            && earlier != kind
        {
            return Err(format!(
                "entry `{path}` appears twice with different types; nothing was written"
            ));
        }
        match (kind, disk(components)) {
            (EntryKind::Directory, Some(OnDisk::Symlink | OnDisk::Other)) => {
                return Err(format!(
                    "entry `{path}` is a directory but a file or symlink is in its place; nothing was written"
                ));
            }
            (EntryKind::File | EntryKind::Symlink, Some(OnDisk::Directory)) => {
                return Err(format!(
                    "entry `{path}` is not a directory but a directory is in its place; nothing was written"
                ));
            }
            _ => {}
        }
        archive.insert(components, *kind);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(path: &str) -> Vec<Vec<u8>> {
        archive_components(path.as_bytes()).unwrap()
    }

    fn check(entries: &[(&str, EntryKind)], disk: &[(&str, OnDisk)]) -> Result<(), String> {
        let entries: Vec<_> = entries
            .iter()
            .map(|(path, kind)| (parts(path), *kind))
            .collect();
        check_entries(&entries, |components| {
            disk.iter()
                .find(|(path, _)| parts(path) == components)
                .map(|(_, kind)| *kind)
        })
    }

    use EntryKind::{Directory, File, Symlink};

    #[test]
    fn paths_must_stay_inside() {
        assert_eq!(
            parts("./a//b/./c/"),
            vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert!(parts("./").is_empty());
        for bad in ["/etc/passwd", "../x", "a/../../x", "a/..", "a\0b"] {
            assert!(archive_components(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn ordinary_archives_pass() {
        let entries = [
            ("./", Directory),
            ("src/", Directory),
            ("src/main.rs", File),
            ("link", Symlink),
            ("src/again.rs", File),
            ("src/main.rs", File),
        ];
        assert_eq!(
            check(
                &entries,
                &[("src", OnDisk::Directory), ("src/main.rs", OnDisk::Other)]
            ),
            Ok(())
        );
    }

    #[test]
    fn entries_below_symlinks_are_refused() {
        let through_archive = check(&[("escape", Symlink), ("escape/passwd", File)], &[]);
        assert!(
            through_archive
                .unwrap_err()
                .contains("below the archive's symlink `escape`")
        );
        let through_disk = check(&[("link/x", File)], &[("link", OnDisk::Symlink)]);
        assert!(
            through_disk
                .unwrap_err()
                .contains("below the symlink `link`")
        );
        let deep = check(
            &[("a/b/c/d", File)],
            &[("a", OnDisk::Directory), ("a/b", OnDisk::Symlink)],
        );
        assert!(deep.unwrap_err().contains("`a/b`"));
        assert!(check(&[("f", File), ("f/x", File)], &[]).is_err());
        assert!(check(&[("f/x", File)], &[("f", OnDisk::Other)]).is_err());
    }

    #[test]
    fn types_must_fit_what_is_there() {
        assert!(check(&[("d", File)], &[("d", OnDisk::Directory)]).is_err());
        assert!(check(&[("d", Symlink)], &[("d", OnDisk::Directory)]).is_err());
        assert!(check(&[("f", Directory)], &[("f", OnDisk::Other)]).is_err());
        assert!(check(&[("l", Directory)], &[("l", OnDisk::Symlink)]).is_err());
        assert_eq!(
            check(&[("l", Symlink)], &[("l", OnDisk::Symlink)]),
            Ok(()),
            "replaced"
        );
        assert!(check(&[("x", File), ("x", Directory)], &[]).is_err());
        assert_eq!(
            check(&[("d", Directory)], &[("d", OnDisk::Directory)]),
            Ok(())
        );
    }
}
