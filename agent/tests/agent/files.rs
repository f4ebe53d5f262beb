//! The files API: streaming round trip of a large file with bounded memory, listing, deletion, modes,
//! parent creation, 404/400/409 cases, and the protected token file and executable.

use std::os::unix::fs::{PermissionsExt, symlink};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Agent, BoxError, TOKEN, agent_binary};

/// Deterministic pseudo-random bytes (xorshift), so both sides can produce and check them.
struct Pattern(u64);

impl Pattern {
    fn fill(&mut self, buffer: &mut [u8]) {
        for chunk in buffer.chunks_mut(8) {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let bytes = self.0.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// FNV-1a over a byte stream.
#[derive(Clone, Copy)]
struct Checksum(u64);

impl Checksum {
    fn new() -> Self {
        Checksum(0xcbf2_9ce4_8422_2325)
    }

    fn update(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_file_round_trip_streams_with_bounded_memory() {
    const SIZE: u64 = 300 * 1024 * 1024;
    const CHUNK: usize = 1024 * 1024;
    let agent = Agent::start();
    let baseline = agent.peak_rss_kib();

    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(4);
    let producer = tokio::spawn(async move {
        let mut pattern = Pattern(0x9E37_79B9_7F4A_7C15);
        let mut checksum = Checksum::new();
        let mut sent = 0u64;
        while sent < SIZE {
            let mut chunk = vec![0u8; CHUNK];
            pattern.fill(&mut chunk);
            checksum.update(&chunk);
            sent += CHUNK as u64;
            if sender
                .send(Ok(Frame::data(Bytes::from(chunk))))
                .await
                .is_err()
            {
                break;
            }
        }
        checksum.0
    });
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    });
    let body = BodyExt::boxed(StreamBody::new(stream));
    let response = agent
        .send(
            Method::PUT,
            "/v1/files?path=big/blob.bin",
            body,
            Some(TOKEN),
        )
        .await;
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let written: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, StatusCode::CREATED, "{written}");
    assert_eq!(written["size"], SIZE);
    assert_eq!(
        written["path"],
        agent.root.path().join("big/blob.bin").display().to_string()
    );
    let sent_checksum = producer.await.unwrap();

    let response = agent
        .send(
            Method::GET,
            "/v1/files?path=big/blob.bin",
            crate::common::full(""),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-length"],
        SIZE.to_string().as_str()
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/octet-stream"
    );
    let mut body = response.into_body();
    let mut checksum = Checksum::new();
    let mut received = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            checksum.update(&data);
            received += data.len() as u64;
        }
    }
    assert_eq!(received, SIZE);
    assert_eq!(
        checksum.0, sent_checksum,
        "downloaded bytes differ from the uploaded ones"
    );

