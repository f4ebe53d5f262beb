//! Trajectory Sandboxes of a RolloutGroup (pure): deterministic names `<group>-<index>` (index in
//! launch order), the template's labels and annotations plus the group and stride labels, a
//! controller owner reference to the group and the operator's seal for it, the queue label when the
//! group names a RolloutQueue, and the template's spec with the group's trajectory timeout applied to
//! `run`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::seal;
use orchard_api::{
    MANAGED_BY, MANAGED_BY_LABEL, ROLLOUT_GROUP_LABEL, ROLLOUT_QUEUE_LABEL, RolloutGroup,
    STRIDE_LABEL, Sandbox,
};

/// Name of trajectory `index` (0-based, launch order) of group `group`.
pub fn trajectory_name(group: &str, index: u32) -> String {
    format!("{group}-{index}")
}

/// Index of a trajectory from its name, if it is one of `group`'s.
pub fn trajectory_index(group: &str, name: &str) -> Option<u32> {
    name.strip_prefix(group)?.strip_prefix('-')?.parse().ok()
}

/// The Sandbox of trajectory `index` in stride `stride`, sealed for `owner` under `key`.
pub fn desired_trajectory(
    group: &RolloutGroup,
    owner: &OwnerReference,
    index: u32,
    stride: u32,
    key: &OperatorKey,
) -> Sandbox {
    let group_name = group.metadata.name.clone().unwrap_or_default();
    let template = &group.spec.template;
    let mut labels: BTreeMap<String, String> = template.metadata.labels.clone();
    labels.insert(ROLLOUT_GROUP_LABEL.to_string(), group_name.clone());
    labels.insert(STRIDE_LABEL.to_string(), stride.to_string());
    labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string());
    if let Some(queue) = group.spec.queue.as_ref().filter(|q| !q.is_empty()) {
        labels.insert(ROLLOUT_QUEUE_LABEL.to_string(), queue.clone());
    }
    let mut spec = template.spec.clone();
    if let (Some(run), Some(timeout)) = (spec.run.as_mut(), group.spec.trajectory_timeout_seconds) {
        run.timeout_seconds = timeout;
    }
    let mut sandbox = Sandbox {
        metadata: ObjectMeta {
            name: Some(trajectory_name(&group_name, index)),
            namespace: group.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: (!template.metadata.annotations.is_empty())
                .then(|| template.metadata.annotations.clone()),
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
        let sandbox = desired_trajectory(&group(), &owner(), 5, 1, &key);
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
    }
}
