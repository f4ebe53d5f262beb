//! Trajectory Sandboxes of a RolloutGroup (pure): deterministic names `<group>-<index>` (index in
//! launch order), the template's labels and annotations plus the group and stride labels, a
//! controller owner reference to the group and the operator's seal for it, the queue label when the
//! group names a RolloutQueue, and the template's spec with the group's trajectory timeout applied to
//! `run`. A retried trajectory is the same Sandbox again under the same name, with its attempt label
//! and the resources its retry gives it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;

use crate::plumbing::launch_after::annotation_text;
use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::seal;
use orchard_api::{
    ATTEMPT_LABEL, LAUNCH_AFTER_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, PoolFallback,
    ROLLOUT_GROUP_LABEL, ROLLOUT_QUEUE_LABEL, RolloutGroup, STRIDE_LABEL, Sandbox,
    SandboxResources,
};

/// One trajectory to create.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// Its index (launch order).
    pub index: u32,
    /// Its stride.
    pub stride: u32,
    /// Its attempt (1 for a new trajectory).
    pub attempt: u32,
    /// Resources replacing the template's (a retry's escalated amounts); `None`: the template's.
    pub resources: Option<SandboxResources>,
    /// When its Pod may be created (the stride's launch jitter); `None`: at once.
    pub launch_after: Option<Timestamp>,
}

/// Name of trajectory `index` (0-based, launch order) of group `group`.
pub fn trajectory_name(group: &str, index: u32) -> String {
    format!("{group}-{index}")
}

/// Index of a trajectory from its name, if it is one of `group`'s.
pub fn trajectory_index(group: &str, name: &str) -> Option<u32> {
    name.strip_prefix(group)?.strip_prefix('-')?.parse().ok()
}

