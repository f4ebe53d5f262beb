//! The committer Pod of a SandboxSnapshot (pure): a short-lived Pod on the sandbox's node, in the
//! operator's snapshot namespace, holding that node's containerd socket. Its script finds the
//! sandbox's task container by its pod UID and container name, pauses it (cgroup freezer), has
//! containerd write the diff of its root filesystem against the image's layers, resumes it (always),
//! keeps only `spec.paths` if given, appends the layer to the sandbox's image with crane and pushes
//! the result; it reports through its termination message ([`parse_result`]).
//! docs/SNAPSHOTS.md says what the Pod may do and why that is acceptable.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, HostPathVolumeSource, Pod,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecretVolumeSource,
    SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::pod::disruption::lost_node_tolerations;
use crate::pod::naming::TASK_CONTAINER;
use orchard_api::{
    MANAGED_BY, MANAGED_BY_LABEL, SNAPSHOT_ANNOTATION, SNAPSHOT_UID_LABEL, SandboxSnapshot,
};

/// Label value of `app.kubernetes.io/component` on committer Pods; the operator watches them by it.
pub const COMPONENT: &str = "snapshot-committer";

/// The name of the committer's container.
pub const CONTAINER: &str = "commit";

/// Where the node's containerd socket is mounted in the committer (whatever its path on the node).
pub const SOCKET_IN_POD: &str = "/run/containerd/containerd.sock";

/// How the operator commits snapshots (flags `--snapshot-*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitterSettings {
    /// Repository prefix snapshots are pushed under (`registry.example.com/orchard-snapshots`);
    /// `None`: snapshots are off and every SandboxSnapshot fails with `SnapshotsDisabled`.
    pub registry: Option<String>,
    /// Namespace the committer Pods run in (Pod Security `privileged`; nobody else creates pods
    /// there).
    pub namespace: String,
    /// Image holding `/bin/sh` (busybox), `ctr`, `crane` and `orchard-layer-filter`.
    pub image: String,
    /// Path of containerd's socket on the nodes.
    pub containerd_socket: String,
    /// Push over plain HTTP (crane `--insecure`).
    pub insecure_registry: bool,
    /// Secret (type `kubernetes.io/dockerconfigjson`, in [`Self::namespace`]) with the push
    /// credentials; `None`: anonymous (or a registry that needs none).
    pub registry_secret: Option<String>,
    /// Longest a committer Pod may run (its `activeDeadlineSeconds`), and how long the operator waits
    /// for it to finish at all.
    pub timeout_seconds: i64,
    /// Longest the sandbox's processes stay paused: the diff is stopped after this (and the
    /// snapshot fails) rather than keep them frozen.
    pub pause_limit_seconds: i64,
    /// How long the committer tolerates its node's unreachable/not-ready taints.
    pub node_lost_seconds: Option<i64>,
}

/// What one commit acts on, as the operator chose it from the Sandbox and its Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitTarget {
    /// The node the sandbox's Pod runs on.
    pub node_name: String,
    /// The UID of the sandbox's Pod: the only pod whose container the committer touches.
    pub pod_uid: String,
    /// The task container's ID as the Pod's status gives it (without `containerd://`).
    pub container_id: String,
    /// The image the task container runs (a digest-pinned reference when the runtime gave one).
    pub base_image: String,
    /// Where the snapshot image is pushed (a tag; the result is reported by digest).
    pub target: String,
    /// The most bytes the layer may have under the namespace's snapshot size quota, and that
    /// quota's name (`None`: no quota applies). A bigger layer is not pushed.
    pub room: Option<(u64, String)>,
}

