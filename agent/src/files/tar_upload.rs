//! `PUT /v1/files/tar?path=DIR`: extracts a tar stream into `DIR`. The body is first spooled to an
//! unnamed file (capped at `--max-upload-bytes`), then the whole archive is checked (`tar_check`)
//! against itself and what `DIR` holds before anything is written; then it is extracted, every entry
//! reached through directory descriptors one component at a time, never through a symlink (`O_NOFOLLOW`),
//! files written to a temp file beside them and renamed into place.

use std::fs::{self, File};
use std::io::{self, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use orchard_api::agent::TarExtracted;
use serde::Deserialize;

use super::directory::{Directory, EntryName, Follow};
use super::paths::{ProtectedFiles, resolve_request_path};
use super::receive::{receive_body, upload_too_large};
use super::routes::blocking;
use super::tar_check::{EntryKind, OnDisk, archive_components, check_entries};
use super::transfer::{DEFAULT_FILE_MODE, TempFile};
use crate::entropy::random_hex;
use crate::error::{AgentError, json_response};
use crate::json_body::{DRAIN_LIMIT, drain_body};
use crate::processes::routes::query_error;
use crate::state::AppState;

/// Permission bits kept from the archive: setuid and setgid are dropped.
const KEPT_MODE_BITS: u32 = 0o1777;
/// Mode of directories while they are filled (their own mode is set once everything is written).
const FILLING_DIRECTORY_MODE: u32 = 0o700;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TarQuery {
    path: String,
}

/// An entry as the check and the extraction see it.
struct Planned {
    components: Vec<Vec<u8>>,
    kind: EntryKind,
}

fn bad_archive(error: io::Error) -> AgentError {
    AgentError::BadRequest(format!("the body is not a valid tar archive: {error}"))
}

/// The kind of a tar entry, or why it is refused; `None` for headers that carry no file (pax global
/// headers).
fn entry_kind(entry_type: tar::EntryType, shown: &str) -> Result<Option<EntryKind>, AgentError> {
    use tar::EntryType;
    match entry_type {
        EntryType::Directory => Ok(Some(EntryKind::Directory)),
        EntryType::Regular | EntryType::Continuous => Ok(Some(EntryKind::File)),
        EntryType::Symlink => Ok(Some(EntryKind::Symlink)),
        EntryType::XGlobalHeader => Ok(None),
        EntryType::Link => Err(AgentError::BadRequest(format!(
            "entry `{shown}` is a hard link; hard links are not supported (archive the file itself); nothing was written"
        ))),
        other => Err(AgentError::BadRequest(format!(
            "entry `{shown}` is of type {other:?}; only files, directories and symlinks are supported; nothing was written"
        ))),
    }
}

/// Reads the archive's entries (paths and kinds) without writing anything.
fn plan(spool: &mut File) -> Result<Vec<Planned>, AgentError> {
    spool.seek(SeekFrom::Start(0)).map_err(bad_archive)?;
    let mut archive = tar::Archive::new(BufReader::new(spool));
    let mut planned = Vec::new();
    for entry in archive.entries().map_err(bad_archive)? {
        let entry = entry.map_err(bad_archive)?;
        let raw = entry.path_bytes();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let Some(kind) = entry_kind(entry.header().entry_type(), &shown)? else {
            continue;
        };
        if kind == EntryKind::Symlink
            && entry
                .link_name_bytes()
                .is_none_or(|target| target.is_empty())
        {
            return Err(AgentError::BadRequest(format!(
                "symlink `{shown}` has no target; nothing was written"
            )));
        }
        let components = archive_components(&raw)
            .map_err(|message| AgentError::BadRequest(format!("{message}; nothing was written")))?;
        planned.push(Planned { components, kind });
    }
    Ok(planned)
}

fn relative(components: &[Vec<u8>]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    components
        .iter()
        .map(|component| std::ffi::OsStr::from_bytes(component))
        .collect()
}

/// What is at `components` below `root` now, not following symlinks.
fn on_disk(root: &Path, components: &[Vec<u8>]) -> Option<OnDisk> {
    let metadata = fs::symlink_metadata(root.join(relative(components))).ok()?;
    Some(if metadata.file_type().is_symlink() {
        OnDisk::Symlink
    } else if metadata.is_dir() {
        OnDisk::Directory
    } else {
        OnDisk::Other
    })
}

fn entry_name(component: &[u8]) -> Result<EntryName, AgentError> {
    use std::os::unix::ffi::OsStrExt;
    EntryName::new(std::ffi::OsStr::from_bytes(component)).ok_or_else(|| {
        AgentError::BadRequest(format!(
            "`{}` is not a valid name",
            String::from_utf8_lossy(component)
        ))
    })
}

/// The directory holding entry `components` (created as needed, never through a symlink) and the
/// entry's name in it.
fn parent_of(
    root: &Directory,
    components: &[Vec<u8>],
    target: &Path,
) -> Result<(Directory, EntryName), AgentError> {
    let Some((last, parents)) = components.split_last() else {
        return Err(AgentError::Internal("an entry without a name".into()));
    };
    let mut current = root
        .reopen()
        .map_err(|error| AgentError::io("cannot open", target, error))?;
    for component in parents {
        let name = entry_name(component)?;
        let shown = target.join(relative(components));
        if current.status(&name, Follow::NoSymlinks).is_err() {
            current
                .create_directory(&name, FILLING_DIRECTORY_MODE)
                .or_else(|error| match error.kind() {
                    io::ErrorKind::AlreadyExists => Ok(()),
                    _ => Err(error),
                })
                .map_err(|error| AgentError::io("cannot create a directory for", &shown, error))?;
        }
        current = current
            .open_subdirectory(&name)
            .map_err(|error| AgentError::io("cannot open a directory for", &shown, error))?;
    }
    Ok((current, entry_name(last)?))
}

/// Extracts the checked archive into `target` (created if missing).
fn extract(
    spool: &mut File,
    target: &Path,
    protected: &ProtectedFiles,
) -> Result<TarExtracted, AgentError> {
    fs::create_dir_all(target).map_err(|error| AgentError::io("cannot create", target, error))?;
    let root =
        Directory::open(target).map_err(|error| AgentError::io("cannot open", target, error))?;
    spool.seek(SeekFrom::Start(0)).map_err(bad_archive)?;
    let mut archive = tar::Archive::new(BufReader::new(spool));
    let mut answer = TarExtracted {
        path: target.display().to_string(),
        files: 0,
        directories: 0,
        symlinks: 0,
        size: 0,
    };
    let mut directory_modes = Vec::new();
    for entry in archive.entries().map_err(bad_archive)? {
        let mut entry = entry.map_err(bad_archive)?;
        let raw = entry.path_bytes().into_owned();
        let shown_name = String::from_utf8_lossy(&raw).into_owned();
        let Some(kind) = entry_kind(entry.header().entry_type(), &shown_name)? else {
            continue;
        };
        let components = archive_components(&raw).map_err(AgentError::BadRequest)?;
        if components.is_empty() {
            continue;
        }
        let shown = target.join(relative(&components));
        let mode = entry.header().mode().unwrap_or(DEFAULT_FILE_MODE) & KEPT_MODE_BITS;
        let (directory, name) = parent_of(&root, &components, target)?;
        match kind {
            EntryKind::Directory => {
                if directory.status(&name, Follow::NoSymlinks).is_err() {
                    directory
                        .create_directory(&name, FILLING_DIRECTORY_MODE)
                        .map_err(|error| AgentError::io("cannot create", &shown, error))?;
                }
                directory_modes.push((components, mode));
                answer.directories += 1;
            }
            EntryKind::File => {
                protected.check_entry(&shown, &directory, &name)?;
                let (mut file, temp) =
                    TempFile::create(Arc::new(directory), &name).map_err(|error| {
                        AgentError::io("cannot create a temp file beside", &shown, error)
                    })?;
                let written = io::copy(&mut entry, &mut file)
                    .map_err(|error| AgentError::io("cannot write", &shown, error))?;
                temp.persist(mode)
                    .map_err(|error| AgentError::io("cannot move into place", &shown, error))?;
                answer.files += 1;
                answer.size += written;
            }
            EntryKind::Symlink => {
                protected.check_entry(&shown, &directory, &name)?;
                let link_target = entry
                    .link_name()
                    .map_err(bad_archive)?
                    .map(|target| target.into_owned())
                    .unwrap_or_default();
                if directory.status(&name, Follow::NoSymlinks).is_ok() {
                    directory
                        .unlink(&name)
                        .map_err(|error| AgentError::io("cannot replace", &shown, error))?;
                }
                directory
                    .create_symlink(&link_target, &name)
                    .map_err(|error| AgentError::io("cannot create the symlink", &shown, error))?;
                answer.symlinks += 1;
            }
        }
    }
    // Deepest first, so a read-only directory does not stop its children's modes being set.
    directory_modes.sort_by_key(|(components, _)| std::cmp::Reverse(components.len()));
    for (components, mode) in directory_modes {
        let shown = target.join(relative(&components));
        let (directory, name) = parent_of(&root, &components, target)?;
        directory
            .set_subdirectory_mode(&name, mode)
            .map_err(|error| AgentError::io("cannot set the mode of", &shown, error))?;
    }
    Ok(answer)
}

/// An unnamed file to spool the body to, in the nearest existing directory at or above `target`:
/// created under a random name and unlinked at once, so nothing is left behind whatever happens.
fn spool_file(target: &Path) -> Result<File, AgentError> {
    let mut directory = target;
    while !directory.is_dir() {
        directory = directory.parent().ok_or_else(|| {
            AgentError::InvalidPath(format!("no directory above `{}`", target.display()))
        })?;
    }
    let held = Directory::open(directory)
        .map_err(|error| AgentError::io("cannot open", directory, error))?;
    let name = entry_name(format!(".orchard-tar-{}.tmp", random_hex()).as_bytes())?;
    let file = held
        .create_new_read_write_file(&name, 0o600)
        .map_err(|error| AgentError::io("cannot create a spool file in", directory, error))?;
    held.unlink(&name)
        .map_err(|error| AgentError::io("cannot unlink the spool file in", directory, error))?;
    Ok(file)
}

pub async fn upload(
    State(state): State<AppState>,
    query: Result<Query<TarQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AgentError> {
    let Query(query) = query.map_err(query_error)?;
    let target = resolve_request_path(&state.config.root, &query.path)?;
    let limit = state.config.max_upload_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        drain_body(body, DRAIN_LIMIT).await;
        return Err(upload_too_large(limit));
    }
    let protected = state.config.protected.clone();
    let prepare_target = target.clone();
    let (writer, reader) = blocking(move || {
        let target = prepare_target;
        protected.check_write(&target)?;
        if fs::symlink_metadata(&target).is_ok() && !target.is_dir() {
            return Err(AgentError::InvalidPath(format!(
                "`{}` exists and is not a directory; PUT /v1/files/tar extracts into a directory",
                target.display()
            )));
        }
        let reader = spool_file(&target)?;
        // The same open file: the archive is read back from the start once it is written.
        let writer = reader.try_clone().map_err(|error| {
            AgentError::Internal(format!("cannot duplicate the spool file: {error}"))
        })?;
        Ok((writer, reader))
    })
    .await?;
    receive_body(body, writer, limit, &target).await?;
    let protected = state.config.protected.clone();
    let extract_target = target.clone();
    let answer = blocking(move || {
        let mut spool = reader;
        let planned = plan(&mut spool)?;
        let entries: Vec<(Vec<Vec<u8>>, EntryKind)> = planned
            .into_iter()
            .map(|planned| (planned.components, planned.kind))
            .collect();
        check_entries(&entries, |components| on_disk(&extract_target, components))
            .map_err(AgentError::BadRequest)?;
        // Refused by spelling before anything is written; decided again on each entry's directory.
        for (components, kind) in &entries {
            if *kind != EntryKind::Directory && !components.is_empty() {
                protected.check_write(&extract_target.join(relative(components)))?;
            }
        }
        extract(&mut spool, &extract_target, &protected)
    })
    .await?;
    tracing::debug!(path = %target.display(), files = answer.files, "archive extracted");
    Ok(json_response(StatusCode::CREATED, &answer))
}
