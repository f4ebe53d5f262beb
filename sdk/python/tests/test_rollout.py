"""A RolloutGroup end to end through the SDK: each trajectory's runner writes a result; the operator
runs BAR and records a group of exactly N members with rewards and artifacts (local cluster)."""

from __future__ import annotations

from orchard_env import SandboxClient

from conftest import Cluster

# Trajectory i (the suffix of its sandbox name) gets reward i % 2, length 10 + i, an artifact pointer.
RUNNER = (
    "i=${ORCHARD_SANDBOX##*-}\n"
    "printf '{\"reward\": %d, \"status\": \"completed\", \"length\": %d, \"artifact\": \"mem://%s\"}' "
    "$(( i % 2 )) $(( 10 + i )) \"$ORCHARD_SANDBOX\" > result.json\n"
)


def test_rollout_group_returns_a_balanced_group(client: SandboxClient, cluster: Cluster) -> None:
    template = {
        "image": cluster.image,
        "run": {"command": ["/bin/sh", "-c", RUNNER], "timeoutSeconds": 60, "resultPath": "result.json"},
    }
    with client.create_rollout_group(
        template, group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.25, 0.75), filter=False
    ) as group:
        result = group.wait(timeout=240)
        assert result.complete, result.raw.get("status")
        assert result.selection in ("Balanced", "Relaxed", "TopRanked")
        assert len(result.group) == 4
        assert sorted(result.rewards) == [0.0, 0.0, 1.0, 1.0]
        assert result.positives == 2
        assert all(a and a.startswith("mem://") for a in result.artifacts)
        assert all(m.status == "completed" and m.length >= 10 for m in result.group)
        assert len(result.trajectories) >= 4
        listed = [g.name for g in client.list_rollout_groups()]
        assert group.name in listed
