//! The code blocks of the user documentation, for the tests that run them and the check that every
//! block a user would paste is either run by a test or marked illustrative (pure).
//!
//! A block is a fenced block (```` ```lang ````). Code blocks are those in `sh`, `bash`, `python` or
//! `yaml`, and unlabelled ones; a block in any other language (`text`, `json`, `console`) shows output
//! or data and is not pasted. A code block is accounted for when the line before its fence is a
//! marker comment:
//!
//! - `<!-- illustrative: why -->`: not run, and why (it needs a cloud, a trainer, a registry of yours);
//! - `<!-- run by: path -->`: run, as written, by the test at `path` (which must read this document).
//!
//! A document that a test runs whole (`docs/QUICKSTART.md`, by `e2e/tests/docs_run.rs`) needs no
//! markers.

/// One fenced block of a Markdown document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Line of the opening fence (1-based).
    pub line: usize,
    /// Its language (`sh`, `python`, ...; empty when unlabelled).
    pub lang: String,
    /// Its text, without the fences.
    pub text: String,
    /// The marker comment on the line before the fence, if any (`illustrative: ...`, `run by: ...`).
    pub marker: Option<String>,
}

/// Languages of blocks a user would paste.
const CODE: &[&str] = &["", "sh", "bash", "shell", "python", "py", "yaml", "yml"];

impl Block {
    /// Whether a user would paste it (pure).
    pub fn is_code(&self) -> bool {
        CODE.contains(&self.lang.as_str())
    }

    /// Whether it is a shell block.
    pub fn is_shell(&self) -> bool {
        matches!(self.lang.as_str(), "sh" | "bash" | "shell")
    }

    /// Whether it is a Python block.
    pub fn is_python(&self) -> bool {
        matches!(self.lang.as_str(), "python" | "py")
    }

    /// The reason of an `illustrative:` marker.
    pub fn illustrative(&self) -> Option<&str> {
        self.marker
            .as_deref()?
            .strip_prefix("illustrative:")
            .map(str::trim)
    }

    /// The test path of a `run by:` marker.
    pub fn run_by(&self) -> Option<&str> {
        self.marker
            .as_deref()?
            .strip_prefix("run by:")
            .map(str::trim)
    }
}

/// Every fenced block of `markdown`, in order (pure). An unterminated fence ends at the document's end.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let lines: Vec<&str> = markdown.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let marker = i
            .checked_sub(1)
            .map(|before| lines[before].trim())
            .and_then(|before| before.strip_prefix("<!--")?.strip_suffix("-->"))
            .map(|inside| inside.trim().to_string());
        let start = i;
        let mut end = i + 1;
        while end < lines.len() && !lines[end].trim_start().starts_with("```") {
            end += 1;
        }
        let text = lines[start + 1..end.min(lines.len())].join("\n");
        found.push(Block {
            line: start + 1,
            lang: lang.split_whitespace().next().unwrap_or("").to_string(),
            text: if text.is_empty() { text } else { text + "\n" },
            marker,
        });
        i = end + 1;
    }
    found
}

/// What is wrong with the code blocks of document `name` (`markdown`): each code block without a
/// marker, with an empty illustrative reason, or run by a test at a path `exists` does not know
/// (pure).
pub fn unaccounted(name: &str, markdown: &str, exists: impl Fn(&str) -> bool) -> Vec<String> {
    blocks(markdown)
        .into_iter()
        .filter(Block::is_code)
        .filter_map(|block| {
            let at = format!("{name}:{}", block.line);
            match (block.illustrative(), block.run_by()) {
                (Some(""), _) => Some(format!("{at}: an illustrative block says why")),
                (Some(_), _) => None,
                (None, Some(path)) if exists(path) => None,
                (None, Some(path)) => Some(format!("{at}: run by {path}, which does not exist")),
                (None, None) => Some(format!(
                    "{at}: a {} block that no test runs: run it from a test and mark it `<!-- run by: PATH -->`, or mark it `<!-- illustrative: why -->`",
                    if block.lang.is_empty() { "code" } else { &block.lang }
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# T\n\n```sh\necho a\n```\n\n<!-- illustrative: needs a cloud -->\n```python\nprint(1)\n```\n\n```text\noutput\n```\n<!-- run by: e2e/tests/x.rs -->\n```\nmake x\n```\n<!-- illustrative: -->\n```yaml\na: b\n```\n";

    #[test]
    fn blocks_are_found_with_language_text_and_marker() {
        let found = blocks(DOC);
        assert_eq!(found.len(), 5);
        assert_eq!(found[0].line, 3);
        assert_eq!(found[0].lang, "sh");
        assert_eq!(found[0].text, "echo a\n");
        assert_eq!(found[0].marker, None);
        assert_eq!(found[1].illustrative(), Some("needs a cloud"));
        assert!(found[1].is_python());
        assert!(!found[2].is_code(), "output is not pasted");
        assert_eq!(found[3].run_by(), Some("e2e/tests/x.rs"));
        assert!(found[3].is_code() && found[3].lang.is_empty());
    }

    #[test]
    fn every_code_block_must_be_run_or_say_why_not() {
        let problems = unaccounted("d.md", DOC, |path| path == "e2e/tests/x.rs");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("d.md:3: a sh block that no test runs"));
        assert!(problems[1].starts_with("d.md:20: an illustrative block says why"));
        let moved = unaccounted("d.md", DOC, |_| false);
        assert!(
            moved
                .iter()
                .any(|p| p.contains("e2e/tests/x.rs, which does not exist"))
        );
    }

    #[test]
    fn an_unterminated_fence_ends_at_the_end() {
        let found = blocks("```sh\nls\n");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].text, "ls\n");
    }
}
