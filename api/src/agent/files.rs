//! Files: listings, writes, deletes, stat, mkdir, rename and directory tar streams.

use serde::{Deserialize, Serialize};

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Directory,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (socket, device, fifo).
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileEntry {
    /// File name.
    pub name: String,
    /// `file`, `directory`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    /// Modification time (RFC 3339).
    pub modified: Option<String>,
}

/// A directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileList {
    /// Absolute path listed.
    pub path: String,
    /// Entries sorted by name.
    pub entries: Vec<FileEntry>,
}

/// Answer of an upload: `{"path": "/abs/P", "size": N}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileWritten {
    /// Absolute path written.
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

/// Answer of a file delete: `{"path": "/abs/P", "deleted": true}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileDeleted {
    /// Absolute path.
    pub path: String,
    /// Always true (a missing path is a 404).
    pub deleted: bool,
}

/// Answer of `GET /v1/files/stat?path=P`: what is at `P`, without following a final symlink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileStat {
    /// Absolute path asked about.
    pub path: String,
    /// Whether anything is there (the other fields are null when not).
    pub exists: bool,
    /// `file`, `directory`, `symlink` (not followed) or `other`.
    #[serde(rename = "type")]
    pub kind: Option<FileKind>,
    /// Size in bytes (of the symlink itself for a symlink).
    pub size: Option<u64>,
    /// Permission bits (`mode & 0o7777`).
    pub mode: Option<u32>,
    /// Modification time (RFC 3339).
    pub modified: Option<String>,
    /// Owner's uid.
    pub uid: Option<u32>,
    /// Owner's gid.
    pub gid: Option<u32>,
    /// A symlink's target, as stored in the link.
    pub target: Option<String>,
}

/// Body of `POST /v1/files/mkdir`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// Directory to create (absolute or relative to the agent's root).
    pub path: String,
    /// Create missing parents too, and accept an existing directory (`mkdir -p`); default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parents: Option<bool>,
    /// Octal permission bits of the new directories (default `0755`, less the umask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// Answer of `POST /v1/files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DirectoryCreated {
    /// Absolute path of the directory.
    pub path: String,
    /// False when it existed already (`parents: true`).
    pub created: bool,
}

/// Body of `POST /v1/files/rename`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// Entry to move (a symlink itself, never its target).
    pub from: String,
    /// New path (same file system as `from`).
    pub to: String,
    /// Replace an existing file (or empty directory) at `to`; default false (409 instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<bool>,
}

/// Answer of `POST /v1/files/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Renamed {
    /// Absolute old path.
    pub from: String,
    /// Absolute new path.
    pub to: String,
}

/// Answer of `PUT /v1/files/tar?path=DIR`: what the archive put into `DIR`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TarExtracted {
    /// Absolute path of the directory extracted into.
    pub path: String,
    /// Regular files written.
    pub files: u64,
    /// Directories created or updated.
    pub directories: u64,
    /// Symlinks created.
    pub symlinks: u64,
    /// Bytes of file content written.
    pub size: u64,
}
