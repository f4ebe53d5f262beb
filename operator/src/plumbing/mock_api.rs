//! A scripted API server for reconcile tests (the tower-test pattern of kube-rs' controller-rs): a
//! test lists the exact requests one reconcile must send, in order, with the answer to each, and runs
//! the reconcile against a context whose client ([`KubeCtx`]) talks to the script. A request the script does not
//! expect, one it expects that never comes, or any request after the script ended fails the test.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::{Request, Response};
use k8s_openapi::api::core::v1::Pod;

use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tower_test::mock;

use crate::app::config::OperatorArgs;
use crate::app::settings::Settings;
use crate::plumbing::backoff::ReconcileBackoff;
use crate::plumbing::caches::Caches;
use crate::plumbing::kube_ctx::KubeCtx;
use crate::plumbing::leader::Leadership;
use crate::plumbing::metrics::Metrics;
use crate::plumbing::own_writes::OwnWrites;
use kube::runtime::events::{Recorder, Reporter};
use orchard_api::{RolloutGroup, RolloutQueue, Sandbox, SandboxPool, SandboxSnapshot};

/// How the scripted server answers a request whose body (JSON, or `null`) it was given.
type Reply = Box<dyn Fn(&Value) -> (u16, Value) + Send>;

/// An extra check of a request's body.
type Check = Box<dyn Fn(&Value) + Send>;

/// One expected request: `METHOD /path` (the query string is checked with `query` when given) and the
/// answer.
pub struct Expect {
    method: &'static str,
    path: String,
    query: Option<&'static str>,
    check: Option<Check>,
    reply: Reply,
}

impl Expect {
    /// A request `method path` answered with `status` and `body`.
    pub fn new(method: &'static str, path: impl Into<String>, status: u16, body: Value) -> Self {
        Self {
            method,
            path: path.into(),
            query: None,
            check: None,
            reply: Box::new(move |_| (status, body.clone())),
        }
    }

    /// A create answered with the object sent, as the API server would store it (a UID and a
    /// resourceVersion added).
    pub fn create(path: impl Into<String>, uid: &'static str) -> Self {
        Self {
            reply: Box::new(move |sent| {
                let mut stored = sent.clone();
                stored["metadata"]["uid"] = json!(uid);
                stored["metadata"]["resourceVersion"] = json!("1");
                (201, stored)
            }),
            ..Self::new("POST", path, 201, Value::Null)
        }
    }

    /// A `404 NotFound` answer.
    pub fn not_found(method: &'static str, path: impl Into<String>) -> Self {
        Self::new(
            method,
            path,
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        )
    }

    /// A `DELETE` answered `200` with a success Status.
    pub fn delete(path: impl Into<String>) -> Self {
        Self::new(
            "DELETE",
            path,
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}),
        )
    }

    /// Also requires the query string to contain `part`.
    pub fn query(mut self, part: &'static str) -> Self {
        self.query = Some(part);
        self
    }

    /// Also checks the request body.
    pub fn body(mut self, check: impl Fn(&Value) + Send + 'static) -> Self {
        self.check = Some(Box::new(check));
        self
    }

    /// Answers with the body sent (a patch or an apply echoed back with `extra` merged into it).
    pub fn echo(mut self, status: u16) -> Self {
        self.reply = Box::new(move |sent| (status, sent.clone()));
        self
    }
}

/// The caches a test fills before the reconcile runs.
pub struct TestCaches {
    pub sandboxes: Writer<Sandbox>,
    pub pods: Writer<CachedPod>,
    pub policies: Writer<NetworkPolicy>,
    pub rollout_groups: Writer<RolloutGroup>,
    pub rollout_queues: Writer<RolloutQueue>,
    pub sandbox_pools: Writer<SandboxPool>,
    pub snapshots: Writer<SandboxSnapshot>,
    pub committers: Writer<Pod>,
    caches: Caches,
}

