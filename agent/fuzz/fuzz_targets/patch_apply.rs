//! `apply_hunks` on structured input. Three modes:
//! - `Exact`: a file from a small, repetitive vocabulary (lines like `-- a`, `+++ b`, `\ x`, `a\r`,
//!   with or without a final newline), edited at random; the harness diffs old -> new, renders the diff,
//!   parses it with `parse_patch` (which must give back the same hunks), applies it: the result is the
//!   new file, and the reversed diff applied to the new file gives back the old one.
//! - `Offset`: unique lines with unrelated lines added before and after, so every hunk applies at an
//!   offset: the result is still exact (when every hunk has lines to anchor on), both ways.
//! - `Wild`: arbitrary bytes and arbitrary hunks (any start, including huge ones): never panics, and the
//!   rendered hunks parse back unchanged.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use orchard_agent::patch::apply::apply_hunks;
use orchard_agent::patch::parse::{Hunk, HunkLine, LineKind, parse_patch};
use orchard_agent_fuzz::diff::{Line, file_bytes, render_hunks, reverse, unified_diff};

const VOCABULARY: &[&str] = &[
    "a",
    "b",
    "c",
    "",
    " ",
    "a\r",
    "-- a",
    "++ b",
    "--- a",
    "+++ b",
    "\\ x",
    "@@ -1 +1 @@",
    "x y",
    "é",
    "\t",
    "diff --git a/f b/f",
];

#[derive(Debug, Arbitrary)]
enum Mode {
    Exact,
    Offset,
    Wild,
}

#[derive(Debug, Arbitrary)]
struct Edit {
    at: u8,
    delete: u8,
    insert: Vec<u8>,
}

#[derive(Debug, Arbitrary)]
struct WildLine {
    kind: u8,
    pick: u8,
    no_newline: bool,
}

#[derive(Debug, Arbitrary)]
struct WildHunk {
    old_start: u64,
    new_start: u16,
    lines: Vec<WildLine>,
}

#[derive(Debug, Arbitrary)]
struct Input {
    mode: Mode,
    original: Vec<u8>,
    edits: Vec<Edit>,
    context: u8,
    old_ends_without_newline: bool,
    new_ends_without_newline: bool,
    prefix: u8,
    suffix: u8,
    wild: Vec<WildHunk>,
    raw: Vec<u8>,
}

fn word(pick: u8) -> &'static str {
    VOCABULARY[pick as usize % VOCABULARY.len()]
}

/// Every line ends in a newline except, if asked, a non-empty last one.
fn set_newlines(lines: &mut [Line], last_without: bool) {
    for line in lines.iter_mut() {
        line.newline = true;
    }
    if let Some(last) = lines.last_mut() {
        last.newline = !(last_without && !last.text.is_empty());
    }
}

/// `original` with `edits` applied; inserted lines come from `make`.
fn edited(original: &[Line], edits: &[Edit], mut make: impl FnMut(u8) -> Line) -> Vec<Line> {
    let mut lines = original.to_vec();
    for edit in edits.iter().take(8) {
        let at = edit.at as usize % (lines.len() + 1);
        let delete = (edit.delete as usize % 4).min(lines.len() - at);
        let insert: Vec<Line> = edit.insert.iter().take(4).map(|&pick| make(pick)).collect();
        lines.splice(at..at + delete, insert);
    }
    lines
}

/// Generates, renders and re-parses the diff of `old` -> `new` (the parser must give the same hunks).
fn diff_through_parser(old: &[Line], new: &[Line], context: usize) -> Vec<Hunk> {
    let hunks = unified_diff(old, new, context);
    let mut text = String::from("--- a/f\n+++ b/f\n");
    render_hunks(&mut text, &hunks);
    let mut files = parse_patch(&text, 1)
        .unwrap_or_else(|error| panic!("a generated diff does not parse: {error}\n{text}"));
    assert_eq!(files.len(), 1, "{text}");
    let parsed = files.remove(0).hunks;
    assert_eq!(
        parsed, hunks,
        "the parser changed a generated diff:\n{text}"
    );
    parsed
}

