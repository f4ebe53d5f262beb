"""Trainer-driven RolloutGroups on the local cluster: ``drive()`` runs an episode for every trajectory
Sandbox the controller launches (two strides here), posts its reward, and the operator records a
balanced group from those rewards (sync, async, and the mini-swe-agent example)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orchard_env import AsyncSandbox, AsyncSandboxClient, GroupResult, Sandbox, SandboxClient

from conftest import Cluster

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[3]


def index_of(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def scored(name: str) -> dict[str, Any]:
    """The trainer's result of trajectory ``name``: only the second stride (indices 5-7) succeeds, so
    the group needs both strides; lengths rank the members."""
    index = index_of(name)
    return {"reward": 1.0 if index >= 5 else 0.0, "length": 10 + index}


def check(result: GroupResult, group: str, ran: list[str]) -> None:
    assert result.complete, result.raw.get("status")
    assert result.selection == "Balanced"
    assert sorted(ran, key=index_of) == [f"{group}-{i}" for i in range(8)], "one episode per trajectory, both strides"
    assert result.positives == 2
    assert {m.name: m.reward for m in result.group} == {
        f"{group}-5": 1.0, f"{group}-6": 1.0, f"{group}-0": 0.0, f"{group}-1": 0.0}
    for trajectory in result.trajectories:
        assert trajectory.status == "completed" and trajectory.reward == scored(trajectory.name)["reward"]
        assert trajectory.stride == index_of(trajectory.name) // 4


def test_drive_records_the_trainers_rewards_over_two_strides(client: SandboxClient, cluster: Cluster) -> None:
    ran: list[str] = []

    def episode(sandbox: Sandbox) -> dict[str, Any]:
        assert sandbox.exec(["echo", sandbox.name], check=True).stdout == f"{sandbox.name}\n"
        ran.append(sandbox.name)
        return scored(sandbox.name)

    # cleanup Keep: the trajectories' Sandboxes outlive the group's completion, so they can be searched for
    # the payload below (with Delete the operator may already have removed them: a 404 on the real node).
    with client.create_rollout_group(
        {"image": cluster.image}, group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.25, 0.75),
        cleanup="Keep",
    ) as group:
        result = group.drive(episode, concurrency=3, timeout=240)
        check(result, group.name, ran)
        recorded = client.get(f"{group.name}-5")["status"]["result"]
        assert recorded["reward"] == 1.0 and recorded["length"] == 15


async def test_async_drive_records_the_trainers_rewards_over_two_strides(
    aclient: AsyncSandboxClient, cluster: Cluster
) -> None:
    ran: list[str] = []

    async def episode(sandbox: AsyncSandbox) -> dict[str, Any]:
        assert (await sandbox.exec(["echo", sandbox.name], check=True)).stdout == f"{sandbox.name}\n"
        ran.append(sandbox.name)
        return scored(sandbox.name)

    async with await aclient.create_rollout_group(
        {"image": cluster.image}, group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.25, 0.75)
    ) as group:
        result = await group.drive(episode, concurrency=2, timeout=240)
        check(result, group.name, ran)


def test_drive_hands_back_payloads_matched_by_trajectory_and_never_stores_them(client: SandboxClient, cluster: Cluster) -> None:
    def episode(sandbox: Sandbox) -> tuple[dict[str, Any], dict[str, Any]]:
        said = sandbox.exec(["echo", sandbox.name], check=True).stdout.strip()
        return scored(sandbox.name), {"said": said, "marker": f"PAYLOAD-SECRET-{sandbox.name}"}

    # cleanup Keep: the trajectories' Sandboxes outlive the group's completion, so they can be searched for
    # the payload below (with Delete the operator may already have removed them: a 404 on the real node).
    with client.create_rollout_group(
        {"image": cluster.image}, group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.25, 0.75),
        cleanup="Keep",
    ) as group:
        result = group.drive(episode, concurrency=3, timeout=240)
        check(result, group.name, list(result.episodes))
        assert [p["said"] for p in result.payloads] == [m.name for m in result.group], "in group order, by trajectory"
        members = {m.name for m in result.group}
        assert {n for n, e in result.episodes.items() if e.in_group} == members
        assert all(e.payload["said"] == n and e.recorded and e.error is None for n, e in result.episodes.items())
        stored = json.dumps([group.get().raw, *(client.get(n) for n in result.episodes)])
        assert "PAYLOAD-SECRET" not in stored, "no payload in any status, annotation or label"


def load_example() -> ModuleType:
    if os.environ.get("CI") != "true":
        pytest.importorskip("minisweagent")
    path = ROOT / "examples" / "minisweagent_rollout.py"
    spec = importlib.util.spec_from_file_location("minisweagent_rollout", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_minisweagent_example_records_a_balanced_group(client: SandboxClient, cluster: Cluster) -> None:
    example = load_example()
    result = example.run(client, cluster.python_image, timeout=300)
    outcomes = {t.name.rsplit("-", 1)[1]: (t.status, t.reward) for t in result.trajectories}
    assert result.complete and result.selection == "Balanced", (result.message, outcomes)
    members = {m.name.rsplit("-", 1)[1]: m.reward for m in result.group}
    assert members == example.EXPECTED_GROUP
    assert outcomes == {
        str(i): ("completed", 1.0 if i in (0, 5) else 0.0) for i in range(8)
    }, "trajectory 2 passed its own rewritten test, yet the trainer's held-out test scores it 0"
