//! Opening a file for reading only when it is a regular file. A FIFO would block the reading thread
//! until a writer appears (forever), a character device such as `/dev/zero` never ends, and a socket
//! cannot be opened at all: those are refused with a clear message instead. The type is checked before
//! opening (without opening for read), and again on the opened descriptor, which is opened with
//! `O_NONBLOCK` so that a FIFO swapped in between the two checks cannot block the open itself.

use std::fs::{self, File, FileType, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What a path names, for reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileClass {
    Regular,
    Directory,
    /// Anything else, described for messages: "a FIFO", "a character device", ...
    Special(&'static str),
}

/// Classifies a file type (following symlinks is the caller's choice of metadata).
pub fn classify(file_type: FileType) -> FileClass {
    if file_type.is_file() {
        FileClass::Regular
    } else if file_type.is_dir() {
        FileClass::Directory
    } else if file_type.is_fifo() {
        FileClass::Special("a FIFO (named pipe)")
    } else if file_type.is_char_device() {
        FileClass::Special("a character device")
    } else if file_type.is_block_device() {
        FileClass::Special("a block device")
    } else if file_type.is_socket() {
        FileClass::Special("a socket")
    } else {
        FileClass::Special("not a file or directory")
    }
}

/// The outcome of [`open_regular`].
#[derive(Debug)]
pub enum Opened {
    /// A regular file, open for reading, with the metadata of the opened descriptor.
    File(File, Metadata),
    /// Not opened: `path` is a directory.
    Directory,
    /// Not opened: `path` is a special file (described as in [`FileClass::Special`]).
    Special(&'static str),
}

impl Opened {
    fn refused(class: FileClass) -> Option<Opened> {
        match class {
            FileClass::Regular => None,
            FileClass::Directory => Some(Opened::Directory),
            FileClass::Special(what) => Some(Opened::Special(what)),
        }
    }
}

/// Opens `path` (following symlinks) for reading if it is a regular file: checked with `metadata`
/// first, opened with `O_NONBLOCK | O_NOCTTY`, and checked again with `fstat` on the descriptor.
pub fn open_regular(path: &Path) -> io::Result<Opened> {
    if let Some(refused) = Opened::refused(classify(fs::metadata(path)?.file_type())) {
        return Ok(refused);
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let metadata = file.metadata()?;
    Ok(Opened::refused(classify(metadata.file_type())).unwrap_or(Opened::File(file, metadata)))
}

/// The message for a refused special file.
pub fn not_regular_message(path: &Path, what: &str) -> String {
    format!(
        "`{}` is not a regular file ({what}); only regular files can be read",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn only_regular_files_are_opened() {
        let dir =
            std::env::temp_dir().join(format!("orchard-regular-{}", crate::entropy::random_hex()));
        fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
        assert!(matches!(
            open_regular(&fifo).unwrap(),
            Opened::Special(what) if what.contains("FIFO")
        ));
        symlink("/dev/zero", dir.join("zero")).unwrap();
        assert!(matches!(
            open_regular(&dir.join("zero")).unwrap(),
            Opened::Special("a character device")
        ));
        assert!(matches!(open_regular(&dir).unwrap(), Opened::Directory));
        fs::write(dir.join("file"), "x").unwrap();
        assert!(matches!(
            open_regular(&dir.join("file")).unwrap(),
            Opened::File(_, metadata) if metadata.len() == 1
        ));
        assert!(open_regular(&dir.join("missing")).is_err());
        fs::remove_dir_all(dir).unwrap();
    }
}
