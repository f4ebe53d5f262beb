//! The agent's own cgroup (its container's): where its files are (`location`, from
//! `/proc/self/cgroup`, cgroup v2 or v1) and what they say (`stats`: CPU time, memory now, peak and
//! limit, PIDs, OOM kills). Parsing and locating are pure; `read` does the I/O.

pub mod location;
pub mod read;
pub mod stats;