/// The committer's shell script (busybox `sh`). Its environment: `POD_UID`, `CONTAINER`,
/// `CONTAINER_ID`, `BASE_IMAGE`, `TARGET`, `KEEP_PATHS` (newline-separated, may be empty),
/// `PAUSE_LIMIT_SECONDS`, `INSECURE` (`1` or empty), `MAX_LAYER_BYTES` and `QUOTA` (the room left
/// under the namespace's snapshot size quota and that ResourceQuota's name; empty: no quota), and `CONTAINERD_ADDRESS` and
/// `CONTAINERD_NAMESPACE` for `ctr`. It writes `key=value` lines to its termination message
/// ([`parse_result`]).
pub const SCRIPT: &str = r#"set -u
W=/work
RESULT=/dev/termination-log
paused=0
id=
kept=
fail() {
  msg=$(printf '%s' "$2" | tr '\n\r\t' '   ' | cut -c1-3000)
  printf 'result=failed\nreason=%s\nmessage=%s\n' "$1" "$msg" > "$RESULT"
  echo "orchard-commit: $1: $msg" >&2
  exit 1
}
resume() {
  if [ "$paused" = 1 ]; then
    paused=0
    ctr tasks resume "$id" >&2 || echo "orchard-commit: cannot resume $id" >&2
  fi
}
# The layer is kept in containerd's content store (a GC root) only until it is copied out.
release() {
  if [ -n "$kept" ]; then
    ctr content label "$kept" containerd.io/gc.root= orchard.dev/commit= > /dev/null 2>&1 || true
    kept=
  fi
}
trap 'resume; release' EXIT
trap 'resume; release; fail CommitFailed "stopped while committing (the committer pod was deleted or timed out)"' TERM INT HUP
uptime_ms() { awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime; }

ids=$(ctr containers ls -q "labels.\"io.kubernetes.pod.uid\"==\"$POD_UID\",labels.\"io.kubernetes.container.name\"==\"$CONTAINER\"" 2>"$W/err") ||
  fail CommitFailed "cannot list the node's containers through containerd ($CONTAINERD_ADDRESS): $(cat "$W/err")"
count=$(printf '%s\n' "$ids" | grep -c .)
[ "$count" = 1 ] || fail SandboxNotReady "found $count containers named $CONTAINER of pod $POD_UID on this node (one was expected: was the pod replaced?)"
id=$ids
[ -z "$CONTAINER_ID" ] || [ "$id" = "$CONTAINER_ID" ] ||
  fail SandboxNotReady "the task container of pod $POD_UID is $id, not $CONTAINER_ID as its pod status said (restarted?)"
state=$(ctr tasks ls 2>"$W/err" | awk -v id="$id" '$1 == id { print $3 }')
[ "$state" = RUNNING ] || fail SandboxNotReady "the task container $id is ${state:-not running}, not RUNNING"
ctr containers info "$id" > "$W/info" 2>"$W/err" || fail CommitFailed "cannot read container $id: $(cat "$W/err")"
snapshotter=$(sed -n 's/^ *"Snapshotter": "\([^"]*\)".*/\1/p' "$W/info" | head -n 1)
key=$(sed -n 's/^ *"SnapshotKey": "\([^"]*\)".*/\1/p' "$W/info" | head -n 1)
[ -n "$snapshotter" ] && [ -n "$key" ] || fail CommitFailed "container $id names no snapshotter or root filesystem snapshot"

# Frozen from here until resume: the layer is the filesystem as of one instant. containerd writes it
# into its content store (kept there under a label of this attempt); it is copied out after resume.
start=$(uptime_ms)
mark="$POD_UID-$start"
ctr tasks pause "$id" 2>"$W/err" || fail CommitFailed "cannot pause container $id: $(cat "$W/err")"
paused=1
timeout "$PAUSE_LIMIT_SECONDS" ctr snapshots --snapshotter "$snapshotter" diff --keep \
  --label "orchard.dev/commit=$mark" --media-type application/vnd.oci.image.layer.v1.tar "$key" \
  > /dev/null 2>"$W/err"
rc=$?
resume
end=$(uptime_ms)
kept=$(ctr content ls -q "labels.\"orchard.dev/commit\"==\"$mark\"" 2>/dev/null | head -n 1)
[ "$rc" = 0 ] || fail CommitFailed "reading the changes of container $id failed (exit $rc; more than ${PAUSE_LIMIT_SECONDS}s paused is refused): $(cat "$W/err")"
[ -n "$kept" ] || fail CommitFailed "containerd kept no layer for container $id"
ctr content get "$kept" > "$W/layer.tar" 2>"$W/err" || fail CommitFailed "cannot read the layer $kept: $(cat "$W/err")"
release

