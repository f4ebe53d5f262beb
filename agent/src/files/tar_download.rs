//! `GET /v1/files/tar?path=DIR`: `DIR` as a tar stream, written on a blocking thread while it is sent.
//! Symlinks are archived as symlinks, never followed; files other than regular files, directories and
//! symlinks (sockets, FIFOs, devices) are left out. A directory holding the token file is refused
//! before anything is sent; a file that turns out to be the token (a hard link) is left out.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::directory::Directory;
use super::paths::{Access, ProtectedFiles, resolve_request_path};
use super::routes::blocking;
use super::transfer::{DOWNLOAD_CHUNK, QUEUE_DEPTH};
use crate::error::AgentError;
use crate::processes::routes::query_error;
use crate::state::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TarQuery {
    path: String,
}

/// Sends what is written to it as body chunks of up to [`DOWNLOAD_CHUNK`] bytes.
struct ChunkSender {
    chunks: mpsc::Sender<io::Result<Bytes>>,
    buffer: Vec<u8>,
}

impl ChunkSender {
    fn send_buffer(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::take(&mut self.buffer));
        self.chunks
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl Write for ChunkSender {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= DOWNLOAD_CHUNK {
            self.send_buffer()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buffer()
    }
}

/// Exactly `length` bytes of a file: zeros after an early end (the file shrank while it was read), so
/// the archive stays well-formed.
struct ExactLength {
    file: io::Take<File>,
    missing: u64,
}

impl Read for ExactLength {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.file.read(buffer)?;
        if read > 0 || buffer.is_empty() {
            self.missing -= read as u64;
            return Ok(read);
        }
        let zeros = buffer
            .len()
            .min(usize::try_from(self.missing).unwrap_or(usize::MAX));
        buffer[..zeros].fill(0);
        self.missing -= zeros as u64;
        Ok(zeros)
    }
}

fn header_for(metadata: &Metadata, entry_type: tar::EntryType) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_metadata_in_mode(metadata, tar::HeaderMode::Complete);
    header.set_entry_type(entry_type);
    if entry_type != tar::EntryType::Regular {
        header.set_size(0);
    }
    header
}

/// Writes the tree under `root` (entries named relative to it) as a tar archive to `out`.
fn write_archive(root: &Path, protected: &ProtectedFiles, out: impl Write) -> io::Result<()> {
    let mut builder = tar::Builder::new(out);
    builder.follow_symlinks(false);
    // Depth first, names sorted: the same tree gives the same archive.
    let mut pending: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let directory = root.join(&relative);
        let mut names: Vec<_> = match fs::read_dir(&directory) {
            Ok(entries) => entries
                .filter_map(|entry| entry.ok().map(|entry| entry.file_name()))
                .collect(),
            Err(error) if relative.as_os_str().is_empty() => return Err(error),
            Err(_) => continue, // removed or unreadable meanwhile
        };
        names.sort();
        let mut subdirectories = Vec::new();
        for name in names {
            let path = directory.join(&name);
            let inside = relative.join(&name);
            let Ok(metadata) = fs::symlink_metadata(&path) else {
                continue;
            };
            let file_type = metadata.file_type();
            if file_type.is_symlink() {
                let Ok(target) = fs::read_link(&path) else {
                    continue;
                };
                let mut header = header_for(&metadata, tar::EntryType::Symlink);
                builder.append_link(&mut header, &inside, &target)?;
            } else if file_type.is_dir() {
                let mut header = header_for(&metadata, tar::EntryType::Directory);
                builder.append_data(&mut header, &inside, io::empty())?;
                subdirectories.push(inside);
            } else if file_type.is_file() {
                let Ok(file) = OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
                    .open(&path)
                else {
                    continue;
                };
                let Ok(opened) = file.metadata() else {
                    continue;
                };
                if !opened.is_file() {
                    continue;
                }
                if protected
                    .check_opened(&path, &opened, Access::Read)
                    .is_err()
                {
                    tracing::warn!(path = %path.display(), "left the token file out of a tar download");
                    continue;
                }
                let mut header = header_for(&opened, tar::EntryType::Regular);
                let length = opened.len();
                let data = ExactLength {
                    file: file.take(length),
                    missing: length,
                };
                builder.append_data(&mut header, &inside, data)?;
            }
        }
        // Reversed onto the stack, so they are taken in name order.
        pending.extend(subdirectories.into_iter().rev());
    }
    builder.into_inner()?.flush()
}

