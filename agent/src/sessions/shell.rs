//! Which shell a session runs, and what it is told before the first command. Pure: the file system is
//! asked through the `exists` predicate the caller passes.

use std::path::{Path, PathBuf};

/// Where bash is looked for first, before `PATH`.
const BASH: &str = "/bin/bash";
/// Where sh is looked for first, before `PATH`.
const SH: &str = "/bin/sh";

/// What the shell runs before the first command: `__orchard_run` runs a command (given in
/// `__orchard_command`) in the shell itself, so its `cd`, variables and functions persist; an interrupt
/// (SIGINT) makes it return 130, which aborts the command as a whole (loops included) without ending
/// the shell. Commands the shell starts get SIGINT's default action back (a handled signal is reset
/// at `exec`), so they die of it. `command eval`, not `eval`: a syntax error in a special built-in's
/// argument ends a POSIX shell (dash, ash), and `command` turns that into a failed command.
pub const PRELUDE: &str =
    "__orchard_run() { command eval \"$__orchard_command\"; }\ntrap 'return 130' INT\n";

/// The shell to start: the requested one (a path, or a name looked up in `path_var`), else bash when
/// the image has it (`/bin/bash` or on `PATH`), else sh. `None` when none of them exists.
pub fn choose_shell(
    requested: Option<&str>,
    path_var: Option<&str>,
    exists: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    let find = |name: &str| -> Option<PathBuf> {
        if name.contains('/') {
            let path = PathBuf::from(name);
            return exists(&path).then_some(path);
        }
        path_var
            .unwrap_or("/usr/local/bin:/usr/bin:/bin")
            .split(':')
            .filter(|directory| !directory.is_empty())
            .map(|directory| Path::new(directory).join(name))
            .find(|candidate| exists(candidate))
    };
    match requested {
        Some(name) => find(name),
        None => find(BASH)
            .or_else(|| find("bash"))
            .or_else(|| find(SH))
            .or_else(|| find("sh")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(requested: Option<&str>, present: &[&str]) -> Option<String> {
        choose_shell(requested, Some("/usr/bin:/bin"), |path| {
            present.iter().any(|p| Path::new(p) == path)
        })
        .map(|path| path.display().to_string())
    }

    #[test]
    fn bash_first_then_sh() {
        assert_eq!(
            chosen(None, &["/bin/bash", "/bin/sh"]).as_deref(),
            Some("/bin/bash")
        );
        assert_eq!(
            chosen(None, &["/usr/bin/bash", "/bin/sh"]).as_deref(),
            Some("/usr/bin/bash"),
            "bash on PATH"
        );
        assert_eq!(chosen(None, &["/bin/sh"]).as_deref(), Some("/bin/sh"));
        assert_eq!(
            chosen(None, &["/usr/bin/sh"]).as_deref(),
            Some("/usr/bin/sh")
        );
        assert_eq!(chosen(None, &[]), None);
    }

    #[test]
    fn a_requested_shell_is_used_as_given_or_found_on_path() {
        assert_eq!(
            chosen(Some("/bin/sh"), &["/bin/bash", "/bin/sh"]).as_deref(),
            Some("/bin/sh")
        );
        assert_eq!(
            chosen(Some("zsh"), &["/usr/bin/zsh"]).as_deref(),
            Some("/usr/bin/zsh")
        );
        assert_eq!(chosen(Some("/opt/fish"), &["/bin/bash"]), None);
    }
}
