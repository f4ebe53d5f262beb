//! Applying the hunks of one file to its content, in memory. A hunk must match exactly, at its stated
//! line or at the nearest offset (searched outward, like `patch`, carrying the offset to later hunks);
//! there is no fuzz. Content is handled as bytes, so non-UTF-8 files and CRLF line ends survive.

use super::parse::{Hunk, LineKind};

/// A hunk that did not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HunkFailure {
    /// 1-based index of the hunk in its file.
    pub hunk: usize,
    pub header: String,
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Line<'a> {
    text: &'a [u8],
    newline: bool,
}

fn split_lines(bytes: &[u8]) -> Vec<Line<'_>> {
    let mut lines: Vec<Line<'_>> = bytes
        .split(|byte| *byte == b'\n')
        .map(|text| Line {
            text,
            newline: true,
        })
        .collect();
    if let Some(last) = lines.pop()
        && !last.text.is_empty()
    {
        lines.push(Line {
            text: last.text,
            newline: false,
        });
    }
    lines
}

fn side<'a>(hunk: &'a Hunk, kind: LineKind) -> Vec<Line<'a>> {
    hunk.lines
        .iter()
        .filter(|line| line.kind == LineKind::Context || line.kind == kind)
        .map(|line| Line {
            text: line.text.as_bytes(),
            newline: !line.no_newline,
        })
        .collect()
}

fn matches_at(lines: &[Line<'_>], position: usize, expected: &[Line<'_>]) -> bool {
    position + expected.len() <= lines.len()
        && lines[position..position + expected.len()] == *expected
}

fn describe(line: &Line<'_>) -> String {
    let text = String::from_utf8_lossy(line.text);
    let shown: String = text.chars().take(80).collect();
    if line.newline {
        format!("`{shown}`")
    } else {
        format!("`{shown}` (no newline at end of file)")
    }
}

/// Why `old` does not match at `position` (the first differing line), for the failure message.
fn mismatch(lines: &[Line<'_>], position: usize, old: &[Line<'_>]) -> String {
    for (index, wanted) in old.iter().enumerate() {
        match lines.get(position + index) {
            Some(found) if found == wanted => continue,
            Some(found) => {
                return format!(
                    "line {} is {} but the patch expects {}",
                    position + index + 1,
                    describe(found),
                    describe(wanted)
                );
            }
            None => {
                return format!(
                    "the file ends at line {} but the patch expects {}",
                    lines.len(),
                    describe(wanted)
                );
            }
        }
    }
    "no match".to_string()
}

/// Applies `hunks` to `original`. On failure, every failing hunk is reported (later hunks are still tried).
pub fn apply_hunks(original: &[u8], hunks: &[Hunk]) -> Result<Vec<u8>, Vec<HunkFailure>> {
    let lines = split_lines(original);
    let mut output = Vec::with_capacity(original.len() + 256);
    let mut failures = Vec::new();
    let mut cursor = 0usize;
    let mut offset: isize = 0;
    for (index, hunk) in hunks.iter().enumerate() {
        let old = side(hunk, LineKind::Remove);
        let new = side(hunk, LineKind::Add);
        // `-5,0` inserts after line 5; otherwise the old lines start at line `old_start`.
        let stated = if hunk.old_count == 0 {
            hunk.old_start
        } else {
            hunk.old_start.saturating_sub(1)
        };
        let found = find(&lines, cursor, stated.saturating_add_signed(offset), &old);
        let Some(position) = found else {
            let at = stated
                .saturating_add_signed(offset)
                .clamp(cursor.min(lines.len()), lines.len());
            failures.push(HunkFailure {
                hunk: index + 1,
                header: hunk.header(),
                reason: format!(
                    "context does not match at line {} or at any offset: {}",
                    at + 1,
                    mismatch(&lines, at, &old)
                ),
            });
            continue;
        };
        for line in &lines[cursor..position] {
            push_line(&mut output, line);
        }
        for line in &new {
            push_line(&mut output, line);
        }
        cursor = position + old.len();
        // Saturating: a header may state any line number, up to `usize::MAX`.
        offset = (position as isize).saturating_sub_unsigned(stated);
    }
    if !failures.is_empty() {
        return Err(failures);
    }
    for line in &lines[cursor..] {
        push_line(&mut output, line);
    }
    Ok(output)
}

fn push_line(output: &mut Vec<u8>, line: &Line<'_>) {
    output.extend_from_slice(line.text);
    if line.newline {
        output.push(b'\n');
    }
}