fn exact(input: &Input) {
    let mut old: Vec<Line> = input
        .original
        .iter()
        .take(40)
        .map(|&pick| Line::new(word(pick)))
        .collect();
    set_newlines(&mut old, input.old_ends_without_newline);
    let mut new = edited(&old, &input.edits, |pick| Line::new(word(pick)));
    set_newlines(&mut new, input.new_ends_without_newline);
    let hunks = diff_through_parser(&old, &new, input.context as usize % 4);
    let (old_bytes, new_bytes) = (file_bytes(&old), file_bytes(&new));
    assert_eq!(
        apply_hunks(&old_bytes, &hunks).as_deref(),
        Ok(&new_bytes[..]),
        "forward"
    );
    assert_eq!(
        apply_hunks(&new_bytes, &reverse(&hunks)).as_deref(),
        Ok(&old_bytes[..]),
        "reverse"
    );
}

fn offset(input: &Input) {
    let old: Vec<Line> = (0..input.original.len() % 40)
        .map(|i| Line::new(format!("line {i}")))
        .collect();
    let mut inserted = 0;
    let new = edited(&old, &input.edits, |_| {
        inserted += 1;
        Line::new(format!("new {inserted}"))
    });
    let hunks = diff_through_parser(&old, &new, input.context as usize % 4);
    let around = |middle: &[Line]| {
        let mut lines: Vec<Line> = (0..input.prefix % 16)
            .map(|i| Line::new(format!("pre {i}")))
            .collect();
        lines.extend_from_slice(middle);
        lines.extend((0..input.suffix % 16).map(|i| Line::new(format!("post {i}"))));
        file_bytes(&lines)
    };
    let (old_bytes, new_bytes) = (around(&old), around(&new));
    let anchored = |hunks: &[Hunk], kind: LineKind| {
        hunks
            .iter()
            .all(|hunk| hunk.lines.iter().any(|line| line.kind != kind))
    };
    // A hunk with nothing on its old side (pure insertion, no context) has only its line number to go by.
    if anchored(&hunks, LineKind::Add) {
        assert_eq!(
            apply_hunks(&old_bytes, &hunks).as_deref(),
            Ok(&new_bytes[..]),
            "forward"
        );
    }
    if anchored(&hunks, LineKind::Remove) {
        let back = reverse(&hunks);
        assert_eq!(
            apply_hunks(&new_bytes, &back).as_deref(),
            Ok(&old_bytes[..]),
            "reverse"
        );
    }
}

fn wild(input: &Input) {
    let original = if input.raw.is_empty() {
        let lines: Vec<Line> = input
            .original
            .iter()
            .take(64)
            .map(|&pick| Line::new(word(pick)))
            .collect();
        file_bytes(&lines)
    } else {
        input.raw.clone()
    };
    let hunks: Vec<Hunk> = input
        .wild
        .iter()
        .take(8)
        .map(|wild| {
            let lines: Vec<HunkLine> = wild
                .lines
                .iter()
                .take(12)
                .map(|line| HunkLine {
                    kind: [LineKind::Context, LineKind::Remove, LineKind::Add]
                        [line.kind as usize % 3],
                    text: word(line.pick).to_string(),
                    no_newline: line.no_newline,
                })
                .collect();
            let count = |skip: LineKind| lines.iter().filter(|line| line.kind != skip).count();
            Hunk {
                old_start: wild.old_start as usize,
                old_count: count(LineKind::Add),
                new_start: wild.new_start as usize,
                new_count: count(LineKind::Remove),
                lines,
            }
        })
        .collect();
    let mut text = String::from("--- a/f\n+++ b/f\n");
    render_hunks(&mut text, &hunks);
    match parse_patch(&text, 1) {
        Ok(files) => assert_eq!(
            files.first().map(|file| &file.hunks),
            Some(&hunks),
            "{text}"
        ),
        Err(error) => panic!("rendered hunks do not parse: {error}\n{text}"),
    }
    let _ = apply_hunks(&original, &hunks);
}

fuzz_target!(|input: Input| {
    match input.mode {
        Mode::Exact => exact(&input),
        Mode::Offset => offset(&input),
        Mode::Wild => wild(&input),
    }
});
