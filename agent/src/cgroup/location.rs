//! Finding the agent's cgroup files from the text of `/proc/self/cgroup`. Pure: whether a directory
//! exists is asked through the `exists` predicate.
//!
//! cgroup v2 (the unified hierarchy mounted at `/sys/fs/cgroup`, which then has `cgroup.controllers`):
//! the `0::<path>` line names the cgroup below the mount. cgroup v1: one line per hierarchy,
//! `<id>:<controllers>:<path>`, each mounted at `/sys/fs/cgroup/<controllers>` (or one of its
//! controllers' names). In a container with its own cgroup namespace the path is `/`; without one it
//! is the container's path from the host's root, which the container may or may not see mounted: the
//! first of `<mount>/<path>` and `<mount>` that exists is taken.

use std::path::{Path, PathBuf};

/// Where cgroup file systems are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// One line of `/proc/self/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine {
    /// Controllers of the hierarchy (empty for the v2 line).
    pub controllers: Vec<String>,
    /// Path of the cgroup in its hierarchy.
    pub path: String,
}

/// The lines of `/proc/self/cgroup` (malformed ones skipped).
pub fn parse_proc_cgroup(text: &str) -> Vec<CgroupLine> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let _id = fields.next()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            Some(CgroupLine {
                controllers: controllers
                    .split(',')
                    .filter(|name| !name.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// Which cgroup version the files are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CgroupVersion {
    pub fn name(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        }
    }
}

/// The files the agent reads, where they exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupFiles {
    pub version: CgroupVersion,
    /// v2 `cpu.stat` (`usage_usec`), v1 `cpuacct.usage` (nanoseconds).
    pub cpu: Option<PathBuf>,
    /// v2 `memory.current`, v1 `memory.usage_in_bytes`.
    pub memory: Option<PathBuf>,
    /// v2 `memory.peak`, v1 `memory.max_usage_in_bytes`.
    pub memory_peak: Option<PathBuf>,
    /// v2 `memory.max`, v1 `memory.limit_in_bytes`.
    pub memory_limit: Option<PathBuf>,
    /// `pids.current` (both versions).
    pub pids: Option<PathBuf>,
    /// v2 `memory.events`, v1 `memory.oom_control` (both have an `oom_kill` line).
    pub oom_kills: Option<PathBuf>,
}

/// The directory of the cgroup at `path` below `mounts` (tried in order): the first of
/// `<mount>/<path>` and `<mount>` that exists.
fn cgroup_directory(
    mounts: &[PathBuf],
    path: &str,
    exists: &impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    let relative = path.trim_start_matches('/');
    mounts.iter().find_map(|mount| {
        [mount.join(relative), mount.clone()]
            .into_iter()
            .find(|candidate| exists(candidate))
    })
}

