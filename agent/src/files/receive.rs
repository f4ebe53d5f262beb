//! Receiving an upload's body into a file: streamed through a small queue to a blocking writer
//! thread, capped at `--max-upload-bytes` (413, with the rest of an oversized body read and discarded up
//! to a limit so ordinary clients see the answer). Shared by `PUT /v1/files` and `PUT /v1/files/tar`.

use std::fs::File;
use std::path::Path;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::transfer::{QUEUE_DEPTH, write_chunks};
use crate::error::AgentError;
use crate::json_body::DRAIN_LIMIT;

/// The 413 of an upload over `limit` bytes.
pub fn upload_too_large(limit: u64) -> AgentError {
    AgentError::PayloadTooLarge(format!(
        "upload exceeds the {limit}-byte limit (--max-upload-bytes)"
    ))
}

/// Writes `body` to `file` (which `target` names in messages); the number of bytes written.
pub async fn receive_body(
    body: Body,
    file: File,
    limit: u64,
    target: &Path,
) -> Result<u64, AgentError> {
    let (chunks, receiver) = mpsc::channel::<Bytes>(QUEUE_DEPTH);
    let writer = tokio::task::spawn_blocking(move || write_chunks(receiver, file));
    let mut body = body.into_data_stream();
    let mut size: u64 = 0;
    let mut failure = None;
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(chunk) => {
                size += chunk.len() as u64;
                if size > limit {
                    failure = Some(upload_too_large(limit));
                    let mut drained = 0u64;
                    while drained <= DRAIN_LIMIT {
                        match body.next().await {
                            Some(Ok(chunk)) => drained += chunk.len() as u64,
                            _ => break,
                        }
                    }
                    break;
                }
                if chunks.send(chunk).await.is_err() {
                    break; // the writer failed; its error is reported below
                }
            }
            Err(error) => {
                failure = Some(AgentError::BadRequest(format!(
                    "upload interrupted: {error}"
                )));
                break;
            }
        }
    }
    drop(chunks);
    let written = writer
        .await
        .map_err(|error| AgentError::Internal(format!("file writer failed: {error}")))?;
    if let Some(failure) = failure {
        return Err(failure);
    }
    written.map_err(|error| AgentError::io("cannot write", target, error))?;
    Ok(size)
}
