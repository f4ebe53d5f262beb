//! `GET /v1/files/stat?path=P`: what is at a path, without following a final symlink. A missing path is
//! not an error: `exists` is false.

use std::fs::{self, Metadata};
use std::os::unix::fs::MetadataExt;
use std::time::UNIX_EPOCH;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use orchard_api::agent::{FileKind, FileStat};
use serde::Deserialize;

use super::paths::resolve_request_path;
use super::routes::blocking;
use crate::clock::rfc3339;
use crate::error::{AgentError, json_response};
use crate::processes::routes::query_error;
use crate::state::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatQuery {
    path: String,
}

/// The kind of an entry from its (not followed) metadata.
pub fn kind_of(metadata: &Metadata) -> FileKind {
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Directory
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// The stat answer for `path` given its metadata (`None`: nothing there) and symlink target.
pub fn file_stat(path: String, metadata: Option<&Metadata>, target: Option<String>) -> FileStat {
    match metadata {
        None => FileStat {
            path,
            exists: false,
            kind: None,
            size: None,
            mode: None,
            modified: None,
            uid: None,
            gid: None,
            target: None,
        },
        Some(metadata) => FileStat {
            path,
            exists: true,
            kind: Some(kind_of(metadata)),
            size: Some(metadata.len()),
            mode: Some(metadata.mode() & 0o7777),
            modified: metadata
                .modified()
                .ok()
                .filter(|time| *time >= UNIX_EPOCH)
                .map(rfc3339),
            uid: Some(metadata.uid()),
            gid: Some(metadata.gid()),
            target,
        },
    }
}

pub async fn stat(
    State(state): State<AppState>,
    query: Result<Query<StatQuery>, QueryRejection>,
) -> Result<Response, AgentError> {
    let Query(query) = query.map_err(query_error)?;
    let path = resolve_request_path(&state.config.root, &query.path)?;
    let protected = state.config.protected.clone();
    let answer = blocking(move || {
        protected.check_read(&path)?;
        let shown = path.display().to_string();
        match fs::symlink_metadata(&path) {
            Ok(metadata) => {
                let target = metadata
                    .file_type()
                    .is_symlink()
                    .then(|| fs::read_link(&path).ok())
                    .flatten()
                    .map(|target| target.display().to_string());
                Ok(file_stat(shown, Some(&metadata), target))
            }
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                Ok(file_stat(shown, None, None))
            }
            Err(error) => Err(AgentError::io("cannot stat", &path, error)),
        }
    })
    .await?;
    Ok(json_response(StatusCode::OK, &answer))
}