/// The attempt a trajectory Sandbox says it is (its label; 1 without one, as before retries).
pub fn attempt_of(sandbox: &Sandbox) -> u32 {
    sandbox
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ATTEMPT_LABEL))
        .and_then(|v| v.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// The Sandbox of `launch` (an attempt of a trajectory of a stride), sealed for `owner` under `key`.
/// Its `resources` replace the template's (a retry's escalated memory and CPU); such an attempt never
/// fits the members of the template's SandboxPool, so it starts its own Pod (`whenPoolEmpty:
/// ColdStart`) rather than wait for one. Its `launch_after` becomes the `orchard.dev/launch-after`
/// annotation.
pub fn desired_trajectory(
    group: &RolloutGroup,
    owner: &OwnerReference,
    launch: &Launch,
    key: &OperatorKey,
) -> Sandbox {
    let (index, stride, attempt) = (launch.index, launch.stride, launch.attempt);
    let resources = launch.resources.as_ref();
    let group_name = group.metadata.name.clone().unwrap_or_default();
    let template = &group.spec.template;
    let mut labels: BTreeMap<String, String> = template.metadata.labels.clone();
    labels.insert(ROLLOUT_GROUP_LABEL.to_string(), group_name.clone());
    labels.insert(STRIDE_LABEL.to_string(), stride.to_string());
    labels.insert(ATTEMPT_LABEL.to_string(), attempt.max(1).to_string());
    labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string());
    if let Some(queue) = group.spec.queue.as_ref().filter(|q| !q.is_empty()) {
        labels.insert(ROLLOUT_QUEUE_LABEL.to_string(), queue.clone());
    }
    let mut spec = template.spec.clone();
    if let (Some(run), Some(timeout)) = (spec.run.as_mut(), group.spec.trajectory_timeout_seconds) {
        run.timeout_seconds = timeout;
    }
    if let Some(resources) = resources {
        spec.resources = Some(resources.clone());
        if spec.pool.is_some() {
            spec.when_pool_empty = Some(PoolFallback::ColdStart);
        }
    }
    let mut sandbox = Sandbox {
        metadata: ObjectMeta {
            name: Some(trajectory_name(&group_name, index)),
            namespace: group.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: annotations(&template.metadata.annotations, launch),
            owner_references: Some(vec![owner.clone()]),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    };
    // Last: the seal replaces any the template's annotations carry.
    seal(&mut sandbox, key);
    sandbox
}

/// The template's annotations, and the start time of a jittered launch.
fn annotations(
    template: &BTreeMap<String, String>,
    launch: &Launch,
) -> Option<BTreeMap<String, String>> {
    let mut annotations = template.clone();
    if let Some(at) = launch.launch_after {
        annotations.insert(LAUNCH_AFTER_ANNOTATION.to_string(), annotation_text(at));
    }
    (!annotations.is_empty()).then_some(annotations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::{
        CleanupPolicy, EarlyStop, PositiveFraction, RolloutGroupSpec, RunSpec, SandboxSpec,
        SandboxTemplate, TemplateMetadata,
    };

    fn group() -> RolloutGroup {
        let mut g = RolloutGroup::new(
            "prompt-7",
            RolloutGroupSpec {
                launch_jitter_seconds: None,
                group_size: 8,
                max_trajectories: 16,
                stride: Some(4),
                positive_fraction: PositiveFraction::default(),
                early_stop: EarlyStop::StrideBoundary,
                filter: None,
                template: SandboxTemplate {
                    metadata: TemplateMetadata {
                        labels: BTreeMap::from([("task".into(), "swe".into())]),
                        annotations: BTreeMap::from([("note".into(), "x".into())]),
                    },
                    spec: SandboxSpec {
                        image: "python:3.11".into(),
                        run: Some(RunSpec {
                            command: vec!["/bin/run".into()],
                            timeout_seconds: 600,
                            result_path: "/tmp/r.json".into(),
                        }),
                        ..SandboxSpec::default()
                    },
                },
                trajectory_timeout_seconds: Some(90),
                cleanup: CleanupPolicy::Delete,
                queue: Some("batch".into()),
                retry: None,
                active_deadline_seconds: None,
            },
        );
        g.metadata.namespace = Some("rl".into());
        g
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "orchard.dev/v1alpha1".into(),
            kind: "RolloutGroup".into(),
            name: "prompt-7".into(),
            uid: "uid-g".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }
    }

    #[test]
    fn names_are_deterministic_and_parse_back() {
        assert_eq!(trajectory_name("prompt-7", 12), "prompt-7-12");
        assert_eq!(trajectory_index("prompt-7", "prompt-7-12"), Some(12));
        assert_eq!(trajectory_index("prompt-7", "prompt-70-1"), None);
        assert_eq!(trajectory_index("prompt", "prompt-7-12"), None);
    }

    #[test]
    fn trajectories_carry_group_labels_owner_and_timeout() {
        let key = crate::plumbing::mock_api::test_token_key();
        let sandbox = desired_trajectory(
            &group(),
            &owner(),
            &Launch {
                index: 5,
                stride: 1,
                attempt: 1,
                resources: None,
                launch_after: None,
            },
            &key,
        );
        assert_eq!(
            crate::plumbing::ownership::sealed(&sandbox, &key),
            Some("uid-g"),
            "sealed for the group"
        );
        assert_eq!(sandbox.metadata.name.as_deref(), Some("prompt-7-5"));
        assert_eq!(sandbox.metadata.namespace.as_deref(), Some("rl"));
        let labels = sandbox.metadata.labels.unwrap();
        assert_eq!(labels[ROLLOUT_GROUP_LABEL], "prompt-7");
        assert_eq!(labels[STRIDE_LABEL], "1");
        assert_eq!(labels[ATTEMPT_LABEL], "1");
        assert_eq!(labels["task"], "swe");
        assert_eq!(labels[ROLLOUT_QUEUE_LABEL], "batch");
        assert_eq!(sandbox.metadata.annotations.unwrap()["note"], "x");
        assert_eq!(sandbox.metadata.owner_references.unwrap(), vec![owner()]);
        assert_eq!(
            sandbox.spec.run.unwrap().timeout_seconds,
            90,
            "trajectoryTimeoutSeconds wins"
        );
        assert_eq!(sandbox.spec.image, "python:3.11");
        assert_eq!(sandbox.spec.resources, None, "the template's");
    }

    #[test]
    fn a_retry_is_the_same_trajectory_with_its_attempt_and_resources() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let key = crate::plumbing::mock_api::test_token_key();
        let grown = SandboxResources {
            memory: Some(Quantity("128Mi".into())),
            ..SandboxResources::default()
        };
        let sandbox = desired_trajectory(
            &group(),
            &owner(),
            &Launch {
                index: 5,
                stride: 1,
                attempt: 2,
                resources: Some(grown.clone()),
                launch_after: None,
            },
            &key,
        );
        assert_eq!(
            sandbox.metadata.name.as_deref(),
            Some("prompt-7-5"),
            "the same name"
        );
        assert_eq!(attempt_of(&sandbox), 2);
        assert_eq!(
            sandbox.metadata.labels.as_ref().unwrap()[ATTEMPT_LABEL],
            "2"
        );
        assert_eq!(sandbox.spec.resources, Some(grown.clone()));
        assert_eq!(sandbox.spec.when_pool_empty, None, "no pool, no fallback");
        assert_eq!(
            crate::plumbing::ownership::sealed(&sandbox, &key),
            Some("uid-g"),
            "sealed for the group"
        );

        let mut pooled = group();
        pooled.spec.template.spec.pool = Some("warm".into());
        pooled.spec.template.spec.when_pool_empty = Some(PoolFallback::Wait);
        let first = desired_trajectory(
            &pooled,
            &owner(),
            &Launch {
                index: 5,
                stride: 1,
                attempt: 1,
                resources: None,
                launch_after: None,
            },
            &key,
        );
        assert_eq!(first.spec.when_pool_empty, Some(PoolFallback::Wait));
        let escalated = desired_trajectory(
            &pooled,
            &owner(),
            &Launch {
                index: 5,
                stride: 1,
                attempt: 2,
                resources: Some(grown.clone()),
                launch_after: None,
            },
            &key,
        );
        assert_eq!(
            escalated.spec.when_pool_empty,
            Some(PoolFallback::ColdStart),
            "no member fits the escalated resources: it starts its own Pod"
        );

        let mut unlabelled = first;
        unlabelled.metadata.labels = None;
        assert_eq!(attempt_of(&unlabelled), 1, "made before retries: attempt 1");
    }
}
