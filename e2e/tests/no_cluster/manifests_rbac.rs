//! The operator's and the egress proxy's RBAC as the install manifests render it (Helm chart with
//! default and full values and `watchNamespace`, kustomize default, HA and namespaced overlays), with no
//! cluster: no wildcard anywhere, exactly the permissions docs/SECURITY.md documents, each with its
//! reason, granted to the right ServiceAccount, and the chart and kustomize grant the same rules, bind
//! the same ServiceAccounts, run the same Deployments and Services and install the generated CRDs
//! unchanged. The exact rule table (which verbs on which resources and names, in which role, in both
//! install modes) is asserted here, and the kustomize namespaced overlay grants what the chart grants
//! with `watchNamespace`. That the operator's rules are also sufficient is proved by
//! `manifests_install.rs`, which also checks every write the operator sends (the API server's audit
//! log) against them.

use std::collections::{BTreeMap, BTreeSet};

use orchard_testcluster::binaries::workspace_root;
use orchard_testcluster::test_support::manifests::{
    RELEASE_NAMESPACE, container, documents, egress_deployment, env_map, grants, grants_to,
    helm_default, helm_full, helm_template, kustomize, of_kind, operator_deployment,
    service_account_of, strings,
};
use serde_json::{Value, json};

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

/// (apiGroup, resource, resourceNames joined by commas — empty: any —, verb).
type Table = BTreeSet<(String, String, String, String)>;

/// One row of the rule table: what is granted and why the code needs it.
struct Rule {
    group: &'static str,
    resource: &'static str,
    /// resourceNames; empty: any object.
    names: Vec<String>,
    verbs: &'static [&'static str],
    why: &'static str,
}

/// A row on every object of the resource.
fn rule(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    why: &'static str,
) -> Rule {
    Rule {
        group,
        resource,
        names: Vec::new(),
        verbs,
        why,
    }
}

/// A row on the named objects only.
fn named_rule(
    group: &'static str,
    resource: &'static str,
    names: &[&str],
    verbs: &'static [&'static str],
    why: &'static str,
) -> Rule {
    Rule {
        group,
        resource,
        names: names.iter().map(|name| name.to_string()).collect(),
        verbs,
        why,
    }
}

fn table(rules: &[Rule]) -> Table {
    let mut table = Table::new();
    for rule in rules {
        assert!(
            !rule.why.trim().is_empty() && !rule.verbs.is_empty(),
            "every row of the rule table says why: {} {}",
            rule.group,
            rule.resource
        );
        for verb in rule.verbs {
            table.insert((
                rule.group.to_string(),
                rule.resource.to_string(),
                rule.names.join(","),
                verb.to_string(),
            ));
        }
    }
    table
}

/// What the rendered bindings grant ServiceAccount `name` of the release namespace.
fn permissions_of(docs: &[Value], name: &str) -> Table {
    grants_to(docs, RELEASE_NAMESPACE, name)
        .into_iter()
        .map(|(_, _, _, group, resource, names, verb)| (group, resource, names, verb))
        .collect()
}

/// The operator's cluster-scoped rules (a ClusterRole in both modes): the gateway's reviews, the API
/// server's addresses and the nodes' pod ranges.
fn cluster_rules() -> Table {
    table(&[
        rule(
            "authentication.k8s.io",
            "tokenreviews",
            &["create"],
            "the gateway authenticates callers' bearer tokens",
        ),
        rule(
            "authorization.k8s.io",
            "subjectaccessreviews",
            &["create"],
            "the gateway authorises each call for its caller",
        ),
        named_rule(
            "discovery.k8s.io",
            "endpointslices",
            &["kubernetes"],
            &["get", "list", "watch"],
            "the API server's addresses (default/kubernetes, watched), excepted from sandbox egress \
             and probed as policy canaries",
        ),
        rule(
            "",
            "nodes",
            &["list", "watch"],
            "the nodes' pod ranges (spec.podCIDRs, watched), excepted from AllowAll's IP blocks",
        ),
    ])
}

