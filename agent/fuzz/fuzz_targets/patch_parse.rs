//! `parse_patch` on arbitrary text with `strip` 0 to 3: never panics; what it accepts is consistent
//! (hunk lines match their header counts, every file has a name, no binary patch), and with the API's
//! default `strip` 1 it survives a round trip: render the parsed patch as a `git diff`, parse it again,
//! get the same patch.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orchard_agent::patch::parse::{FilePatch, LineKind, parse_patch};
use orchard_agent_fuzz::diff::render_patch;

fn check_consistent(files: &[FilePatch]) {
    for file in files {
        assert!(file.old_path.is_some() || file.new_path.is_some());
        assert!(!file.binary);
        for hunk in &file.hunks {
            let count = |kind: LineKind| hunk.lines.iter().filter(|line| line.kind == kind).count();
            let context = count(LineKind::Context);
            assert_eq!(
                hunk.old_count,
                context + count(LineKind::Remove),
                "{}",
                hunk.header()
            );
            assert_eq!(
                hunk.new_count,
                context + count(LineKind::Add),
                "{}",
                hunk.header()
            );
            assert!(hunk.lines.iter().all(|line| !line.text.contains('\n')));
        }
    }
}

/// Names a `git diff` can carry through `strip` 1 unchanged (rename lines are taken verbatim, so a
/// parsed name may be absolute or empty; those do not round-trip through `a/`+name and are skipped).
fn round_trippable(files: &[FilePatch]) -> bool {
    files.iter().all(|file| {
        [&file.old_path, &file.new_path]
            .into_iter()
            .flatten()
            .all(|name| !name.is_empty() && !name.starts_with('/'))
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for strip in 0..=3 {
        if let Ok(files) = parse_patch(&text, strip) {
            check_consistent(&files);
            if strip == 1 && round_trippable(&files) {
                let rendered = render_patch(&files);
                let reparsed = parse_patch(&rendered, 1).unwrap_or_else(|error| {
                    panic!("the rendered patch does not parse: {error}\n{rendered}")
                });
                assert_eq!(reparsed, files, "round trip changed the patch:\n{rendered}");
            }
        }
    }
});