    let peak = agent.peak_rss_kib();
    assert!(
        peak < baseline + 64 * 1024,
        "agent peak RSS grew from {baseline} KiB to {peak} KiB for a 300 MiB file"
    );
    // No temp files are left beside the target.
    let names: Vec<String> = std::fs::read_dir(agent.root.path().join("big"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["blob.bin".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_list_delete_and_modes() {
    let agent = Agent::start();
    let (status, written) = agent
        .call(
            Method::PUT,
            "/v1/files?path=a/b/c/script.sh&mode=0755",
            "#!/bin/sh\necho hi\n",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&written)
    );
    let script = agent.root.path().join("a/b/c/script.sh");
    assert_eq!(
        std::fs::metadata(&script).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    assert_eq!(
        agent.exec(json!({"argv": [script]})).await["stdout"],
        "hi\n"
    );

    // Replacing keeps the existing mode unless one is given; new files default to 0644.
    agent
        .call(
            Method::PUT,
            "/v1/files?path=a/b/c/script.sh",
            "#!/bin/sh\necho replaced\n",
        )
        .await;
    assert_eq!(
        std::fs::metadata(&script).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    agent
        .call(
            Method::PUT,
            &format!(
                "/v1/files?path={}",
                agent.root.path().join("plain.txt").display()
            ),
            "x",
        )
        .await;
    assert_eq!(
        std::fs::metadata(agent.root.path().join("plain.txt"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o644
    );
    let (status, empty) = agent
        .call(Method::PUT, "/v1/files?path=empty.txt", "")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{empty:?}");

    let (status, bytes) = agent
        .call(Method::GET, "/v1/files?path=a/b/c/script.sh", "")
        .await;
    assert_eq!(
        (status, &bytes[..]),
        (StatusCode::OK, &b"#!/bin/sh\necho replaced\n"[..])
    );

    symlink("plain.txt", agent.root.path().join("link")).unwrap();
    let (status, listing) = agent.get("/v1/files/list?path=.").await;
    assert_eq!(status, StatusCode::OK);
    let entries = listing["entries"].as_array().unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|entry| entry["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["a", "empty.txt", "link", "plain.txt", "secrets"]
    );
    let by_name = |name: &str| {
        entries
            .iter()
            .find(|entry| entry["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(by_name("a")["type"], "directory");
    assert_eq!(by_name("link")["type"], "symlink");
    assert_eq!(
        (
            by_name("plain.txt")["type"].as_str(),
            by_name("plain.txt")["size"].as_u64()
        ),
        (Some("file"), Some(1))
    );
    assert_eq!(by_name("plain.txt")["mode"], 0o644);
    assert!(
        by_name("plain.txt")["modified"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );

    // Errors.
    let cases: Vec<(Method, &str, StatusCode, &str)> = vec![
        (
            Method::GET,
            "/v1/files?path=missing.txt",
            StatusCode::NOT_FOUND,
            "NotFound",
        ),
        (
            Method::GET,
            "/v1/files?path=a",
            StatusCode::BAD_REQUEST,
            "InvalidPath",
        ),
        (
            Method::GET,
            "/v1/files?path=",
            StatusCode::BAD_REQUEST,
            "InvalidPath",
        ),
        (
            Method::GET,
            "/v1/files?path=a%00b",
            StatusCode::BAD_REQUEST,
            "InvalidPath",
        ),
        (
            Method::GET,
            "/v1/files",
            StatusCode::BAD_REQUEST,
            "BadRequest",
        ),
        (
            Method::GET,
            "/v1/files/list?path=missing",
            StatusCode::NOT_FOUND,
            "NotFound",
        ),
        (
            Method::GET,
            "/v1/files/list?path=plain.txt",
            StatusCode::BAD_REQUEST,
            "InvalidPath",
        ),
        (
            Method::DELETE,
            "/v1/files?path=missing.txt",
            StatusCode::NOT_FOUND,
            "NotFound",
        ),
        (
            Method::DELETE,
            "/v1/files?path=a",
            StatusCode::CONFLICT,
            "Conflict",
        ),
        (
            Method::PUT,
            "/v1/files?path=a",
            StatusCode::BAD_REQUEST,
            "InvalidPath",
        ),
        (
            Method::PUT,
            "/v1/files?path=x&mode=999",
            StatusCode::BAD_REQUEST,
            "BadRequest",
        ),
        (
            Method::PUT,
            "/v1/files?path=plain.txt/child",
            StatusCode::BAD_REQUEST,
            "InvalidPath",
        ),
        (
            Method::PUT,
            "/v1/files?path=new-dir/",
            StatusCode::BAD_REQUEST,
            "InvalidPath",
        ),
        (
            Method::DELETE,
            "/v1/files?path=a/..",
            StatusCode::BAD_REQUEST,
            "InvalidPath",
        ),
    ];
    for (method, path, status, code) in cases {
        let (got, bytes) = agent.call(method.clone(), path, "data").await;
        let error: Value =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{method} {path}: {bytes:?}"));
        assert_eq!(
            (got, error["code"].as_str()),
            (status, Some(code)),
            "{method} {path}: {error}"
        );
    }

    let (status, deleted) = agent
        .json(Method::DELETE, "/v1/files?path=link", Value::Null)
        .await;
    assert_eq!(
        (status, deleted["deleted"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    assert!(
        agent.root.path().join("plain.txt").exists(),
        "deleting a symlink keeps its target"
    );
    let (status, _) = agent
        .json(
            Method::DELETE,
            "/v1/files?path=a&recursive=true",
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(!agent.root.path().join("a").exists());
    let (status, _) = agent
        .json(Method::DELETE, "/v1/files?path=plain.txt", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_over_the_limit_is_413_and_leaves_nothing() {
    let agent = Agent::start_with(crate::common::AgentOptions {
        args: vec!["--max-upload-bytes".into(), "1M".into()],
        ..Default::default()
    });
    let (status, bytes) = agent
        .call(
            Method::PUT,
            "/v1/files?path=too-big.bin",
            vec![0u8; 2 * 1024 * 1024],
        )
        .await;
    assert_eq!(
        status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let leftovers: Vec<_> = std::fs::read_dir(agent.root.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("secrets")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_file_and_own_executable_are_off_limits() {
    let agent = Agent::start();
    let root = agent.root.path();
    symlink(&agent.token_file, root.join("token-alias")).unwrap();
    symlink(root.join("secrets"), root.join("secrets-alias")).unwrap();
    std::fs::create_dir_all(root.join("x")).unwrap();
    let token_spellings = [
        agent.token_file.display().to_string(),
        "secrets/token".to_string(),
        "token-alias".to_string(),
        "secrets-alias/token".to_string(),
        "x/../secrets/token".to_string(),
        "nonexistent/../secrets/./token".to_string(),
        // The traversal fuzzing found: `..` after a missing directory, then a symlink.
        "nonexistent/../secrets-alias/token".to_string(),
    ];
    for spelling in &token_spellings {
        for (method, path) in [
            (Method::GET, format!("/v1/files?path={spelling}")),
            (Method::PUT, format!("/v1/files?path={spelling}")),
            (Method::DELETE, format!("/v1/files?path={spelling}")),
        ] {
            let (status, bytes) = agent.call(method.clone(), &path, "stolen").await;
            let error: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(
                (status, error["code"].as_str()),
                (StatusCode::FORBIDDEN, Some("Forbidden")),
                "{method} {path}: {error}"
            );
        }
    }
    let (status, _) = agent
        .json(
            Method::DELETE,
            "/v1/files?path=secrets&recursive=true",
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        std::fs::read_to_string(&agent.token_file).unwrap().trim(),
        TOKEN
    );

    let exe = std::fs::canonicalize(agent_binary()).unwrap();
    let (status, _) = agent
        .call(
            Method::PUT,
            &format!("/v1/files?path={}", exe.display()),
            "overwrite",
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = agent
        .json(
            Method::DELETE,
            &format!("/v1/files?path={}", exe.display()),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = agent
        .json(
            Method::DELETE,
            &format!(
                "/v1/files?path={}&recursive=true",
                exe.parent().unwrap().display()
            ),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Reading the executable is fine (the init container copies it the same way).
    let response = agent
        .send(
            Method::GET,
            &format!("/v1/files?path={}", exe.display()),
            crate::common::full(""),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    // Patches cannot write it either.
    let patch = "--- a/secrets/token\n+++ b/secrets/token\n@@ -1 +1 @@\n-x\n+y\n";
    let (status, _) = agent
        .json(Method::POST, "/v1/patch", json!({"patch": patch}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_files_are_400_not_a_hung_read() {
    let agent = Agent::start();
    let fifo = agent.root.path().join("pipe");
    let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o644) }, 0);
    symlink("/dev/zero", agent.root.path().join("zero")).unwrap();
    let socket_path = agent.root.path().join("sock");
    let _socket = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    for (path, what) in [
        ("pipe", "FIFO"),
        ("zero", "character device"),
        ("/dev/null", "character device"),
        ("sock", "socket"),
    ] {
        // Without the check, the FIFO read blocks forever and /dev/zero never ends.
        let (status, error) = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            agent.get(&format!("/v1/files?path={path}")),
        )
        .await
        .unwrap_or_else(|_| panic!("GET {path} hung"));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {error}");
        assert_eq!(error["code"], "InvalidPath", "{path}: {error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains("not a regular file"), "{path}: {error}");
        assert!(message.contains(what), "{path}: {error}");
    }
    // A patch of the FIFO is refused the same way.
    let (status, error) = agent
        .json(
            Method::POST,
            "/v1/patch",
            json!({"patch": "--- a/pipe\n+++ b/pipe\n@@ -1 +1 @@\n-a\n+b\n"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    // Regular files still download.
    std::fs::write(agent.root.path().join("plain"), "ok").unwrap();
    let (status, bytes) = agent.call(Method::GET, "/v1/files?path=plain", "").await;
    assert_eq!((status, &bytes[..]), (StatusCode::OK, &b"ok"[..]));
}

/// Requests racing the swap of `d` (a directory with a decoy `token`, then a symlink to the token's
/// directory, and back): 2,000 per test, four in flight.
const RACING_REQUESTS: usize = 2_000;
const IN_FLIGHT: usize = 4;
const DECOY: &[u8] = b"decoy\n";

/// The token file, and the inode it had before the race: the race must neither replace nor delete it.
fn token_identity(agent: &Agent) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(&agent.token_file).expect("the token file exists");
    (metadata.dev(), metadata.ino())
}

fn assert_token_untouched(agent: &Agent, before: (u64, u64)) {
    assert_eq!(
        std::fs::read_to_string(&agent.token_file).expect("the token file exists"),
        format!("{TOKEN}\n"),
        "the token file's content changed"
    );
    assert_eq!(token_identity(agent), before, "the token file was replaced");
}

/// Whether `body` shows the token (as the whole body, or inside an error message).
fn shows_token(body: &[u8]) -> bool {
    body.windows(TOKEN.len())
        .any(|window| window == TOKEN.as_bytes())
}

fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|error| error["code"].as_str().map(str::to_string))
}

/// Security review L4: a check on the path string, then an open through the same path, read the real
/// token when `d` became the symlink in between. Every answer is now the decoy or 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_racing_a_directory_swap_never_return_the_token() {
    let agent = Agent::start();
    let swapper = crate::common::DirectorySwapper::start(agent.root.path(), "secrets", DECOY);
    let answers = crate::common::send_many(&agent, RACING_REQUESTS, IN_FLIGHT, |_| {
        (Method::GET, "/v1/files?path=d/token".into(), Bytes::new())
    })
    .await;
    let swaps = swapper.stop();
    for (index, (status, body)) in answers.iter().enumerate() {
        assert!(
            !shows_token(body),
            "GET #{index} of d/token returned the token ({status}) after {swaps} swaps"
        );
        match *status {
            StatusCode::OK => assert_eq!(&body[..], DECOY, "GET #{index}"),
            StatusCode::FORBIDDEN => assert_eq!(error_code(body).as_deref(), Some("Forbidden")),
            other => panic!("GET #{index}: unexpected {other}: {body:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_racing_a_directory_swap_never_replace_the_token() {
    let agent = Agent::start();
    let before = token_identity(&agent);
    let swapper = crate::common::DirectorySwapper::start(agent.root.path(), "secrets", DECOY);
    let answers = crate::common::send_many(&agent, RACING_REQUESTS, IN_FLIGHT, |index| {
        let body = Bytes::from(format!("written by PUT #{index}\n"));
        (Method::PUT, "/v1/files?path=d/token".into(), body)
    })
    .await;
    let swaps = swapper.stop();
    assert_token_untouched(&agent, before);
    for (index, (status, body)) in answers.iter().enumerate() {
        assert!(
            matches!(*status, StatusCode::CREATED | StatusCode::FORBIDDEN),
            "PUT #{index} (after {swaps} swaps): {status} {body:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_racing_a_directory_swap_never_remove_the_token() {
    let agent = Agent::start();
    let before = token_identity(&agent);
    let swapper = crate::common::DirectorySwapper::start(agent.root.path(), "secrets", DECOY);
    let answers = crate::common::send_many(&agent, RACING_REQUESTS, IN_FLIGHT, |_| {
        (
            Method::DELETE,
            "/v1/files?path=d/token".into(),
            Bytes::new(),
        )
    })
    .await;
    let swaps = swapper.stop();
    assert_token_untouched(&agent, before);
    for (index, (status, body)) in answers.iter().enumerate() {
        // 404: a previous DELETE removed the decoy and the swapper has not put it back yet.
        assert!(
            matches!(
                *status,
                StatusCode::OK | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND
            ),
            "DELETE #{index} (after {swaps} swaps): {status} {body:?}"
        );
    }
}

/// Only the protected files are checked by identity: a user's symlinks, to directories and to files,
/// work as they always did (a symlinked directory is written into and read from; DELETE removes a
/// symlink, never what it names, even recursively).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_symlinks_keep_working() {
    let agent = Agent::start();
    let root = agent.root.path();
    std::fs::create_dir(root.join("real")).unwrap();
    symlink("real", root.join("linked")).unwrap();
    let (status, body) = agent
        .call(Method::PUT, "/v1/files?path=linked/a.txt", "through a link")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body:?}");
    assert_eq!(
        std::fs::read_to_string(root.join("real/a.txt")).unwrap(),
        "through a link"
    );
    symlink("real/a.txt", root.join("alias")).unwrap();
    for path in ["linked/a.txt", "alias"] {
        let (status, body) = agent
            .call(Method::GET, &format!("/v1/files?path={path}"), "")
            .await;
        assert_eq!(
            (status, &body[..]),
            (StatusCode::OK, &b"through a link"[..]),
            "{path}"
        );
    }
    let (status, _) = agent
        .json(Method::DELETE, "/v1/files?path=linked/a.txt", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(!root.join("real/a.txt").exists());
    std::fs::write(root.join("real/kept.txt"), "kept").unwrap();
    let (status, _) = agent
        .json(
            Method::DELETE,
            "/v1/files?path=linked&recursive=true",
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(std::fs::symlink_metadata(root.join("linked")).is_err());
    assert_eq!(
        std::fs::read_to_string(root.join("real/kept.txt")).unwrap(),
        "kept"
    );
}