/// The controllers' and the gateway's rules in the watched namespaces (the ClusterRole when all are
/// watched, a Role in the one namespace with `watchNamespace`). Every verb is one the code sends:
/// status writes are JSON patches (no `get`/`update` on the status subresources), RolloutGroups are
/// never patched.
fn namespaced_rules() -> Table {
    const CRUD: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
    table(&[
        rule(
            "orchard.dev",
            "sandboxes",
            CRUD,
            "watched; created by RolloutGroups and the gateway, deleted at their deadline; \
             heartbeats are merge patches of an annotation",
        ),
        rule(
            "orchard.dev",
            "sandboxes/status",
            &["patch"],
            "status written with JSON patches (never a PUT, never a read of the subresource)",
        ),
        rule(
            "orchard.dev",
            "rolloutgroups",
            &["get", "list", "watch", "create", "delete"],
            "watched; created and deleted through the gateway; never patched",
        ),
        rule(
            "orchard.dev",
            "rolloutgroups/status",
            &["patch"],
            "status written with JSON patches",
        ),
        rule(
            "orchard.dev",
            "rolloutqueues",
            &["get", "list", "watch"],
            "a queue's limits",
        ),
        rule(
            "orchard.dev",
            "rolloutqueues/status",
            &["patch"],
            "slots in use and the waiting strides (JSON patches)",
        ),
        rule(
            "orchard.dev",
            "sandboxpools",
            &["get", "list", "watch"],
            "a pool's size and template",
        ),
        rule(
            "orchard.dev",
            "sandboxpools/status",
            &["patch"],
            "members Ready and starting, claims (JSON patches)",
        ),
        rule(
            "orchard.dev",
            "sandboxsnapshots",
            CRUD,
            "watched; created and deleted through the gateway, deleted when \
             ttlSecondsAfterUnused runs out; the finalizer is added and removed with JSON patches",
        ),
        rule(
            "orchard.dev",
            "sandboxsnapshots/status",
            &["patch"],
            "phase, image, conditions (JSON patches)",
        ),
        rule(
            "",
            "resourcequotas",
            &["list"],
            "a namespace's snapshot size quota (orchard.dev/snapshot-bytes), read when a snapshot \
             starts committing or becomes Ready",
        ),
        rule(
            "",
            "pods",
            CRUD,
            "sandbox pods and pool members: created with POST, watched, deleted on failure or \
             expiry; a member is patched once, when a Sandbox claims it",
        ),
        rule(
            "events.k8s.io",
            "events",
            &["create", "patch"],
            "events on transitions (the recorder patches repeats into series)",
        ),
        rule(
            "networking.k8s.io",
            "networkpolicies",
            CRUD,
            "the per-namespace baseline policy and per-sandbox egress policies",
        ),
    ])
}

/// The operator in the release namespace (a Role): the leader-election Lease is read, created and
/// renewed with PUT; the agent-token key Secret is read (by name only) and created by the first
/// replica. No Secret permission anywhere else: agent tokens are derived, not stored per sandbox.
fn lease_rules() -> Table {
    table(&[
        rule(
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"],
            "leader election: the Lease is read, created and renewed with PUT, never patched",
        ),
        named_rule(
            "",
            "secrets",
            &["orchard-agent-token-key"],
            &["get"],
            "the agent-token key, read at start",
        ),
        rule(
            "",
            "secrets",
            &["create"],
            "the agent-token key, created by the first replica that finds none (`create` cannot \
             be limited by resourceNames)",
        ),
    ])
}

/// The operator in the snapshot namespace (a Role, only with snapshots on): the committer Pods,
/// which hold a node's containerd socket and so run nowhere else.
fn snapshot_rules() -> Table {
    table(&[rule(
        "",
        "pods",
        &["get", "list", "watch", "create", "delete"],
        "committer pods of SandboxSnapshots: created with POST, watched, deleted once they \
         reported; never patched",
    )])
}

/// The operator in the release namespace (a Role of the egress proxy's templates): the proxy's
/// Service, read at start for its cluster IP, selector and port.
fn egress_service_rules(fullname: &str) -> Table {
    table(&[named_rule(
        "",
        "services",
        &[&format!("{fullname}-egress")],
        &["get"],
        "the egress proxy's Service, read at start (ORCHARD_EGRESS_PROXY_SERVICE): its cluster IP \
         goes to sandboxes as HTTP_PROXY, its selector and port into their NetworkPolicy",
    )])
}

/// The egress proxy's cluster-scoped rules (its ClusterRole in both modes): the ranges it never
/// connects to, read as the operator reads them.
fn egress_cluster_rules() -> Table {
    table(&[
        named_rule(
            "discovery.k8s.io",
            "endpointslices",
            &["kubernetes"],
            &["get", "list", "watch"],
            "the API server's addresses (default/kubernetes, watched): never connected to",
        ),
        rule(
            "",
            "nodes",
            &["list", "watch"],
            "the nodes' pod ranges (spec.podCIDRs, watched): never connected to",
        ),
        rule(
            "networking.k8s.io",
            "servicecidrs",
            &["list"],
            "the service ranges (ServiceCIDR objects, listed every minute): never connected to",
        ),
    ])
}

