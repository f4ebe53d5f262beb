//! One pod on the local node, from acceptance to removal: image checks (with the unpullable fault),
//! volumes (emptyDir and Secret files), init containers run for real, the task container's process on
//! the pod's loopback IP, readiness probing, status reports, faults, and termination that kills the
//! whole process tree (including commands the agent started in sessions of their own).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::Inner;
use super::mounts::{Mount, MountTable, image_matches, pod_listen_address, resolve_program};
use super::pod_status::{ContainerState, ContainerView, PodView, status_patch};
use crate::now_rfc3339;
use crate::supervise::{Child, Exit, SIGKILL, Spec, kill_marked};

/// Environment marker on every process of a pod (value: pod uid), inherited by the commands its
/// agent runs, so termination can find and kill all of them.
pub const POD_MARKER: &str = "ORCHARD_E2E_POD";
/// Environment marker on a pod's agent process only (value: `namespace/name`).
pub const AGENT_MARKER: &str = "ORCHARD_E2E_AGENT";

/// How long a kubelet takes at most to report a started container (its pod lifecycle event
/// generator relists every second).
const PLEG_RELIST: Duration = Duration::from_secs(1);

/// What a test or the watch loop asks of a pod worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodCommand {
    /// The pod is being deleted: stop everything and remove the pod.
    Terminate,
    /// Node-pressure eviction: kill the processes, report `Failed`/`Evicted`.
    Evict,
    /// SIGKILL the agent.
    KillAgent,
    /// Stop (`true`) or continue (`false`) every process of the pod and stop reporting.
    Freeze(bool),
    /// Harness teardown: kill processes, leave the API object alone.
    Shutdown,
}

enum Boot {
    Running(Child, ProbeTarget),
    Stuck,
    Stop(PodCommand),
}

#[derive(Debug, Clone)]
struct ProbeTarget {
    address: String,
    path: String,
    period: Duration,
    failure_threshold: u32,
}

pub(crate) struct PodWorker {
    inner: Arc<Inner>,
    pod: Pod,
    commands: mpsc::UnboundedReceiver<PodCommand>,
    dir: PathBuf,
    view: PodView,
    ip: Option<Ipv4Addr>,
    frozen: bool,
    agent_pid: Arc<AtomicU32>,
}

fn container_view(c: &Container, state: ContainerState) -> ContainerView {
    ContainerView {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        state,
        ready: false,
    }
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState::Waiting {
        reason: reason.to_string(),
        message,
    }
}

