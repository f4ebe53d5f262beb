//! The module graph of a crate, read from its source text, and the two rules the workspace keeps
//! (checked by `tests/workspace.rs`, part of `make lint`):
//!
//! - **No import cycles between files.** A file that names a path of another (`crate::a::b`,
//!   `super::b`, `use crate::{a, b}`) depends on it; no file may depend on itself through others.
//! - **Layers.** Each top-level module of a crate may import only the modules its layer table
//!   allows (the operator: `plumbing` below everything, `app` above everything).
//!
//! Test code is left out: `#[cfg(test)]` modules inline or in their own files (a test may reach
//! into any layer). Everything here is pure over the file texts; [`read_crate`] is the one reader.
//!
//! Why not a crate per layer: the compiler would enforce the direction, but the operator's layers
//! share one binary, one error type and one metrics registry, and a crate per layer would split
//! those for no runtime gain. A file-level graph also catches cycles inside a layer, which crates
//! would not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub mod parse;

/// A module path inside a crate, `[]` for the crate root (`["sandbox", "status"]`).
pub type ModPath = Vec<String>;

/// One source file of a crate: its module path and its text with comments and test modules removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Path relative to the crate's `src/`.
    pub file: String,
    /// The module the file defines.
    pub module: ModPath,
    /// Whether it is a `mod.rs`, `lib.rs` or `main.rs` (its `super` is its parent's parent).
    pub is_dir_module: bool,
    /// The code, without comments, string contents and `#[cfg(test)]` items.
    pub code: String,
    /// The modules it declares under `#[cfg(test)]` in files of their own (`#[cfg(test)] mod x;`).
    pub test_modules: Vec<String>,
}

impl SourceFile {
    /// The file `file` (relative to `src/`) with text `text` (pure); `None` outside the library.
    pub fn new(file: &str, text: &str) -> Option<Self> {
        let (module, is_dir_module) = module_of(file)?;
        let clean = parse::strip_comments(text);
        Some(Self {
            file: file.to_string(),
            module,
            is_dir_module,
            test_modules: parse::test_module_declarations(&clean),
            code: parse::strip_tests(&clean),
        })
    }
}

/// The module path a file under `src/` defines (pure): `a/b.rs` and `a/b/mod.rs` are `a::b`,
/// `lib.rs` and `main.rs` the root. `None` for files outside the library (`bin/`).
pub fn module_of(relative: &str) -> Option<(ModPath, bool)> {
    let relative = relative.strip_suffix(".rs")?;
    if relative.starts_with("bin/") {
        return None;
    }
    let mut parts: Vec<String> = relative.split('/').map(str::to_string).collect();
    let last = parts.last().cloned().unwrap_or_default();
    if parts.len() == 1 && (last == "lib" || last == "main") {
        return Some((vec![], true));
    }
    if last == "mod" {
        parts.pop();
        return Some((parts, true));
    }
    Some((parts, false))
}

/// The files of a crate whose `src/` is `src`, with test-only files left out: a file is test-only
/// when its parent declares it under `#[cfg(test)]`.
pub fn read_crate(src: &Path) -> std::io::Result<Vec<SourceFile>> {
    let mut paths = Vec::new();
    collect(src, &mut paths)?;
    let mut files = Vec::new();
    for path in paths {
        let relative = path
            .strip_prefix(src)
            .unwrap_or(&path)
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path)?;
        files.extend(SourceFile::new(&relative, &text));
    }
    let test_only = test_only_modules(&files);
    files.retain(|f| !test_only.iter().any(|t| f.module.starts_with(t)));
    Ok(files)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Modules declared `#[cfg(test)] mod name;` by their parent (pure).
fn test_only_modules(files: &[SourceFile]) -> Vec<ModPath> {
    files
        .iter()
        .flat_map(|f| {
            f.test_modules.iter().cloned().map(move |name| {
                // `a/b.rs` and `a/b/mod.rs` declaring `mod c;` both own `a::b::c`.
                let mut path = f.module.clone();
                path.push(name);
                path
            })
        })
        .collect()
}

/// The file-level dependency graph: for each file, the files whose modules it names (pure). A path
/// names the longest module prefix that is a file of the crate; a path to the crate root or to the
/// file itself is not an edge.
pub fn graph(files: &[SourceFile]) -> BTreeMap<String, BTreeSet<String>> {
    let by_module: BTreeMap<&ModPath, &str> =
        files.iter().map(|f| (&f.module, f.file.as_str())).collect();
    let mut edges = BTreeMap::new();
    for file in files {
        let mut targets = BTreeSet::new();
        let children = parse::module_declarations(&file.code);
        for path in parse::paths_from(&file.code, &children) {
            let Some(absolute) = resolve(file, &path) else {
                continue;
            };
            let target = (1..=absolute.len())
                .rev()
                .find_map(|n| by_module.get(&absolute[..n].to_vec()).copied());
            if let Some(target) = target
                && target != file.file
            {
                targets.insert(target.to_string());
            }
        }
        edges.insert(file.file.clone(), targets);
    }
    edges
}

