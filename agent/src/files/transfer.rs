//! Streaming file transfers. Uploads go to a temp file beside the target (renamed into place when
//! complete, removed if anything fails or the client goes away); downloads are read in fixed chunks on
//! a blocking thread. Memory per transfer is a few chunks, whatever the file size.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::directory::{Directory, EntryName};
use crate::entropy::random_hex;

/// Bytes per download chunk.
pub const DOWNLOAD_CHUNK: usize = 256 * 1024;
/// Chunks queued between the network and the disk thread.
pub const QUEUE_DEPTH: usize = 8;
/// Mode of a new file when the request names none.
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// A temp file beside its target, in the directory held by descriptor that the target was checked in:
/// renamed over the target there ([`TempFile::persist`]), or deleted there when dropped.
#[derive(Debug)]
pub struct TempFile {
    directory: Arc<Directory>,
    name: EntryName,
    target: EntryName,
    /// A second descriptor of the temp file, for its mode: changed on the file written, never
    /// through a name someone could have swapped meanwhile.
    handle: File,
    kept: bool,
}

impl TempFile {
    /// Creates a fresh temp file for `target` in `directory` (the same file system, so the rename is
    /// atomic); returns the file to write and the guard that puts it in place.
    pub fn create(directory: Arc<Directory>, target: &EntryName) -> io::Result<(File, TempFile)> {
        let prefix: String = target
            .as_os_str()
            .to_string_lossy()
            .chars()
            .take(64)
            .collect();
        loop {
            let Some(name) =
                EntryName::new(format!(".{prefix}.orchard-{}.tmp", random_hex()).as_ref())
            else {
                return Err(io::Error::other("no temp file name"));
            };
            match directory.create_new_file(&name, 0o600) {
                Ok(file) => {
                    let handle = file.try_clone()?;
                    let temp = TempFile {
                        directory,
                        name,
                        target: target.clone(),
                        handle,
                        kept: false,
                    };
                    return Ok((file, temp));
                }
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(error) => return Err(error),
            }
        }
    }

    /// Sets `mode` and renames the temp file over its target.
    pub fn persist(mut self, mode: u32) -> io::Result<()> {
        self.handle
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
        self.directory.rename(&self.name, &self.target)?;
        self.kept = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = self.directory.unlink(&self.name);
        }
    }
}

/// Writes every chunk from `chunks` to `file` (runs on a blocking thread).
pub fn write_chunks(mut chunks: mpsc::Receiver<Bytes>, file: File) -> io::Result<()> {
    let mut writer = BufWriter::with_capacity(DOWNLOAD_CHUNK, file);
    while let Some(chunk) = chunks.blocking_recv() {
        writer.write_all(&chunk)?;
    }
    writer.flush()
}

/// Sends `length` bytes of `file` as chunks (runs on a blocking thread); stops when the receiver is gone.
pub fn read_chunks(file: File, length: u64, chunks: mpsc::Sender<io::Result<Bytes>>) {
    let mut reader = file.take(length);
    loop {
        let mut chunk = Vec::with_capacity(DOWNLOAD_CHUNK);
        match (&mut reader)
            .take(DOWNLOAD_CHUNK as u64)
            .read_to_end(&mut chunk)
        {
            Ok(0) => return,
            Ok(_) => {
                if chunks.blocking_send(Ok(Bytes::from(chunk))).is_err() {
                    return;
                }
            }
            Err(error) => {
                let _ = chunks.blocking_send(Err(error));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::Path;

    fn directory_with_target() -> (std::path::PathBuf, Arc<Directory>, EntryName) {
        let dir = std::env::temp_dir().join(format!("orchard-transfer-{}", random_hex()));
        fs::create_dir_all(&dir).unwrap();
        let held = Arc::new(Directory::open(&dir).unwrap());
        let target = EntryName::new("target.txt".as_ref()).unwrap();
        (dir, held, target)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn temp_file_is_removed_unless_persisted() {
        let (dir, held, target) = directory_with_target();
        let (_, temp) = TempFile::create(Arc::clone(&held), &target).unwrap();
        assert_eq!(names(&dir).len(), 1);
        assert!(names(&dir)[0].starts_with(".target.txt.orchard-"));
        drop(temp);
        assert!(names(&dir).is_empty());
        let (mut file, temp) = TempFile::create(held, &target).unwrap();
        file.write_all(b"hi").unwrap();
        temp.persist(0o640).unwrap();
        let target = dir.join("target.txt");
        assert_eq!(fs::read(&target).unwrap(), b"hi");
        assert_eq!(
            fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        assert_eq!(names(&dir), vec!["target.txt".to_string()]);
        fs::remove_dir_all(dir).unwrap();
    }
}
