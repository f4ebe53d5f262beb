//! Just enough of Rust's lexical structure to read module paths (pure): comments and literals
//! removed, `#[cfg(test)]` items removed, and the `crate::`, `super::` and `self::` paths of what
//! remains, `use` trees expanded.

/// `text` with comments removed and the contents of string and character literals blanked (a
/// string that spells a path is not an import). Line structure is kept.
pub fn strip_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => out.push('\n'),
                    _ => {}
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                } else if chars[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{..}'), or a lifetime ('a) left as it is.
            let close = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The names of modules declared `#[cfg(test)] mod name;` (in files of their own) in `code`.
pub fn test_module_declarations(code: &str) -> Vec<String> {
    let tokens = tokens(code);
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if let Some(end) = cfg_test_at(&tokens, i) {
            let mut j = end;
            while tokens
                .get(j)
                .is_some_and(|t| t == "pub" || t.starts_with('('))
            {
                j += 1;
            }
            if tokens.get(j).map(String::as_str) == Some("mod")
                && tokens.get(j + 2).map(String::as_str) == Some(";")
                && let Some(name) = tokens.get(j + 1)
            {
                found.push(name.clone());
            }
            i = end;
        } else {
            i += 1;
        }
    }
    found
}

/// `code` without the items marked `#[cfg(test)]` (a module, a function, a `use`, ...): from the
/// attribute to the item's `;` or the end of its `{ ... }` block.
pub fn strip_tests(code: &str) -> String {
    let bytes = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < code.len() {
        if code[i..].starts_with("#[cfg(test)]") {
            let mut j = i + "#[cfg(test)]".len();
            let mut depth = 0usize;
            while j < bytes.len() {
                match bytes[j] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            j += 1;
                            break;
                        }
                    }
                    b';' if depth == 0 => {
                        j += 1;
                        break;
                    }
                    _ => {}
                }
                j += 1;
            }
            i = j;
        } else {
            let c = code[i..].chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The index just after a `# [ cfg ( test ) ]` at `i`, if there is one.
fn cfg_test_at(tokens: &[String], i: usize) -> Option<usize> {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    let matches = want
        .iter()
        .enumerate()
        .all(|(k, w)| tokens.get(i + k).map(String::as_str) == Some(*w));
    matches.then_some(i + want.len())
}

/// Identifiers, `::` and single punctuation characters of `code` (whitespace dropped).
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// Every path of `code` that starts with `crate`, `super` or `self` and continues with `::`, as its
/// segments; `use` trees (`crate::{a, b::{c, self}}`) expanded into one path per leaf.
pub fn paths(code: &str) -> Vec<Vec<String>> {
    paths_from(code, &[])
}

/// The modules `code` declares (`mod name;`, `pub mod name;`, `pub(crate) mod name;`).
pub fn module_declarations(code: &str) -> Vec<String> {
    let tokens = tokens(code);
    tokens
        .windows(3)
        .filter(|w| w[0] == "mod" && w[2] == ";" && is_ident(&w[1]))
        .map(|w| w[1].clone())
        .collect()
}

/// [`paths`], and also the paths that start with one of `children` (modules the file declares,
/// named without a prefix: `routes::State`), with `self` put in front of them.
pub fn paths_from(code: &str, children: &[String]) -> Vec<Vec<String>> {
    let tokens = tokens(code);
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let unprefixed = i == 0 || tokens[i - 1] != "::";
        let child = unprefixed
            && children.contains(&tokens[i])
            && tokens.get(i + 1).map(String::as_str) == Some("::");
        if child {
            i = tree(&tokens, i, vec!["self".to_string()], &mut found);
            continue;
        }
        let starts = matches!(tokens[i].as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).map(String::as_str) == Some("::")
            && unprefixed;
        if starts {
            i = tree(&tokens, i, Vec::new(), &mut found);
        } else {
            i += 1;
        }
    }
    found
}

/// Reads the use tree at `i` under `prefix`, pushing its leaves to `found`; returns the index after it.
fn tree(
    tokens: &[String],
    mut i: usize,
    mut prefix: Vec<String>,
    found: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match tokens.get(i).map(String::as_str) {
            Some("{") => {
                i += 1;
                loop {
                    match tokens.get(i).map(String::as_str) {
                        None => return i,
                        Some("}") => return i + 1,
                        Some(",") => i += 1,
                        Some(_) => i = tree(tokens, i, prefix.clone(), found),
                    }
                }
            }
            Some(segment) if is_ident(segment) => {
                if segment != "self" || prefix.is_empty() {
                    prefix.push(segment.to_string());
                }
                i += 1;
                if tokens.get(i).map(String::as_str) == Some("::") {
                    i += 1;
                    continue;
                }
                found.push(prefix);
                // A rename (`a::B as C`) names nothing more.
                if tokens.get(i).map(String::as_str) == Some("as") {
                    i += 2;
                }
                return i;
            }
            _ => {
                if !prefix.is_empty() {
                    found.push(prefix);
                }
                return i;
            }
        }
    }
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(paths: &[&str]) -> Vec<Vec<String>> {
        paths
            .iter()
            .map(|p| p.split("::").map(str::to_string).collect())
            .collect()
    }

    #[test]
    fn use_trees_expand_to_one_path_per_leaf() {
        assert_eq!(
            paths("use crate::{a, b::{c, self}, d::E as F}; use super::x::*;"),
            strings(&[
                "crate::a",
                "crate::b::c",
                "crate::b",
                "crate::d::E",
                "super::x"
            ])
        );
    }

    #[test]
    fn expressions_and_visibility_are_read_right() {
        assert_eq!(
            paths("pub(crate) fn f() { crate::a::b(1); self.x; x::crate_y(); Self::z(); }"),
            strings(&["crate::a::b"])
        );
    }

    #[test]
    fn comments_and_literals_hide_their_paths() {
        let code = strip_comments(
            "let a = \"crate::x\"; // crate::y\n/* crate::z /* nested */ */ let b = r#\"crate::w\"#; let c = '\"'; fn f<'a>(x: &'a str) { crate::v(); }",
        );
        assert_eq!(paths(&code), strings(&["crate::v"]));
    }

    #[test]
    fn paths_through_declared_children_are_read_too() {
        let code = "pub mod routes; mod http; use routes::{State, x::Y}; fn f() { http::serve(); other::g(); }";
        assert_eq!(
            module_declarations(code),
            vec!["routes".to_string(), "http".to_string()]
        );
        assert_eq!(
            paths_from(code, &module_declarations(code)),
            strings(&[
                "self::routes::State",
                "self::routes::x::Y",
                "self::http::serve"
            ])
        );
    }

    #[test]
    fn test_items_are_removed_and_test_files_named() {
        let code = "fn a() {}\n#[cfg(test)]\nmod tests { use crate::x; fn t() { if true { } } }\n#[cfg(test)]\npub mod mock;\n#[cfg(test)]\nuse crate::y;\nfn b() { crate::z(); }";
        assert_eq!(paths(&strip_tests(code)), strings(&["crate::z"]));
        assert_eq!(test_module_declarations(code), vec!["mock".to_string()]);
    }
}
