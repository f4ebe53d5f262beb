//! Generators of committed files: the values reference of `docs/CONFIGURATION.md`
//! ([`config_reference`], written by `gen-docs`: `make docs`) and the Kubernetes schemas under
//! `e2e/packaging-tools/schemas` ([`k8s_schemas`], written by `gen-schemas`: `make schemas`). The
//! end-to-end tests (`docs_drift.rs`, `manifests_install.rs`) compare the committed files with what
//! these same functions generate; they never write them.

pub mod config_reference;
pub mod k8s_schemas;
