//! The files API beyond single files: stat, mkdir, rename, and directories as tar streams (round trip,
//! modes and symlinks kept, traversal refusals that write nothing, the token file).

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Agent, AgentOptions, TOKEN, TempDir};

fn query(path: &Path) -> String {
    path.display()
        .to_string()
        .replace('%', "%25")
        .replace(' ', "%20")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_describes_without_following_and_missing_is_not_an_error() {
    let agent = Agent::start();
    let root = agent.root.path();
    std::fs::write(root.join("file.txt"), "12345").unwrap();
    std::fs::set_permissions(
        root.join("file.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    symlink("file.txt", root.join("link")).unwrap();
    let (status, file) = agent.get("/v1/files/stat?path=file.txt").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            file["exists"].as_bool(),
            file["type"].as_str(),
            file["size"].as_u64(),
            file["mode"].as_u64()
        ),
        (Some(true), Some("file"), Some(5), Some(0o640))
    );
    assert!(file["modified"].as_str().unwrap().ends_with('Z'));
    assert_eq!(file["path"], root.join("file.txt").display().to_string());
    let (_, dir) = agent.get("/v1/files/stat?path=dir").await;
    assert_eq!(dir["type"], "directory");
    let (_, link) = agent.get("/v1/files/stat?path=link").await;
    assert_eq!(
        (link["type"].as_str(), link["target"].as_str()),
        (Some("symlink"), Some("file.txt"))
    );
    let (status, missing) = agent.get("/v1/files/stat?path=nope/deeper").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (missing["exists"].as_bool(), &missing["type"]),
        (Some(false), &Value::Null)
    );
    let (status, refused) = agent
        .get(&format!("/v1/files/stat?path={}", query(&agent.token_file)))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mkdir_and_rename() {
    let agent = Agent::start();
    let root = agent.root.path();
    let (status, created) = agent
        .json(Method::POST, "/v1/files/mkdir", json!({"path": "a"}))
        .await;
    assert_eq!(
        (status, created["created"].as_bool()),
        (StatusCode::CREATED, Some(true)),
        "{created}"
    );
    let (status, _) = agent
        .json(Method::POST, "/v1/files/mkdir", json!({"path": "a"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, again) = agent
        .json(
            Method::POST,
            "/v1/files/mkdir",
            json!({"path": "a", "parents": true}),
        )
        .await;
    assert_eq!(
        (status, again["created"].as_bool()),
        (StatusCode::OK, Some(false))
    );
    let (status, _) = agent
        .json(Method::POST, "/v1/files/mkdir", json!({"path": "x/y/z"}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/files/mkdir",
            json!({"path": "x/y/z", "parents": true, "mode": "0700"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        std::fs::metadata(root.join("x/y/z")).unwrap().mode() & 0o777,
        0o700
    );
    std::fs::write(root.join("x/file"), "f").unwrap();
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/files/mkdir",
            json!({"path": "x/file", "parents": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "a file is in the way");

    std::fs::write(root.join("a/one"), "1").unwrap();
    std::fs::write(root.join("a/two"), "2").unwrap();
    let (status, renamed) = agent
        .json(
            Method::POST,
            "/v1/files/rename",
            json!({"from": "a/one", "to": "x/moved"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{renamed}");
    assert_eq!(std::fs::read_to_string(root.join("x/moved")).unwrap(), "1");
    assert!(!root.join("a/one").exists());
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/files/rename",
            json!({"from": "a/two", "to": "x/moved"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "no overwrite by default");
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/files/rename",
            json!({"from": "a/two", "to": "x/moved", "overwrite": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(std::fs::read_to_string(root.join("x/moved")).unwrap(), "2");
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/files/rename",
            json!({"from": "a", "to": "renamed-dir"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(root.join("renamed-dir").is_dir());
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/files/rename",
            json!({"from": "missing", "to": "b"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let token = agent.token_file.display().to_string();
    for body in [
        json!({"from": token, "to": "stolen"}),
        json!({"from": "secrets", "to": "stolen-dir"}),
        json!({"from": "x/moved", "to": token, "overwrite": true}),
    ] {
        let (status, error) = agent
            .json(Method::POST, "/v1/files/rename", body.clone())
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}: {error}");
    }
    assert!(agent.token_file.exists());
}

async fn download(agent: &Agent, path: &str) -> (StatusCode, Vec<u8>) {
    let (status, bytes) = agent
        .call(Method::GET, &format!("/v1/files/tar?path={path}"), "")
        .await;
    (status, bytes.to_vec())
}

async fn upload(agent: &Agent, path: &str, archive: Vec<u8>) -> (StatusCode, Value) {
    let (status, bytes) = agent
        .call(Method::PUT, &format!("/v1/files/tar?path={path}"), archive)
        .await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_round_trip_as_tar_with_modes_and_symlinks() {
    let agent = Agent::start();
    let root = agent.root.path();
    let tree = root.join("tree");
    std::fs::create_dir_all(tree.join("src/deep")).unwrap();
    std::fs::write(tree.join("src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(tree.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(tree.join("run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::write(
        tree.join("src/deep/big.bin"),
        vec![7u8; 3 * 1024 * 1024 + 5],
    )
    .unwrap();
    std::fs::set_permissions(
        tree.join("src/deep"),
        std::fs::Permissions::from_mode(0o711),
    )
    .unwrap();
    symlink("src/main.rs", tree.join("main-link")).unwrap();
    symlink("/etc/passwd", tree.join("outside-link")).unwrap();

    let (status, archive) = download(&agent, "tree").await;
    assert_eq!(status, StatusCode::OK);
    let (status, extracted) = upload(&agent, "copy/of/tree", archive.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{extracted}");
    assert_eq!(
        (
            extracted["files"].as_u64(),
            extracted["directories"].as_u64(),
            extracted["symlinks"].as_u64()
        ),
        (Some(3), Some(2), Some(2)),
        "{extracted}"
    );
    let copy = root.join("copy/of/tree");
    assert_eq!(
        std::fs::read_to_string(copy.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    assert_eq!(
        std::fs::read(copy.join("src/deep/big.bin")).unwrap().len(),
        3 * 1024 * 1024 + 5
    );
    assert_eq!(
        std::fs::metadata(copy.join("run.sh")).unwrap().mode() & 0o777,
        0o750
    );
    assert_eq!(
        std::fs::metadata(copy.join("src/deep")).unwrap().mode() & 0o777,
        0o711
    );
    assert_eq!(
        std::fs::read_link(copy.join("main-link")).unwrap(),
        Path::new("src/main.rs")
    );
    assert_eq!(
        std::fs::read_link(copy.join("outside-link")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert!(
        std::fs::symlink_metadata(copy.join("outside-link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // Extracting again over the copy replaces files and keeps going.
    std::fs::write(copy.join("src/main.rs"), "changed").unwrap();
    let (status, _) = upload(&agent, "copy/of/tree", archive).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        std::fs::read_to_string(copy.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );

    let (status, _) = download(&agent, "tree/run.sh").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = download(&agent, "missing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = download(&agent, ".").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the root holds the token file"
    );
    let (status, _) = upload(&agent, "tree/run.sh", Vec::new()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "not a directory");
    let (status, _) = upload(&agent, "garbage", b"not a tar archive at all".repeat(40)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(!root.join("garbage").exists());
}

/// A tar header naming `path` as given (the tar crate's own setters refuse `..` and absolute paths).
fn raw_entry(
    builder: &mut tar::Builder<Vec<u8>>,
    path: &str,
    kind: tar::EntryType,
    data: &[u8],
    link: Option<&str>,
) {
    let mut header = tar::Header::new_old();
    header.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    if let Some(link) = link {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_size(data.len() as u64);
    header.set_cksum();
    builder.append(&header, data).unwrap();
}

fn archive(entries: &[(&str, tar::EntryType, &str, Option<&str>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, kind, data, link) in entries {
        raw_entry(&mut builder, path, *kind, data.as_bytes(), *link);
    }
    builder.into_inner().unwrap()
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = walk(dir);
    names.sort();
    names
}

fn walk(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        names.push(path.display().to_string());
        if entry.file_type().unwrap().is_dir() {
            names.extend(walk(&path));
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traversal_is_refused_and_writes_nothing() {
    use tar::EntryType::{Directory, Regular, Symlink};
    let agent = Agent::start();
    let root = agent.root.path();
    let outside = TempDir::new("outside");
    std::fs::create_dir_all(root.join("existing")).unwrap();
    std::fs::write(root.join("existing/keep.txt"), "keep").unwrap();
    symlink(outside.path(), root.join("existing/escape")).unwrap();
    let outside_link = outside.path().display().to_string();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "dot-dot",
            archive(&[
                ("ok.txt", Regular, "fine", None),
                ("../evil", Regular, "x", None),
            ]),
        ),
        (
            "deeper dot-dot",
            archive(&[
                ("a/", Directory, "", None),
                ("a/../../evil", Regular, "x", None),
            ]),
        ),
        (
            "absolute",
            archive(&[
                ("ok.txt", Regular, "fine", None),
                ("/tmp/orchard-evil", Regular, "x", None),
            ]),
        ),
        (
            "through the archive's symlink",
            archive(&[
                ("ok.txt", Regular, "fine", None),
                ("esc", Symlink, "", Some(&outside_link)),
                ("esc/evil", Regular, "x", None),
            ]),
        ),
        (
            "through a symlink already there",
            archive(&[
                ("ok.txt", Regular, "fine", None),
                ("escape/evil", Regular, "x", None),
            ]),
        ),
        (
            "a hard link",
            archive(&[
                ("ok.txt", Regular, "fine", None),
                ("hard", tar::EntryType::Link, "", Some("/etc/shadow")),
            ]),
        ),
    ];
    for (case, bytes) in cases {
        let before_root = listing(root);
        let before_outside = listing(outside.path());
        // The symlink already there is in `existing` only: into a fresh directory the archive is fine.
        let targets: &[&str] = if case == "through a symlink already there" {
            &["existing"]
        } else {
            &["existing", "fresh/dir"]
        };
        for target in targets {
            let (status, error) = upload(&agent, target, bytes.clone()).await;
            assert_eq!(
                (status, error["code"].as_str()),
                (StatusCode::BAD_REQUEST, Some("BadRequest")),
                "{case} into {target}: {error}"
            );
            assert!(
                error["message"]
                    .as_str()
                    .unwrap()
                    .contains("nothing was written"),
                "{case}: {error}"
            );
        }
        assert_eq!(listing(root), before_root, "{case}: something was written");
        assert_eq!(
            listing(outside.path()),
            before_outside,
            "{case}: something was written outside"
        );
        assert!(!Path::new("/tmp/orchard-evil").exists());
    }
    // The token file cannot be replaced by an extraction.
    let token_name = agent
        .token_file
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let bytes = archive(&[(token_name.as_str(), Regular, "new-token", None)]);
    let (status, _) = upload(&agent, "secrets", bytes).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        std::fs::read_to_string(&agent.token_file).unwrap().trim(),
        TOKEN
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_uploads_are_capped() {
    let agent = Agent::start_with(AgentOptions {
        args: vec!["--max-upload-bytes".into(), "64K".into()],
        ..AgentOptions::default()
    });
    let big = "x".repeat(100 * 1024);
    let bytes = archive(&[("big", tar::EntryType::Regular, big.as_str(), None)]);
    // Sent without a length, so the cap is enforced while streaming.
    let chunks: Vec<Vec<u8>> = bytes.chunks(8192).map(<[u8]>::to_vec).collect();
    let stream = futures::stream::iter(chunks.into_iter().map(|chunk| {
        Ok::<_, crate::common::BoxError>(hyper::body::Frame::data(bytes::Bytes::from(chunk)))
    }));
    let body = http_body_util::StreamBody::new(stream).boxed();
    let response = agent
        .send(Method::PUT, "/v1/files/tar?path=capped", body, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let _ = response.into_body().collect().await;
    assert!(!agent.root.path().join("capped").exists());
    let (status, _) = agent
        .call(
            Method::PUT,
            "/v1/files/tar?path=capped",
            bytes::Bytes::from(archive(&[("small", tar::EntryType::Regular, "s", None)])),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
}
