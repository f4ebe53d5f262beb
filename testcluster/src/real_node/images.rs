//! The real node's images: built by `e2e/node-tools/images.sh` with crane (cached as OCI image
//! layouts under `~/.cache/orchard/images`), pushed into the registry on the node's loopback at every
//! start (crane's registry keeps manifests in memory; the blobs stay on disk across runs), and pulled
//! by the kubelet through containerd like on any cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::layout::{IMAGE_HOST, REGISTRY};
use super::namespaces::exec_in_node;
use crate::binaries::{agent_bin, node_bin, run_script, static_operator_bin, workspace_root};
use crate::error::{E2eError, Result};

/// An image built by `images.sh`: its name and OCI layout directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// `debian-python`, `debian-chromium`, `busybox`, `probe`, `pause`, `orchard-agent`,
    /// `orchard-operator`, `orchard-committer`.
    pub name: String,
    /// OCI image layout.
    pub layout: PathBuf,
}

/// The tag each image is pushed under (pure).
pub fn tag_of(name: &str) -> &'static str {
    match name {
        "debian-python" | "debian-chromium" => "trixie",
        "busybox" => "1.35",
        "pause" => "3.10",
        "probe" => "1",
        _ => "dev",
    }
}

/// Further names an image is pushed under (pure): the operator's and agent's images also under the
/// version the chart names by default (so a chart installed with only `image.repository` set pulls
/// them), and stand-ins for the public images the user docs name, under their Docker Hub paths
/// (`library/...`, which the node's containerd mirrors to its registry): busybox for
/// `busybox:1.36`, the Debian image (python3, git, curl, pip) for `python:3.11` and `python:3.12-slim`.
pub fn aliases(name: &str) -> Vec<String> {
    let version = env!("CARGO_PKG_VERSION");
    match name {
        "orchard-operator" | "orchard-agent" | "orchard-committer" => {
            vec![format!("{name}:{version}")]
        }
        "busybox" => vec!["library/busybox:1.36".to_string()],
        "debian-python" => vec![
            "library/python:3.11".to_string(),
            "library/python:3.12-slim".to_string(),
        ],
        _ => Vec::new(),
    }
}

/// Images in the node's registry: name -> reference pods use.
#[derive(Debug, Clone, Default)]
pub struct Pushed(BTreeMap<String, String>);

impl Pushed {
    /// Whether image `name` was pushed.
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The reference of image `name` (`localhost:5000/<name>:<tag>`); a name that was not pushed gives
    /// a reference the registry does not have (what an image-pull failure test wants anyway).
    pub fn reference(&self, name: &str) -> String {
        self.0
            .get(name)
            .cloned()
            .unwrap_or_else(|| format!("{IMAGE_HOST}/{name}:{}", tag_of(name)))
    }
}

/// Builds (or finds cached) every image the node needs; the agent image from `agent_bin()`, and the
/// operator image when `make operator-image` built its static binary.
pub fn build() -> Result<Vec<Built>> {
    let script = workspace_root().join("e2e/node-tools/images.sh");
    let mut args = vec![
        format!("agent={}", agent_bin()?.display()),
        format!("pause={}", node_bin("orchard-pause")?.display()),
        format!("probe={}", node_bin("orchard-probe")?.display()),
        format!(
            "layerfilter={}",
            node_bin("orchard-layer-filter")?.display()
        ),
    ];
    if let Some(operator) = static_operator_bin() {
        args.push(format!("operator={}", operator.display()));
    }
    let stdout = run_script(&script, &args)?;
    Ok(parse_built(&stdout))
}

/// `<name> <layout>` lines of `images.sh` (pure).
pub fn parse_built(stdout: &str) -> Vec<Built> {
    stdout
        .lines()
        .filter_map(|line| {
            let (name, layout) = line.trim().split_once(' ')?;
            Some(Built {
                name: name.to_string(),
                layout: PathBuf::from(layout.trim()),
            })
        })
        .collect()
}

