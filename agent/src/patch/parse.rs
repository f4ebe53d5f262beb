//! Parsing unified diffs (`diff -u`, `git diff`) into per-file patches: `---`/`+++` headers, `@@` hunks,
//! `\ No newline at end of file`, and git's extended headers (new/deleted file mode, mode changes,
//! renames, quoted names). Text outside of file patches (commit messages, `Only in ...`) is ignored.

/// One line of a hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HunkLine {
    pub kind: LineKind,
    /// The line without its `\n`.
    pub text: String,
    /// Followed by `\ No newline at end of file`.
    pub no_newline: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineKind {
    Context,
    Remove,
    Add,
}

/// One `@@ -a,b +c,d @@` hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    pub old_start: usize,
    pub old_count: usize,
    pub new_start: usize,
    pub new_count: usize,
    pub lines: Vec<HunkLine>,
}

impl Hunk {
    pub fn header(&self) -> String {
        format!(
            "@@ -{},{} +{},{} @@",
            self.old_start, self.old_count, self.new_start, self.new_count
        )
    }
}

/// The changes to one file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilePatch {
    /// `None` for `/dev/null` (the file is created).
    pub old_path: Option<String>,
    /// `None` for `/dev/null` (the file is deleted).
    pub new_path: Option<String>,
    pub hunks: Vec<Hunk>,
    /// Permission bits from `new file mode` / `new mode`.
    pub new_mode: Option<u32>,
    /// A git rename (`rename from`/`rename to`): the old file is removed.
    pub renamed: bool,
    pub binary: bool,
}

impl FilePatch {
    /// The name used in messages.
    pub fn display_path(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or("<unknown>")
    }
}

/// Git's `diff --git` block state before its `---`/`+++` lines.
#[derive(Debug, Default)]
struct GitHeader {
    old_path: Option<String>,
    new_path: Option<String>,
    created: bool,
    deleted: bool,
    renamed: bool,
}