/// The egress proxy's rules where it serves Sandboxes (its ClusterRole when all namespaces are
/// watched, a Role in the one namespace with `watchNamespace`).
fn egress_namespaced_rules() -> Table {
    table(&[
        rule(
            "orchard.dev",
            "sandboxes",
            &["get", "list", "watch"],
            "watched: each sandbox's rules, keyed by its pod IP; never written",
        ),
        rule(
            "orchard.dev",
            "sandboxes/status",
            &["patch"],
            "status.egress (the generation enforced), JSON patches with a UID test",
        ),
        rule(
            "events.k8s.io",
            "events",
            &["create", "patch"],
            "EgressDenied and EgressCut events (the recorder patches repeats into series)",
        ),
    ])
}

/// What the operator's ServiceAccount is granted, whichever role grants it: the contract of
/// docs/SECURITY.md.
fn operator_permissions(fullname: &str) -> Table {
    cluster_rules()
        .into_iter()
        .chain(namespaced_rules())
        .chain(lease_rules())
        .chain(egress_service_rules(fullname))
        .collect()
}

/// What the egress proxy's ServiceAccount is granted, whichever role grants it.
fn egress_permissions() -> Table {
    egress_cluster_rules()
        .into_iter()
        .chain(egress_namespaced_rules())
        .collect()
}

/// (role kind, role name, namespace) -> what that role grants.
fn by_role(docs: &[Value]) -> BTreeMap<(String, String, String), Table> {
    let mut roles: BTreeMap<(String, String, String), Table> = BTreeMap::new();
    for (kind, name, namespace, group, resource, names, verb) in grants(docs) {
        roles
            .entry((kind, name, namespace))
            .or_default()
            .insert((group, resource, names, verb));
    }
    roles
}

/// The exact rule table of an install named `fullname` watching all namespaces, or only `watched`,
/// with committer Pods in `snapshots` when snapshots are on.
fn expected_roles(
    fullname: &str,
    watched: Option<&str>,
    snapshots: Option<&str>,
) -> BTreeMap<(String, String, String), Table> {
    let key =
        |kind: &str, name: String, namespace: &str| (kind.to_string(), name, namespace.to_string());
    let egress = format!("{fullname}-egress");
    let mut roles = BTreeMap::new();
    roles.insert(
        key(
            "Role",
            format!("{fullname}-leader-election"),
            RELEASE_NAMESPACE,
        ),
        lease_rules(),
    );
    roles.insert(
        key(
            "Role",
            format!("{fullname}-egress-service"),
            RELEASE_NAMESPACE,
        ),
        egress_service_rules(fullname),
    );
    if let Some(namespace) = snapshots {
        roles.insert(
            key("Role", format!("{fullname}-snapshots"), namespace),
            snapshot_rules(),
        );
    }
    match watched {
        None => {
            let all = cluster_rules().into_iter().chain(namespaced_rules());
            roles.insert(key("ClusterRole", fullname.to_string(), ""), all.collect());
            let all = egress_cluster_rules()
                .into_iter()
                .chain(egress_namespaced_rules());
            roles.insert(key("ClusterRole", egress, ""), all.collect());
        }
        Some(namespace) => {
            roles.insert(
                key("ClusterRole", fullname.to_string(), ""),
                cluster_rules(),
            );
            roles.insert(
                key("Role", fullname.to_string(), namespace),
                namespaced_rules(),
            );
            roles.insert(
                key("ClusterRole", egress.clone(), ""),
                egress_cluster_rules(),
            );
            roles.insert(key("Role", egress, namespace), egress_namespaced_rules());
        }
    }
    roles
}

/// The namespace config/overlays/namespaced watches.
const KUSTOMIZE_WATCHED: &str = "orchard-sandboxes";

/// The namespace committer Pods run in (the chart's default, config/overlays/snapshots).
const SNAPSHOT_NAMESPACE: &str = "orchard-snapshots";

/// One render: its name, its documents, its object-name prefix (`orchard-operator` for release
/// `orchard`, the full values' `fullnameOverride`), the namespace it watches (`None`: all) and the one
/// committer Pods run in (`None`: snapshots off).
type Render = (
    &'static str,
    Vec<Value>,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
);

