//! The end-to-end checks that start no cluster: the docs against the code (`docs_drift`) and the
//! install manifests rendered and checked offline (`manifests_hardening`, `manifests_kubeconform`,
//! `manifests_rbac`). One binary, linked once (docs/TESTING.md, "Test binaries").

mod docs_drift;
mod manifests_hardening;
mod manifests_kubeconform;
mod manifests_rbac;
