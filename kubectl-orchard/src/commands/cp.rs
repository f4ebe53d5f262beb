//! `cp SRC DST`, kubectl-style: one side is `SANDBOX:PATH` (or `NAMESPACE/SANDBOX:PATH`), the other a
//! local path. A directory copies as a tar stream (symlinks and permission bits kept) and its contents
//! land in DST, created if missing; a file copies as a file, into DST or, when DST is an existing
//! directory, under its own name there.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use orchard_api::agent::{FileKind, FileStat};
use reqwest::Method;
use tokio::io::AsyncWriteExt;

use crate::cli::CpArgs;
use crate::error::{CliError, Result};
use crate::gateway::Gateway;
use crate::tar_stream;

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local path.
    Local(PathBuf),
    /// A path in a sandbox.
    Remote {
        /// The namespace, when the spec names one (`ns/sandbox:path`).
        namespace: Option<String>,
        /// The sandbox.
        sandbox: String,
        /// The path in it (relative paths are relative to its working directory).
        path: String,
    },
}

/// Reads a `cp` argument (pure): `SANDBOX:PATH` and `NAMESPACE/SANDBOX:PATH` are remote; anything
/// starting with `/`, `.` or `~`, or without a `:` after a name, is local.
pub fn parse_location(text: &str) -> Result<Location> {
    if text.is_empty() {
        return Err(CliError::Usage("an empty path".into()));
    }
    let local = || Location::Local(PathBuf::from(text));
    if text.starts_with(['/', '.', '~']) {
        return Ok(local());
    }
    let Some((prefix, path)) = text.split_once(':') else {
        return Ok(local());
    };
    let (namespace, sandbox) = match prefix.split_once('/') {
        Some((namespace, sandbox)) => (Some(namespace), sandbox),
        None => (None, prefix),
    };
    if sandbox.is_empty() || sandbox.contains('/') || namespace.is_some_and(str::is_empty) {
        return Ok(local());
    }
    if path.is_empty() {
        return Err(CliError::Usage(format!(
            "`{text}` names no path in sandbox {sandbox}: write {prefix}:/path"
        )));
    }
    Ok(Location::Remote {
        namespace: namespace.map(str::to_string),
        sandbox: sandbox.to_string(),
        path: path.to_string(),
    })
}

/// The direction of a copy (pure): exactly one side must be in a sandbox.
pub fn direction(src: Location, dst: Location) -> Result<(Location, Location, bool)> {
    match (&src, &dst) {
        (Location::Local(_), Location::Remote { .. }) => Ok((src, dst, true)),
        (Location::Remote { .. }, Location::Local(_)) => Ok((src, dst, false)),
        (Location::Local(_), Location::Local(_)) => Err(CliError::Usage(
            "neither side is in a sandbox: write one as SANDBOX:PATH".into(),
        )),
        (Location::Remote { .. }, Location::Remote { .. }) => Err(CliError::Usage(
            "both sides are in sandboxes: copy through a local directory".into(),
        )),
    }
}

/// `dir/name` for a path in a sandbox (pure).
pub fn remote_join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// The last component of a path in a sandbox (pure).
pub fn remote_name(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|name| !name.is_empty() && *name != "." && *name != "..")
}

/// Copies; 0 when done.
pub async fn run(gateway: &Gateway, args: CpArgs) -> Result<u8> {
    let (src, dst, upload) = direction(parse_location(&args.src)?, parse_location(&args.dst)?)?;
    match (src, dst, upload) {
        (
            Location::Local(local),
            Location::Remote {
                namespace,
                sandbox,
                path,
            },
            true,
        ) => {
            let gateway = gateway.in_namespace(namespace);
            upload_path(&gateway, &local, &sandbox, &path).await?;
        }
        (
            Location::Remote {
                namespace,
                sandbox,
                path,
            },
            Location::Local(local),
            false,
        ) => {
            let gateway = gateway.in_namespace(namespace);
            download_path(&gateway, &sandbox, &path, &local).await?;
        }
        _ => return Err(CliError::Usage("unsupported copy".into())),
    }
    Ok(0)
}

async fn stat(gateway: &Gateway, sandbox: &str, path: &str) -> Result<FileStat> {
    gateway
        .json(gateway.request(Method::GET, sandbox, &["files", "stat"], &[("path", path)])?)
        .await
}