impl Default for TestCaches {
    /// Empty caches.
    fn default() -> Self {
        fn store<K>() -> (Store<K>, Writer<K>)
        where
            K: kube::Resource<DynamicType = ()> + Clone + 'static,
        {
            reflector::store::<K>()
        }
        let (sandboxes, sandboxes_w) = store();
        let (pods, pods_w) = store();
        let (policies, policies_w) = store();
        let (rollout_groups, rollout_groups_w) = store();
        let (rollout_queues, rollout_queues_w) = store();
        let (sandbox_pools, sandbox_pools_w) = store();
        let (snapshots, snapshots_w) = store();
        let (committers, committers_w) = store();
        Self {
            sandboxes: sandboxes_w,
            pods: pods_w,
            policies: policies_w,
            rollout_groups: rollout_groups_w,
            rollout_queues: rollout_queues_w,
            sandbox_pools: sandbox_pools_w,
            snapshots: snapshots_w,
            committers: committers_w,
            caches: Caches {
                sandboxes,
                pods,
                policies,
                rollout_groups,
                rollout_queues,
                sandbox_pools,
                snapshots,
                committers,
            },
        }
    }
}

/// Puts `object` into a cache as a watch event would.
pub fn cache<K>(writer: &mut Writer<K>, object: K)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    writer.apply_watcher_event(&watcher::Event::Apply(object));
}

/// Operator settings as the binary's defaults give them.
pub fn default_settings() -> Settings {
    use clap::Parser;
    let args = OperatorArgs::parse_from(["orchard-operator"]);
    match Settings::from_args(&args) {
        Ok(settings) => settings,
        Err(err) => panic!("the default settings are valid: {err}"),
    }
}

/// A context (leader, default settings) whose client talks to `script`, and the server task; await
/// [`Scripted::finish`] after the reconcile.
pub fn scripted(caches: &TestCaches, script: Vec<Expect>) -> Scripted {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        for (step, expect) in script.into_iter().enumerate() {
            let Some((request, respond)) = handle.next_request().await else {
                panic!(
                    "request {step} never came: expected {} {}; seen: {seen:#?}",
                    expect.method, expect.path
                );
            };
            let (parts, body) = request.into_parts();
            let line = format!("{} {}", parts.method, parts.uri);
            assert_eq!(
                (parts.method.as_str(), parts.uri.path()),
                (expect.method, expect.path.as_str()),
                "request {step} is not the expected one; seen before: {seen:#?}"
            );
            if let Some(part) = expect.query {
                let query = parts.uri.query().unwrap_or_default();
                assert!(query.contains(part), "{line}: query lacks {part}");
            }
            let bytes = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let sent: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if let Some(check) = &expect.check {
                check(&sent);
            }
            let (status, reply) = (expect.reply)(&sent);
            let response = Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&reply).unwrap_or_default()))
                .unwrap_or_else(|err| panic!("a response: {err}"));
            respond.send_response(response);
            seen.push(line);
        }
        // Nothing more may come while the reconcile finishes.
        if let Ok(Some((extra, _))) =
            tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await
        {
            panic!(
                "unexpected request after the script: {} {}; seen: {seen:#?}",
                extra.method(),
                extra.uri()
            );
        }
        seen
    });
    let kube = KubeCtx {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "orchard-operator".into(),
                instance: None,
            },
        ),
        client,
        caches: caches.caches.clone(),
        filled: crate::plumbing::caches::CacheFill::all_set(),
        metrics: Metrics::new().unwrap_or_else(|err| panic!("metrics: {err}")),
        backoff: Arc::new(ReconcileBackoff::new(
            Duration::from_millis(100),
            Duration::from_secs(60),
        )),
        own_writes: Arc::new(OwnWrites::default()),
        leadership: Leadership::always(),
        key: Arc::new(test_token_key()),
        resync: default_settings().resync,
    };
    Scripted {
        kube: Arc::new(kube),
        server,
    }
}

/// The shared handles bound to a script (each controller's tests build their context on them).
pub struct Scripted {
    /// The handles to reconcile with.
    pub kube: Arc<KubeCtx>,
    server: tokio::task::JoinHandle<Vec<String>>,
}

impl Scripted {
    /// Waits for the script to be played to its end and returns the requests seen.
    pub async fn finish(self) -> Vec<String> {
        match tokio::time::timeout(Duration::from_secs(5), self.server).await {
            Ok(Ok(seen)) => seen,
            Ok(Err(err)) => std::panic::resume_unwind(err.into_panic()),
            Err(_) => panic!("the script did not finish within 5 s"),
        }
    }
}

/// The token key of test contexts (fixed, so tests can derive the tokens of the pods they build).
pub fn test_token_key() -> crate::plumbing::operator_key::OperatorKey {
    match crate::plumbing::operator_key::OperatorKey::new(&[7; 32]) {
        Ok(key) => key,
        Err(err) => panic!("a 32-byte key is valid: {err}"),
    }
}
