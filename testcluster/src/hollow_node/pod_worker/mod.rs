//! One pod on the local node, from acceptance to removal: image checks (with the unpullable fault),
//! volumes (emptyDir and Secret files), init containers run for real, the task container's process on
//! the pod's loopback IP, readiness probing, status reports, faults, and termination that kills the
//! whole process tree (including commands the agent started in sessions of their own).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tracing::debug;

use super::mounts::image_matches;
use super::pod_status::{
    ContainerState, ContainerView, PodView, needs_resync, reported_ready, status_patch,
};
use super::shared::NodeShared;
use crate::now_rfc3339;
use crate::supervise::{Child, Exit, SIGKILL, kill_marked};

mod boot;

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
    /// The watch saw the pod at `resource_version` with its `Ready` condition `ready`: the node
    /// reports its own view again when someone else changed it ([`needs_resync`]).
    Observed {
        /// The pod's resourceVersion in the event.
        resource_version: u64,
        /// Whether its `Ready` condition is `True`.
        ready: bool,
    },
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
    inner: Arc<NodeShared>,
    pod: Pod,
    commands: mpsc::UnboundedReceiver<PodCommand>,
    dir: PathBuf,
    view: PodView,
    ip: Option<Ipv4Addr>,
    frozen: bool,
    agent_pid: Arc<AtomicU32>,
    /// The resourceVersion the node's last status report produced (0: none yet).
    reported_version: u64,
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
        inner: Arc<NodeShared>,
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
            reported_version: 0,
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
        match self
            .api()
            .patch_status(
                &self.pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(pod) => {
                self.reported_version = resource_version(&pod).unwrap_or(self.reported_version);
            }
            // A report that failed is made again when the watch shows the pod disagreeing.
            Err(err) => debug!(%err, pod = %self.pod.name_any(), "status report failed"),
        }
    }

    /// Reports again when the API's pod, seen by the watch, no longer says what this node does.
    async fn resync(&mut self, resource_version: u64, ready: bool) {
        if needs_resync(
            resource_version,
            ready,
            self.reported_version,
            reported_ready(&self.view),
        ) {
            debug!(pod = %self.pod.name_any(), ready, "the pod's readiness was changed by someone else: reporting again");
            self.report().await;
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
                Ok(PodCommand::KillAgent | PodCommand::Evict | PodCommand::Observed { .. }) => {}
                Ok(command) => return Some(command),
                Err(mpsc::error::TryRecvError::Empty) => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => return Some(PodCommand::Shutdown),
            }
        }
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
                    Some(PodCommand::Observed { resource_version, ready }) => {
                        self.resync(resource_version, ready).await;
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
                Some(PodCommand::Observed {
                    resource_version,
                    ready,
                }) => self.resync(resource_version, ready).await,
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

/// A pod's resourceVersion as a number (etcd's revision; `None` when it is not one).
pub(crate) fn resource_version(pod: &Pod) -> Option<u64> {
    pod.metadata.resource_version.as_deref()?.parse().ok()
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
