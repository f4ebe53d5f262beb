//! Name churn: Sandboxes and RolloutGroups created, deleted and recreated under the same names, the
//! way trainers reuse a prompt's group name every epoch. Used by the `recreate_churn` test (a few
//! names, a few rounds) and by `make soak` (50 names, minutes).
//!
//! Each name gets its own task that loops: create; then, chosen at random, wait until Ready/Complete,
//! or pause 0-300 ms, or nothing; delete (background propagation, like `kubectl delete`); recreate at
//! once (so the previous incarnation's Pod is usually still terminating). The last incarnation of every
//! name is left alive and must then reach Ready/Complete, own every child it uses (owner UID), and
//! leave nothing of earlier incarnations behind.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams, PropagationPolicy};
use kube::{Client, Resource, ResourceExt};
use orchard_operator::api::{RolloutGroup, Sandbox};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

/// What is churned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Standalone Sandboxes (busybox, the three egress modes in turn).
    Sandboxes,
    /// RolloutGroups with a deterministic runner (N=2, Nmax=4, stride 2).
    RolloutGroups,
}

/// How long and how hard to churn.
#[derive(Debug, Clone)]
pub struct Churn {
    /// What is churned.
    pub kind: Kind,
    /// Number of distinct names, each churned by its own task.
    pub names: usize,
    /// Create/delete rounds per name before the final incarnation (when `duration` is `None`).
    pub rounds: u32,
    /// Churn until this much time has passed instead of a fixed number of rounds.
    pub duration: Option<Duration>,
    /// Seed of the random choices (printed by the callers so a failure can be replayed).
    pub seed: u64,
    /// How long a final incarnation may take to become Ready/Complete.
    pub settle: Duration,
}

/// What a churn run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Objects created in all (every incarnation of every name).
    pub incarnations: u64,
    /// Waits for Ready/Complete during the churn that timed out (`name#round`).
    pub stuck_during_churn: Vec<String>,
    /// Final incarnations that did not become Ready/Complete within `settle`.
    pub stuck: Vec<String>,
    /// Children of a live object owned by someone else, or missing (`kind name: why`).
    pub wrong_owner: Vec<String>,
    /// Pods, Secrets, NetworkPolicies (and trajectory Sandboxes) of earlier incarnations still present.
    pub leaks: Vec<String>,
    /// Wall time of the churn phase.
    pub churn_time: Duration,
}

impl Report {
    /// Whether nothing went wrong.
    pub fn clean(&self) -> bool {
        self.stuck_during_churn.is_empty()
            && self.stuck.is_empty()
            && self.wrong_owner.is_empty()
            && self.leaks.is_empty()
    }
}

/// The name of churned object `index`.
pub fn churn_name(kind: Kind, index: usize) -> String {
    match kind {
        Kind::Sandboxes => format!("again-{index}"),
        Kind::RolloutGroups => format!("prompt-{index}"),
    }
}

/// A Sandbox spec for round `round`: the egress mode rotates so every kind of policy is churned.
fn sandbox_spec(round: u32) -> serde_json::Value {
    match round % 3 {
        0 => json!({"image": "busybox:1.36"}),
        1 => json!({"image": "busybox:1.36", "network": {"egress": "AllowAll"}}),
        _ => json!({"image": "busybox:1.36", "network": {"egress": "AllowList",
            "allow": [{"cidr": "10.99.0.0/16", "ports": [{"port": 443}]}]}}),
    }
}

/// A deterministic runner: trajectory `i` earns reward `i % 2` at once (so N=2 always balances).
fn group_spec() -> serde_json::Value {
    let script = "i=${ORCHARD_SANDBOX##*-}\nprintf '{\"reward\": %d, \"status\": \"completed\"}' $(( i % 2 )) > result.json\n";
    json!({
        "groupSize": 2, "maxTrajectories": 4, "stride": 2, "cleanup": "Keep",
        "template": {"spec": {
            "image": "busybox:1.36",
            "run": {"command": ["/bin/sh", "-c", script], "timeoutSeconds": 60, "resultPath": "result.json"},
        }},
    })
}

