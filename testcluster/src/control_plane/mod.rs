//! The upstream control plane: etcd, kube-apiserver (RBAC on, static token users, self-signed serving
//! certificate, service-account signing keys) and kube-controller-manager running the
//! garbage-collector, namespace, node-lifecycle and resource-quota controllers. kube-apiserver listens on 127.0.0.1 for
//! the hollow node, or on the host's end of the real node's veth pair, where it also serves a real
//! kubelet (Node authorization, a client certificate for its calls to the kubelet, tokens of the node's
//! components, endpoints of the `kubernetes` Service). Free ports, a generated kubeconfig, logs under
//! the cluster directory, and teardown of every process.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{E2eError, Result};

mod credentials;

pub use credentials::client_from_kubeconfig;
use credentials::write_kubelet_client_certificate;

/// The operator's namespace (its default, `POD_NAMESPACE`'s, and the chart's release namespace in the
/// tests): it holds the agent-token key Secret of an operator running as a host process, as it would
/// in an install.
pub const OPERATOR_NAMESPACE: &str = "orchard-system";

/// The namespace SandboxSnapshots' committer Pods run in (the operator's default
/// `--snapshot-namespace`, the chart's `snapshots.namespace`): created with every control plane, as
/// the chart creates it.
pub const SNAPSHOT_NAMESPACE: &str = "orchard-snapshots";

/// Creates namespace `name` (an existing one is fine).
async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
            .map_err(|e| E2eError::Setup(format!("namespace {name}: {e}")))?;
    match api
        .create(&kube::api::PostParams::default(), &namespace)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(E2eError::Setup(format!(
            "cannot create namespace {name}: {err}"
        ))),
    }
}
use crate::ports::free_ports;
use crate::supervise::{Child, Spec};

/// Static users of the test cluster (token file): `admin` is in `system:masters`; the others have no
/// rights until a test grants them some with RBAC.
pub const USERS: &[&str] = &["admin", "alice", "bob"];

/// `GOGC` of the control plane's Go processes (`ORCHARD_E2E_GOGC`, default 400). Everything here shares
/// two cores, and a profile of kube-apiserver under the 1,000-sandbox benchmark spent about a fifth of its
/// CPU in Go's garbage collector at the default of 100; memory is plentiful (24 GiB), so the collector
/// runs less often. Large production control planes are tuned the same way.
fn gogc() -> String {
    std::env::var("ORCHARD_E2E_GOGC").unwrap_or_else(|_| "400".to_string())
}

/// kube-apiserver's `GOMEMLIMIT` (a soft limit: Go's collector runs more often near it), which keeps
/// `GOGC` 400 from growing its heap to five times what is live. Above what `make bench-control-plane`
/// needs with 50,000 sandboxes held: at 20,000 its RSS was 3.9 GiB, and near the limit the collector
/// runs continuously and takes the cores the benchmark measures.
const APISERVER_MEMORY_LIMIT: &str = "10GiB";

/// Identities of the real nodes' components shared by every node (token file users): the users
/// kube-proxy and kube-scheduler have default RBAC bindings for, and kube-router (the NetworkPolicy
/// enforcer; the node binds its ClusterRole when it runs it). Each kubelet has its own
/// ([`node_users`]).
pub const NODE_USERS: &[(&str, &str)] = &[
    ("system:kube-proxy", ""),
    ("system:kube-scheduler", ""),
    ("system:kube-router", ""),
];

/// The token file users (name, group) of a cluster of `nodes` real nodes: one kubelet identity per
/// node (`system:node:<name>` in `system:nodes`, for the Node authorizer), then [`NODE_USERS`] (pure).
pub fn node_users(nodes: u8) -> Vec<(String, String)> {
    (0..nodes.max(1))
        .map(|ordinal| {
            (
                format!(
                    "system:node:{}",
                    crate::real_node::layout::node_name(ordinal)
                ),
                "system:nodes".to_string(),
            )
        })
        .chain(
            NODE_USERS
                .iter()
                .map(|(user, group)| (user.to_string(), group.to_string())),
        )
        .collect()
}

