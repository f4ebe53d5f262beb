//! NetworkPolicy enforcement on the real node: kube-router's network policy controller (k3s-io's
//! maintained fork v2.6.3-k3s1, the enforcer k3s ships), built from the Go module proxy by
//! `e2e/node-tools/build.sh` and run in firewall-only mode in the node's namespaces. It turns every
//! `networking.k8s.io/v1` NetworkPolicy into iptables rules and ipsets (this kernel has no
//! `NFT_QUEUE`, so nfqueue-based enforcers cannot run here); traffic between pods on the node's bridge
//! passes iptables through bridge netfilter.

use std::time::{Duration, Instant};

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::layout::Layout;
use super::namespaces::exec_in_node;
use crate::error::{E2eError, Result};

/// The token-file user kube-router authenticates as.
pub const KUBE_ROUTER_USER: &str = "system:kube-router";

/// kube-router's command line: the firewall only (routing is the CNI bridge's, Services are
/// kube-proxy's), no health or metrics listener (nothing to clash with), this node by name (pure).
pub fn kube_router_args(layout: &Layout) -> Vec<String> {
    vec![
        "--run-firewall=true".into(),
        "--run-router=false".into(),
        "--run-service-proxy=false".into(),
        "--enable-cni=false".into(),
        format!(
            "--kubeconfig={}",
            layout.path("kube-router/kubeconfig").display()
        ),
        format!("--hostname-override={}", layout.name),
        format!("--service-cluster-ip-range={}", layout.service_cidr()),
        "--health-port=0".into(),
        "--metrics-port=0".into(),
        // Policies and pods are applied on watch events; this is only the safety-net full resync.
        "--iptables-sync-period=1m".into(),
        "--v=1".into(),
    ]
}

/// Grants kube-router what its controllers watch (the rules of its upstream DaemonSet manifest,
/// read-only here: no router, no service proxy).
pub async fn grant_kube_router(client: &Client) -> Result<()> {
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "orchard-e2e:kube-router"},
        "rules": [
            {"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    }))
    .map_err(|e| E2eError::Setup(format!("kube-router ClusterRole: {e}")))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "orchard-e2e:kube-router"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "orchard-e2e:kube-router"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": KUBE_ROUTER_USER}],
    }))
    .map_err(|e| E2eError::Setup(format!("kube-router ClusterRoleBinding: {e}")))?;
    let params = PatchParams::apply("orchard-e2e").force();
    Api::<ClusterRole>::all(client.clone())
        .patch("orchard-e2e:kube-router", &params, &Patch::Apply(&role))
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch("orchard-e2e:kube-router", &params, &Patch::Apply(&binding))
        .await?;
    Ok(())
}

/// Waits until kube-router has installed its chains in the node's filter table (its first full sync:
/// from then on every policy and pod change is applied).
pub async fn wait_enforcing(init_pid: u32, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let rules = exec_in_node(init_pid, "iptables -S", "iptables", &["-S", "FORWARD"]);
        if rules
            .as_deref()
            .is_ok_and(|rules| rules.contains("KUBE-ROUTER-FORWARD"))
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(E2eError::NotReady {
                component: "kube-router".into(),
                seconds: timeout.as_secs(),
                detail: format!(
                    "no KUBE-ROUTER-FORWARD jump in the node's FORWARD chain (see kube-router.log): {rules:?}"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn kube_router_runs_the_firewall_only() {
        let layout = Layout::new(3, 42, Path::new("/n"));
        let args = kube_router_args(&layout);
        for flag in [
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--health-port=0",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
        }
        assert!(args.contains(&"--service-cluster-ip-range=10.96.3.0/24".to_string()));
        assert!(args.contains(&"--kubeconfig=/n/kube-router/kubeconfig".to_string()));
        assert!(args.contains(&"--hostname-override=orchard-node".to_string()));
        let second = Layout::member(1, 4, 42, Path::new("/m"), &layout);
        let args = kube_router_args(&second);
        assert!(args.contains(&"--hostname-override=orchard-node-2".to_string()));
        assert!(
            args.contains(&"--service-cluster-ip-range=10.96.3.0/24".to_string()),
            "the cluster's Service range, not one of its own"
        );
    }
}