async fn upload_path(gateway: &Gateway, local: &Path, sandbox: &str, path: &str) -> Result<()> {
    let meta = tokio::fs::metadata(local)
        .await
        .map_err(|e| CliError::local(local.display(), e))?;
    if meta.is_dir() {
        let (body, task) = tar_stream::archive(local.to_path_buf());
        let request = gateway
            .request(Method::PUT, sandbox, &["files", "tar"], &[("path", path)])?
            .header("Content-Type", "application/x-tar")
            .body(body);
        let (sent, built) = tokio::join!(gateway.send(request), task);
        built
            .map_err(|e| CliError::Local(e.to_string()))?
            .map_err(|e| CliError::Local(e.to_string()))?;
        sent?;
        return Ok(());
    }
    let target = match stat(gateway, sandbox, path).await? {
        FileStat {
            kind: Some(FileKind::Directory),
            ..
        } => {
            let name = local
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| CliError::Usage(format!("{} has no file name", local.display())))?;
            remote_join(path, name)
        }
        _ => path.to_string(),
    };
    let mode = format!("{:o}", meta.permissions().mode() & 0o7777);
    let file = tokio::fs::File::open(local)
        .await
        .map_err(|e| CliError::local(local.display(), e))?;
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
    gateway
        .send(
            gateway
                .request(
                    Method::PUT,
                    sandbox,
                    &["files"],
                    &[("path", target.as_str()), ("mode", mode.as_str())],
                )?
                .header("Content-Length", meta.len())
                .body(body),
        )
        .await?;
    Ok(())
}

async fn download_path(gateway: &Gateway, sandbox: &str, path: &str, local: &Path) -> Result<()> {
    let found = stat(gateway, sandbox, path).await?;
    if !found.exists {
        return Err(CliError::Gateway {
            status: 404,
            code: "NotFound".into(),
            message: format!("{path} does not exist in sandbox {sandbox}"),
        });
    }
    if found.kind == Some(FileKind::Directory) {
        let response = gateway
            .send(gateway.request(Method::GET, sandbox, &["files", "tar"], &[("path", path)])?)
            .await?;
        return tar_stream::unpack(response.bytes_stream(), local.to_path_buf())
            .await
            .map_err(|e| CliError::Local(e.to_string()));
    }
    let target = if local.is_dir() {
        let name = remote_name(path)
            .ok_or_else(|| CliError::Usage(format!("`{path}` has no file name")))?;
        local.join(name)
    } else {
        local.to_path_buf()
    };
    let response = gateway
        .send(gateway.request(Method::GET, sandbox, &["files"], &[("path", path)])?)
        .await?;
    let mut file = tokio::fs::File::create(&target)
        .await
        .map_err(|e| CliError::local(target.display(), e))?;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| gateway.connection(e))?;
        file.write_all(&chunk)
            .await
            .map_err(|e| CliError::local(target.display(), e))?;
    }
    file.flush()
        .await
        .map_err(|e| CliError::local(target.display(), e))?;
    if let Some(mode) = found.mode {
        tokio::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode & 0o777))
            .await
            .map_err(|e| CliError::local(target.display(), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(namespace: Option<&str>, sandbox: &str, path: &str) -> Location {
        Location::Remote {
            namespace: namespace.map(str::to_string),
            sandbox: sandbox.into(),
            path: path.into(),
        }
    }

    #[test]
    fn locations() {
        assert_eq!(
            parse_location("s1:/work").unwrap(),
            remote(None, "s1", "/work")
        );
        assert_eq!(
            parse_location("s1:rel/x").unwrap(),
            remote(None, "s1", "rel/x")
        );
        assert_eq!(
            parse_location("rl/s1:/a:b").unwrap(),
            remote(Some("rl"), "s1", "/a:b")
        );
        for local in [
            "./s1:/x", "/tmp/a:b", "dir/file", "file", "a/b/c:d", "~/x", ":x", "/ns:x",
        ] {
            assert_eq!(
                parse_location(local).unwrap(),
                Location::Local(local.into()),
                "{local}"
            );
        }
        assert!(parse_location("s1:").is_err());
        assert!(parse_location("").is_err());
    }

    #[test]
    fn exactly_one_side_is_remote() {
        let up = direction(Location::Local("a".into()), remote(None, "s", "/b")).unwrap();
        assert!(up.2);
        let down = direction(remote(None, "s", "/b"), Location::Local("a".into())).unwrap();
        assert!(!down.2);
        assert!(direction(Location::Local("a".into()), Location::Local("b".into())).is_err());
        assert!(direction(remote(None, "s", "/a"), remote(None, "t", "/b")).is_err());
    }

    #[test]
    fn remote_paths() {
        assert_eq!(remote_join("/work/", "x"), "/work/x");
        assert_eq!(remote_join("work", "x"), "work/x");
        assert_eq!(remote_name("/work/x.txt"), Some("x.txt"));
        assert_eq!(remote_name("/work/dir/"), Some("dir"));
        assert_eq!(remote_name("/"), None);
        assert_eq!(remote_name(".."), None);
    }
}
