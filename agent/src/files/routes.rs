//! HTTP routes of the files API: `PUT`/`GET`/`DELETE /v1/files?path=` and `GET /v1/files/list?path=`.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use orchard_api::agent::{FileDeleted, FileEntry, FileKind, FileList, FileWritten};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::directory::{Directory, Follow, split_path};
use super::paths::{Access, parse_mode, resolve_request_path};
use super::receive::{receive_body, upload_too_large};
use super::regular::{Opened, not_regular_message, open_regular};
use super::remove::delete_entry;
use super::transfer::{DEFAULT_FILE_MODE, QUEUE_DEPTH, TempFile, read_chunks};
use crate::clock::rfc3339;
use crate::error::{AgentError, json_response};
use crate::json_body::{DRAIN_LIMIT, drain_body};
use crate::processes::routes::query_error;
use crate::state::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutQuery {
    path: String,
    mode: Option<String>,
}

pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| AgentError::Internal(format!("file task failed: {error}")))?
}

pub async fn put(
    State(state): State<AppState>,
    query: Result<Query<PutQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, AgentError> {
    let Query(query) = query.map_err(query_error)?;
    let target = resolve_request_path(&state.config.root, &query.path)?;
    let explicit_mode = query.mode.as_deref().map(parse_mode).transpose()?;
    let limit = state.config.max_upload_bytes;
    let too_large = || upload_too_large(limit);
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        drain_body(body, DRAIN_LIMIT).await;
        return Err(too_large());
    }

    let protected = state.config.protected.clone();
    let prepare_target = target.clone();
    let (file, temp, mode) = blocking(move || {
        let target = prepare_target;
        // Refused early (nothing created yet) by spelling; decided below on the directory descriptor.
        protected.check_write(&target)?;
        let is_directory = || {
            AgentError::InvalidPath(format!(
                "`{}` is a directory; PUT needs a file path",
                target.display()
            ))
        };
        let split = match split_path(&target) {
            Ok(split) if !split.directory_only => split,
            _ => {
                return Err(AgentError::InvalidPath(format!(
                    "`{}` ends in `/`, `.` or `..`; PUT needs a file path",
                    target.display()
                )));
            }
        };
        if fs::metadata(&target).is_ok_and(|metadata| metadata.is_dir()) {
            return Err(is_directory());
        }
        let component_is_a_file = || {
            AgentError::InvalidPath(format!(
                "cannot create the parent directories of `{}`: a component is a file",
                target.display()
            ))
        };
        fs::create_dir_all(&split.parent).map_err(|error| match error.kind() {
            io::ErrorKind::AlreadyExists | io::ErrorKind::NotADirectory => component_is_a_file(),
            _ => AgentError::io("cannot create parent directories of", &target, error),
        })?;
        // From here on, one directory: the one checked is the one written to.
        let directory = Directory::open(&split.parent).map_err(|error| match error.kind() {
            io::ErrorKind::NotADirectory => component_is_a_file(),
            _ => AgentError::io("cannot open the directory of", &target, error),
        })?;
        let existing = directory.status(&split.name, Follow::Symlinks).ok();
        if existing.is_some_and(|status| status.is_directory()) {
            return Err(is_directory());
        }
        protected.check_entry(&target, &directory, &split.name)?;
        let (file, temp) = TempFile::create(Arc::new(directory), &split.name)
            .map_err(|error| AgentError::io("cannot create a temp file beside", &target, error))?;
        let mode = explicit_mode
            .or_else(|| existing.map(|status| status.mode))
            .unwrap_or(DEFAULT_FILE_MODE);
        Ok((file, temp, mode))
    })
    .await?;

    // Dropping `temp` on failure removes the partial file.
    let size = receive_body(body, file, limit, &target).await?;
    let final_target = target.clone();
    blocking(move || {
        temp.persist(mode).map_err(|error| {
            AgentError::io("cannot move upload into place at", &final_target, error)
        })
    })
    .await?;
    tracing::debug!(path = %target.display(), size, "file written");
    Ok(json_response(
        StatusCode::CREATED,
        &FileWritten {
            path: target.display().to_string(),
            size,
        },
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathQuery {
    path: String,
}

pub async fn get(
    State(state): State<AppState>,
    query: Result<Query<PathQuery>, QueryRejection>,
) -> Result<Response, AgentError> {
    let Query(query) = query.map_err(query_error)?;
    let path = resolve_request_path(&state.config.root, &query.path)?;
    let protected = state.config.protected.clone();
    let (file, length) = blocking(move || {
        protected.check_read(&path)?;
        match open_regular(&path).map_err(|error| AgentError::io("cannot open", &path, error))? {
            Opened::File(file, metadata) => {
                // The file opened, whatever the path resolved to by then, is what is checked.
                protected.check_opened(&path, &metadata, Access::Read)?;
                Ok((file, metadata.len()))
            }
            Opened::Directory => Err(AgentError::InvalidPath(format!(
                "`{}` is a directory; list it with GET /v1/files/list",
                path.display()
            ))),
            Opened::Special(what) => Err(AgentError::InvalidPath(not_regular_message(&path, what))),
        }
    })
    .await?;
    let (sender, mut receiver) = mpsc::channel::<io::Result<Bytes>>(QUEUE_DEPTH / 2);
    tokio::task::spawn_blocking(move || read_chunks(file, length, sender));
    let stream = futures::stream::poll_fn(move |context| receiver.poll_recv(context));
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    Ok(response)
}

pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<PathQuery>, QueryRejection>,
) -> Result<Response, AgentError> {
    let Query(query) = query.map_err(query_error)?;
    let path = resolve_request_path(&state.config.root, &query.path)?;
    let listing = blocking(move || {
        let metadata =
            fs::metadata(&path).map_err(|error| AgentError::io("cannot list", &path, error))?;
        if !metadata.is_dir() {
            return Err(AgentError::InvalidPath(format!(
                "`{}` is not a directory; download it with GET /v1/files",
                path.display()
            )));
        }
        let reader =
            fs::read_dir(&path).map_err(|error| AgentError::io("cannot list", &path, error))?;
        let mut entries = Vec::new();
        for entry in reader {
            let entry = entry.map_err(|error| AgentError::io("cannot list", &path, error))?;
            let Ok(metadata) = entry.path().symlink_metadata() else {
                continue; // removed while listing
            };
            let file_type = metadata.file_type();
            let kind = if file_type.is_symlink() {
                FileKind::Symlink
            } else if file_type.is_dir() {
                FileKind::Directory
            } else if file_type.is_file() {
                FileKind::File
            } else {
                FileKind::Other
            };
            entries.push(FileEntry {
                name: entry.file_name().to_string_lossy().into_owned(),
                kind,
                size: metadata.len(),
                mode: metadata.mode() & 0o7777,
                modified: metadata
                    .modified()
                    .ok()
                    .filter(|time| *time >= UNIX_EPOCH)
                    .map(rfc3339),
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(FileList {
            path: path.display().to_string(),
            entries,
        })
    })
    .await?;
    Ok(json_response(StatusCode::OK, &listing))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    path: String,
    recursive: Option<bool>,
}

pub async fn delete(
    State(state): State<AppState>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<Response, AgentError> {
    let Query(query) = query.map_err(query_error)?;
    let path: PathBuf = resolve_request_path(&state.config.root, &query.path)?;
    let recursive = query.recursive.unwrap_or(false);
    let protected = state.config.protected.clone();
    let deleted = blocking(move || {
        protected.check_delete(&path, recursive)?;
        delete_entry(&path, recursive, &protected)?;
        Ok(FileDeleted {
            path: path.display().to_string(),
            deleted: true,
        })
    })
    .await?;
    Ok(json_response(StatusCode::OK, &deleted))
}
