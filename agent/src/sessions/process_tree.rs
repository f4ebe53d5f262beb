//! The processes below a process (its children, theirs, ...), from `/proc/<pid>/stat`: what a session
//! kills when an interrupted command does not end, and what a signal for the running command reaches,
//! without the shell itself. Parsing and the tree walk are pure; [`descendants_of`], [`children_of`] and
//! [`command_processes`] read `/proc`.

use std::collections::{HashMap, HashSet};

/// The parent pid in the text of `/proc/<pid>/stat` (`pid (comm) state ppid ...`; `comm` may hold
/// spaces and parentheses, so the fields are counted from the last `)`).
pub fn parse_parent(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

/// The pids in the text of `/proc/<pid>/task/<tid>/children` (separated by spaces; anything else is
/// skipped).
pub fn parse_children(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .collect()
}

/// Every pid below `root` in the `(pid, parent)` pairs, children before their children.
pub fn descendants(root: i32, processes: &[(i32, i32)]) -> Vec<i32> {
    descendants_except(root, &[], processes)
}

/// Every pid below `root` except the `excluded` ones and everything below them.
pub fn descendants_except(root: i32, excluded: &[i32], processes: &[(i32, i32)]) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (pid, parent) in processes {
        children.entry(*parent).or_default().push(*pid);
    }
    let mut found = Vec::new();
    let mut seen: HashSet<i32> = excluded.iter().copied().collect();
    seen.insert(root);
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

/// Every process now as `(pid, parent)` (empty when `/proc` cannot be read).
fn processes() -> Vec<(i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, parse_parent(&stat)?))
        })
        .collect()
}

/// The processes below `root` now (empty when `/proc` cannot be read).
pub fn descendants_of(root: i32) -> Vec<i32> {
    descendants(root, &processes())
}

/// The children of the single-threaded process `pid` now, in one read of
/// `/proc/<pid>/task/<pid>/children` (cheap enough for every session run); `None` when the kernel does
/// not list children (built without `CONFIG_PROC_CHILDREN`) or `pid` is gone.
pub fn children_of(pid: i32) -> Option<Vec<i32>> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .map(|text| parse_children(&text))
}

/// The processes of the command a shell (`shell`) runs now: every process below it except the
/// `earlier` children (its `&` jobs from before the command started) and theirs. Without `earlier`
/// (unknown), every process below the shell.
pub fn command_processes(shell: i32, earlier: Option<&[i32]>) -> Vec<i32> {
    descendants_except(shell, earlier.unwrap_or_default(), &processes())
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
    fn children_lists_are_pids_separated_by_spaces() {
        assert_eq!(parse_children("12 345 6 "), vec![12, 345, 6]);
        assert_eq!(parse_children(""), Vec::<i32>::new());
        assert_eq!(parse_children("7 x 8\n"), vec![7, 8]);
    }

    #[test]
    fn earlier_children_and_their_trees_are_left_out() {
        // The shell (1) has an `&` job (2, with a child 3) from before, and the command (4, with 5).
        let processes = [(2, 1), (3, 2), (4, 1), (5, 4), (6, 9)];
        let mut command = descendants_except(1, &[2], &processes);
        command.sort();
        assert_eq!(command, vec![4, 5]);
        let mut all = descendants_except(1, &[], &processes);
        all.sort();
        assert_eq!(all, vec![2, 3, 4, 5]);
        assert_eq!(
            descendants_except(1, &[2, 4], &processes),
            Vec::<i32>::new()
        );
        assert_eq!(
            descendants_except(1, &[99], &processes).len(),
            4,
            "a child gone since is no matter"
        );
    }

    #[test]
    fn this_process_has_no_descendants_it_did_not_start() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let below = descendants_of(std::process::id() as i32);
        assert!(below.contains(&(child.id() as i32)), "{below:?}");
        let pid = child.id() as i32;
        // The test harness is multi-threaded: children of other threads are not in this one's list.
        if let Some(children) = children_of(pid) {
            assert!(children.is_empty(), "sleep starts nothing: {children:?}");
        }
        assert_eq!(children_of(-1), None);
        let mine = command_processes(std::process::id() as i32, Some(&[pid]));
        assert!(!mine.contains(&pid), "{mine:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