/// The start of the match nearest to `expected` at or after `cursor`.
fn find(lines: &[Line<'_>], cursor: usize, expected: usize, old: &[Line<'_>]) -> Option<usize> {
    let last_start = lines.len().checked_sub(old.len())?;
    if cursor > last_start {
        return None;
    }
    let expected = expected.clamp(cursor, last_start);
    let reach = (expected - cursor).max(last_start - expected);
    for distance in 0..=reach {
        if expected + distance <= last_start && matches_at(lines, expected + distance, old) {
            return Some(expected + distance);
        }
        if distance > 0
            && expected >= cursor + distance
            && matches_at(lines, expected - distance, old)
        {
            return Some(expected - distance);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::parse::parse_patch;

    fn hunks(diff: &str) -> Vec<Hunk> {
        parse_patch(diff, 1).unwrap().remove(0).hunks
    }

    #[test]
    fn modifies_in_place() {
        let diff = "--- a/f\n+++ b/f\n@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n";
        assert_eq!(
            apply_hunks(b"a\nb\nc\nd\ne\n", &hunks(diff)).unwrap(),
            b"a\nb\nC\nd\ne\n"
        );
    }

    #[test]
    fn finds_hunks_at_an_offset_and_carries_it() {
        let diff = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\n-b\n+B\n@@ -5,2 +5,2 @@\n e\n-f\n+F\n";
        let original = b"x\ny\na\nb\nc\nd\ne\nf\n";
        assert_eq!(
            apply_hunks(original, &hunks(diff)).unwrap(),
            b"x\ny\na\nB\nc\nd\ne\nF\n"
        );
    }

    #[test]
    fn multiple_hunks_and_insertions() {
        let diff = "--- a/f\n+++ b/f\n@@ -0,0 +1 @@\n+top\n@@ -3 +4,2 @@\n c\n+after-c\n";
        assert_eq!(
            apply_hunks(b"a\nb\nc\n", &hunks(diff)).unwrap(),
            b"top\na\nb\nc\nafter-c\n"
        );
    }

    #[test]
    fn reports_every_failing_hunk() {
        let diff =
            "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-zzz\n+y\n@@ -3 +3 @@\n-c\n+C\n@@ -4 +4 @@\n-qqq\n+r\n";
        let failures = apply_hunks(b"a\nb\nc\nd\n", &hunks(diff)).unwrap_err();
        assert_eq!(
            failures
                .iter()
                .map(|failure| failure.hunk)
                .collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert!(
            failures[0].reason.contains("line 1 is `a`"),
            "{}",
            failures[0].reason
        );
        assert_eq!(failures[0].header, "@@ -1,1 +1,1 @@");
    }

    #[test]
    fn newline_at_end_of_file_is_respected() {
        let add_newline = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+a\n";
        assert_eq!(apply_hunks(b"a", &hunks(add_newline)).unwrap(), b"a\n");
        assert!(apply_hunks(b"a\n", &hunks(add_newline)).is_err());
        let drop_newline =
            "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n x\n-a\n+b\n\\ No newline at end of file\n";
        assert_eq!(
            apply_hunks(b"x\na\n", &hunks(drop_newline)).unwrap(),
            b"x\nb"
        );
    }

    /// Found by the `patch_apply` fuzz target: a hunk numbered past `isize::MAX` overflowed the offset
    /// carried to the next hunk (a panic with overflow checks, a wrapped offset without).
    #[test]
    fn huge_line_numbers_do_not_overflow() {
        let diff = "--- a/f\n+++ b/f\n@@ -9223372036854775809,1 +1,1 @@\n-a\n+b\n@@ -1,1 +1,1 @@\n-c\n+d\n";
        assert_eq!(apply_hunks(b"a\nc\n", &hunks(diff)).unwrap(), b"b\nd\n");
        let diff = "--- a/f\n+++ b/f\n@@ -18446744073709551615,0 +1 @@\n+end\n";
        assert_eq!(apply_hunks(b"a\n", &hunks(diff)).unwrap(), b"a\nend\n");
    }

    #[test]
    fn bytes_and_crlf_survive() {
        let diff = "--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n-a\r\n+A\r\n b\r\n";
        assert_eq!(
            apply_hunks(b"a\r\nb\r\n\xff\n", &hunks(diff)).unwrap(),
            b"A\r\nb\r\n\xff\n"
        );
    }
}