/// The absolute module path of a path written in `file` (pure): `crate::a::b` is `a::b`;
/// `super::b` is relative to the file's parent module; `self::b` to the file's own module. Other
/// paths (other crates, local names) are `None`.
fn resolve(file: &SourceFile, path: &[String]) -> Option<ModPath> {
    let (first, rest) = path.split_first()?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some(file.module.iter().chain(rest).cloned().collect()),
        "super" => {
            let mut base = file.module.clone();
            let mut rest = rest;
            base.pop()?;
            while let Some((next, tail)) = rest.split_first() {
                if next != "super" {
                    break;
                }
                base.pop()?;
                rest = tail;
            }
            Some(base.into_iter().chain(rest.iter().cloned()).collect())
        }
        _ => None,
    }
}

/// Every cycle of the graph, as its files in order (pure): the strongly connected components with
/// more than one file (Tarjan's algorithm), each sorted.
pub fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, node: &'a str) {
        s.index.insert(node, s.next);
        s.low.insert(node, s.next);
        s.next += 1;
        s.stack.push(node);
        s.on_stack.insert(node);
        let graph = s.graph;
        for target in graph.get(node).into_iter().flatten() {
            let target = target.as_str();
            if !s.index.contains_key(target) {
                visit(s, target);
                let low = s.low[target].min(s.low[node]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(target) {
                let low = s.index[target].min(s.low[node]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            while let Some(top) = s.stack.pop() {
                s.on_stack.remove(top);
                component.push(top.to_string());
                if top == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found.sort();
    state.found
}

/// A layer table: each top-level module and the top-level modules it may import.
pub type Layers<'a> = &'a [(&'a str, &'a [&'a str])];

/// The imports that break `layers` (pure): `file -> target` for every edge from a top-level
/// module to another that its row does not list. Files at the crate root (`lib.rs`, `main.rs`) and
/// modules the table does not name are unchecked; a module the table names may always import
/// itself.
pub fn layer_violations(
    graph: &BTreeMap<String, BTreeSet<String>>,
    layers: Layers<'_>,
) -> Vec<String> {
    let top = |file: &str| -> Option<String> {
        let (module, _) = module_of(file)?;
        module.first().cloned()
    };
    let mut found = Vec::new();
    for (file, targets) in graph {
        let Some(from) = top(file) else { continue };
        let Some((_, allowed)) = layers.iter().find(|(name, _)| *name == from) else {
            continue;
        };
        for target in targets {
            let Some(to) = top(target) else { continue };
            if to != from && !allowed.contains(&to.as_str()) {
                found.push(format!("{file} -> {target} ({from} may not import {to})"));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, code: &str) -> SourceFile {
        SourceFile::new(name, code).unwrap()
    }

    #[test]
    fn files_map_to_their_modules() {
        assert_eq!(module_of("lib.rs"), Some((vec![], true)));
        assert_eq!(module_of("a/mod.rs"), Some((vec!["a".into()], true)));
        assert_eq!(
            module_of("a/b.rs"),
            Some((vec!["a".into(), "b".into()], false))
        );
        assert_eq!(module_of("bin/x.rs"), None);
    }

    #[test]
    fn crate_super_and_self_paths_resolve_to_files() {
        let files = vec![
            file("lib.rs", "pub mod a; pub mod b;"),
            file("a/mod.rs", "pub mod x; use self::x::f; use super::b::g;"),
            file("a/x.rs", "use super::super::b; fn f() { crate::b::g(); }"),
            file("b.rs", "use crate::{a::x::f, a};"),
        ];
        let g = graph(&files);
        assert_eq!(
            g["a/mod.rs"],
            BTreeSet::from(["a/x.rs".to_string(), "b.rs".to_string()])
        );
        assert_eq!(g["a/x.rs"], BTreeSet::from(["b.rs".to_string()]));
        assert_eq!(
            g["b.rs"],
            BTreeSet::from(["a/x.rs".to_string(), "a/mod.rs".to_string()])
        );
        assert_eq!(g["lib.rs"], BTreeSet::new());
    }

    #[test]
    fn a_cycle_is_found_and_a_chain_is_not() {
        let files = vec![
            file("lib.rs", ""),
            file("a.rs", "use crate::b::B;"),
            file("b.rs", "use crate::c::C;"),
            file("c.rs", "fn f() { crate::a::g() }"),
            file("d.rs", "use crate::a;"),
        ];
        assert_eq!(
            cycles(&graph(&files)),
            vec![vec!["a.rs".to_string(), "b.rs".into(), "c.rs".into()]]
        );
        let files = vec![file("a.rs", "use crate::b::B;"), file("b.rs", "")];
        assert!(cycles(&graph(&files)).is_empty());
    }

    #[test]
    fn test_modules_and_comments_are_not_dependencies() {
        let files = vec![
            file(
                "a.rs",
                "// crate::b is mentioned\n/// see crate::b\nfn f() {}\n#[cfg(test)]\nmod tests { use crate::b; }",
            ),
            file("b.rs", "use crate::a;"),
        ];
        assert!(cycles(&graph(&files)).is_empty());
    }

    #[test]
    fn imports_against_the_layer_table_are_reported() {
        let files = vec![
            file("low/x.rs", "use crate::high::y;"),
            file("high/y.rs", "use crate::low::x;"),
            file("other/z.rs", "use crate::high::y;"),
        ];
        let layers: Layers<'_> = &[("low", &[]), ("high", &["low"])];
        assert_eq!(
            layer_violations(&graph(&files), layers),
            vec!["low/x.rs -> high/y.rs (low may not import high)".to_string()]
        );
    }
}
