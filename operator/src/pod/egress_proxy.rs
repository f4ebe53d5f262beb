//! Where sandboxes find the egress proxy (pure): its Service's cluster IP and `proxy` port become the
//! task container's proxy variables, its selector and target port the baseline's one egress rule.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::pod::policy::ProxyPeer;

/// Name of the Service port sandboxes send their proxied requests to.
pub const PROXY_PORT_NAME: &str = "proxy";

/// The egress proxy as sandboxes see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressProxy {
    /// `http://<cluster IP>:<port>`: sandboxes without DNS reach it too.
    pub url: String,
    /// Its pods, for the baseline NetworkPolicy.
    pub peer: ProxyPeer,
}

/// The egress proxy behind `service` (pure), or why it cannot be used: the Service needs a cluster
/// IP, a selector, and a TCP port named `proxy` whose target port is a number.
pub fn egress_proxy(service: &Service) -> Result<EgressProxy, String> {
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let namespace = service.metadata.namespace.clone().unwrap_or_default();
    let spec = service
        .spec
        .as_ref()
        .ok_or_else(|| format!("Service {namespace}/{name} has no spec"))?;
    let ip = spec
        .cluster_ip
        .as_deref()
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .ok_or_else(|| {
            format!("Service {namespace}/{name} has no cluster IP (a headless Service cannot be the egress proxy)")
        })?;
    let pod_labels = spec
        .selector
        .clone()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("Service {namespace}/{name} has no selector"))?;
    let port = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(PROXY_PORT_NAME))
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .ok_or_else(|| {
            format!("Service {namespace}/{name} has no TCP port named `{PROXY_PORT_NAME}`")
        })?;
    let target = match &port.target_port {
        None => port.port,
        Some(IntOrString::Int(target)) => *target,
        Some(IntOrString::String(named)) => {
            return Err(format!(
                "Service {namespace}/{name}: port `{PROXY_PORT_NAME}` targets the named port `{named}`; give it a number (the sandboxes' NetworkPolicy names the pods' port)"
            ));
        }
    };
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    Ok(EgressProxy {
        url: format!("http://{host}:{}", port.port),
        peer: ProxyPeer {
            namespace,
            pod_labels,
            port: target,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(spec: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "orchard-egress", "namespace": "orchard-system"},
            "spec": spec,
        }))
        .expect("service")
    }

    #[test]
    fn the_cluster_ip_and_proxy_port_become_the_url_and_the_peer() {
        let found = egress_proxy(&service(json!({
            "clusterIP": "10.0.0.40",
            "selector": {"app.kubernetes.io/name": "orchard-egress"},
            "ports": [{"name": "metrics", "port": 8080}, {"name": "proxy", "port": 3128, "targetPort": 8128}],
        })))
        .expect("usable");
        assert_eq!(found.url, "http://10.0.0.40:3128");
        assert_eq!(found.peer.port, 8128);
        assert_eq!(found.peer.namespace, "orchard-system");
        assert_eq!(
            found.peer.pod_labels["app.kubernetes.io/name"],
            "orchard-egress"
        );
        let v6 = egress_proxy(&service(json!({
            "clusterIP": "fd00::40", "selector": {"a": "b"}, "ports": [{"name": "proxy", "port": 3128}],
        })))
        .expect("usable");
        assert_eq!(v6.url, "http://[fd00::40]:3128");
        assert_eq!(v6.peer.port, 3128);
    }

    #[test]
    fn unusable_services_say_why() {
        for (spec, says) in [
            (
                json!({"clusterIP": "None", "selector": {"a": "b"}, "ports": [{"name": "proxy", "port": 3128}]}),
                "no cluster IP",
            ),
            (
                json!({"clusterIP": "10.0.0.4", "ports": [{"name": "proxy", "port": 3128}]}),
                "no selector",
            ),
            (
                json!({"clusterIP": "10.0.0.4", "selector": {"a": "b"}, "ports": [{"name": "http", "port": 3128}]}),
                "no TCP port named `proxy`",
            ),
            (
                json!({"clusterIP": "10.0.0.4", "selector": {"a": "b"}, "ports": [{"name": "proxy", "port": 3128, "targetPort": "proxy"}]}),
                "give it a number",
            ),
        ] {
            let err = egress_proxy(&service(spec)).expect_err("unusable");
            assert!(err.contains(says), "{err}");
        }
    }
}