fn object<K: serde::de::DeserializeOwned>(kind: &str, name: &str, spec: serde_json::Value) -> K {
    serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": kind,
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("churn objects are valid JSON")
}

/// Whether a Sandbox is Ready.
pub fn sandbox_ready(s: &Sandbox) -> bool {
    s.status.as_ref().is_some_and(|st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Whether a RolloutGroup is Complete.
pub fn group_complete(g: &RolloutGroup) -> bool {
    g.status.as_ref().is_some_and(|st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
    })
}

/// Creates `name`, retrying while the previous incarnation is still being removed (AlreadyExists).
async fn create(client: &Client, ns: &str, kind: Kind, name: &str, round: u32) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let created = match kind {
            Kind::Sandboxes => Api::<Sandbox>::namespaced(client.clone(), ns)
                .create(
                    &PostParams::default(),
                    &object("Sandbox", name, sandbox_spec(round)),
                )
                .await
                .map(|o| o.uid()),
            Kind::RolloutGroups => Api::<RolloutGroup>::namespaced(client.clone(), ns)
                .create(
                    &PostParams::default(),
                    &object("RolloutGroup", name, group_spec()),
                )
                .await
                .map(|o| o.uid()),
        };
        match created {
            Ok(uid) => return uid,
            Err(kube::Error::Api(s)) if s.is_already_exists() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => panic!("cannot create {name}: {err}"),
        }
    }
}

async fn delete(client: &Client, ns: &str, kind: Kind, name: &str) {
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    let result = match kind {
        Kind::Sandboxes => Api::<Sandbox>::namespaced(client.clone(), ns)
            .delete(name, &params)
            .await
            .map(|_| ()),
        Kind::RolloutGroups => Api::<RolloutGroup>::namespaced(client.clone(), ns)
            .delete(name, &params)
            .await
            .map(|_| ()),
    };
    match result {
        Ok(()) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(err) => panic!("cannot delete {name}: {err}"),
    }
}

