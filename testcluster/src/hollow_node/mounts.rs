//! How the local node maps a container's view of the filesystem onto the host (pure): volume mounts
//! become per-pod host directories, program paths outside mounts resolve inside the image's root
//! (for the agent image) or on the host (task images: the local node has no image store, so task
//! commands see the host's programs), and `0.0.0.0:` in the agent's listen address becomes the pod IP
//! (the pod's own network namespace, emulated by a loopback address per pod).

use std::path::{Path, PathBuf};

/// A container path backed by a host directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Path inside the container, e.g. `/opt/orchard`.
    pub container_path: String,
    /// Host directory, e.g. `<pod dir>/volumes/orchard-agent`.
    pub host_path: PathBuf,
}

/// The mount table of one container, longest container path first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountTable {
    mounts: Vec<Mount>,
}

impl MountTable {
    /// A table from mounts in any order.
    pub fn new(mut mounts: Vec<Mount>) -> Self {
        mounts.sort_by_key(|m| std::cmp::Reverse(m.container_path.len()));
        Self { mounts }
    }

    /// The host path of `container_path` if it lies under a mount.
    pub fn host_path(&self, container_path: &str) -> Option<PathBuf> {
        self.mounts.iter().find_map(|m| {
            let base = m.container_path.trim_end_matches('/');
            if container_path == base {
                Some(m.host_path.clone())
            } else {
                container_path
                    .strip_prefix(base)
                    .and_then(|rest| rest.strip_prefix('/'))
                    .map(|rest| m.host_path.join(rest))
            }
        })
    }

    /// Rewrites a value (argument or environment value) that is a path under a mount; other values
    /// pass unchanged.
    pub fn translate(&self, value: &str) -> String {
        if !value.starts_with('/') {
            return value.to_string();
        }
        self.host_path(value)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| value.to_string())
    }
}

/// Where the program `argv0` of a container lives on the host: under a mount, inside the image root
/// when the image has one, else on the host itself.
pub fn resolve_program(argv0: &str, mounts: &MountTable, image_root: Option<&Path>) -> PathBuf {
    if let Some(path) = mounts.host_path(argv0) {
        return path;
    }
    match image_root {
        Some(root) if argv0.starts_with('/') => root.join(argv0.trim_start_matches('/')),
        _ => PathBuf::from(argv0),
    }
}

/// The pod's own address for a listen address: a wildcard (`0.0.0.0:<port>`, `[::]:<port>`,
/// `:<port>`) binds the pod IP, since every hollow pod's agent shares the host's network.
pub fn pod_listen_address(value: &str, pod_ip: &str) -> String {
    let port = ["0.0.0.0:", "[::]:", ":"]
        .iter()
        .find_map(|wildcard| value.strip_prefix(wildcard));
    match port {
        Some(port) => format!("{pod_ip}:{port}"),
        None => value.to_string(),
    }
}

/// Whether `image` matches `pattern` (`*` matches any run of characters; no `*` means substring).
pub fn image_matches(image: &str, pattern: &str) -> bool {
    if !pattern.contains('*') {
        return image.contains(pattern);
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = image;
    for (i, part) in parts.iter().enumerate() {
        if part.is_empty() {
            continue;
        }
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> MountTable {
        MountTable::new(vec![
            Mount {
                container_path: "/opt/orchard".into(),
                host_path: "/pods/p/volumes/agent".into(),
            },
            Mount {
                container_path: "/var/run/orchard".into(),
                host_path: "/pods/p/volumes/token".into(),
            },
            Mount {
                container_path: "/opt".into(),
                host_path: "/pods/p/volumes/opt".into(),
            },
        ])
    }

    #[test]
    fn paths_under_mounts_translate_longest_first() {
        let t = table();
        assert_eq!(
            t.translate("/opt/orchard/orchard-agent"),
            "/pods/p/volumes/agent/orchard-agent"
        );
        assert_eq!(t.translate("/opt/orchard"), "/pods/p/volumes/agent");
        assert_eq!(t.translate("/opt/other"), "/pods/p/volumes/opt/other");
        assert_eq!(
            t.translate("/var/run/orchard/token"),
            "/pods/p/volumes/token/token"
        );
        assert_eq!(t.translate("/opt/orchardx"), "/pods/p/volumes/opt/orchardx");
        assert_eq!(t.translate("/usr/bin/python3"), "/usr/bin/python3");
        assert_eq!(t.translate("serve"), "serve");
    }

    #[test]
    fn programs_resolve_in_mounts_then_image_root_then_host() {
        let t = table();
        assert_eq!(
            resolve_program("/opt/orchard/orchard-agent", &t, None),
            PathBuf::from("/pods/p/volumes/agent/orchard-agent")
        );
        assert_eq!(
            resolve_program("/orchard-agent", &t, Some(Path::new("/images/agent"))),
            PathBuf::from("/images/agent/orchard-agent")
        );
        assert_eq!(
            resolve_program("/bin/sh", &t, None),
            PathBuf::from("/bin/sh")
        );
    }

    #[test]
    fn wildcard_listen_addresses_bind_the_pod_ip() {
        assert_eq!(
            pod_listen_address("0.0.0.0:9090", "127.3.0.7"),
            "127.3.0.7:9090"
        );
        for wildcard in ["[::]:9090", ":9090"] {
            assert_eq!(pod_listen_address(wildcard, "127.3.0.7"), "127.3.0.7:9090");
        }
        assert_eq!(
            pod_listen_address("127.0.0.1:9090", "127.3.0.7"),
            "127.0.0.1:9090"
        );
        assert_eq!(pod_listen_address("[::1]:9090", "127.3.0.7"), "[::1]:9090");
    }

    #[test]
    fn image_patterns() {
        assert!(image_matches("registry.example/broken:1", "broken"));
        assert!(image_matches("registry.example/broken:1", "*broken*"));
        assert!(image_matches(
            "registry.example/broken:1",
            "registry.example/*:1"
        ));
        assert!(!image_matches("python:3.11", "broken"));
        assert!(!image_matches("python:3.11", "*:3.12"));
    }
}