/// Locates the agent's cgroup files: v2 when `unified` (the v2 hierarchy is what is mounted at
/// [`CGROUP_ROOT`]), else v1. A file is given only when its directory exists (the file itself may
/// still be missing: `memory.peak` needs Linux 5.19, a root cgroup has no `pids.current`).
pub fn locate(
    lines: &[CgroupLine],
    unified: bool,
    exists: impl Fn(&Path) -> bool,
) -> Option<CgroupFiles> {
    let root = PathBuf::from(CGROUP_ROOT);
    if unified {
        let line = lines.iter().find(|line| line.controllers.is_empty())?;
        let directory = cgroup_directory(std::slice::from_ref(&root), &line.path, &exists)?;
        let file = |name: &str| Some(directory.join(name));
        return Some(CgroupFiles {
            version: CgroupVersion::V2,
            cpu: file("cpu.stat"),
            memory: file("memory.current"),
            memory_peak: file("memory.peak"),
            memory_limit: file("memory.max"),
            pids: file("pids.current"),
            oom_kills: file("memory.events"),
        });
    }
    let directory_of = |controller: &str| {
        let line = lines
            .iter()
            .find(|line| line.controllers.iter().any(|name| name == controller))?;
        let mounts = [root.join(line.controllers.join(",")), root.join(controller)];
        cgroup_directory(&mounts, &line.path, &exists)
    };
    let cpu = directory_of("cpuacct");
    let memory = directory_of("memory");
    let pids = directory_of("pids");
    if cpu.is_none() && memory.is_none() && pids.is_none() {
        return None;
    }
    let memory_file = |name: &str| memory.as_ref().map(|directory| directory.join(name));
    Some(CgroupFiles {
        version: CgroupVersion::V1,
        cpu: cpu.map(|directory| directory.join("cpuacct.usage")),
        memory: memory_file("memory.usage_in_bytes"),
        memory_peak: memory_file("memory.max_usage_in_bytes"),
        memory_limit: memory_file("memory.limit_in_bytes"),
        pids: pids.map(|directory| directory.join("pids.current")),
        oom_kills: memory_file("memory.oom_control"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "9:name=systemd:/\n8:pids:/kubepods/pod1/c1\n4:memory:/kubepods/pod1/c1\n2:cpu,cpuacct:/kubepods/pod1/c1\n0::/\n";

    fn existing(paths: &'static [&'static str]) -> impl Fn(&Path) -> bool {
        move |path| paths.iter().any(|p| Path::new(p) == path)
    }

    #[test]
    fn lines_are_parsed() {
        let lines = parse_proc_cgroup(V1);
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[3].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(lines[3].path, "/kubepods/pod1/c1");
        assert!(lines[4].controllers.is_empty());
        assert_eq!(parse_proc_cgroup("garbage\n0::/a:b\n")[0].path, "/a:b");
    }

    #[test]
    fn v2_with_and_without_a_cgroup_namespace() {
        let namespaced = locate(
            &parse_proc_cgroup("0::/\n"),
            true,
            existing(&["/sys/fs/cgroup"]),
        )
        .unwrap();
        assert_eq!(namespaced.version, CgroupVersion::V2);
        assert_eq!(
            namespaced.memory.as_deref(),
            Some(Path::new("/sys/fs/cgroup/memory.current"))
        );
        let lines = parse_proc_cgroup("0::/kubepods.slice/pod1/c1\n");
        let host_view = locate(
            &lines,
            true,
            existing(&["/sys/fs/cgroup", "/sys/fs/cgroup/kubepods.slice/pod1/c1"]),
        )
        .unwrap();
        assert_eq!(
            host_view.cpu.as_deref(),
            Some(Path::new("/sys/fs/cgroup/kubepods.slice/pod1/c1/cpu.stat"))
        );
        assert_eq!(
            host_view.oom_kills.as_deref(),
            Some(Path::new(
                "/sys/fs/cgroup/kubepods.slice/pod1/c1/memory.events"
            ))
        );
        // The path is the host's but only the container's own cgroup is mounted.
        let mounted_own = locate(&lines, true, existing(&["/sys/fs/cgroup"])).unwrap();
        assert_eq!(
            mounted_own.pids.as_deref(),
            Some(Path::new("/sys/fs/cgroup/pids.current"))
        );
        assert_eq!(
            locate(&parse_proc_cgroup("1:memory:/\n"), true, existing(&[])),
            None
        );
    }

    #[test]
    fn v1_per_controller() {
        let files = locate(
            &parse_proc_cgroup(V1),
            false,
            existing(&[
                "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1",
                "/sys/fs/cgroup/memory/kubepods/pod1/c1",
                "/sys/fs/cgroup/pids",
            ]),
        )
        .unwrap();
        assert_eq!(files.version, CgroupVersion::V1);
        assert_eq!(
            files.cpu.as_deref(),
            Some(Path::new(
                "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1/cpuacct.usage"
            ))
        );
        assert_eq!(
            files.memory_peak.as_deref(),
            Some(Path::new(
                "/sys/fs/cgroup/memory/kubepods/pod1/c1/memory.max_usage_in_bytes"
            ))
        );
        assert_eq!(
            files.oom_kills.as_deref(),
            Some(Path::new(
                "/sys/fs/cgroup/memory/kubepods/pod1/c1/memory.oom_control"
            ))
        );
        assert_eq!(
            files.pids.as_deref(),
            Some(Path::new("/sys/fs/cgroup/pids/pids.current")),
            "mounted without the path"
        );
        // cpuacct mounted on its own.
        let alone = locate(
            &parse_proc_cgroup("2:cpuacct:/\n"),
            false,
            existing(&["/sys/fs/cgroup/cpuacct"]),
        )
        .unwrap();
        assert_eq!(
            alone.cpu.as_deref(),
            Some(Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage"))
        );
        assert_eq!((alone.memory, alone.pids), (None, None));
        assert_eq!(locate(&parse_proc_cgroup(V1), false, existing(&[])), None);
    }
}
