//! `POST /v1/patch` over HTTP: a `git diff` with creations, modifications (several hunks, one at an
//! offset), deletions; conflicts that change nothing; malformed diffs.

use hyper::{Method, StatusCode};
use serde_json::json;

use crate::common::Agent;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applies_a_git_diff_all_or_nothing() {
    let agent = Agent::start();
    let repo = agent.root.path().join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    let original: String = (1..=30).map(|n| format!("line {n}\n")).collect();
    // Two extra lines at the top shift the second hunk's position: it must be found at an offset.
    std::fs::write(
        repo.join("src/main.txt"),
        format!("new header\nnew header 2\n{original}"),
    )
    .unwrap();
    std::fs::write(repo.join("obsolete.txt"), "old\n").unwrap();
    let diff = "\
diff --git a/src/main.txt b/src/main.txt
index 1111111..2222222 100644
--- a/src/main.txt
+++ b/src/main.txt
@@ -1,3 +1,3 @@
-new header
+NEW HEADER
 new header 2
 line 1
@@ -18,3 +18,4 @@ fn context
 line 15
 line 16
+inserted after 16
 line 17
diff --git a/docs/new.md b/docs/new.md
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/docs/new.md
@@ -0,0 +1,2 @@
+# New
+no newline here
\\ No newline at end of file
diff --git a/obsolete.txt b/obsolete.txt
deleted file mode 100644
index 4444444..0000000
--- a/obsolete.txt
+++ /dev/null
@@ -1 +0,0 @@
-old
";
    // Shift the file further so hunk 2 applies at an offset of 3 lines.
    std::fs::write(
        repo.join("src/main.txt"),
        format!(
            "new header\nnew header 2\n{}",
            original.replacen("line 1\n", "line 1\nx\ny\nz\n", 1)
        ),
    )
    .unwrap();
    let (status, applied) = agent
        .json(
            Method::POST,
            "/v1/patch",
            json!({"patch": diff, "cwd": "repo"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{applied}");
    assert_eq!(applied["applied"], true);
    assert_eq!(
        applied["files"],
        json!([
            {"path": "src/main.txt", "action": "modified"},
            {"path": "docs/new.md", "action": "created"},
            {"path": "obsolete.txt", "action": "deleted"}
        ])
    );
    let main = std::fs::read_to_string(repo.join("src/main.txt")).unwrap();
    assert!(
        main.starts_with("NEW HEADER\nnew header 2\nline 1\nx\n"),
        "{main}"
    );
    assert!(
        main.contains("line 16\ninserted after 16\nline 17\n"),
        "{main}"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("docs/new.md")).unwrap(),
        "# New\nno newline here"
    );
    assert!(!repo.join("obsolete.txt").exists());

    // Applying the same patch again conflicts everywhere and changes nothing.
    let before = std::fs::read_to_string(repo.join("src/main.txt")).unwrap();
    let (status, conflict) = agent
        .json(
            Method::POST,
            "/v1/patch",
            json!({"patch": diff, "cwd": "repo"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    assert_eq!(conflict["code"], "PatchConflict");
    let failed = conflict["failedHunks"].as_array().unwrap();
    assert!(
        failed.iter().any(|hunk| hunk["path"] == "src/main.txt"
            && hunk["hunk"] == 1
            && hunk["header"] == "@@ -1,3 +1,3 @@"),
        "{conflict}"
    );
    assert!(
        failed.iter().any(|hunk| hunk["path"] == "docs/new.md"),
        "{conflict}"
    );
    assert!(
        failed.iter().any(|hunk| hunk["path"] == "obsolete.txt"),
        "{conflict}"
    );
    assert!(failed.iter().all(|hunk| hunk["reason"].is_string()));
    assert_eq!(
        std::fs::read_to_string(repo.join("src/main.txt")).unwrap(),
        before
    );

    // One good file and one conflicting file: the good one is not written either.
    let mixed = "\
--- a/src/main.txt
+++ b/src/main.txt
@@ -1 +1 @@
-NEW HEADER
+changed again
--- a/docs/new.md
+++ b/docs/new.md
@@ -1 +1 @@
-# Not the title
+# Title
";
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/patch",
            json!({"patch": mixed, "cwd": "repo"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(
        std::fs::read_to_string(repo.join("src/main.txt")).unwrap(),
        before
    );

    // strip=0 for diffs without a/ b/ prefixes.
    let unprefixed = "--- src/main.txt\n+++ src/main.txt\n@@ -1 +1 @@\n-NEW HEADER\n+stripped\n";
    let (status, applied) = agent
        .json(
            Method::POST,
            "/v1/patch",
            json!({"patch": unprefixed, "cwd": "repo", "strip": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{applied}");
    assert!(
        std::fs::read_to_string(repo.join("src/main.txt"))
            .unwrap()
            .starts_with("stripped\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_patches_are_400() {
    let agent = Agent::start();
    for patch in [
        "this is not a diff",
        "--- a/x\n+++ b/x\n@@ -1,5 +1,5 @@\n-only one line\n",
        "--- a/x\n+++ b/x\n@@ nonsense @@\n",
        "diff --git a/x.png b/x.png\nBinary files a/x.png and b/x.png differ\n",
    ] {
        let (status, error) = agent
            .json(Method::POST, "/v1/patch", json!({"patch": patch}))
            .await;
        assert_eq!(
            (status, error["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("BadRequest")),
            "{patch}: {error}"
        );
    }
    let (status, error) = agent
        .json(
            Method::POST,
            "/v1/patch",
            json!({"patch": "--- a/x\n+++ b/x\n", "cwd": "nowhere"}),
        )
        .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("InvalidCwd"))
    );
    let (status, error) = agent
        .json(Method::POST, "/v1/patch", json!({"cwd": "."}))
        .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("InvalidRequest"))
    );
}

/// Security review L4 for patches: the file was read, checked and written through the path, each time
/// resolving `d` anew, so a swap of `d` to a symlink to the token's directory in between replaced the
/// token, or showed its first line in a conflict message. A patch that rewrites the decoy unchanged
/// either applies to the decoy or is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patches_racing_a_directory_swap_never_touch_or_show_the_token() {
    use std::os::unix::fs::MetadataExt;
    let agent = Agent::start();
    let token = || {
        let metadata = std::fs::metadata(&agent.token_file).expect("the token file exists");
        let content = std::fs::read_to_string(&agent.token_file).expect("the token file reads");
        (metadata.ino(), content)
    };
    let before = token();
    let swapper = crate::common::DirectorySwapper::start(agent.root.path(), "secrets", b"decoy\n");
    let patch = json!({"patch": "--- a/d/token\n+++ b/d/token\n@@ -1 +1 @@\n-decoy\n+decoy\n"});
    let answers = crate::common::send_many(&agent, 2_000, 4, |_| {
        (Method::POST, "/v1/patch".into(), patch.to_string().into())
    })
    .await;
    let swaps = swapper.stop();
    assert_eq!(token(), before, "the token file was replaced or changed");
    for (index, (status, body)) in answers.iter().enumerate() {
        let text = String::from_utf8_lossy(body);
        assert!(
            !text.contains(crate::common::TOKEN),
            "patch #{index} (after {swaps} swaps) showed the token: {text}"
        );
        assert!(
            matches!(*status, StatusCode::OK | StatusCode::FORBIDDEN),
            "patch #{index} (after {swaps} swaps): {status} {text}"
        );
    }
}
