//! Prints the CustomResourceDefinitions of the Orchard Env API as YAML (`make crds` writes them to `crds/`).
//!
//! `crdgen` prints every CRD as one multi-document stream; `crdgen sandbox`, `crdgen rolloutgroup`,
//! `crdgen rolloutqueue`, `crdgen sandboxpool` or `crdgen sandboxsnapshot` prints one.

use kube::CustomResourceExt;
use orchard_operator::api::{RolloutGroup, RolloutQueue, Sandbox, SandboxPool, SandboxSnapshot};

fn main() {
    let which = std::env::args().nth(1);
    let crds = match which.as_deref() {
        None => vec![
            Sandbox::crd(),
            RolloutGroup::crd(),
            RolloutQueue::crd(),
            SandboxPool::crd(),
            SandboxSnapshot::crd(),
        ],
        Some("sandbox") => vec![Sandbox::crd()],
        Some("rolloutgroup") => vec![RolloutGroup::crd()],
        Some("rolloutqueue") => vec![RolloutQueue::crd()],
        Some("sandboxpool") => vec![SandboxPool::crd()],
        Some("sandboxsnapshot") => vec![SandboxSnapshot::crd()],
        Some(other) => {
            eprintln!(
                "crdgen: unknown kind `{other}` (expected `sandbox`, `rolloutgroup`, `rolloutqueue`, `sandboxpool` or `sandboxsnapshot`)"
            );
            std::process::exit(2);
        }
    };
    let mut out = String::new();
    for crd in crds {
        match serde_yaml::to_string(&crd) {
            Ok(yaml) => {
                out.push_str("---\n");
                out.push_str(&yaml);
            }
            Err(err) => {
                eprintln!("crdgen: cannot serialise CRD: {err}");
                std::process::exit(1);
            }
        }
    }
    print!("{out}");
}