layer="$W/layer.tar"
if [ -n "$KEEP_PATHS" ]; then
  printf '%s\n' "$KEEP_PATHS" > "$W/keep"
  orchard-layer-filter "$W/keep" < "$W/layer.tar" > "$W/kept.tar" 2>"$W/err" ||
    fail CommitFailed "keeping spec.paths of the layer failed: $(cat "$W/err")"
  layer="$W/kept.tar"
fi
size=$(wc -c < "$layer" | tr -d ' ')
if [ -n "$MAX_LAYER_BYTES" ] && awk -v s="$size" -v m="$MAX_LAYER_BYTES" 'BEGIN { exit !(s > m) }'; then
  fail QuotaExceeded "the committed layer is $size bytes, more than the $MAX_LAYER_BYTES bytes the namespace's snapshots have left under ResourceQuota $QUOTA (orchard.dev/snapshot-bytes); nothing was pushed: delete snapshots, or keep less with spec.paths"
fi

insecure=
[ "$INSECURE" = 1 ] && insecure=--insecure
digest=$(crane append $insecure --set-base-image-annotations --base="$BASE_IMAGE" --new_layer="$layer" \
  --new_tag="$TARGET" 2>"$W/err") ||
  fail PushRefused "pushing $TARGET (base $BASE_IMAGE) failed: $(tail -c 2000 "$W/err")"
case "$digest" in
  *@sha256:*) ;;
  *) fail PushRefused "crane pushed $TARGET but printed no digest: $digest $(tail -c 500 "$W/err")" ;;
esac
printf 'result=ok\nimage=%s\nsize=%s\npausedMs=%s\n' "$digest" "$size" "$((end - start))" > "$RESULT"
echo "orchard-commit: pushed $digest ($size bytes, paused $((end - start)) ms)"
"#;

/// The name of the committer Pod of the snapshot with `uid`: one per snapshot incarnation.
pub fn committer_name(snapshot_uid: &str) -> String {
    format!("commit-{snapshot_uid}")
}

/// Where the snapshot `namespace/name` (UID `uid`) is pushed under `registry` (a repository
/// prefix): one repository per snapshot name, tagged with the UID, so a snapshot recreated under
/// the same name never overwrites its predecessor's tag (pure).
pub fn target_reference(registry: &str, namespace: &str, name: &str, uid: &str) -> String {
    format!(
        "{}/{namespace}/{name}:{uid}",
        registry.trim_end_matches('/')
    )
}