/// Where the node registry keeps blobs between runs.
pub fn blob_dir() -> Result<PathBuf> {
    let home = std::env::var("HOME").map_err(|_| E2eError::Setup("HOME is not set".into()))?;
    let dir = Path::new(&home).join(".cache/orchard/node-registry");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Pushes `images` into the registry of the node whose PID 1 is `init_pid`, waiting for the registry
/// to answer first.
pub async fn push(init_pid: u32, crane: &Path, images: &[Built]) -> Result<Pushed> {
    let crane = crane.display().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match exec_in_node(init_pid, "crane catalog", &crane, &["catalog", REGISTRY]) {
            Ok(_) => break,
            Err(err) if Instant::now() >= deadline => return Err(err),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let mut pushed = BTreeMap::new();
    for image in images {
        let reference = push_one(
            init_pid,
            &crane,
            &image.layout,
            &image.name,
            tag_of(&image.name),
        )?;
        let (target, _) = registry_names(&image.name, tag_of(&image.name));
        for alias in aliases(&image.name) {
            exec_in_node(
                init_pid,
                &format!("pushing image {} as {alias}", image.name),
                &crane,
                &["copy", &target, &format!("{REGISTRY}/{alias}")],
            )?;
        }
        pushed.insert(image.name.clone(), reference);
    }
    Ok(Pushed(pushed))
}

/// Where `crane push` sends image `name:tag` (the registry on the node's loopback) and the reference
/// pods use for it (the name containerd maps to that registry) (pure).
pub fn registry_names(name: &str, tag: &str) -> (String, String) {
    (
        format!("{REGISTRY}/{name}:{tag}"),
        format!("{IMAGE_HOST}/{name}:{tag}"),
    )
}

/// `crane push SOURCE` into the node's registry as `name:tag`, where SOURCE is an OCI image layout
/// directory or a docker save-style tarball (a release's `dist/images/<name>-<version>.tar`); returns
/// the reference pods use. The registry must be serving (the node has started).
pub fn push_one(
    init_pid: u32,
    crane: &str,
    source: &Path,
    name: &str,
    tag: &str,
) -> Result<String> {
    let (target, reference) = registry_names(name, tag);
    exec_in_node(
        init_pid,
        &format!("pushing image {name} from {}", source.display()),
        crane,
        &["push", &source.display().to_string(), &target],
    )?;
    Ok(reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_names_the_docs_use_have_stand_ins() {
        assert_eq!(aliases("busybox"), vec!["library/busybox:1.36"]);
        assert!(aliases("debian-python").contains(&"library/python:3.12-slim".to_string()));
        assert_eq!(
            aliases("orchard-operator"),
            vec![format!("orchard-operator:{}", env!("CARGO_PKG_VERSION"))]
        );
        assert!(aliases("probe").is_empty());
    }

    #[test]
    fn built_images_are_read_from_the_scripts_output() {
        let built = parse_built("busybox /c/busybox/ab12\norchard-agent /c/agent/cd34\n\n");
        assert_eq!(built.len(), 2);
        assert_eq!(built[1].name, "orchard-agent");
        assert_eq!(built[1].layout, PathBuf::from("/c/agent/cd34"));
    }

    #[test]
    fn references_use_the_node_registry_name() {
        let pushed = Pushed(BTreeMap::from([(
            "busybox".to_string(),
            "localhost:5000/busybox:1.35".to_string(),
        )]));
        assert_eq!(pushed.reference("busybox"), "localhost:5000/busybox:1.35");
        assert_eq!(pushed.reference("missing"), "localhost:5000/missing:dev");
        assert_eq!(tag_of("debian-python"), "trixie");
    }

    #[test]
    fn pushes_go_to_the_loopback_registry_and_pods_name_the_mapped_host() {
        assert_eq!(
            registry_names("orchard-operator", "0.1.0"),
            (
                "127.0.0.1:5000/orchard-operator:0.1.0".to_string(),
                "localhost:5000/orchard-operator:0.1.0".to_string()
            )
        );
    }
}