/// Parses a unified diff; `strip` leading path components are removed from `---`/`+++`/`diff --git` names
/// (like `patch -p`). Errors are messages for a 400 response.
pub fn parse_patch(text: &str, strip: usize) -> Result<Vec<FilePatch>, String> {
    let lines: Vec<&str> = text.split('\n').collect();
    let lines = if lines.last() == Some(&"") {
        &lines[..lines.len() - 1]
    } else {
        &lines[..]
    };
    let mut files: Vec<FilePatch> = Vec::new();
    let mut current: Option<FilePatch> = None;
    let mut git: Option<GitHeader> = None;
    let mut index = 0;
    while index < lines.len() {
        let line = lines[index];
        let header = line.strip_suffix('\r').unwrap_or(line);
        if let Some(rest) = header.strip_prefix("diff --git ") {
            finish(&mut files, &mut current, &mut git, strip)?;
            let (old, new) = split_git_names(rest).ok_or_else(|| {
                format!("line {}: cannot read file names from `{header}`", index + 1)
            })?;
            git = Some(GitHeader {
                old_path: Some(old),
                new_path: Some(new),
                ..GitHeader::default()
            });
            current = Some(FilePatch::default());
            index += 1;
            continue;
        }
        if header.starts_with("--- ")
            && lines
                .get(index + 1)
                .is_some_and(|next| next.starts_with("+++ "))
        {
            let next = lines[index + 1];
            let next = next.strip_suffix('\r').unwrap_or(next);
            let old = header_name(&header[4..])?;
            let new = header_name(&next[4..])?;
            let in_git_block = git.is_some()
                && current.as_ref().is_some_and(|patch| {
                    patch.hunks.is_empty() && patch.old_path.is_none() && patch.new_path.is_none()
                });
            if !in_git_block {
                finish(&mut files, &mut current, &mut git, strip)?;
                current = Some(FilePatch::default());
            }
            if let Some(patch) = current.as_mut() {
                patch.old_path = strip_name(old.as_deref(), strip)?;
                patch.new_path = strip_name(new.as_deref(), strip)?;
                if patch.old_path.is_none() && patch.new_path.is_none() {
                    return Err(format!("line {}: both file names are /dev/null", index + 1));
                }
            }
            index += 2;
            continue;
        }
        if header.starts_with("@@ ") || header == "@@" {
            let Some(patch) = current.as_mut() else {
                return Err(format!(
                    "line {}: hunk `{header}` before any `---`/`+++` file header",
                    index + 1
                ));
            };
            let (hunk, next_index) = parse_hunk(lines, index)?;
            patch.hunks.push(hunk);
            index = next_index;
            continue;
        }
        if let (Some(git_header), Some(patch)) = (git.as_mut(), current.as_mut()) {
            if let Some(mode) = header.strip_prefix("new file mode ") {
                git_header.created = true;
                patch.new_mode = Some(parse_git_mode(mode, index)?);
            } else if header.starts_with("deleted file mode ") {
                git_header.deleted = true;
            } else if let Some(mode) = header.strip_prefix("new mode ") {
                patch.new_mode = Some(parse_git_mode(mode, index)?);
            } else if let Some(name) = header.strip_prefix("rename from ") {
                git_header.old_path = Some(unquote(name)?);
                git_header.renamed = true;
            } else if let Some(name) = header.strip_prefix("rename to ") {
                git_header.new_path = Some(unquote(name)?);
                git_header.renamed = true;
            } else if header.starts_with("copy from ") || header.starts_with("copy to ") {
                return Err(format!(
                    "line {}: git copies are not supported; send the copy as a new file",
                    index + 1
                ));
            } else if header.starts_with("GIT binary patch")
                || (header.starts_with("Binary files ") && header.ends_with(" differ"))
            {
                patch.binary = true;
            }
        }
        index += 1;
    }
    finish(&mut files, &mut current, &mut git, strip)?;
    if let Some(binary) = files.iter().find(|patch| patch.binary) {
        return Err(format!(
            "binary patch for `{}` is not supported; upload the file with PUT /v1/files",
            binary.display_path()
        ));
    }
    Ok(files)
}

/// Completes the current file patch, filling names from git headers when `---`/`+++` were absent
/// (empty files, pure renames and mode changes have none).
fn finish(
    files: &mut Vec<FilePatch>,
    current: &mut Option<FilePatch>,
    git: &mut Option<GitHeader>,
    strip: usize,
) -> Result<(), String> {
    let Some(mut patch) = current.take() else {
        *git = None;
        return Ok(());
    };
    if let Some(header) = git.take() {
        patch.renamed = header.renamed;
        if patch.old_path.is_none() && patch.new_path.is_none() {
            // Names from `diff --git a/x b/y` carry prefixes; `rename from/to` names do not.
            let (old, new) = if header.renamed {
                (header.old_path, header.new_path)
            } else {
                (
                    strip_name(header.old_path.as_deref(), strip)?,
                    strip_name(header.new_path.as_deref(), strip)?,
                )
            };
            patch.old_path = if header.created { None } else { old };
            patch.new_path = if header.deleted { None } else { new };
        }
    }
    if patch.old_path.is_none() && patch.new_path.is_none() {
        return Ok(());
    }
    files.push(patch);
    Ok(())
}

fn parse_git_mode(text: &str, index: usize) -> Result<u32, String> {
    u32::from_str_radix(text.trim(), 8)
        .map(|mode| mode & 0o7777)
        .map_err(|_| format!("line {}: `{text}` is not an octal file mode", index + 1))
}