/// The port kube-apiserver serves on with a real node (on that run's own host address).
pub const REAL_NODE_API_PORT: u16 = 6443;

/// Where kube-apiserver listens and whether it serves a real kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaneOptions {
    /// Address kube-apiserver listens on and advertises.
    pub address: Ipv4Addr,
    /// Service addresses (`--service-cluster-ip-range`).
    pub service_cidr: String,
    /// Serve a real node: Node authorization, kubelet client certificate, node component users,
    /// `kubernetes` Service endpoints, the EndpointSlice controller.
    pub real_node: bool,
    /// How many real nodes (kubelet identities) the cluster has, with `real_node`.
    pub real_nodes: u8,
    /// Write an audit log of every write request ([`ControlPlane::audit_log`]; off by default: it
    /// costs a file write per request).
    pub audit_log: bool,
    /// With `audit_log`: reads too (get, list; a watch when it ends), not only writes.
    pub audit_reads: bool,
    /// kube-controller-manager's `--node-monitor-grace-period`: how long a node may miss its Lease
    /// renewals before it is NotReady (5 s for the local nodes, which renew every second).
    pub node_monitor_grace: Duration,
}

/// The audit policy of [`PlaneOptions::audit_log`] (pure): metadata (who, what, when, result) of
/// writes, and with `reads` of reads too (once each, when the answer is complete).
pub fn audit_policy(reads: bool) -> String {
    let verbs = if reads {
        "[create, update, patch, delete, deletecollection, get, list, watch]"
    } else {
        "[create, update, patch, delete, deletecollection]"
    };
    format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n  verbs: {verbs}\n- level: None\n"
    )
}

impl Default for PlaneOptions {
    fn default() -> Self {
        Self {
            address: Ipv4Addr::LOCALHOST,
            service_cidr: "10.0.0.0/24".into(),
            real_node: false,
            real_nodes: 1,
            audit_log: false,
            audit_reads: false,
            node_monitor_grace: Duration::from_secs(5),
        }
    }
}

/// A running control plane.
pub struct ControlPlane {
    /// Directory holding data, certificates, kubeconfig and logs.
    pub dir: PathBuf,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// Bearer tokens of [`USERS`] (and [`NODE_USERS`] for a real node).
    pub tokens: BTreeMap<String, String>,
    /// How it was started.
    pub options: PlaneOptions,
    bin_dir: PathBuf,
    etcd_port: u16,
    api_port: u16,
    etcd: Mutex<Option<Child>>,
    apiserver: Mutex<Option<Child>>,
    controller_manager: Mutex<Option<Child>>,
}

impl ControlPlane {
    /// The port kube-apiserver serves on.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }
}

/// Credentials: kubeconfigs for the test users and for any bearer token, and clients from them.
impl ControlPlane {
    /// The CA that signed the client certificate kube-apiserver presents to kubelets (a real node's
    /// kubelet trusts it for exec, logs and port-forward).
    pub fn kubelet_client_ca(&self) -> PathBuf {
        self.dir.join("pki/kubelet-ca.crt")
    }

    /// The file holding the CA of kube-apiserver's serving certificate.
    pub fn serving_ca(&self) -> PathBuf {
        self.dir.join("pki/apiserver.crt")
    }

    /// PEM of the CA the serving certificate chains to (the apiserver writes its self-signed chain).
    fn ca_pem(&self) -> Result<Vec<u8>> {
        Ok(std::fs::read(self.dir.join("pki/apiserver.crt"))?)
    }

    /// Writes a kubeconfig for `user` (one of [`USERS`]) to `path`.
    pub fn write_kubeconfig(&self, user: &str, path: &Path) -> Result<()> {
        let token = self
            .tokens
            .get(user)
            .ok_or_else(|| E2eError::Setup(format!("no such test user `{user}`")))?;
        self.write_token_kubeconfig(token, path)
    }