pub async fn download(
    State(state): State<AppState>,
    query: Result<Query<TarQuery>, QueryRejection>,
) -> Result<Response, AgentError> {
    let Query(query) = query.map_err(query_error)?;
    let path = resolve_request_path(&state.config.root, &query.path)?;
    let protected = state.config.protected.clone();
    let checked = path.clone();
    let protected_for_check = protected.clone();
    blocking(move || {
        let metadata = fs::metadata(&checked)
            .map_err(|error| AgentError::io("cannot archive", &checked, error))?;
        if !metadata.is_dir() {
            return Err(AgentError::InvalidPath(format!(
                "`{}` is not a directory; download a file with GET /v1/files",
                checked.display()
            )));
        }
        let top = Directory::open(&checked)
            .map_err(|error| AgentError::io("cannot open", &checked, error))?;
        protected_for_check.check_tree_read(&checked, &top)
    })
    .await?;
    let (chunks, mut receiver) = mpsc::channel::<io::Result<Bytes>>(QUEUE_DEPTH / 2);
    tokio::task::spawn_blocking(move || {
        let sender = ChunkSender {
            chunks: chunks.clone(),
            buffer: Vec::with_capacity(DOWNLOAD_CHUNK),
        };
        if let Err(error) = write_archive(&path, &protected, sender) {
            tracing::debug!(path = %path.display(), %error, "tar download ended early");
            let _ = chunks.blocking_send(Err(error));
        }
    });
    let stream = futures::stream::poll_fn(move |context| receiver.poll_recv(context));
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_files_are_padded_to_their_length() {
        let dir =
            std::env::temp_dir().join(format!("orchard-exact-{}", crate::entropy::random_hex()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("f"), b"abc").unwrap();
        let file = File::open(dir.join("f")).unwrap();
        let mut exact = ExactLength {
            file: file.take(5),
            missing: 5,
        };
        let mut bytes = Vec::new();
        exact.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes, b"abc\0\0");
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn archives_keep_symlinks_and_leave_out_the_token() {
        use std::os::unix::fs::symlink;
        let dir =
            std::env::temp_dir().join(format!("orchard-archive-{}", crate::entropy::random_hex()));
        fs::create_dir_all(dir.join("tree/sub")).unwrap();
        fs::create_dir_all(dir.join("secret")).unwrap();
        fs::write(dir.join("secret/token"), b"t").unwrap();
        fs::write(dir.join("tree/sub/a.txt"), b"hello").unwrap();
        symlink("/etc/passwd", dir.join("tree/link")).unwrap();
        fs::hard_link(dir.join("secret/token"), dir.join("tree/hard")).unwrap();
        let protected = ProtectedFiles::new(None, Some(&dir.join("secret/token")));
        let mut bytes = Vec::new();
        write_archive(&dir.join("tree"), &protected, &mut bytes).unwrap();
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let kind = entry.header().entry_type();
            let mut content = String::new();
            if kind == tar::EntryType::Regular {
                entry.read_to_string(&mut content).unwrap();
            }
            let target = entry
                .link_name()
                .unwrap()
                .map(|target| target.display().to_string());
            seen.push((path, kind, content, target));
        }
        assert_eq!(
            seen,
            vec![
                (
                    "link".into(),
                    tar::EntryType::Symlink,
                    String::new(),
                    Some("/etc/passwd".into())
                ),
                ("sub".into(), tar::EntryType::Directory, String::new(), None),
                (
                    "sub/a.txt".into(),
                    tar::EntryType::Regular,
                    "hello".into(),
                    None
                ),
            ]
        );
        fs::remove_dir_all(dir).unwrap();
    }
}