/// Parses the hunk starting at `lines[start]`; returns it and the index after it.
fn parse_hunk(lines: &[&str], start: usize) -> Result<(Hunk, usize), String> {
    let header = lines[start].strip_suffix('\r').unwrap_or(lines[start]);
    let malformed = || {
        format!(
            "line {}: malformed hunk header `{header}` (expected `@@ -a,b +c,d @@`)",
            start + 1
        )
    };
    let ranges = header
        .strip_prefix("@@ ")
        .and_then(|rest| rest.split(" @@").next())
        .ok_or_else(malformed)?;
    let mut parts = ranges.split_whitespace();
    let (old_start, old_count) = parts
        .next()
        .and_then(|part| part.strip_prefix('-'))
        .and_then(parse_range)
        .ok_or_else(malformed)?;
    let (new_start, new_count) = parts
        .next()
        .and_then(|part| part.strip_prefix('+'))
        .and_then(parse_range)
        .ok_or_else(malformed)?;
    let mut hunk = Hunk {
        old_start,
        old_count,
        new_start,
        new_count,
        lines: Vec::new(),
    };
    let (mut old_left, mut new_left) = (old_count, new_count);
    let mut index = start + 1;
    while old_left > 0
        || new_left > 0
        || lines.get(index).is_some_and(|line| line.starts_with('\\'))
    {
        let Some(line) = lines.get(index) else {
            return Err(format!(
                "hunk `{}` ends early: {old_left} old and {new_left} new lines missing (was the patch truncated?)",
                hunk.header()
            ));
        };
        let (kind, text) = match line.as_bytes().first() {
            Some(b' ') => (LineKind::Context, &line[1..]),
            Some(b'-') => (LineKind::Remove, &line[1..]),
            Some(b'+') => (LineKind::Add, &line[1..]),
            // Some tools strip the space of empty context lines.
            None => (LineKind::Context, ""),
            Some(b'\\') => {
                match hunk.lines.last_mut() {
                    Some(previous) => previous.no_newline = true,
                    None => {
                        return Err(format!(
                            "line {}: `\\` marker before any hunk line",
                            index + 1
                        ));
                    }
                }
                index += 1;
                continue;
            }
            Some(_) => {
                return Err(format!(
                    "line {}: unexpected `{line}` inside hunk `{}` ({old_left} old and {new_left} new lines still expected)",
                    index + 1,
                    hunk.header()
                ));
            }
        };
        let (uses_old, uses_new) = match kind {
            LineKind::Context => (true, true),
            LineKind::Remove => (true, false),
            LineKind::Add => (false, true),
        };
        if (uses_old && old_left == 0) || (uses_new && new_left == 0) {
            return Err(format!(
                "line {}: hunk `{}` has more lines than its header counts",
                index + 1,
                hunk.header()
            ));
        }
        old_left -= usize::from(uses_old);
        new_left -= usize::from(uses_new);
        hunk.lines.push(HunkLine {
            kind,
            text: text.to_string(),
            no_newline: false,
        });
        index += 1;
    }
    if let Some(next) = lines.get(index) {
        let stray_add = next.starts_with('+') && !next.starts_with("+++ ");
        let stray_remove =
            next.starts_with('-') && !next.starts_with("--- ") && !next.starts_with("-- ");
        if stray_add || stray_remove {
            return Err(format!(
                "line {}: hunk `{}` has more lines than its header counts",
                index + 1,
                hunk.header()
            ));
        }
    }
    Ok((hunk, index))
}

/// `12,3` or `12` (count 1).
fn parse_range(text: &str) -> Option<(usize, usize)> {
    match text.split_once(',') {
        Some((start, count)) => Some((start.parse().ok()?, count.parse().ok()?)),
        None => Some((text.parse().ok()?, 1)),
    }
}

/// The file name of a `---`/`+++` header: up to a tab (timestamps follow it), unquoted.
fn header_name(text: &str) -> Result<Option<String>, String> {
    let name = if text.starts_with('"') {
        text.to_string()
    } else {
        text.split('\t').next().unwrap_or("").to_string()
    };
    let name = unquote(name.trim_end_matches(' '))?;
    if name == "/dev/null" {
        Ok(None)
    } else {
        Ok(Some(name))
    }
}