    /// Writes a kubeconfig authenticating with `token` (any bearer token, e.g. a service account's).
    pub fn write_token_kubeconfig(&self, token: &str, path: &Path) -> Result<()> {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem()?);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: orchard-local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: orchard-local\n  context: {{cluster: orchard-local, user: user, namespace: default}}\ncurrent-context: orchard-local\n",
            server = self.server
        );
        std::fs::write(path, text)?;
        Ok(())
    }

    /// A client authenticated as `admin`.
    pub async fn client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// An admin client whose requests carry the User-Agent `agent` (the API server's audit log names
    /// the sender by it: the local node and the test driver share the admin identity).
    pub async fn client_as(&self, agent: &str) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| E2eError::Setup(format!("kubeconfig: {e}")))?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| E2eError::Setup(format!("kubeconfig: {e}")))?;
        if let Ok(value) = http::HeaderValue::from_str(agent) {
            config.headers.push((http::header::USER_AGENT, value));
        }
        Ok(Client::try_from(config)?)
    }

    /// A client authenticated with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        let path = self.dir.join(format!("kubeconfig-{}", random_hex(4)));
        self.write_token_kubeconfig(token, &path)?;
        let client = client_from_kubeconfig(&path).await;
        let _ = std::fs::remove_file(&path);
        client
    }
}

fn random_hex(bytes: usize) -> String {
    (0..bytes).map(|_| format!("{:02x}", rand_byte())).collect()
}

fn rand_byte() -> u8 {
    rand::random()
}

