//! The operator's RBAC as the install manifests render it (Helm chart with default and full values,
//! kustomize default and HA overlay), with no cluster: no wildcard anywhere, exactly the permissions
//! docs/SECURITY.md documents, and the chart and kustomize grant the same rules, bind the same
//! ServiceAccount, run the same Deployment and Services and install the generated CRDs unchanged.
//! The exact rule table (which verbs, in which role, in both install modes) is asserted here, and the
//! kustomize namespaced overlay grants what the chart grants with `watchNamespace`. That the rules are
//! also sufficient is proved by `manifests_install.rs`, which also checks every write the operator
//! sends (the API server's audit log) against them.

use std::collections::{BTreeMap, BTreeSet};

use orchard_testcluster::binaries::workspace_root;
use orchard_testcluster::test_support::manifests::{
    RELEASE_NAMESPACE, documents, env_map, helm_default, helm_full, helm_template, kustomize,
    of_kind, one_of_kind, strings,
};
use serde_json::{Value, json};

/// Every (role kind, role name, namespace, apiGroup, resource, verb) the rendered Roles and
/// ClusterRoles grant.
fn granted(docs: &[Value]) -> BTreeSet<(String, String, String, String, String, String)> {
    let mut grants = BTreeSet::new();
    for role in docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
    {
        let kind = role["kind"].as_str().unwrap_or_default().to_string();
        let name = role["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = role["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for rule in role["rules"].as_array().expect("rules") {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        grants.insert((
                            kind.clone(),
                            name.clone(),
                            namespace.clone(),
                            group.clone(),
                            resource.clone(),
                            verb,
                        ));
                    }
                }
            }
        }
    }
    grants
}

/// (apiGroup, resource, verb) regardless of which role grants it.
fn permissions(docs: &[Value]) -> BTreeSet<(String, String, String)> {
    granted(docs)
        .into_iter()
        .map(|(_, _, _, group, resource, verb)| (group, resource, verb))
        .collect()
}

fn assert_no_wildcards(source: &str, docs: &[Value]) {
    let roles: Vec<_> = docs
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
        .collect();
    assert!(!roles.is_empty(), "{source} renders no Role or ClusterRole");
    for role in roles {
        let name = &role["metadata"]["name"];
        for rule in role["rules"].as_array().expect("rules") {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                for item in strings(&rule[field]) {
                    assert!(
                        !item.contains('*'),
                        "{source}: {} {name} has a wildcard in {field}: {rule}",
                        role["kind"]
                    );
                }
            }
            assert!(
                rule.get("nonResourceURLs").is_none(),
                "{source}: {name} grants non-resource URLs: {rule}"
            );
        }
    }
}

/// (apiGroup, resource, verb) triples.
type Table = BTreeSet<(String, String, String)>;

fn table(rules: &[(&str, &str, &[&str])]) -> Table {
    let mut table = Table::new();
    for (group, resource, verbs) in rules {
        for verb in *verbs {
            table.insert((group.to_string(), resource.to_string(), verb.to_string()));
        }
    }
    table
}

/// Cluster-scoped rules (a ClusterRole in both modes): the gateway's reviews, the API server's
/// addresses and the nodes' pod ranges.
fn cluster_rules() -> Table {
    table(&[
        ("authentication.k8s.io", "tokenreviews", &["create"]),
        ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
        (
            "discovery.k8s.io",
            "endpointslices",
            &["get", "list", "watch"],
        ),
        ("", "nodes", &["list", "watch"]),
    ])
}

