//! kubeconform -strict on every render of the install manifests: the same check as
//! `make manifests-check` (`hack/manifests-check.sh`: CRD copies, helm lint, helm and kustomize
//! renders validated against the committed Kubernetes v1.36.3 schemas and our CRDs' schemas), so
//! `make e2e` covers it too. That the committed schemas are what the live kube-apiserver serves is
//! checked by `manifests_install.rs` (regenerate them with `make schemas`).

use std::process::Command;

use orchard_testcluster::binaries::workspace_root;
use orchard_testcluster::test_support::manifests::run;

#[test]
fn kubeconform_strict_accepts_every_render() {
    // The same check as `make manifests-check`, so `make e2e` covers it too.
    let script = workspace_root().join("hack/manifests-check.sh");
    let output = run(&mut Command::new(&script));
    // Every summary line: something was validated, and nothing was invalid.
    let summaries: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("Invalid: ") && line.contains("Valid: "))
        .collect();
    assert!(!summaries.is_empty(), "no kubeconform summary: {output}");
    for summary in summaries {
        assert!(summary.contains("Invalid: 0, Errors: 0"), "{output}");
        let valid: usize = summary
            .split("Valid: ")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        assert!(valid > 0, "a render validated no resource: {summary}");
    }
}