async fn wait_etcd(port: u16, deadline: Instant) -> Result<()> {
    let mut last = String::new();
    while Instant::now() < deadline {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(mut stream) => {
                let _ = stream.write_all(b"GET /health HTTP/1.0\r\n\r\n").await;
                let mut body = String::new();
                let _ = stream.read_to_string(&mut body).await;
                if body.contains("\"health\":\"true\"") {
                    return Ok(());
                }
                last = body;
            }
            Err(err) => last = err.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(E2eError::NotReady {
        component: "etcd".into(),
        seconds: 30,
        detail: last,
    })
}

/// kube-controller-manager's `--controllers` for a control plane started with `options` (pure). With
/// several real nodes also the pod garbage collector, which deletes the pods of a Node that is gone
/// (as on any cluster once a reclaimed machine's Node object is deleted), and the taint-eviction
/// controller, which deletes the pods of a node tainted `NoExecute` (unreachable, not ready) once
/// their toleration runs out: what a spot reclaim meets on any cluster.
pub fn controllers(options: &PlaneOptions) -> String {
    let mut controllers = if options.real_node {
        "--controllers=garbage-collector-controller,namespace-controller,node-lifecycle-controller,endpointslice-controller,serviceaccount-controller,root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller,disruption-controller,resourcequota-controller"
    } else {
        "--controllers=garbage-collector-controller,namespace-controller,node-lifecycle-controller,resourcequota-controller"
    }
    .to_string();
    if options.real_node && options.real_nodes > 1 {
        controllers.push_str(",pod-garbage-collector-controller,taint-eviction-controller");
    }
    controllers
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager with binaries from `bin_dir`, keeping
    /// everything under `dir` (created). The CRDs in `crds_dir` are installed before the controller
    /// manager starts, so its garbage collector knows them from the first moment (it rediscovers
    /// resources only every 30 s).
    pub async fn start(
        dir: &Path,
        bin_dir: &Path,
        crds_dir: &Path,
        options: PlaneOptions,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir.join("logs"))?;
        std::fs::create_dir_all(dir.join("pki"))?;
        let ports = free_ports(3)?;
        // A real node's API server listens on an address of its own run, on 6443 as kubeadm's and
        // kind's do: the chart's defaults (its NetworkPolicy's API server ports) then fit as they
        // would on a user's cluster.
        let (etcd_port, peer_port) = (ports[0], ports[1]);
        let api_port = if options.real_node {
            REAL_NODE_API_PORT
        } else {
            ports[2]
        };
        let mut users: Vec<(String, String)> = USERS
            .iter()
            .map(|u| {
                let group = if *u == "admin" { "system:masters" } else { "" };
                (u.to_string(), group.to_string())
            })
            .collect();
        if options.real_node {
            users.extend(node_users(options.real_nodes));
            write_kubelet_client_certificate(&dir.join("pki"))?;
        }
        let tokens: BTreeMap<String, String> = users
            .iter()
            .map(|(u, _)| (u.clone(), random_hex(32)))
            .collect();
        let token_file: String = users
            .iter()
            .map(|(user, group)| {
                let token = &tokens[user];
                if group.is_empty() {
                    format!("{token},{user},{user}\n")
                } else {
                    format!("{token},{user},{user},{group}\n")
                }
            })
            .collect();
        std::fs::write(dir.join("tokens.csv"), token_file)?;
        if options.audit_log {
            std::fs::write(
                dir.join("audit-policy.yaml"),
                audit_policy(options.audit_reads),
            )?;
        }
        let key = dir.join("pki/sa.key");
        let status = std::process::Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .stderr(std::process::Stdio::null())
            .status()
            .map_err(|e| {
                E2eError::Setup(format!(
                    "openssl is needed for the service-account key: {e}"
                ))
            })?;
        if !status.success() {
            return Err(E2eError::Setup("openssl genrsa failed".into()));
        }
        let plane = Self {
            dir: dir.to_path_buf(),
            kubeconfig: dir.join("kubeconfig"),
            server: format!("https://{}:{api_port}", options.address),
            tokens,
            options,
            bin_dir: bin_dir.to_path_buf(),
            etcd_port,
            api_port,
            etcd: Mutex::new(None),
            apiserver: Mutex::new(None),
            controller_manager: Mutex::new(None),
        };
        let etcd = Child::spawn(
            Spec::new("etcd", bin_dir.join("etcd"))
                .args([
                    "--name=default".to_string(),
                    format!("--data-dir={}", dir.join("etcd").display()),
                    format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
                    format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"),
                    format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                    format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                    "--unsafe-no-fsync".to_string(),
                    "--log-level=warn".to_string(),
                    // Room for thousands of sandboxes without compaction pressure in a short run.
                    "--quota-backend-bytes=8589934592".to_string(),
                ])
                .env("GOGC", gogc())
                .log(dir.join("logs/etcd.log")),
        )?;
        *plane.etcd.lock().unwrap_or_else(|p| p.into_inner()) = Some(etcd);
        wait_etcd(etcd_port, Instant::now() + Duration::from_secs(30)).await?;
        plane.start_apiserver().await?;
        plane
            .wait_serving_certificate(Duration::from_secs(60))
            .await?;
        plane.write_kubeconfig("admin", &plane.kubeconfig)?;
        plane.wait_apiserver(Duration::from_secs(90)).await?;
        let client = plane.client().await?;
        crate::crds::install(&client, crds_dir).await?;
        create_namespace(&client, OPERATOR_NAMESPACE).await?;
        create_namespace(&client, SNAPSHOT_NAMESPACE).await?;
        plane.start_controller_manager()?;
        Ok(plane)
    }

    fn apiserver_spec(&self) -> Spec {
        let dir = &self.dir;
        let key = dir.join("pki/sa.key");
        let address = self.options.address;
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_port),
            format!("--bind-address={address}"),
            format!("--advertise-address={address}"),
            format!("--secure-port={}", self.api_port),
            format!("--cert-dir={}", dir.join("pki").display()),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            format!("--service-account-key-file={}", key.display()),
            format!("--service-account-signing-key-file={}", key.display()),
            format!("--service-cluster-ip-range={}", self.options.service_cidr),
            "--allow-privileged=true".to_string(),
            // Two cores: the defaults (400/200 in-flight) are fine, but be generous with the
            // per-client rate so load tests measure the system, not a throttle.
            "--max-requests-inflight=1000".to_string(),
            "--max-mutating-requests-inflight=500".to_string(),
            "--v=1".to_string(),
        ];
        if self.options.audit_log {
            args.extend([
                format!(
                    "--audit-policy-file={}",
                    dir.join("audit-policy.yaml").display()
                ),
                format!("--audit-log-path={}", dir.join("logs/audit.log").display()),
                "--audit-log-format=json".to_string(),
            ]);
        }
        if self.options.real_node {
            let pki = dir.join("pki");
            args.extend([
                // Pods that run in-cluster clients (the chart-installed operator) get projected
                // ServiceAccount tokens; Pod Security admission is on as in every cluster.
                "--enable-admission-plugins=ServiceAccount,PodSecurity".to_string(),
                "--authorization-mode=Node,RBAC".to_string(),
                "--endpoint-reconciler-type=lease".to_string(),
                format!(
                    "--kubelet-client-certificate={}",
                    pki.join("kubelet-client.crt").display()
                ),
                format!(
                    "--kubelet-client-key={}",
                    pki.join("kubelet-client.key").display()
                ),
                // No DNS for node names here: reach the kubelet at its InternalIP (--node-ip).
                "--kubelet-preferred-address-types=InternalIP,Hostname".to_string(),
            ]);
        } else {
            args.extend([
                // The hollow node cannot mount projected ServiceAccount tokens.
                "--disable-admission-plugins=ServiceAccount".to_string(),
                "--authorization-mode=RBAC".to_string(),
                "--endpoint-reconciler-type=none".to_string(),
            ]);
        }
        Spec::new("kube-apiserver", self.bin_dir.join("kube-apiserver"))
            .args(args)
            .env("GOGC", gogc())
            // With GOGC at 400 the heap of a busy API server grows to several GiB (5 GiB after 3,000
            // KWOK sandboxes): past this soft limit Go collects as often as it must instead.
            .env("GOMEMLIMIT", APISERVER_MEMORY_LIMIT)
            .log(dir.join("logs/kube-apiserver.log"))
    }

    async fn start_apiserver(&self) -> Result<()> {
        let child = Child::spawn(self.apiserver_spec())?;
        *self.apiserver.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }

    fn start_controller_manager(&self) -> Result<()> {
        let child = Child::spawn(
            Spec::new(
                "kube-controller-manager",
                self.bin_dir.join("kube-controller-manager"),
            )
            .args([
                format!("--kubeconfig={}", self.kubeconfig.display()),
                controllers(&self.options),
                // The local nodes renew their Lease every second: notice a silent node within 5 s.
                format!(
                    "--node-monitor-grace-period={}s",
                    self.options.node_monitor_grace.as_secs()
                ),
                "--node-monitor-period=1s".to_string(),
                "--leader-elect=false".to_string(),
                "--secure-port=0".to_string(),
                // Garbage collection of thousands of pods should not queue behind 20 workers.
                "--concurrent-gc-syncs=50".to_string(),
                "--kube-api-qps=500".to_string(),
                "--kube-api-burst=1000".to_string(),
                "--v=1".to_string(),
            ])
            .env("GOGC", gogc())
            .log(self.dir.join("logs/kube-controller-manager.log")),
        )?;
        *self
            .controller_manager
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }

    /// Waits until kube-apiserver has written its self-signed serving certificate (the kubeconfig's CA).
    async fn wait_serving_certificate(&self, timeout: Duration) -> Result<()> {
        let path = self.dir.join("pki/apiserver.crt");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if std::fs::read(&path)
                .is_ok_and(|pem| pem.windows(9).filter(|w| w == b"-----END ").count() >= 1)
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(E2eError::NotReady {
            component: "kube-apiserver serving certificate".into(),
            seconds: timeout.as_secs(),
            detail: format!(
                "{} missing (log: {})",
                path.display(),
                self.dir.join("logs/kube-apiserver.log").display()
            ),
        })
    }

    /// Waits until `/readyz` answers OK.
    pub async fn wait_apiserver(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            match self.client().await {
                Ok(client) => {
                    let request = http::Request::get("/readyz").body(Vec::new());
                    match request {
                        Ok(request) => match client.request_text(request).await {
                            Ok(body) if body.trim() == "ok" => return Ok(()),
                            Ok(body) => last = body,
                            Err(err) => last = err.to_string(),
                        },
                        Err(err) => last = err.to_string(),
                    }
                }
                Err(err) => last = err.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(E2eError::NotReady {
            component: "kube-apiserver".into(),
            seconds: timeout.as_secs(),
            detail: format!(
                "{last} (log: {})",
                self.dir.join("logs/kube-apiserver.log").display()
            ),
        })
    }

    /// The audit log (JSON lines, one `audit.k8s.io/v1` Event per write), if
    /// [`PlaneOptions::audit_log`] is on.
    pub fn audit_log(&self) -> Option<PathBuf> {
        self.options
            .audit_log
            .then(|| self.dir.join("logs/audit.log"))
    }

    /// Stops kube-apiserver and starts it again on the same port (watches must recover).
    pub async fn restart_apiserver(&self) -> Result<()> {
        let old = self
            .apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(old) = old {
            old.stop(Duration::from_secs(10)).await;
        }
        self.start_apiserver().await?;
        self.wait_apiserver(Duration::from_secs(90)).await
    }

    /// Process ids of etcd, kube-apiserver and kube-controller-manager (for resource accounting).
    pub fn pids(&self) -> BTreeMap<&'static str, u32> {
        let mut pids = BTreeMap::new();
        for (name, slot) in [
            ("etcd", &self.etcd),
            ("kube-apiserver", &self.apiserver),
            ("kube-controller-manager", &self.controller_manager),
        ] {
            if let Some(child) = slot.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                pids.insert(name, child.pid());
            }
        }
        pids
    }

    /// Stops every process (controller manager, apiserver, then etcd) and removes etcd's data.
    pub fn stop(&self) {
        for slot in [&self.controller_manager, &self.apiserver, &self.etcd] {
            if let Some(child) = slot.lock().unwrap_or_else(|p| p.into_inner()).take() {
                child.kill_now();
            }
        }
        let _ = std::fs::remove_dir_all(self.dir.join("etcd"));
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_real_node_has_a_kubelet_identity_of_its_own() {
        let one = node_users(1);
        assert_eq!(
            one[0],
            ("system:node:orchard-node".into(), "system:nodes".into())
        );
        assert_eq!(one.len(), 1 + NODE_USERS.len());
        let two = node_users(2);
        assert_eq!(
            two[1],
            ("system:node:orchard-node-2".into(), "system:nodes".into())
        );
        assert_eq!(two.len(), 2 + NODE_USERS.len());
        assert_eq!(
            node_users(0),
            one,
            "a real-node cluster has at least one node"
        );
    }

    #[test]
    fn only_a_cluster_of_several_real_nodes_collects_and_evicts_the_pods_of_lost_nodes() {
        let mut options = PlaneOptions {
            real_node: true,
            ..PlaneOptions::default()
        };
        assert!(!controllers(&options).contains("pod-garbage-collector"));
        assert!(!controllers(&options).contains("taint-eviction"));
        assert!(controllers(&options).contains("disruption-controller"));
        options.real_nodes = 2;
        assert!(
            controllers(&options)
                .ends_with(",pod-garbage-collector-controller,taint-eviction-controller")
        );
        assert!(!controllers(&PlaneOptions::default()).contains("pod-garbage-collector"));
        assert!(!controllers(&PlaneOptions::default()).contains("taint-eviction"));
    }
}
