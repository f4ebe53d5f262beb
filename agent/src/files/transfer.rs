//! Streaming file transfers. Uploads go to a temp file beside the target (renamed into place when
//! complete, removed if anything fails or the client goes away); downloads are read in fixed chunks on
//! a blocking thread. Memory per transfer is a few chunks, whatever the file size.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::entropy::random_hex;

/// Bytes per download chunk.
pub const DOWNLOAD_CHUNK: usize = 256 * 1024;
/// Chunks queued between the network and the disk thread.
pub const QUEUE_DEPTH: usize = 8;
/// Mode of a new file when the request names none.
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// A temp file that is deleted unless it was renamed into place.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
    kept: bool,
}

impl TempFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets `mode` and renames the temp file over `target`.
    pub fn persist(mut self, target: &Path, mode: u32) -> io::Result<()> {
        fs::set_permissions(&self.path, fs::Permissions::from_mode(mode))?;
        fs::rename(&self.path, target)?;
        self.kept = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Creates a fresh temp file in `directory` (same file system as the target, so the rename is atomic).
pub fn create_temp_beside(target: &Path) -> io::Result<(File, TempFile)> {
    let directory = target.parent().unwrap_or(Path::new("/"));
    let name = target
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut prefix: String = name.chars().take(64).collect();
    if prefix.is_empty() {
        prefix.push_str("file");
    }
    loop {
        let path = directory.join(format!(".{prefix}.orchard-{}.tmp", random_hex()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(file) => return Ok((file, TempFile { path, kept: false })),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
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

    #[test]
    fn temp_file_is_removed_unless_persisted() {
        let dir = std::env::temp_dir().join(format!("orchard-transfer-{}", random_hex()));
        fs::create_dir_all(&dir).unwrap();
        let target = dir.join("target.txt");
        let (_, temp) = create_temp_beside(&target).unwrap();
        let temp_path = temp.path().to_path_buf();
        assert!(temp_path.exists());
        drop(temp);
        assert!(!temp_path.exists());
        let (mut file, temp) = create_temp_beside(&target).unwrap();
        file.write_all(b"hi").unwrap();
        temp.persist(&target, 0o640).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"hi");
        assert_eq!(
            fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
            0o640
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
