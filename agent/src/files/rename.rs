//! `POST /v1/files/rename`: moves an entry (a symlink itself, never its target) within one file
//! system. Both ends are acted on through descriptors of their directories and checked there, like
//! uploads and deletes: neither protected file may be moved or replaced, nor a directory holding one
//! moved.

use std::io;
use std::path::Path;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use orchard_api::agent::{RenameRequest, Renamed};

use super::directory::{Directory, Follow, SplitPath, split_path};
use super::paths::resolve_request_path;
use super::routes::blocking;
use crate::error::{AgentError, json_response};
use crate::json_body::JsonBody;
use crate::state::AppState;

fn entry_of(path: &Path) -> Result<SplitPath, AgentError> {
    split_path(path).map_err(|_| {
        AgentError::InvalidPath(format!(
            "`{}` names no entry (it is `/` or ends in `.` or `..`)",
            path.display()
        ))
    })
}

pub async fn rename(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<RenameRequest>,
) -> Result<Response, AgentError> {
    let from = resolve_request_path(&state.config.root, &request.from)?;
    let to = resolve_request_path(&state.config.root, &request.to)?;
    let overwrite = request.overwrite.unwrap_or(false);
    let protected = state.config.protected.clone();
    let renamed = blocking(move || {
        protected.check_delete(&from, true)?;
        protected.check_write(&to)?;
        let source = entry_of(&from)?;
        let target = entry_of(&to)?;
        let source_directory = Directory::open(&source.parent)
            .map_err(|error| AgentError::io("cannot open the directory of", &from, error))?;
        let target_directory = Directory::open(&target.parent)
            .map_err(|error| AgentError::io("cannot open the directory of", &to, error))?;
        let status = source_directory
            .status(&source.name, Follow::NoSymlinks)
            .map_err(|error| AgentError::io("cannot rename", &from, error))?;
        protected.check_entry(&from, &source_directory, &source.name)?;
        if status.is_directory() {
            let moved = source_directory
                .open_subdirectory(&source.name)
                .map_err(|error| AgentError::io("cannot rename", &from, error))?;
            protected.check_tree(&from, &moved)?;
        }
        protected.check_entry(&to, &target_directory, &target.name)?;
        source_directory
            .rename_to(&source.name, &target_directory, &target.name, !overwrite)
            .map_err(|error| match error.raw_os_error() {
                Some(libc::EEXIST) => AgentError::conflict(format!(
                    "`{}` exists; pass `overwrite: true` to replace it",
                    to.display()
                )),
                Some(libc::EXDEV) => AgentError::InvalidPath(format!(
                    "`{}` and `{}` are on different file systems; rename cannot move between them",
                    from.display(),
                    to.display()
                )),
                Some(libc::ENOTEMPTY) => AgentError::conflict(format!(
                    "`{}` is a directory that is not empty",
                    to.display()
                )),
                _ if error.kind() == io::ErrorKind::InvalidInput => {
                    AgentError::InvalidPath(format!("cannot move `{}` into itself", from.display()))
                }
                _ => AgentError::io("cannot rename", &from, error),
            })?;
        Ok(Renamed {
            from: from.display().to_string(),
            to: to.display().to_string(),
        })
    })
    .await?;
    Ok(json_response(StatusCode::OK, &renamed))
}