/// The controllers' and the gateway's rules in the watched namespaces (the ClusterRole when all are
/// watched, a Role in the one namespace with `watchNamespace`). Every verb is one the code sends:
/// status writes are JSON patches (no `get`/`update` on the status subresources), Pods are created
/// with POST and never patched, RolloutGroups are never patched.
fn namespaced_rules() -> Table {
    let crud: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
    table(&[
        ("orchard.dev", "sandboxes", crud),
        ("orchard.dev", "sandboxes/status", &["patch"]),
        (
            "orchard.dev",
            "rolloutgroups",
            &["get", "list", "watch", "create", "delete"],
        ),
        ("orchard.dev", "rolloutgroups/status", &["patch"]),
        ("orchard.dev", "rolloutqueues", &["get", "list", "watch"]),
        ("orchard.dev", "rolloutqueues/status", &["patch"]),
        ("orchard.dev", "sandboxpools", &["get", "list", "watch"]),
        ("orchard.dev", "sandboxpools/status", &["patch"]),
        (
            "",
            "pods",
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        ("events.k8s.io", "events", &["create", "patch"]),
        ("networking.k8s.io", "networkpolicies", crud),
    ])
}

/// The release namespace (a Role): the leader-election Lease is read, created and renewed with PUT;
/// the agent-token key Secret is read (by name only) and created by the first replica. No Secret
/// permission anywhere else: agent tokens are derived, not stored per sandbox.
fn lease_rules() -> Table {
    table(&[
        (
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"],
        ),
        ("", "secrets", &["get", "create"]),
    ])
}

/// What the controllers and the gateway need: the contract of docs/SECURITY.md.
fn expected_permissions() -> Table {
    cluster_rules()
        .into_iter()
        .chain(namespaced_rules())
        .chain(lease_rules())
        .collect()
}

/// (role kind, namespace) -> what that role grants.
fn by_role(docs: &[Value]) -> BTreeMap<(String, String), Table> {
    let mut roles: BTreeMap<(String, String), Table> = BTreeMap::new();
    for (kind, _, namespace, group, resource, verb) in granted(docs) {
        roles
            .entry((kind, namespace))
            .or_default()
            .insert((group, resource, verb));
    }
    roles
}

/// The exact rule table of an install watching all namespaces, or only `watched`.
fn expected_roles(watched: Option<&str>) -> BTreeMap<(String, String), Table> {
    let mut roles = BTreeMap::new();
    roles.insert(
        ("Role".to_string(), RELEASE_NAMESPACE.to_string()),
        lease_rules(),
    );
    match watched {
        None => {
            let all = cluster_rules().into_iter().chain(namespaced_rules());
            roles.insert(("ClusterRole".to_string(), String::new()), all.collect());
        }
        Some(namespace) => {
            roles.insert(("ClusterRole".to_string(), String::new()), cluster_rules());
            roles.insert(
                ("Role".to_string(), namespace.to_string()),
                namespaced_rules(),
            );
        }
    }
    roles
}

/// The namespace config/overlays/namespaced watches.
const KUSTOMIZE_WATCHED: &str = "orchard-sandboxes";

#[test]
fn every_render_grants_exactly_the_rule_table_in_the_right_role() {
    let renders = [
        ("helm default", documents(&helm_default()), None),
        (
            "helm full values",
            documents(&helm_full()),
            Some("rl-sandboxes"),
        ),
        (
            "helm watchNamespace",
            documents(&helm_template(&[
                "--set",
                &format!("watchNamespace={KUSTOMIZE_WATCHED}"),
            ])),
            Some(KUSTOMIZE_WATCHED),
        ),
        ("kustomize default", documents(&kustomize("default")), None),
        ("kustomize ha", documents(&kustomize("overlays/ha")), None),
        (
            "kustomize namespaced",
            documents(&kustomize("overlays/namespaced")),
            Some(KUSTOMIZE_WATCHED),
        ),
    ];
    for (source, docs, watched) in &renders {
        assert_eq!(
            by_role(docs),
            expected_roles(*watched),
            "{source}: the rules per role differ from the table"
        );
    }
}

#[test]
fn the_namespaced_overlay_matches_the_chart_with_watch_namespace() {
    let chart = documents(&helm_template(&[
        "--set",
        &format!("watchNamespace={KUSTOMIZE_WATCHED}"),
    ]));
    let kustomized = documents(&kustomize("overlays/namespaced"));
    assert_eq!(
        granted(&chart),
        granted(&kustomized),
        "config/overlays/namespaced and the chart with watchNamespace grant different rules"
    );
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        assert_eq!(
            identities(&chart, kind),
            identities(&kustomized, kind),
            "{kind}s differ"
        );
    }
    let watch = |docs: &[Value]| {
        env_map(&one_of_kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0])
            ["ORCHARD_WATCH_NAMESPACE"]
            .clone()
    };
    assert_eq!(watch(&chart), KUSTOMIZE_WATCHED);
    assert_eq!(watch(&kustomized), KUSTOMIZE_WATCHED);
}

