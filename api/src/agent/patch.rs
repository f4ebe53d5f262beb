//! Patches: unified diffs applied by the agent, and what became of each file and hunk.

use serde::{Deserialize, Serialize};

/// `{"patch": "<git diff>", "cwd": "repo", "strip": 1}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PatchRequest {
    /// Unified diff.
    pub patch: String,
    /// Directory the paths are relative to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Leading path components to strip (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strip: Option<usize>,
}

/// What a patch did to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PatchAction {
    /// The file is new.
    Created,
    /// The file existed and changed.
    Modified,
    /// The file was removed.
    Deleted,
}

/// One file a patch changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PatchedFile {
    /// Path as written in the patch (after `strip`).
    pub path: String,
    /// `created`, `modified` or `deleted`.
    pub action: PatchAction,
}

/// `{"applied": true, "files": [{"path", "action"}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PatchResult {
    /// Always true on 200.
    pub applied: bool,
    /// Changed files with `created`, `modified` or `deleted`.
    pub files: Vec<PatchedFile>,
}

/// One hunk of a patch that did not apply (part of a `PatchConflict` error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FailedHunk {
    /// Path of the file.
    pub path: String,
    /// 1-based index of the hunk within its file; 0 when the whole file failed (e.g. missing).
    pub hunk: usize,
    /// The hunk's `@@` header.
    pub header: String,
    /// Why it did not apply.
    pub reason: String,
}
