//! The processes below a process (its children, theirs, ...), from `/proc/<pid>/stat`: what a session
//! kills when an interrupted command does not end, without killing the shell itself. Parsing and the
//! tree walk are pure; [`descendants_of`] reads `/proc`.

use std::collections::{HashMap, HashSet};

/// The parent pid in the text of `/proc/<pid>/stat` (`pid (comm) state ppid ...`; `comm` may hold
/// spaces and parentheses, so the fields are counted from the last `)`).
pub fn parse_parent(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// Every pid below `root` in the `(pid, parent)` pairs, children before their children.
pub fn descendants(root: i32, processes: &[(i32, i32)]) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, parent) in processes {
        children.entry(*parent).or_default().push(*pid);
    }
    let mut found = Vec::new();
    let mut seen = HashSet::from([root]);
    let mut queue = vec![root];
    while let Some(next) = queue.pop() {
        for child in children.get(&next).into_iter().flatten() {
            if seen.insert(*child) {
                found.push(*child);
                queue.push(*child);
            }
        }
    }
    found
}

/// The processes below `root` now (empty when `/proc` cannot be read).
pub fn descendants_of(root: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let processes: Vec<(i32, i32)> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, parse_parent(&stat)?))
        })
        .collect();
    descendants(root, &processes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_read_after_the_command_name() {
        assert_eq!(parse_parent("42 (bash) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parse_parent("43 (a) b (c) R 9 1"), Some(9));
        assert_eq!(parse_parent("garbage"), None);
        assert_eq!(parse_parent("1 (x) S"), None);
    }

    #[test]
    fn the_tree_below_a_process() {
        let processes = [(2, 1), (3, 2), (4, 3), (5, 1), (6, 2), (7, 7)];
        let mut below = descendants(2, &processes);
        below.sort();
        assert_eq!(below, vec![3, 4, 6]);
        assert!(descendants(4, &processes).is_empty());
        assert_eq!(descendants(7, &processes), Vec::<i32>::new(), "no cycles");
    }

    #[test]
    fn this_process_has_no_descendants_it_did_not_start() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let below = descendants_of(std::process::id() as i32);
        assert!(below.contains(&(child.id() as i32)), "{below:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