/// The chart with snapshots on, as config/overlays/snapshots installs them.
fn helm_snapshots() -> Vec<Value> {
    documents(&helm_template(&[
        "--set",
        "snapshots.registry=registry.example.com/orchard-snapshots",
    ]))
}

fn renders() -> Vec<Render> {
    vec![
        (
            "helm default",
            documents(&helm_default()),
            "orchard-operator",
            None,
            None,
        ),
        (
            "helm full values",
            documents(&helm_full()),
            "orchard-ha",
            Some("rl-sandboxes"),
            Some(SNAPSHOT_NAMESPACE),
        ),
        (
            "helm watchNamespace",
            documents(&helm_template(&[
                "--set",
                &format!("watchNamespace={KUSTOMIZE_WATCHED}"),
            ])),
            "orchard-operator",
            Some(KUSTOMIZE_WATCHED),
            None,
        ),
        (
            "helm snapshots",
            helm_snapshots(),
            "orchard-operator",
            None,
            Some(SNAPSHOT_NAMESPACE),
        ),
        (
            "kustomize default",
            documents(&kustomize("default")),
            "orchard-operator",
            None,
            None,
        ),
        (
            "kustomize ha",
            documents(&kustomize("overlays/ha")),
            "orchard-operator",
            None,
            None,
        ),
        (
            "kustomize namespaced",
            documents(&kustomize("overlays/namespaced")),
            "orchard-operator",
            Some(KUSTOMIZE_WATCHED),
            None,
        ),
        (
            "kustomize snapshots",
            documents(&kustomize("overlays/snapshots")),
            "orchard-operator",
            None,
            Some(SNAPSHOT_NAMESPACE),
        ),
    ]
}

#[test]
fn every_render_grants_exactly_the_rule_table_in_the_right_role() {
    for (source, docs, fullname, watched, snapshots) in &renders() {
        assert_eq!(
            by_role(docs),
            expected_roles(fullname, *watched, *snapshots),
            "{source}: the rules per role differ from the table"
        );
    }
}

