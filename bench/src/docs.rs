//! Writing benchmark results into the documentation: one section of a Markdown file, from its `## `
//! heading to the next one, replaced (or appended) by the benchmarks that produce it.

use std::path::Path;

/// `text` with the section at `heading` replaced by `section` (appended when absent) (pure).
pub fn replace_section(text: &str, heading: &str, section: &str) -> String {
    let section = section.trim_end_matches('\n').to_string() + "\n\n";
    let at_line_start = |i: usize| i == 0 || text.as_bytes()[i - 1] == b'\n';
    let start = text
        .match_indices(&format!("{heading}\n"))
        .map(|(i, _)| i)
        .find(|i| at_line_start(*i));
    let Some(start) = start else {
        return format!("{}\n\n{section}", text.trim_end());
    };
    let after = &text[start + heading.len()..];
    let end = after
        .find("\n## ")
        .map_or(text.len(), |i| start + heading.len() + i + 1);
    format!("{}{section}{}", &text[..start], &text[end..])
}

/// `10,000` (pure).
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Replaces the section at `heading` of the Markdown file `doc` with `section`.
pub fn write_section(doc: &Path, heading: &str, section: &str) -> std::io::Result<()> {
    let text = std::fs::read_to_string(doc).unwrap_or_else(|_| "# Benchmarks\n".into());
    std::fs::write(doc, replace_section(&text, heading, section))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_grouped_by_thousands() {
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(10_000), "10,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn a_section_is_replaced_up_to_the_next_heading() {
        let text = "# B\n\n## A\nold a\n\n## Scale\nold\n\n## C\nc\n";
        assert_eq!(
            replace_section(text, "## Scale", "## Scale\nnew\n"),
            "# B\n\n## A\nold a\n\n## Scale\nnew\n\n## C\nc\n"
        );
        assert_eq!(
            replace_section("# B\n", "## Scale", "## Scale\nnew"),
            "# B\n\n## Scale\nnew\n\n"
        );
        assert_eq!(
            replace_section("## Scale setup\nx\n", "## Scale", "## Scale\nnew"),
            "## Scale setup\nx\n\n## Scale\nnew\n\n",
            "a heading that only starts like it is another section"
        );
    }
}