/// `doc` without labels and annotations, every number as a float: Helm re-serialises the CRDs
/// (`fromYaml | toYaml`), which writes the generated `minimum: 1.0` as `1`; both are the same number to
/// the API server.
fn without_labels(mut doc: Value) -> Value {
    fn floats(value: &mut Value) {
        match value {
            Value::Number(n) => {
                if let Some(f) = n.as_f64().and_then(serde_json::Number::from_f64) {
                    *n = f;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(floats),
            Value::Object(map) => map.values_mut().for_each(floats),
            _ => {}
        }
    }
    if let Some(metadata) = doc["metadata"].as_object_mut() {
        metadata.remove("labels");
        metadata.remove("annotations");
    }
    floats(&mut doc);
    doc
}

fn crd_files() -> BTreeMap<String, Value> {
    let dir = workspace_root().join("crds");
    let mut crds = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("crds/") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("CRD file");
        for doc in documents(&text) {
            crds.insert(doc["metadata"]["name"].as_str().unwrap().to_string(), doc);
        }
    }
    crds
}

#[test]
fn no_wildcards_in_any_rendered_role_and_every_permission_is_accounted_for() {
    let renders = [
        ("helm default", documents(&helm_default())),
        ("helm full values", documents(&helm_full())),
        ("kustomize default", documents(&kustomize("default"))),
        ("kustomize ha", documents(&kustomize("overlays/ha"))),
        (
            "kustomize namespaced",
            documents(&kustomize("overlays/namespaced")),
        ),
    ];
    for (source, docs) in &renders {
        assert_no_wildcards(source, docs);
        // Cluster-wide (ClusterRole) or namespace-scoped (watchNamespace: Role), the operator is
        // granted exactly the documented permissions: nothing missing, nothing extra.
        assert_eq!(
            permissions(docs),
            expected_permissions(),
            "{source}: granted permissions differ from the documented contract"
        );
    }
}

#[test]
fn chart_and_kustomize_grant_the_same_rules_and_run_the_same_pod() {
    let chart = documents(&helm_default());
    let kustomized = documents(&kustomize("default"));
    assert_eq!(
        granted(&chart),
        granted(&kustomized),
        "config/rbac and the chart's RBAC templates differ"
    );
    for kind in ["ClusterRoleBinding", "RoleBinding", "ServiceAccount"] {
        assert_eq!(
            identities(&chart, kind),
            identities(&kustomized, kind),
            "{kind}s differ"
        );
    }
    // Same Deployment spec (pod template, probes, env, security) and Services.
    assert_eq!(
        one_of_kind(&chart, "Deployment")["spec"],
        one_of_kind(&kustomized, "Deployment")["spec"],
        "config/manager/manager.yaml and the chart's deployment.yaml (default values, release `orchard`) differ"
    );
    let services = |docs: &[Value]| -> BTreeMap<String, Value> {
        of_kind(docs, "Service")
            .into_iter()
            .map(|s| {
                (
                    s["metadata"]["name"].as_str().unwrap().to_string(),
                    s["spec"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(services(&chart), services(&kustomized), "Services differ");

    // Both install the generated CRDs unchanged (apart from labels and annotations).
    let generated = crd_files();
    for (source, docs) in [("chart", &chart), ("kustomize", &kustomized)] {
        let crds: BTreeMap<String, Value> = of_kind(docs, "CustomResourceDefinition")
            .into_iter()
            .map(|d| {
                (
                    d["metadata"]["name"].as_str().unwrap().to_string(),
                    without_labels(d.clone()),
                )
            })
            .collect();
        let expected: BTreeMap<String, Value> = generated
            .iter()
            .map(|(name, crd)| (name.clone(), without_labels(crd.clone())))
            .collect();
        assert_eq!(
            crds.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{source} installs other CRDs than crds/"
        );
        for (name, crd) in &crds {
            assert!(
                *crd == expected[name],
                "{source}'s {name} differs from crds/ (run `make sync-crds`)"
            );
        }
    }
    let keep = of_kind(&chart, "CustomResourceDefinition")
        .iter()
        .all(|crd| crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep");
    assert!(
        keep,
        "the chart's CRDs must survive `helm uninstall` by default"
    );
}

/// What must match between two renders for each object of `kind`: name, namespace, and what a
/// binding binds (`roleRef`, `subjects`).
fn identities(docs: &[Value], kind: &str) -> BTreeSet<String> {
    of_kind(docs, kind)
        .into_iter()
        .map(|d| {
            json!([
                d["metadata"]["name"],
                d["metadata"]["namespace"],
                d["roleRef"],
                d["subjects"]
            ])
            .to_string()
        })
        .collect()
}
