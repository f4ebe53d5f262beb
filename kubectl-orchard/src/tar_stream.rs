//! Local directories as tar streams, like `tar` does it: symlinks archived as symlinks (never
//! followed), permission bits kept both ways. The tar work runs on blocking threads, bridged to the
//! HTTP bodies by [`crate::stream_io`].

use std::io::{self, Write};
use std::path::PathBuf;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::stream_io::{ChannelReader, ChannelWriter};

/// Chunks buffered between the tar thread and the HTTP body.
const DEPTH: usize = 8;

/// A request body streaming `dir`'s tree as a tar archive (entries relative to `dir`, `dir` itself
/// left out), and the task building it (its error says what could not be read).
pub fn archive(dir: PathBuf) -> (reqwest::Body, JoinHandle<io::Result<()>>) {
    let (writer, receiver) = ChannelWriter::new(DEPTH);
    let failure = writer.failure_handle();
    let task = tokio::task::spawn_blocking(move || {
        let mut builder = tar::Builder::new(writer);
        builder.follow_symlinks(false);
        let built = builder
            .append_dir_all("", &dir)
            .and_then(|()| builder.into_inner())
            .and_then(|mut writer| writer.flush());
        if let Err(error) = &built {
            // Before the builder's drop writes the end of the archive: the body must fail, not end.
            failure.fail(io::Error::new(error.kind(), error.to_string()));
        }
        built.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))
    });
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (chunk, receiver))
    });
    (reqwest::Body::wrap_stream(stream), task)
}

/// Extracts the tar stream `body` into `dest` (created if missing): existing files are replaced.
pub async fn unpack(
    body: impl futures::Stream<Item = reqwest::Result<Bytes>> + Unpin,
    dest: PathBuf,
) -> io::Result<()> {
    std::fs::create_dir_all(&dest)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dest.display())))?;
    let (sender, receiver) = mpsc::channel(DEPTH);
    let unpacking = tokio::task::spawn_blocking(move || {
        let mut archive = tar::Archive::new(ChannelReader::new(receiver));
        archive.set_overwrite(true);
        archive.unpack(&dest)
    });
    let mut body = body;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(io::Error::other);
        let failed = chunk.is_err();
        // A closed channel means the unpacking ended (with an error): it says why below.
        if sender.send(chunk).await.is_err() || failed {
            break;
        }
    }
    drop(sender);
    unpacking.await.map_err(io::Error::other)?
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kubectl-orchard-test-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[tokio::test]
    async fn a_tree_round_trips_with_modes_and_symlinks() {
        let root = scratch("roundtrip");
        let src = root.join("src");
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::write(src.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
        std::fs::set_permissions(src.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::write(src.join("sub/data.txt"), "data").unwrap();
        std::os::unix::fs::symlink("sub/data.txt", src.join("link")).unwrap();

        let (body, task) = archive(src.clone());
        let bytes = http_body_util::BodyExt::collect(body)
            .await
            .unwrap()
            .to_bytes();
        task.await.unwrap().unwrap();
        let dest = root.join("dest");
        let stream = futures::stream::iter(
            bytes
                .chunks(1000)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect::<Vec<_>>(),
        );
        unpack(stream, dest.clone()).await.unwrap();

        let mode = std::fs::metadata(dest.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            std::fs::read_link(dest.join("link")).unwrap(),
            PathBuf::from("sub/data.txt")
        );
        assert_eq!(std::fs::read_to_string(dest.join("link")).unwrap(), "data");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[tokio::test]
    async fn a_missing_directory_fails_the_body() {
        let (body, task) = archive(PathBuf::from("/nonexistent/kubectl-orchard"));
        assert!(http_body_util::BodyExt::collect(body).await.is_err());
        let error = task.await.unwrap().unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/kubectl-orchard"),
            "{error}"
        );
    }
}
