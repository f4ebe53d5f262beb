//! Reading the agent's cgroup: located once (`/proc/self/cgroup` does not change while the agent runs)
//! and read afresh for every request.

use std::path::Path;
use std::sync::OnceLock;

use super::location::{CGROUP_ROOT, CgroupFiles, CgroupVersion, locate, parse_proc_cgroup};
use super::stats::{cpu_seconds_v1, cpu_seconds_v2, memory_limit, number, parse_oom_kills};

/// Values read from the cgroup; `None` where a file is missing or unreadable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CgroupSample {
    pub version: Option<CgroupVersion>,
    pub cpu_seconds: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub oom_kills: Option<u64>,
}

/// The agent's cgroup files, located at first use.
pub fn cgroup_files() -> Option<&'static CgroupFiles> {
    static FILES: OnceLock<Option<CgroupFiles>> = OnceLock::new();
    FILES
        .get_or_init(|| {
            let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
            let unified = Path::new(CGROUP_ROOT).join("cgroup.controllers").exists();
            locate(&parse_proc_cgroup(&text), unified, |path| path.is_dir())
        })
        .as_ref()
}

fn read(path: Option<&Path>) -> Option<String> {
    std::fs::read_to_string(path?).ok()
}

/// Reads everything the cgroup reports now.
pub fn sample() -> CgroupSample {
    let Some(files) = cgroup_files() else {
        return CgroupSample::default();
    };
    let cpu = read(files.cpu.as_deref());
    CgroupSample {
        version: Some(files.version),
        cpu_seconds: cpu.as_deref().and_then(match files.version {
            CgroupVersion::V2 => cpu_seconds_v2,
            CgroupVersion::V1 => cpu_seconds_v1,
        }),
        memory_bytes: read(files.memory.as_deref()).as_deref().and_then(number),
        memory_peak_bytes: read(files.memory_peak.as_deref())
            .as_deref()
            .and_then(number),
        memory_limit_bytes: read(files.memory_limit.as_deref())
            .as_deref()
            .and_then(memory_limit),
        pids: read(files.pids.as_deref()).as_deref().and_then(number),
        oom_kills: read(files.oom_kills.as_deref())
            .as_deref()
            .and_then(parse_oom_kills),
    }
}