/// Removes `strip` leading `/`-separated components (like `patch -p`).
fn strip_name(name: Option<&str>, strip: usize) -> Result<Option<String>, String> {
    let Some(name) = name else { return Ok(None) };
    if strip == 0 {
        return Ok(Some(name.to_string()));
    }
    let mut rest = name;
    for _ in 0..strip {
        match rest.split_once('/') {
            Some((_, tail)) => rest = tail.trim_start_matches('/'),
            None => {
                return Err(format!(
                    "cannot strip {strip} leading components from `{name}`; use a smaller `strip`"
                ));
            }
        }
    }
    if rest.is_empty() {
        return Err(format!(
            "`{name}` has no file name left after stripping {strip} components"
        ));
    }
    Ok(Some(rest.to_string()))
}

/// Undoes git's C-style quoting of names with special characters (`"a/tab\there"`).
fn unquote(text: &str) -> Result<String, String> {
    let Some(inner) = text
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
    else {
        return Ok(text.to_string());
    };
    let mut bytes = Vec::with_capacity(inner.len());
    let mut chars = inner.bytes().peekable();
    while let Some(byte) = chars.next() {
        if byte != b'\\' {
            bytes.push(byte);
            continue;
        }
        let escaped = chars
            .next()
            .ok_or_else(|| format!("bad quoted name {text}"))?;
        let value = match escaped {
            b'n' => b'\n',
            b't' => b'\t',
            b'r' => b'\r',
            b'a' => 7,
            b'b' => 8,
            b'f' => 12,
            b'v' => 11,
            b'\\' | b'"' => escaped,
            b'0'..=b'7' => {
                let mut value = u32::from(escaped - b'0');
                for _ in 0..2 {
                    match chars.peek() {
                        Some(digit @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(digit - b'0');
                            chars.next();
                        }
                        _ => break,
                    }
                }
                u8::try_from(value).map_err(|_| format!("bad octal escape in {text}"))?
            }
            other => return Err(format!("unknown escape `\\{}` in {text}", other as char)),
        };
        bytes.push(value);
    }
    String::from_utf8(bytes).map_err(|_| format!("quoted name {text} is not UTF-8"))
}

/// Splits `a/x b/y` of a `diff --git` line (names may be quoted; unquoted names with spaces are split
/// where both halves name the same file, as git does).
fn split_git_names(text: &str) -> Option<(String, String)> {
    let text = text.trim_end();
    if text.starts_with('"') {
        let end = find_closing_quote(text)?;
        let old = unquote(&text[..=end]).ok()?;
        let new = unquote(text[end + 1..].trim_start()).ok()?;
        return Some((old, new));
    }
    if let Some(position) = text.find(" \"") {
        return Some((
            text[..position].to_string(),
            unquote(&text[position + 1..]).ok()?,
        ));
    }
    let bytes = text.as_bytes();
    // Prefer a split whose halves agree after their first component (a/NAME b/NAME).
    let spaces: Vec<usize> = bytes
        .iter()
        .enumerate()
        .filter(|(_, byte)| **byte == b' ')
        .map(|(index, _)| index)
        .collect();
    for &space in &spaces {
        let (old, new) = (&text[..space], &text[space + 1..]);
        let tail = |name: &str| name.split_once('/').map(|(_, rest)| rest.to_string());
        if tail(old).is_some() && tail(old) == tail(new) {
            return Some((old.to_string(), new.to_string()));
        }
    }
    let space = *spaces.first()?;
    Some((text[..space].to_string(), text[space + 1..].to_string()))
}

