//! Unified diffs made by the harness: an LCS line diff of two files into the agent's `Hunk`s (with
//! `context` lines, `diff -u` numbering), reversal (swap `+`/`-`), and rendering of parsed patches back to
//! text (git headers, C-quoted names, `\ No newline at end of file`), so the targets can check
//! generate -> render -> parse -> apply, and parse -> render -> parse.

use std::fmt::Write as _;

use orchard_agent::patch::parse::{FilePatch, Hunk, HunkLine, LineKind};

/// One line of a file; `newline: false` only for a last line without `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub text: String,
    pub newline: bool,
}

impl Line {
    pub fn new(text: impl Into<String>) -> Self {
        Line {
            text: text.into(),
            newline: true,
        }
    }
}

/// The bytes of a file made of `lines`.
pub fn file_bytes(lines: &[Line]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for line in lines {
        bytes.extend_from_slice(line.text.as_bytes());
        if line.newline {
            bytes.push(b'\n');
        }
    }
    bytes
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Equal(usize),
    Delete(usize),
    Insert(usize),
}

/// A shortest edit script from `a` to `b` (LCS; deletions before insertions in each change).
fn edit_script(a: &[Line], b: &[Line]) -> Vec<Op> {
    let (n, m) = (a.len(), b.len());
    // suffix[i][j] = LCS length of a[i..] and b[j..].
    let mut suffix = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            suffix[i][j] = if a[i] == b[j] {
                suffix[i + 1][j + 1] + 1
            } else {
                suffix[i + 1][j].max(suffix[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::new();
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push(Op::Equal(i));
            i += 1;
            j += 1;
        } else if j == m || (i < n && suffix[i + 1][j] >= suffix[i][j + 1]) {
            ops.push(Op::Delete(i));
            i += 1;
        } else {
            ops.push(Op::Insert(j));
            j += 1;
        }
    }
    ops
}

/// The hunks of `diff -U<context>` from `a` to `b`.
pub fn unified_diff(a: &[Line], b: &[Line], context: usize) -> Vec<Hunk> {
    let ops = edit_script(a, b);
    let changes: Vec<usize> = (0..ops.len())
        .filter(|&index| !matches!(ops[index], Op::Equal(_)))
        .collect();
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for &change in &changes {
        match groups.last_mut() {
            Some((_, last)) if change - *last - 1 <= 2 * context => *last = change,
            _ => groups.push((change, change)),
        }
    }
    // Lines of each side consumed before every op.
    let mut old_before = Vec::with_capacity(ops.len() + 1);
    let mut new_before = Vec::with_capacity(ops.len() + 1);
    let (mut old, mut new) = (0, 0);
    for op in &ops {
        old_before.push(old);
        new_before.push(new);
        match op {
            Op::Equal(_) => {
                old += 1;
                new += 1;
            }
            Op::Delete(_) => old += 1,
            Op::Insert(_) => new += 1,
        }
    }
    old_before.push(old);
    new_before.push(new);
    groups
        .into_iter()
        .map(|(first, last)| {
            let start = first.saturating_sub(context);
            let end = (last + context).min(ops.len() - 1);
            let lines: Vec<HunkLine> = ops[start..=end]
                .iter()
                .map(|op| {
                    let (kind, line) = match *op {
                        Op::Equal(i) => (LineKind::Context, &a[i]),
                        Op::Delete(i) => (LineKind::Remove, &a[i]),
                        Op::Insert(j) => (LineKind::Add, &b[j]),
                    };
                    HunkLine {
                        kind,
                        text: line.text.clone(),
                        no_newline: !line.newline,
                    }
                })
                .collect();
            let old_count = old_before[end + 1] - old_before[start];
            let new_count = new_before[end + 1] - new_before[start];
            // `diff -u` numbering: an empty side names the line after which it sits.
            let number = |before: usize, count: usize| if count == 0 { before } else { before + 1 };
            Hunk {
                old_start: number(old_before[start], old_count),
                old_count,
                new_start: number(new_before[start], new_count),
                new_count,
                lines,
            }
        })
        .collect()
}

/// The same hunks applied the other way round.
pub fn reverse(hunks: &[Hunk]) -> Vec<Hunk> {
    hunks
        .iter()
        .map(|hunk| Hunk {
            old_start: hunk.new_start,
            old_count: hunk.new_count,
            new_start: hunk.old_start,
            new_count: hunk.old_count,
            lines: hunk
                .lines
                .iter()
                .map(|line| HunkLine {
                    kind: match line.kind {
                        LineKind::Context => LineKind::Context,
                        LineKind::Remove => LineKind::Add,
                        LineKind::Add => LineKind::Remove,
                    },
                    ..line.clone()
                })
                .collect(),
        })
        .collect()
}

/// Appends `hunks` as text.
pub fn render_hunks(out: &mut String, hunks: &[Hunk]) {
    for hunk in hunks {
        let _ = writeln!(out, "{}", hunk.header());
        for line in &hunk.lines {
            out.push(match line.kind {
                LineKind::Context => ' ',
                LineKind::Remove => '-',
                LineKind::Add => '+',
            });
            out.push_str(&line.text);
            out.push('\n');
            if line.no_newline {
                out.push_str("\\ No newline at end of file\n");
            }
        }
    }
}

/// Whether a name must be C-quoted to survive a `---`/`+++` or `diff --git` line.
fn needs_quotes(name: &str) -> bool {
    name.ends_with(' ')
        || name
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\' || !c.is_ascii())
}

/// `prefix + name`, C-quoted (as git does) when needed.
pub fn quote(prefix: &str, name: &str) -> String {
    let full = format!("{prefix}{name}");
    if !needs_quotes(name) {
        return full;
    }
    let mut quoted = String::from("\"");
    for byte in full.bytes() {
        match byte {
            b'"' => quoted.push_str("\\\""),
            b'\\' => quoted.push_str("\\\\"),
            b'\n' => quoted.push_str("\\n"),
            b'\t' => quoted.push_str("\\t"),
            b'\r' => quoted.push_str("\\r"),
            0x20..=0x7e => quoted.push(byte as char),
            _ => {
                let _ = write!(quoted, "\\{byte:03o}");
            }
        }
    }
    quoted.push('"');
    quoted
}

/// Renders parsed file patches as a `git diff` (always with `---`/`+++` lines, names with `a/`/`b/`).
pub fn render_patch(files: &[FilePatch]) -> String {
    let mut out = String::new();
    for file in files {
        let old = file.old_path.as_deref();
        let new = file.new_path.as_deref();
        let git_old = old.or(new).unwrap_or("");
        let git_new = new.or(old).unwrap_or("");
        if needs_quotes(git_old) || needs_quotes(git_new) {
            let (a, b) = (quote("a/", git_old), quote("b/", git_new));
            let force = |name: String| {
                if name.starts_with('"') {
                    name
                } else {
                    format!("\"{name}\"")
                }
            };
            let _ = writeln!(out, "diff --git {} {}", force(a), force(b));
        } else {
            let _ = writeln!(out, "diff --git a/{git_old} b/{git_new}");
        }
        match (old, file.new_mode) {
            (None, Some(mode)) => {
                let _ = writeln!(out, "new file mode {:o}", 0o100000 | mode);
            }
            (Some(_), Some(mode)) => {
                let _ = writeln!(out, "old mode 100644\nnew mode {:o}", 0o100000 | mode);
            }
            (_, None) => {}
        }
        if new.is_none() {
            out.push_str("deleted file mode 100644\n");
        }
        if file.renamed {
            let _ = writeln!(
                out,
                "rename from {}\nrename to {}",
                quote("", git_old),
                quote("", git_new)
            );
        }
        let _ = writeln!(
            out,
            "--- {}",
            old.map_or("/dev/null".to_string(), |name| quote("a/", name))
        );
        let _ = writeln!(
            out,
            "+++ {}",
            new.map_or("/dev/null".to_string(), |name| quote("b/", name))
        );
        render_hunks(&mut out, &file.hunks);
    }
    out
}