impl PodWorker {
    pub(crate) fn new(
        inner: Arc<Inner>,
        pod: Pod,
        commands: mpsc::UnboundedReceiver<PodCommand>,
        agent_pid: Arc<AtomicU32>,
    ) -> Self {
        let uid = pod.uid().unwrap_or_default();
        let dir = inner.config.work_dir.join(format!(
            "{}_{}_{}",
            pod.namespace().unwrap_or_default(),
            pod.name_any(),
            &uid[..uid.len().min(8)]
        ));
        let spec = pod.spec.clone().unwrap_or_default();
        let now = now_rfc3339();
        let view = PodView {
            phase: "Pending",
            pod_ip: None,
            start_time: now.clone(),
            reason: None,
            message: None,
            init_containers: spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| container_view(c, waiting("PodInitializing", None)))
                .collect(),
            containers: spec
                .containers
                .iter()
                .map(|c| container_view(c, waiting("ContainerCreating", None)))
                .collect(),
            now,
        };
        Self {
            inner,
            pod,
            commands,
            dir,
            view,
            ip: None,
            frozen: false,
            agent_pid,
        }
    }

    fn namespace(&self) -> String {
        self.pod.namespace().unwrap_or_default()
    }

    fn uid(&self) -> String {
        self.pod.uid().unwrap_or_default()
    }

    fn api(&self) -> Api<Pod> {
        Api::namespaced(self.inner.client.clone(), &self.namespace())
    }

    async fn report(&mut self) {
        if self.frozen || self.inner.paused.load(Ordering::SeqCst) {
            return;
        }
        self.view.now = now_rfc3339();
        let patch = status_patch(&self.view);
        if let Err(err) = self
            .api()
            .patch_status(
                &self.pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            debug!(%err, pod = %self.pod.name_any(), "status report failed");
        }
    }

    pub(crate) async fn run(mut self) {
        let stop = match self.boot().await {
            Boot::Running(agent, probe) => self.serve(agent, probe).await,
            Boot::Stuck => self.wait_for_stop().await,
            Boot::Stop(command) => command,
        };
        self.cleanup(stop).await;
    }

    fn unpullable(&self, image: &str) -> bool {
        let pattern = self
            .inner
            .unpullable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        pattern.is_some_and(|p| image_matches(image, &p))
    }

    /// Reports `ErrImagePull`, then `ImagePullBackOff`, for container `index` (init or app).
    async fn fail_pull(&mut self, init: bool, index: usize, image: &str) {
        let message =
            format!("failed to pull image \"{image}\": not found (injected by the local node)");
        for reason in ["ErrImagePull", "ImagePullBackOff"] {
            let list = if init {
                &mut self.view.init_containers
            } else {
                &mut self.view.containers
            };
            list[index].state = waiting(reason, Some(message.clone()));
            self.report().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn pending_command(&mut self) -> Option<PodCommand> {
        loop {
            match self.commands.try_recv() {
                Ok(PodCommand::Freeze(frozen)) => self.frozen = frozen,
                Ok(PodCommand::KillAgent | PodCommand::Evict) => {}
                Ok(command) => return Some(command),
                Err(mpsc::error::TryRecvError::Empty) => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => return Some(PodCommand::Shutdown),
            }
        }
    }

    async fn boot(&mut self) -> Boot {
        let spec = self.pod.spec.clone().unwrap_or_default();
        if let Err(err) = std::fs::create_dir_all(self.dir.join("rootfs")) {
            warn!(%err, "cannot create pod directory");
            return Boot::Stuck;
        }
        let volumes = match self.materialize_volumes().await {
            Ok(volumes) => volumes,
            Err(command) => return Boot::Stop(command),
        };
        for (index, init) in spec.init_containers.iter().flatten().enumerate() {
            if let Some(command) = self.pending_command() {
                return Boot::Stop(command);
            }
            let image = init.image.clone().unwrap_or_default();
            if self.unpullable(&image) {
                self.fail_pull(true, index, &image).await;
                return Boot::Stuck;
            }
            let started = now_rfc3339();
            let child = match self.spawn_container(init, &volumes, None) {
                Ok(child) => child,
                Err(message) => {
                    self.view.init_containers[index].state =
                        waiting("RunContainerError", Some(message));
                    self.view.phase = "Failed";
                    self.report().await;
                    return Boot::Stuck;
                }
            };
            let exit = child.wait().await.unwrap_or(Exit::Signal(SIGKILL));
            let (exit_code, signal) = match exit {
                Exit::Code(code) => (code, None),
                Exit::Signal(sig) => (128 + sig, Some(sig)),
            };
            let name = self.view.init_containers[index].name.clone();
            self.view.init_containers[index].state = ContainerState::Terminated {
                exit_code,
                signal,
                reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
                message: (exit_code != 0).then(|| self.log_tail(&name)).flatten(),
                started_at: started,
                finished_at: now_rfc3339(),
            };
            self.view.init_containers[index].ready = exit_code == 0;
            if exit_code != 0 {
                self.view.phase = "Failed";
                self.report().await;
                return Boot::Stuck;
            }
        }
        let Some(task) = spec.containers.first().cloned() else {
            return Boot::Stuck;
        };
        let image = task.image.clone().unwrap_or_default();
        if self.unpullable(&image) {
            self.fail_pull(false, 0, &image).await;
            return Boot::Stuck;
        }
        let probe = task
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref().map(|h| (p, h)));
        let port = match probe {
            Some((_, http)) => match &http.port {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => task
                    .ports
                    .iter()
                    .flatten()
                    .find(|p| p.name.as_deref() == Some(name.as_str()))
                    .map(|p| p.container_port)
                    .unwrap_or(9090),
            },
            None => task
                .ports
                .iter()
                .flatten()
                .next()
                .map(|p| p.container_port)
                .unwrap_or(9090),
        };
        let port = u16::try_from(port).unwrap_or(9090);
        let ip = self
            .inner
            .ip_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allocate(port);
        let Some(ip) = ip else {
            self.view.containers[0].state =
                waiting("CreateContainerError", Some("no free pod IP".into()));
            self.view.phase = "Failed";
            self.report().await;
            return Boot::Stuck;
        };
        self.ip = Some(ip);
        let started_at = now_rfc3339();
        let agent = match self.spawn_container(&task, &volumes, Some(ip)) {
            Ok(child) => child,
            Err(message) => {
                self.view.containers[0].state = waiting("RunContainerError", Some(message));
                self.view.phase = "Failed";
                self.report().await;
                return Boot::Stuck;
            }
        };
        self.agent_pid.store(agent.pid(), Ordering::SeqCst);
        self.view.phase = "Running";
        self.view.pod_ip = Some(ip.to_string());
        self.view.containers[0].state = ContainerState::Running { started_at };
        let target = ProbeTarget {
            address: format!("{ip}:{port}"),
            path: probe
                .and_then(|(_, h)| h.path.clone())
                .unwrap_or_else(|| "/healthz".into()),
            period: Duration::from_secs(
                probe
                    .and_then(|(p, _)| p.period_seconds)
                    .unwrap_or(10)
                    .max(1) as u64,
            ),
            failure_threshold: probe
                .and_then(|(p, _)| p.failure_threshold)
                .unwrap_or(3)
                .max(1) as u32,
        };
        Boot::Running(agent, target)
    }

    /// Creates the pod's volumes; returns their host directories by volume name.
    async fn materialize_volumes(&mut self) -> Result<BTreeMap<String, PathBuf>, PodCommand> {
        let mut volumes = BTreeMap::new();
        let spec = self.pod.spec.clone().unwrap_or_default();
        for volume in spec.volumes.iter().flatten() {
            if let Some(image) = &volume.image {
                // An image volume of the agent image is its root (read-only is not enforced here);
                // the local node has no other image to mount.
                let reference = image.reference.clone().unwrap_or_default();
                if reference.contains(&self.inner.config.agent_image_pattern) {
                    volumes.insert(
                        volume.name.clone(),
                        self.inner.config.agent_image_root.clone(),
                    );
                } else {
                    warn!(%reference, "the local node mounts only the agent image as an image volume");
                }
                continue;
            }
            let host = self.dir.join("volumes").join(&volume.name);
            if std::fs::create_dir_all(&host).is_err() {
                continue;
            }
            if volume.empty_dir.is_some() {
                let _ = std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o777));
            }
            if let Some(source) = &volume.secret {
                let name = source.secret_name.clone().unwrap_or_default();
                let secret = self.wait_for_secret(&name).await?;
                let data = secret.data.unwrap_or_default();
                let mode = source.default_mode.unwrap_or(0o644) as u32;
                let items: Vec<(String, String)> = match &source.items {
                    Some(items) => items
                        .iter()
                        .map(|i| (i.key.clone(), i.path.clone()))
                        .collect(),
                    None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
                };
                for (key, path) in items {
                    if let Some(value) = data.get(&key) {
                        let file = host.join(&path);
                        if std::fs::write(&file, &value.0).is_ok() {
                            let _ = std::fs::set_permissions(
                                &file,
                                std::fs::Permissions::from_mode(mode),
                            );
                        }
                    }
                }
            }
            volumes.insert(volume.name.clone(), host);
        }
        Ok(volumes)
    }

    /// Waits for a Secret like a kubelet does for a secret volume (the pod stays ContainerCreating), from
    /// the node's Secret watch cache.
    async fn wait_for_secret(&mut self, name: &str) -> Result<Secret, PodCommand> {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(&self.namespace());
        loop {
            let changed = self.inner.secret_changed.notified();
            if let Some(secret) = self.inner.secrets.get(&key) {
                return Ok((*secret).clone());
            }
            tokio::select! {
                command = self.commands.recv() => match command {
                    Some(PodCommand::Freeze(frozen)) => self.frozen = frozen,
                    Some(PodCommand::KillAgent | PodCommand::Evict) => {}
                    Some(command) => return Err(command),
                    None => return Err(PodCommand::Shutdown),
                },
                _ = changed => {}
                // The cache may not have started yet: look again now and then.
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    fn spawn_container(
        &self,
        container: &Container,
        volumes: &BTreeMap<String, PathBuf>,
        ip: Option<Ipv4Addr>,
    ) -> Result<Child, String> {
        let mounts = MountTable::new(
            container
                .volume_mounts
                .iter()
                .flatten()
                .filter_map(|m| {
                    Some(Mount {
                        container_path: m.mount_path.clone(),
                        host_path: volumes.get(&m.name)?.clone(),
                    })
                })
                .collect(),
        );
        let image = container.image.clone().unwrap_or_default();
        let image_root = image
            .contains(&self.inner.config.agent_image_pattern)
            .then(|| self.inner.config.agent_image_root.clone());
        let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
        argv.extend(container.args.clone().unwrap_or_default());
        let Some(argv0) = argv.first().cloned() else {
            return Err(format!(
                "container {} has no command (the local node cannot read image entrypoints)",
                container.name
            ));
        };
        let program = resolve_program(&argv0, &mounts, image_root.as_deref());
        let args: Vec<String> = argv[1..].iter().map(|a| mounts.translate(a)).collect();
        let cwd = match container.working_dir.as_deref() {
            Some(dir) => mounts
                .host_path(dir)
                .unwrap_or_else(|| self.dir.join("rootfs").join(dir.trim_start_matches('/'))),
            None => self.dir.join("rootfs"),
        };
        let _ = std::fs::create_dir_all(&cwd);
        let mut spec = Spec::new(
            format!("{}/{}", self.pod.name_any(), container.name),
            program,
        );
        spec.args = args.into_iter().map(Into::into).collect();
        spec.clear_env = true;
        spec.fast = true;
        spec.cwd = Some(cwd);
        spec.log = Some(self.dir.join(format!("{}.log", container.name)));
        for key in ["PATH", "LANG"] {
            if let Ok(value) = std::env::var(key) {
                spec = spec.env(key, value);
            }
        }
        // Each pod gets its own home and temporary directory (pods share the host filesystem otherwise).
        let home = self.dir.join("rootfs/root");
        let tmp = self.dir.join("rootfs/tmp");
        let _ = std::fs::create_dir_all(&home);
        let _ = std::fs::create_dir_all(&tmp);
        spec = spec.env("HOME", &home).env("TMPDIR", &tmp);
        for var in container.env.iter().flatten() {
            let Some(value) = &var.value else { continue };
            let mut value = mounts.translate(value);
            if let Some(ip) = ip {
                value = pod_listen_address(&value, &ip.to_string());
            }
            spec = spec.env(&var.name, value);
        }
        spec = spec.env(POD_MARKER, self.uid());
        if ip.is_some() {
            spec = spec.env(
                AGENT_MARKER,
                format!("{}/{}", self.namespace(), self.pod.name_any()),
            );
        }
        Child::spawn(spec).map_err(|e| e.to_string())
    }

    async fn serve(&mut self, agent: Child, probe: ProbeTarget) -> PodCommand {
        // Probe quickly until the first success (a kubelet would wait a full period), then per period.
        let mut ready = false;
        let mut failures = 0u32;
        let mut next_probe = Duration::ZERO;
        // A kubelet reports a started container within a PLEG relist (1 s) whether or not it is
        // ready; this node folds that write into the first ready report unless the agent is slower.
        let started = tokio::time::Instant::now();
        let mut running_reported = false;
        loop {
            tokio::select! {
                exit = agent.wait() => {
                    let exit = exit.unwrap_or(Exit::Signal(SIGKILL));
                    self.container_exited(exit).await;
                    kill_marked(POD_MARKER, &self.uid());
                    return self.wait_for_stop().await;
                }
                command = self.commands.recv() => match command {
                    Some(PodCommand::KillAgent) => agent.signal(SIGKILL),
                    Some(PodCommand::Evict) => {
                        agent.stop(Duration::from_secs(1)).await;
                        kill_marked(POD_MARKER, &self.uid());
                        self.evicted().await;
                        return self.wait_for_stop().await;
                    }
                    Some(PodCommand::Freeze(frozen)) => {
                        self.frozen = frozen;
                        agent.signal_group(if frozen { Signal::SIGSTOP } else { Signal::SIGCONT } as i32);
                        if !frozen {
                            // The node-lifecycle controller may have marked the pod not ready meanwhile.
                            self.report().await;
                        }
                    }
                    Some(command) => {
                        self.stop_agent(&agent).await;
                        return command;
                    }
                    None => {
                        self.stop_agent(&agent).await;
                        return PodCommand::Shutdown;
                    }
                },
                _ = tokio::time::sleep(next_probe) => {
                    if self.frozen {
                        next_probe = probe.period;
                        continue;
                    }
                    let healthy = http_probe(&probe.address, &probe.path).await;
                    if healthy {
                        failures = 0;
                        if !ready {
                            ready = true;
                            self.view.containers[0].ready = true;
                            self.report().await;
                        }
                        next_probe = probe.period;
                    } else if ready {
                        failures += 1;
                        if failures >= probe.failure_threshold {
                            ready = false;
                            self.view.containers[0].ready = false;
                            self.report().await;
                        }
                        next_probe = probe.period;
                    } else {
                        if !running_reported && started.elapsed() >= PLEG_RELIST {
                            running_reported = true;
                            self.report().await;
                        }
                        next_probe = Duration::from_millis(20);
                    }
                }
            }
        }
    }

    async fn stop_agent(&self, agent: &Child) {
        let grace = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
            .clamp(0, 30) as u64;
        agent.stop(Duration::from_secs(grace)).await;
    }

    /// Marks the task container terminated by `exit` (without reporting).
    fn mark_exited(&mut self, exit: Exit) {
        let (exit_code, signal) = match exit {
            Exit::Code(code) => (code, None),
            Exit::Signal(sig) => (128 + sig, Some(sig)),
        };
        let started_at = match &self.view.containers[0].state {
            ContainerState::Running { started_at } => started_at.clone(),
            _ => now_rfc3339(),
        };
        let name = self.view.containers[0].name.clone();
        self.view.containers[0].state = ContainerState::Terminated {
            exit_code,
            signal,
            reason: if exit_code == 0 { "Completed" } else { "Error" }.into(),
            message: (exit_code != 0).then(|| self.log_tail(&name)).flatten(),
            started_at,
            finished_at: now_rfc3339(),
        };
        self.view.containers[0].ready = false;
        self.view.phase = if exit_code == 0 {
            "Succeeded"
        } else {
            "Failed"
        };
    }

    /// The last 1 KiB of container `name`'s output (its termination message when it failed).
    fn log_tail(&self, name: &str) -> Option<String> {
        let log = std::fs::read(self.dir.join(format!("{name}.log"))).ok()?;
        let tail = &log[log.len().saturating_sub(1024)..];
        let text = String::from_utf8_lossy(tail).trim().to_string();
        (!text.is_empty()).then_some(text)
    }

    async fn container_exited(&mut self, exit: Exit) {
        self.mark_exited(exit);
        self.report().await;
    }

    /// Node-pressure eviction: one report with the container killed and the pod Failed/Evicted.
    async fn evicted(&mut self) {
        self.mark_exited(Exit::Signal(SIGKILL));
        self.view.phase = "Failed";
        self.view.reason = Some("Evicted".into());
        self.view.message = Some(
            "The node was low on resource: memory. (eviction injected by the local node)".into(),
        );
        self.report().await;
    }

    async fn wait_for_stop(&mut self) -> PodCommand {
        loop {
            match self.commands.recv().await {
                Some(PodCommand::Freeze(frozen)) => {
                    self.frozen = frozen;
                    if !frozen {
                        // Like a kubelet that recovers: report what happened while it was hung
                        // (an agent that died meanwhile was not reported then).
                        self.report().await;
                    }
                }
                Some(PodCommand::KillAgent | PodCommand::Evict) => {}
                Some(command) => return command,
                None => return PodCommand::Shutdown,
            }
        }
    }

    async fn cleanup(&mut self, reason: PodCommand) {
        // The agent was stopped (it kills its commands); anything that escaped is swept shortly.
        self.inner
            .finished_pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.uid());
        if let Some(ip) = self.ip.take() {
            self.inner
                .ip_pool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .release(ip);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if reason == PodCommand::Terminate {
            // Remembered before the DELETE, so the watch's Delete event (which forgets it) comes after.
            self.inner
                .terminated_pods
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(self.uid());
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(self.uid()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            if let Err(err) = self.api().delete(&self.pod.name_any(), &params).await {
                debug!(%err, pod = %self.pod.name_any(), "final delete (pod already gone?)");
                let gone = matches!(&err, kube::Error::Api(status) if status.code == 404);
                if !gone {
                    // Not deleted: a later update of the pod may start a worker that tries again.
                    self.inner
                        .terminated_pods
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&self.uid());
                }
            }
        }
    }
}

/// One HTTP readiness probe: `GET path` on `address`, healthy on a 2xx/3xx answer within a second
/// (redirects are not followed, as the kubelet's probe counts a 3xx as success).
async fn http_probe(address: &str, path: &str) -> bool {
    static PROBES: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    let client = PROBES.get_or_init(|| {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(0)
            .user_agent("orchard-local-node")
            .build()
            .unwrap_or_default()
    });
    let answer = client
        .get(format!("http://{address}{path}"))
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    answer.is_ok_and(|r| (200..400).contains(&r.status().as_u16()))
}
