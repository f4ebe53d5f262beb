//! The values reference of `docs/CONFIGURATION.md`, generated from the `# --` comments of the chart's
//! `values.yaml`. One implementation for both users: `make docs` (`gen-docs`) writes the file, and
//! `tests/docs_drift.rs` fails when the committed file differs from what this module generates.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The chart's values file, relative to the workspace root.
pub const VALUES_YAML: &str = "charts/orchard-env/values.yaml";
/// The generated document, relative to the workspace root.
pub const CONFIGURATION_MD: &str = "docs/CONFIGURATION.md";
/// The make target that regenerates the document.
pub const MAKE_TARGET: &str = "make docs";
/// Start of the line that opens the generated table (the line is rewritten to [`BEGIN`]).
const BEGIN_PREFIX: &str = "<!-- BEGIN VALUES";
/// The line that opens the generated table.
pub const BEGIN: &str =
    "<!-- BEGIN VALUES: generated from charts/orchard-env/values.yaml by `make docs` -->\n";
/// The line that closes the generated table.
pub const END: &str = "<!-- END VALUES -->";

/// One row of the values reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueDoc {
    /// Dotted key, e.g. `image.repository`.
    pub key: String,
    /// Default value as JSON.
    pub default: String,
    /// The text of its `# --` comment.
    pub description: String,
}

/// The `# --` documented keys of values.yaml (`text`), in file order, with their defaults; an error
/// names a leaf value that is documented neither itself nor through an ancestor (pure).
pub fn values_reference(text: &str) -> Result<Vec<ValueDoc>, String> {
    let values: Value =
        serde_yaml::from_str(text).map_err(|e| format!("values.yaml does not parse: {e}"))?;
    let mut docs = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(description) = trimmed.strip_prefix("# --") {
            pending = Some(description.trim().to_string());
            continue;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('-') {
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            continue;
        };
        if key.contains(' ') || key.starts_with(['"', '\'']) {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let path: Vec<String> = stack
            .iter()
            .map(|(_, k)| k.clone())
            .chain([key.to_string()])
            .collect();
        if let Some(description) = pending.take() {
            let value = path.iter().fold(&values, |v, k| &v[k.as_str()]);
            docs.push(ValueDoc {
                key: path.join("."),
                default: serde_json::to_string(value).map_err(|e| format!("{key}: {e}"))?,
                description,
            });
        }
        stack.push((indent, key.to_string()));
    }
    // Every leaf value is documented itself or through a documented ancestor.
    fn leaves(value: &Value, prefix: &str, out: &mut Vec<String>) {
        match value.as_object() {
            Some(map) if !map.is_empty() => {
                for (key, child) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    leaves(child, &path, out);
                }
            }
            _ => out.push(prefix.to_string()),
        }
    }
    let mut all = Vec::new();
    leaves(&values, "", &mut all);
    for leaf in all {
        if !docs
            .iter()
            .any(|d| leaf == d.key || leaf.starts_with(&format!("{}.", d.key)))
        {
            return Err(format!("values.yaml: `{leaf}` has no `# --` description"));
        }
    }
    Ok(docs)
}

/// The Markdown table of the values reference of values.yaml (`text`) (pure).
pub fn values_table(text: &str) -> Result<String, String> {
    let mut table = String::from("| Key | Default | Description |\n|---|---|---|\n");
    for doc in values_reference(text)? {
        table.push_str(&format!(
            "| `{}` | `{}` | {} |\n",
            doc.key,
            doc.default.replace('|', "\\|"),
            doc.description.replace('|', "\\|")
        ));
    }
    Ok(table)
}

/// `document` with the text between its BEGIN VALUES line and [`END`] replaced by `table`, and the
/// BEGIN VALUES line itself replaced by [`BEGIN`] (pure).
pub fn with_table(document: &str, table: &str) -> Result<String, String> {
    let start = document
        .match_indices(BEGIN_PREFIX)
        .map(|(i, _)| i)
        .find(|i| *i == 0 || document.as_bytes()[i - 1] == b'\n')
        .ok_or_else(|| format!("{CONFIGURATION_MD} has no `{BEGIN_PREFIX}` marker line"))?;
    let head = &document[..start];
    let after_begin = document[start..]
        .split_once('\n')
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("{CONFIGURATION_MD}: nothing after the BEGIN VALUES marker"))?;
    let (_, tail) = after_begin
        .split_once(END)
        .ok_or_else(|| format!("{CONFIGURATION_MD} has no `{END}` marker"))?;
    Ok(format!("{head}{BEGIN}{table}{END}{tail}"))
}

/// The committed `docs/CONFIGURATION.md` and what it should be.
#[derive(Debug, Clone)]
pub struct ConfigurationDoc {
    /// Path of the document.
    pub path: PathBuf,
    /// Its text on disk.
    pub current: String,
    /// Its text with the table generated from values.yaml.
    pub expected: String,
    /// The generated table alone.
    pub table: String,
}

impl ConfigurationDoc {
    /// Whether the committed document is what the generator writes.
    pub fn is_up_to_date(&self) -> bool {
        self.current == self.expected
    }
}

/// Reads values.yaml and docs/CONFIGURATION.md under the workspace `root` and generates the document.
pub fn generate(root: &Path) -> Result<ConfigurationDoc, String> {
    let read = |relative: &str| {
        std::fs::read_to_string(root.join(relative))
            .map_err(|e| format!("cannot read {relative}: {e}"))
    };
    let table = values_table(&read(VALUES_YAML)?)?;
    let current = read(CONFIGURATION_MD)?;
    let expected = with_table(&current, &table)?;
    Ok(ConfigurationDoc {
        path: root.join(CONFIGURATION_MD),
        current,
        expected,
        table,
    })
}

/// Regenerates docs/CONFIGURATION.md under `root`; returns whether the file changed (it is not
/// written when it is already up to date).
pub fn write(root: &Path) -> Result<bool, String> {
    let doc = generate(root)?;
    if doc.is_up_to_date() {
        return Ok(false);
    }
    std::fs::write(&doc.path, &doc.expected)
        .map_err(|e| format!("cannot write {}: {e}", doc.path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUES: &str = "# -- Replicas.\nreplicas: 1\n# -- The image.\nimage:\n  # -- Where | from.\n  repository: ghcr.io/x\n  tag: \"\"\n";

    #[test]
    fn keys_are_documented_directly_or_through_an_ancestor() {
        let docs = values_reference(VALUES).expect("documented");
        let keys: Vec<_> = docs.iter().map(|d| d.key.as_str()).collect();
        assert_eq!(keys, ["replicas", "image", "image.repository"]);
        assert_eq!(docs[2].default, "\"ghcr.io/x\"");
        let undocumented = values_reference("# -- A.\na: 1\nb: 2\n").unwrap_err();
        assert!(
            undocumented.contains("`b` has no `# --` description"),
            "{undocumented}"
        );
    }

    #[test]
    fn the_table_replaces_the_text_between_the_markers_and_the_marker_line() {
        let table = values_table(VALUES).expect("table");
        assert!(table.contains("| `image.repository` | `\"ghcr.io/x\"` | Where \\| from. |\n"));
        let document =
            "# Doc\n\n<!-- BEGIN VALUES: old words -->\nstale\n<!-- END VALUES -->\nafter\n";
        let updated = with_table(document, &table).expect("markers");
        assert_eq!(updated, format!("# Doc\n\n{BEGIN}{table}{END}\nafter\n"));
        assert_eq!(with_table(&updated, &table).expect("markers"), updated);
        assert!(with_table("no markers\n", &table).is_err());
    }
}
