//! `gen-docs` (`make docs`): regenerates the generated part of the documentation, the values reference
//! table of `docs/CONFIGURATION.md`, from the `# --` comments of `charts/orchard-env/values.yaml`.
//! `tests/docs_drift.rs` checks the committed file with the same generator
//! ([`xtask::config_reference`]).
//!
//! ```text
//! gen-docs [--check]
//! ```
//! With `--check` it writes nothing and exits 1 when the file is out of date.

use orchard_testcluster::binaries::workspace_root;
use xtask::config_reference::{self, CONFIGURATION_MD, MAKE_TARGET};

fn main() {
    let check = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => false,
        [flag] if flag == "--check" => true,
        _ => {
            eprintln!("usage: gen-docs [--check]");
            std::process::exit(2);
        }
    };
    let root = workspace_root();
    let result = if check {
        config_reference::generate(&root).map(|doc| !doc.is_up_to_date())
    } else {
        config_reference::write(&root)
    };
    match result {
        Ok(true) if check => {
            eprintln!("{CONFIGURATION_MD} is out of date with values.yaml: run `{MAKE_TARGET}`");
            std::process::exit(1);
        }
        Ok(true) => println!("{CONFIGURATION_MD}: regenerated"),
        Ok(false) => println!("{CONFIGURATION_MD}: up to date"),
        Err(err) => {
            eprintln!("gen-docs: {err}");
            std::process::exit(1);
        }
    }
}