/// Polls until `name` is Ready/Complete, or `timeout` passes: then says what it last looked like.
async fn settled(
    client: &Client,
    ns: &str,
    kind: Kind,
    name: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let mut last = "never seen".to_string();
    while Instant::now() < deadline {
        let done = match kind {
            Kind::Sandboxes => {
                let sandbox = Api::<Sandbox>::namespaced(client.clone(), ns)
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten();
                if let Some(s) = &sandbox {
                    last = describe_sandbox(s);
                }
                sandbox.is_some_and(|s| sandbox_ready(&s))
            }
            Kind::RolloutGroups => {
                let group = Api::<RolloutGroup>::namespaced(client.clone(), ns)
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten();
                if let Some(g) = &group {
                    last = format!(
                        "{:?}: {}",
                        g.status.as_ref().and_then(|s| s.phase),
                        g.status
                            .as_ref()
                            .and_then(|s| s.message.clone())
                            .unwrap_or_default()
                    );
                }
                group.is_some_and(|g| group_complete(&g))
            }
        };
        if done {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if kind == Kind::Sandboxes {
        last.push_str(&describe_children(client, ns, name).await);
    }
    Err(last)
}

/// What a stuck sandbox's Pod looks like (for reports).
async fn describe_children(client: &Client, ns: &str, name: &str) -> String {
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten();
    let pod = match pod {
        None => "no pod".to_string(),
        Some(p) => format!(
            "pod uid {} owner {:?} node {:?} phase {:?} deleting {}",
            p.uid().unwrap_or_default(),
            owner_uid(&p),
            p.spec.as_ref().and_then(|s| s.node_name.clone()),
            p.status.as_ref().and_then(|s| s.phase.clone()),
            p.metadata.deletion_timestamp.is_some()
        ),
    };
    let sandbox_uid = Api::<Sandbox>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.uid())
        .unwrap_or_default();
    format!(" | sandbox uid {sandbox_uid} | {pod}")
}

/// Phase and the Ready condition's reason and message, for reports.
fn describe_sandbox(s: &Sandbox) -> String {
    let status = s.status.clone().unwrap_or_default();
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
    format!(
        "{:?} {} {}",
        status.phase,
        ready.map(|c| c.reason.as_str()).unwrap_or("-"),
        ready.map(|c| c.message.as_str()).unwrap_or("")
    )
}

/// One name's churn; returns the incarnations created and the waits that timed out.
async fn churn_one(
    client: Client,
    ns: String,
    config: Churn,
    index: usize,
    started: Instant,
) -> (u64, Vec<String>) {
    let name = churn_name(config.kind, index);
    let mut rng = StdRng::seed_from_u64(config.seed ^ (index as u64).wrapping_mul(0x9E37_79B9));
    let mut created = 0;
    let mut stuck = Vec::new();
    let mut round = 0u32;
    loop {
        let more = match config.duration {
            Some(duration) => started.elapsed() < duration,
            None => round < config.rounds,
        };
        create(&client, &ns, config.kind, &name, round).await;
        created += 1;
        if !more {
            break;
        }
        // 0: let it come up, then delete it; 1: delete while it starts (its first stride launching,
        // for a group); otherwise delete at once.
        let choice = rng.random_range(0..4u32);
        if choice == 0
            && let Err(last) = settled(&client, &ns, config.kind, &name, config.settle).await
        {
            stuck.push(format!("{name}#{round}: {last}"));
        }
        if choice == 1 {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
        }
        delete(&client, &ns, config.kind, &name).await;
        round += 1;
    }
    (created, stuck)
}

/// The controller owner UID of an object, if any.
fn owner_uid<K: Resource>(object: &K) -> Option<String> {
    object
        .meta()
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

/// Runs the churn in namespace `ns` and checks the outcome.
pub async fn run(client: &Client, ns: &str, config: &Churn) -> Report {
    let started = Instant::now();
    let tasks: Vec<_> = (0..config.names)
        .map(|index| {
            tokio::spawn(churn_one(
                client.clone(),
                ns.to_string(),
                config.clone(),
                index,
                started,
            ))
        })
        .collect();
    let mut report = Report::default();
    for task in tasks {
        let (created, stuck) = task.await.expect("churn task");
        report.incarnations += created;
        report.stuck_during_churn.extend(stuck);
    }
    report.churn_time = started.elapsed();

    let names: Vec<String> = (0..config.names)
        .map(|i| churn_name(config.kind, i))
        .collect();
    let deadline = Instant::now() + config.settle;
    for name in &names {
        let left = deadline.saturating_duration_since(Instant::now());
        if let Err(last) = settled(client, ns, config.kind, name, left).await {
            report.stuck.push(format!("{name}: {last}"));
        }
    }
    check_children(client, ns, config.kind, &mut report).await;
    report
}

/// Ownership and leak checks once the final incarnations settled: every Pod, Secret and
/// NetworkPolicy (and, for groups, trajectory Sandbox) must belong to a live object, and each live
/// Sandbox's own children must carry its UID. Leftovers of earlier incarnations get a minute to be
/// garbage-collected before they count as leaks.
async fn check_children(client: &Client, ns: &str, kind: Kind, report: &mut Report) {
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let live_sandboxes = sandboxes
            .list(&ListParams::default())
            .await
            .expect("list sandboxes")
            .items;
        let mut live: BTreeSet<String> = live_sandboxes.iter().filter_map(|s| s.uid()).collect();
        let mut wrong = Vec::new();
        let mut leaks = Vec::new();
        if kind == Kind::RolloutGroups {
            let groups: Vec<RolloutGroup> = Api::<RolloutGroup>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .expect("list groups")
                .items;
            let group_uids: BTreeSet<String> = groups.iter().filter_map(|g| g.uid()).collect();
            for s in &live_sandboxes {
                if !owner_uid(s).is_some_and(|uid| group_uids.contains(&uid)) {
                    leaks.push(format!("Sandbox {}: its group is gone", s.name_any()));
                }
            }
            for g in &groups {
                let members = g
                    .status
                    .as_ref()
                    .map(|s| s.group.clone())
                    .unwrap_or_default();
                for member in members {
                    let owned = live_sandboxes
                        .iter()
                        .any(|s| s.name_any() == member.name && owner_uid(s) == g.uid());
                    if !owned {
                        wrong.push(format!(
                            "RolloutGroup {}: member {} is not a trajectory of this incarnation",
                            g.name_any(),
                            member.name
                        ));
                    }
                }
            }
            live.extend(group_uids);
        } else {
            for s in &live_sandboxes {
                check_sandbox_children(client, ns, s, &mut wrong).await;
            }
        }
        collect_leaks::<Pod>(client, ns, &live, &mut leaks).await;
        collect_leaks::<Secret>(client, ns, &live, &mut leaks).await;
        collect_leaks::<NetworkPolicy>(client, ns, &live, &mut leaks).await;
        if (leaks.is_empty() && wrong.is_empty()) || Instant::now() >= deadline {
            report.leaks = leaks;
            report.wrong_owner = wrong;
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Objects of kind `K` in `ns` owned by something not in `live` (the baseline policy has no owner).
async fn collect_leaks<K>(
    client: &Client,
    ns: &str,
    live: &BTreeSet<String>,
    leaks: &mut Vec<String>,
) where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let items = api.list(&ListParams::default()).await.expect("list").items;
    for item in items {
        if let Some(uid) = owner_uid(&item)
            && !live.contains(&uid)
        {
            leaks.push(format!("{} {}", K::kind(&()), item.name_any()));
        }
    }
}

/// A live Sandbox's Pod and egress policy carry its UID, and the agent at its status's endpoint
/// accepts the token derived for that Pod (so the status points at this incarnation's Pod).
async fn check_sandbox_children(
    client: &Client,
    ns: &str,
    sandbox: &Sandbox,
    wrong: &mut Vec<String>,
) {
    let name = sandbox.name_any();
    let uid = sandbox.uid();
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(&name)
        .await
        .expect("get pod");
    let policy = Api::<NetworkPolicy>::namespaced(client.clone(), ns)
        .get_opt(&format!("{name}-egress"))
        .await
        .expect("get policy");
    let mut check = |what: &str, owner: Option<Option<String>>, wanted: bool| match owner {
        Some(owner) if owner != uid => wrong.push(format!("{what} of {name}: owned by {owner:?}")),
        None if wanted => wrong.push(format!("{what} of {name}: missing")),
        _ => {}
    };
    check("Pod", pod.as_ref().map(owner_uid), true);
    let egress = sandbox
        .spec
        .network
        .as_ref()
        .map(|n| format!("{:?}", n.egress))
        .unwrap_or_else(|| "Deny".into());
    check(
        "NetworkPolicy",
        policy.as_ref().map(owner_uid),
        egress != "Deny",
    );
    let token = crate::test_support::sandboxes::token_key(client)
        .await
        .zip(pod.as_ref())
        .and_then(|(key, pod)| orchard_operator::pod::token::token_of(&key, pod).ok());
    let endpoint = sandbox
        .status
        .as_ref()
        .and_then(|s| s.agent_endpoint.clone());
    if let (Some(token), Some(endpoint)) = (token, endpoint) {
        let answer = reqwest::Client::new()
            .post(format!("{endpoint}/v1/exec"))
            .bearer_auth(token.trim())
            .json(&json!({"argv": ["true"]}))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match answer {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => wrong.push(format!(
                "agent of {name}: its own Pod's token got {}",
                r.status()
            )),
            Err(err) => wrong.push(format!("agent of {name}: {err}")),
        }
    }
}

/// Counts of a report for printing: `name -> value`.
pub fn summary(report: &Report) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("incarnations", report.incarnations.to_string()),
        (
            "churn seconds",
            format!("{:.1}", report.churn_time.as_secs_f64()),
        ),
        (
            "stuck during churn",
            report.stuck_during_churn.len().to_string(),
        ),
        ("stuck at the end", report.stuck.len().to_string()),
        ("wrong owner", report.wrong_owner.len().to_string()),
        ("leaks", report.leaks.len().to_string()),
    ])
}