#[test]
fn the_snapshots_overlay_matches_the_chart_with_a_registry() {
    let chart = helm_snapshots();
    let kustomized = documents(&kustomize("overlays/snapshots"));
    assert_eq!(
        grants(&chart),
        grants(&kustomized),
        "config/overlays/snapshots and the chart with snapshots.registry grant different rules"
    );
    for kind in ["ClusterRoleBinding", "RoleBinding", "ServiceAccount"] {
        assert_eq!(
            identities(&chart, kind),
            identities(&kustomized, kind),
            "{kind}s differ"
        );
    }
    let namespace = |docs: &[Value]| -> Value {
        let found = of_kind(docs, "Namespace")
            .into_iter()
            .find(|n| n["metadata"]["name"] == SNAPSHOT_NAMESPACE)
            .expect("the snapshot namespace is created");
        found["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].clone()
    };
    assert_eq!(namespace(&chart), "privileged");
    assert_eq!(namespace(&kustomized), "privileged");
    assert_eq!(
        env_by_name(operator_deployment(&chart)),
        env_by_name(operator_deployment(&kustomized)),
        "the operator's Deployment differs between config/overlays/snapshots and the chart with snapshots.registry"
    );
    assert_eq!(
        env_map(container(operator_deployment(&kustomized)))["ORCHARD_SNAPSHOT_REGISTRY"],
        "registry.example.com/orchard-snapshots"
    );
}

#[test]
fn no_wildcards_in_any_rendered_role_and_every_permission_is_accounted_for() {
    for (source, docs, fullname, _, _) in &renders() {
        assert_no_wildcards(source, docs);
        // Cluster-wide (ClusterRole) or namespace-scoped (watchNamespace: Role), each ServiceAccount
        // is granted exactly its documented permissions: nothing missing, nothing extra, and nothing
        // of the other's.
        let operator = service_account_of(operator_deployment(docs));
        let egress = service_account_of(egress_deployment(docs));
        assert_eq!(
            permissions_of(docs, &operator),
            operator_permissions(fullname),
            "{source}: the operator's ServiceAccount {operator} is granted other permissions than \
             the documented contract"
        );
        assert_eq!(
            permissions_of(docs, &egress),
            egress_permissions(),
            "{source}: the egress proxy's ServiceAccount {egress} is granted other permissions \
             than its rule table"
        );
        // Every role is bound to one of them (no role lies unused), and bindings name no one else.
        let bound: BTreeSet<_> = grants_to(docs, RELEASE_NAMESPACE, &operator)
            .into_iter()
            .chain(grants_to(docs, RELEASE_NAMESPACE, &egress))
            .collect();
        assert_eq!(
            bound,
            grants(docs),
            "{source}: a role is bound to neither ServiceAccount"
        );
        let mut subjects = BTreeSet::new();
        for binding in of_kind(docs, "RoleBinding")
            .into_iter()
            .chain(of_kind(docs, "ClusterRoleBinding"))
        {
            for subject in binding["subjects"].as_array().expect("subjects") {
                subjects.insert(
                    json!([subject["kind"], subject["namespace"], subject["name"]]).to_string(),
                );
            }
        }
        let expected: BTreeSet<String> = [&operator, &egress]
            .into_iter()
            .map(|name| json!(["ServiceAccount", RELEASE_NAMESPACE, name]).to_string())
            .collect();
        assert_eq!(
            subjects, expected,
            "{source}: bindings name only the operator's and the egress proxy's ServiceAccounts"
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
        grants(&chart),
        grants(&kustomized),
        "config/overlays/namespaced and the chart with watchNamespace grant different rules"
    );
    for kind in ["ClusterRoleBinding", "RoleBinding", "ServiceAccount"] {
        assert_eq!(
            identities(&chart, kind),
            identities(&kustomized, kind),
            "{kind}s differ"
        );
    }
    for docs in [&chart, &kustomized] {
        for deployment in [operator_deployment(docs), egress_deployment(docs)] {
            assert_eq!(
                env_map(container(deployment))["ORCHARD_WATCH_NAMESPACE"],
                KUSTOMIZE_WATCHED,
                "{} watches the one namespace",
                deployment["metadata"]["name"]
            );
        }
    }
    // The overlay's patch moves ORCHARD_WATCH_NAMESPACE to the front of the list: compare by name.
    assert_eq!(
        env_by_name(operator_deployment(&chart)),
        env_by_name(operator_deployment(&kustomized)),
        "the operator's Deployment differs between config/overlays/namespaced and the chart with watchNamespace"
    );
    assert_eq!(
        env_by_name(egress_deployment(&chart)),
        env_by_name(egress_deployment(&kustomized)),
        "the egress proxy's Deployment differs between config/overlays/namespaced and the chart with watchNamespace"
    );
}

/// A Deployment's spec with each container's environment sorted by name (no variable of ours refers
/// to another, so their order means nothing).
fn env_by_name(deployment: &Value) -> Value {
    let mut spec = deployment["spec"].clone();
    for container in spec["template"]["spec"]["containers"]
        .as_array_mut()
        .expect("containers")
    {
        if let Some(env) = container["env"].as_array_mut() {
            env.sort_by_key(|e| e["name"].as_str().unwrap_or_default().to_string());
        }
    }
    spec
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
fn chart_and_kustomize_grant_the_same_rules_and_run_the_same_pod() {
    let chart = documents(&helm_default());
    let kustomized = documents(&kustomize("default"));
    assert_eq!(
        grants(&chart),
        grants(&kustomized),
        "config/rbac and config/egress and the chart's RBAC templates differ"
    );
    for kind in ["ClusterRoleBinding", "RoleBinding", "ServiceAccount"] {
        assert_eq!(
            identities(&chart, kind),
            identities(&kustomized, kind),
            "{kind}s differ"
        );
    }
    // The same ServiceAccounts (the egress proxy's mounts no token by default).
    let accounts = |docs: &[Value]| -> BTreeMap<String, Value> {
        of_kind(docs, "ServiceAccount")
            .into_iter()
            .map(|a| {
                (
                    a["metadata"]["name"].as_str().unwrap().to_string(),
                    without_labels(a.clone()),
                )
            })
            .collect()
    };
    assert_eq!(
        accounts(&chart),
        accounts(&kustomized),
        "ServiceAccounts differ"
    );
    // Same Deployment specs (pod template, probes, env, security) and Services.
    assert_eq!(
        operator_deployment(&chart)["spec"],
        operator_deployment(&kustomized)["spec"],
        "config/manager/manager.yaml and the chart's deployment.yaml (default values, release `orchard`) differ"
    );
    assert_eq!(
        egress_deployment(&chart)["spec"],
        egress_deployment(&kustomized)["spec"],
        "config/egress/deployment.yaml and the chart's egress.yaml (default values, release `orchard`) differ"
    );
    assert_eq!(
        of_kind(&chart, "Deployment").len(),
        of_kind(&kustomized, "Deployment").len()
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
