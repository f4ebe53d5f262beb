//! Starting a pod's containers on the local node: the image checks (with the unpullable fault), the
//! volumes (emptyDir and Secret files), the init containers run for real to the end, then the task
//! container's process on the pod's loopback IP, ready to be probed.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Secret};
use kube::ResourceExt;
use tracing::warn;

use super::super::mounts::{Mount, MountTable, pod_listen_address, resolve_program};
use super::super::pod_status::ContainerState;
use super::{AGENT_MARKER, Boot, POD_MARKER, PodCommand, PodWorker, ProbeTarget, waiting};
use crate::now_rfc3339;
use crate::supervise::{Child, Exit, SIGKILL, Spec};

impl PodWorker {
    pub(super) async fn boot(&mut self) -> Boot {
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
}