fn find_closing_quote(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut index = 1;
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 2,
            b'"' => return Some(index),
            _ => index += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_diff_with_modification_creation_deletion() {
        let diff = "\
diff --git a/src/lib.rs b/src/lib.rs
index 3b18e51..a8c2f0e 100644
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -1,3 +1,3 @@
 fn a() {}
-fn b() {}
+fn b() { 1 }
 fn c() {}
diff --git a/new.txt b/new.txt
new file mode 100755
index 0000000..e69de29
--- /dev/null
+++ b/new.txt
@@ -0,0 +1 @@
+hello
\\ No newline at end of file
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
";
        let files = parse_patch(diff, 1).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(files[0].old_path.as_deref(), Some("src/lib.rs"));
        assert_eq!(files[0].hunks[0].lines.len(), 4);
        assert_eq!(files[0].hunks[0].header(), "@@ -1,3 +1,3 @@");
        assert_eq!(files[1].old_path, None);
        assert_eq!(files[1].new_mode, Some(0o755));
        assert!(files[1].hunks[0].lines[0].no_newline);
        assert_eq!(files[2].new_path, None);
        assert_eq!(files[2].old_path.as_deref(), Some("old.txt"));
    }

    #[test]
    fn empty_new_file_and_pure_rename_come_from_git_headers() {
        let diff = "\
diff --git a/empty b/empty
new file mode 100644
index 0000000..e69de29
diff --git a/from name.txt b/to name.txt
similarity index 100%
rename from from name.txt
rename to to name.txt
";
        let files = parse_patch(diff, 1).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(
            (files[0].old_path.clone(), files[0].new_path.as_deref()),
            (None, Some("empty"))
        );
        assert_eq!(files[1].old_path.as_deref(), Some("from name.txt"));
        assert_eq!(files[1].new_path.as_deref(), Some("to name.txt"));
        assert!(files[1].hunks.is_empty());
        assert!(files[1].renamed);
    }

    #[test]
    fn plain_diff_u_with_timestamps_and_strip_zero() {
        let diff = "--- file.txt\t2024-01-01 00:00:00\n+++ file.txt\t2024-01-02 00:00:00\n@@ -1 +1 @@\n-a\n+b\n";
        let files = parse_patch(diff, 0).unwrap();
        assert_eq!(files[0].new_path.as_deref(), Some("file.txt"));
        assert_eq!(files[0].hunks[0].old_count, 1);
    }

    #[test]
    fn malformed_patches_are_errors() {
        assert!(parse_patch("@@ -1 +1 @@\n-a\n+b\n", 1).is_err());
        assert!(parse_patch("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+b\n", 1).is_err());
        assert!(parse_patch("--- a/x\n+++ b/x\n@@ -1,1 +1,1 @@\n-a\n+b\n+c\n", 1).is_err());
        assert!(parse_patch("--- a/x\n+++ b/x\n@@ bogus @@\n", 1).is_err());
        assert!(parse_patch("--- x\n+++ x\n@@ -1 +1 @@\n-a\n+b\n", 1).is_err());
        assert!(parse_patch("diff --git a/x b/x\nBinary files a/x and b/x differ\n", 1).is_err());
        assert_eq!(parse_patch("just some text\n", 1).unwrap(), vec![]);
    }

    #[test]
    fn quoted_names() {
        assert_eq!(unquote("\"a/tab\\there\"").unwrap(), "a/tab\there");
        assert_eq!(unquote("\"a/\\303\\251\"").unwrap(), "a/é");
        assert_eq!(
            split_git_names("\"a/x y\" \"b/x y\""),
            Some(("a/x y".to_string(), "b/x y".to_string()))
        );
        assert_eq!(
            split_git_names("a/x y b/x y"),
            Some(("a/x y".to_string(), "b/x y".to_string()))
        );
    }

    #[test]
    fn empty_context_lines_and_crlf_headers() {
        let diff = "--- a/x\r\n+++ b/x\r\n@@ -1,3 +1,3 @@\r\n a\r\n\n-b\r\n+c\r\n";
        let files = parse_patch(diff, 1).unwrap();
        let lines = &files[0].hunks[0].lines;
        assert_eq!(lines[0].text, "a\r");
        assert_eq!(
            lines[1],
            HunkLine {
                kind: LineKind::Context,
                text: String::new(),
                no_newline: false
            }
        );
    }
}