/// The task container's ID from a Pod status' `containerID` (`containerd://<id>`; pure).
pub fn container_id(status_id: &str) -> String {
    status_id
        .split_once("://")
        .map_or(status_id, |(_, id)| id)
        .to_string()
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// The committer Pod for `snapshot` acting on `target` (pure). Root only to reach the socket
/// (every capability dropped, read-only root filesystem, no privilege escalation); the host's
/// network, so it reaches the registry the node pulls from; the socket is its one host path.
pub fn committer_pod(
    snapshot: &SandboxSnapshot,
    target: &CommitTarget,
    settings: &CommitterSettings,
) -> Pod {
    let uid = snapshot.metadata.uid.clone().unwrap_or_default();
    let namespace = snapshot.metadata.namespace.clone().unwrap_or_default();
    let name = snapshot.metadata.name.clone().unwrap_or_default();
    let labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        (
            "app.kubernetes.io/component".to_string(),
            COMPONENT.to_string(),
        ),
        (SNAPSHOT_UID_LABEL.to_string(), uid.clone()),
    ]);
    let annotations = BTreeMap::from([(
        SNAPSHOT_ANNOTATION.to_string(),
        format!("{namespace}/{name}"),
    )]);
    let mut mounts = vec![
        VolumeMount {
            name: "containerd".into(),
            mount_path: SOCKET_IN_POD.into(),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: "work".into(),
            mount_path: "/work".into(),
            ..VolumeMount::default()
        },
    ];
    let mut volumes = vec![
        Volume {
            name: "containerd".into(),
            host_path: Some(HostPathVolumeSource {
                path: settings.containerd_socket.clone(),
                type_: Some("Socket".into()),
            }),
            ..Volume::default()
        },
        Volume {
            name: "work".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    ];
    let mut env = vec![
        env("POD_UID", target.pod_uid.clone()),
        env("CONTAINER", TASK_CONTAINER),
        env("CONTAINER_ID", target.container_id.clone()),
        env("BASE_IMAGE", target.base_image.clone()),
        env("TARGET", target.target.clone()),
        env("KEEP_PATHS", snapshot.spec.paths.join("\n")),
        env(
            "MAX_LAYER_BYTES",
            target
                .room
                .as_ref()
                .map_or(String::new(), |(bytes, _)| bytes.to_string()),
        ),
        env(
            "QUOTA",
            target
                .room
                .as_ref()
                .map_or(String::new(), |(_, quota)| quota.clone()),
        ),
        env(
            "PAUSE_LIMIT_SECONDS",
            settings.pause_limit_seconds.to_string(),
        ),
        env(
            "INSECURE",
            if settings.insecure_registry { "1" } else { "" },
        ),
        env("CONTAINERD_ADDRESS", SOCKET_IN_POD),
        env("CONTAINERD_NAMESPACE", "k8s.io"),
        env("HOME", "/work"),
    ];
    if let Some(secret) = &settings.registry_secret {
        mounts.push(VolumeMount {
            name: "registry-auth".into(),
            mount_path: "/registry-auth".into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        volumes.push(Volume {
            name: "registry-auth".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                items: Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                    key: ".dockerconfigjson".into(),
                    path: "config.json".into(),
                    mode: None,
                }]),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        env.push(self::env("DOCKER_CONFIG", "/registry-auth"));
    }
    let amounts = |cpu: &str, memory: &str| {
        Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ]))
    };
    let mut tolerations: Vec<Toleration> = lost_node_tolerations(settings.node_lost_seconds, &[]);
    // It must run on the sandbox's node whatever that node's other taints: it was placed there by
    // the sandbox already, and it leaves within its deadline.
    tolerations.push(Toleration {
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    });
    Pod {
        metadata: ObjectMeta {
            name: Some(committer_name(&uid)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(target.node_name.clone()),
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(settings.timeout_seconds),
            // Enough for the script's TERM trap to resume a paused sandbox.
            termination_grace_period_seconds: Some(30),
            host_network: Some(true),
            // The node's resolver: the registry is reached by the name the node pulls it by.
            dns_policy: Some("Default".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            tolerations: Some(tolerations),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(0),
                run_as_group: Some(0),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            containers: vec![Container {
                name: CONTAINER.into(),
                image: Some(settings.image.clone()),
                image_pull_policy: Some("IfNotPresent".into()),
                command: Some(vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()]),
                env: Some(env),
                volume_mounts: Some(mounts),
                termination_message_policy: Some("File".into()),
                resources: Some(ResourceRequirements {
                    requests: amounts("10m", "64Mi"),
                    limits: amounts("1", "512Mi"),
                    ..ResourceRequirements::default()
                }),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    privileged: Some(false),
                    read_only_root_filesystem: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Capabilities::default()
                    }),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// What a committer reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitResult {
    /// Pushed.
    Pushed {
        /// `registry/repository@sha256:...`.
        image: String,
        /// Bytes of the layer, uncompressed.
        size_bytes: Option<i64>,
        /// How long the sandbox was paused.
        paused_milliseconds: Option<i64>,
    },
    /// Not pushed: reason and the script's message.
    Failed {
        /// CamelCase reason (`PushRefused`, `CommitFailed`, `SandboxNotReady`).
        reason: String,
        /// Detail.
        message: String,
    },
}

/// The reasons a committer may report; anything else is read as `CommitFailed`.
const REPORTED_REASONS: &[&str] = &[
    "PushRefused",
    "CommitFailed",
    "SandboxNotReady",
    "QuotaExceeded",
];

/// Reads a committer's termination message (`key=value` lines; pure); `None` when it holds no
/// result (the script never got to write one).
pub fn parse_result(message: &str) -> Option<CommitResult> {
    let mut fields = BTreeMap::new();
    for line in message.lines() {
        if let Some((key, value)) = line.split_once('=') {
            fields.insert(key.trim(), value.trim());
        }
    }
    match fields.get("result").copied()? {
        "ok" => {
            let image = fields.get("image").copied().unwrap_or_default();
            if !image.contains("@sha256:") {
                return Some(CommitResult::Failed {
                    reason: "CommitFailed".into(),
                    message: format!("the committer reported no digest-pinned image: `{image}`"),
                });
            }
            Some(CommitResult::Pushed {
                image: image.to_string(),
                size_bytes: fields.get("size").and_then(|s| s.parse().ok()),
                paused_milliseconds: fields.get("pausedMs").and_then(|s| s.parse().ok()),
            })
        }
        _ => {
            let reason = fields.get("reason").copied().unwrap_or_default();
            let reason = if REPORTED_REASONS.contains(&reason) {
                reason
            } else {
                "CommitFailed"
            };
            Some(CommitResult::Failed {
                reason: reason.to_string(),
                message: fields
                    .get("message")
                    .copied()
                    .unwrap_or("the committer failed without a message")
                    .to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> CommitterSettings {
        CommitterSettings {
            registry: Some("registry.test/snaps".into()),
            namespace: "orchard-snapshots".into(),
            image: "committer:1".into(),
            containerd_socket: "/var/run/k3s/containerd/containerd.sock".into(),
            insecure_registry: false,
            registry_secret: None,
            timeout_seconds: 600,
            pause_limit_seconds: 120,
            node_lost_seconds: Some(30),
        }
    }

    fn snapshot(paths: &[&str]) -> SandboxSnapshot {
        let mut snapshot = SandboxSnapshot::new(
            "prepared",
            orchard_api::SandboxSnapshotSpec {
                sandbox: "prep".into(),
                paths: paths.iter().map(|p| p.to_string()).collect(),
                ttl_seconds_after_unused: None,
            },
        );
        snapshot.metadata.namespace = Some("team".into());
        snapshot.metadata.uid = Some("u-1".into());
        snapshot
    }

    fn target() -> CommitTarget {
        CommitTarget {
            node_name: "node-a".into(),
            pod_uid: "pod-uid".into(),
            container_id: "abc".into(),
            base_image: "localhost:5000/py@sha256:00".into(),
            target: target_reference("registry.test/snaps/", "team", "prepared", "u-1"),
            room: None,
        }
    }

    fn env_of(pod: &Pod) -> BTreeMap<String, String> {
        pod.spec.as_ref().unwrap().containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn the_committer_runs_on_the_sandboxs_node_with_only_the_socket_of_the_host() {
        let pod = committer_pod(&snapshot(&[]), &target(), &settings());
        assert_eq!(pod.metadata.name.as_deref(), Some("commit-u-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("orchard-snapshots"));
        assert_eq!(
            pod.metadata.labels.as_ref().unwrap()[SNAPSHOT_UID_LABEL],
            "u-1"
        );
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[SNAPSHOT_ANNOTATION],
            "team/prepared"
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.host_network, Some(true));
        assert_eq!(
            spec.dns_policy.as_deref(),
            Some("Default"),
            "the node's resolver: the registry's name as the node pulls it"
        );
        assert_eq!(spec.host_pid, None);
        assert_eq!(spec.active_deadline_seconds, Some(600));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let host_paths: Vec<_> = spec
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.host_path.as_ref())
            .collect();
        assert_eq!(host_paths.len(), 1, "the socket is the one host path");
        assert_eq!(
            host_paths[0].path,
            "/var/run/k3s/containerd/containerd.sock"
        );
        assert_eq!(host_paths[0].type_.as_deref(), Some("Socket"));
        let container = &spec.containers[0];
        let security = container.security_context.as_ref().unwrap();
        assert_eq!(security.privileged, Some(false));
        assert_eq!(security.allow_privilege_escalation, Some(false));
        assert_eq!(security.read_only_root_filesystem, Some(true));
        assert_eq!(
            security.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
        let env = env_of(&pod);
        assert_eq!(env["POD_UID"], "pod-uid");
        assert_eq!(env["CONTAINER"], TASK_CONTAINER);
        assert_eq!(env["TARGET"], "registry.test/snaps/team/prepared:u-1");
        assert_eq!(env["KEEP_PATHS"], "");
        assert_eq!(env["MAX_LAYER_BYTES"], "", "no size quota");
        assert_eq!(env["CONTAINERD_ADDRESS"], SOCKET_IN_POD);
        assert_eq!(env["CONTAINERD_NAMESPACE"], "k8s.io");
        assert!(!env.contains_key("DOCKER_CONFIG"));
    }

    #[test]
    fn paths_and_credentials_reach_the_script() {
        let mut settings = settings();
        settings.registry_secret = Some("push-creds".into());
        settings.insecure_registry = true;
        let pod = committer_pod(&snapshot(&["/work", "/usr/local"]), &target(), &settings);
        let env = env_of(&pod);
        assert_eq!(env["KEEP_PATHS"], "/work\n/usr/local");
        assert_eq!(env["INSECURE"], "1");
        assert_eq!(env["DOCKER_CONFIG"], "/registry-auth");
        let secret = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap()[2]
            .secret
            .clone()
            .unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("push-creds"));
    }

    #[test]
    fn the_room_under_the_size_quota_reaches_the_script_which_checks_it_before_the_push() {
        let target = CommitTarget {
            room: Some((4096, "snapshots".into())),
            ..target()
        };
        let env = env_of(&committer_pod(&snapshot(&[]), &target, &settings()));
        assert_eq!(env["MAX_LAYER_BYTES"], "4096");
        assert_eq!(env["QUOTA"], "snapshots");
        let check = SCRIPT.find("fail QuotaExceeded").unwrap();
        let size = SCRIPT.find("size=$(wc -c < \"$layer\"").unwrap();
        let push = SCRIPT.find("crane append").unwrap();
        assert!(
            size < check && check < push,
            "the layer's final size is checked, then pushed"
        );
        assert_eq!(
            parse_result("result=failed\nreason=QuotaExceeded\nmessage=too big\n"),
            Some(CommitResult::Failed {
                reason: "QuotaExceeded".into(),
                message: "too big".into(),
            })
        );
    }

    #[test]
    fn the_script_always_resumes_what_it_paused() {
        assert!(SCRIPT.contains("trap 'resume; release' EXIT"));
        let pause = SCRIPT.find("tasks pause").unwrap();
        let resume = SCRIPT[pause..].find("\nresume\n").unwrap() + pause;
        let push = SCRIPT.find("crane append").unwrap();
        assert!(
            SCRIPT.contains("--base=\"$BASE_IMAGE\""),
            "an image name is never read as a flag"
        );
        assert!(resume < push, "the sandbox runs again before the push");
        assert!(SCRIPT.contains("timeout \"$PAUSE_LIMIT_SECONDS\""));
    }

    #[test]
    fn container_ids_lose_their_runtime_prefix() {
        assert_eq!(container_id("containerd://abc123"), "abc123");
        assert_eq!(container_id("abc123"), "abc123");
    }

    #[test]
    fn results_are_read_from_the_termination_message() {
        assert_eq!(
            parse_result("result=ok\nimage=r/x@sha256:ab\nsize=42\npausedMs=7\n"),
            Some(CommitResult::Pushed {
                image: "r/x@sha256:ab".into(),
                size_bytes: Some(42),
                paused_milliseconds: Some(7),
            })
        );
        assert_eq!(
            parse_result("result=failed\nreason=PushRefused\nmessage=dial tcp: refused = no\n"),
            Some(CommitResult::Failed {
                reason: "PushRefused".into(),
                message: "dial tcp: refused = no".into(),
            })
        );
        assert_eq!(
            parse_result("result=failed\nreason=Whatever\n"),
            Some(CommitResult::Failed {
                reason: "CommitFailed".into(),
                message: "the committer failed without a message".into(),
            }),
            "a reason the operator does not know is not passed on"
        );
        assert!(matches!(
            parse_result("result=ok\nimage=r/x:tag\n"),
            Some(CommitResult::Failed { .. })
        ));
        assert_eq!(parse_result(""), None);
        assert_eq!(parse_result("panic: something"), None);
    }
}
