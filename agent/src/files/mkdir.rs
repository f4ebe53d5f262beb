//! `POST /v1/files/mkdir`: creates a directory (with `parents`, its missing parents too, and an existing
//! directory is fine, as `mkdir -p`).

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::DirBuilderExt;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use orchard_api::agent::{DirectoryCreated, MkdirRequest};

use super::paths::{parse_mode, resolve_request_path};
use super::routes::blocking;
use crate::error::{AgentError, json_response};
use crate::json_body::JsonBody;
use crate::state::AppState;

/// Mode of new directories when the request names none.
pub const DEFAULT_DIRECTORY_MODE: u32 = 0o755;

pub async fn mkdir(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<MkdirRequest>,
) -> Result<Response, AgentError> {
    let path = resolve_request_path(&state.config.root, &request.path)?;
    let mode = request
        .mode
        .as_deref()
        .map(parse_mode)
        .transpose()?
        .unwrap_or(DEFAULT_DIRECTORY_MODE);
    let parents = request.parents.unwrap_or(false);
    let protected = state.config.protected.clone();
    let (status, created) = blocking(move || {
        protected.check_write(&path)?;
        let existed = fs::metadata(&path).is_ok_and(|metadata| metadata.is_dir());
        if existed && parents {
            return Ok((
                StatusCode::OK,
                DirectoryCreated {
                    path: path.display().to_string(),
                    created: false,
                },
            ));
        }
        let mut builder = DirBuilder::new();
        builder.recursive(parents).mode(mode);
        builder.create(&path).map_err(|error| match error.kind() {
            io::ErrorKind::AlreadyExists => AgentError::conflict(format!(
                "`{}` already exists; pass `parents: true` to accept an existing directory",
                path.display()
            )),
            io::ErrorKind::NotFound => AgentError::NotFound(format!(
                "the parent of `{}` does not exist; pass `parents: true` to create it",
                path.display()
            )),
            _ => AgentError::io("cannot create the directory", &path, error),
        })?;
        Ok((
            StatusCode::CREATED,
            DirectoryCreated {
                path: path.display().to_string(),
                created: true,
            },
        ))
    })
    .await?;
    Ok(json_response(status, &created))
}
