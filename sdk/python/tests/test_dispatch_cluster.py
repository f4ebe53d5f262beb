"""The dispatchers on the local cluster: many run-based RolloutGroups with a bound on groups in flight
(``max_in_flight``), and with a RolloutQueue bounding the trajectory sandboxes of all groups."""

from __future__ import annotations

import asyncio
import ssl
import threading
import uuid
from typing import Any

import httpx
import pytest

from orchard_env import AsyncDispatcher, AsyncSandboxClient, Dispatcher, GroupRequest, GroupResult, SandboxClient

from conftest import Cluster

pytestmark = pytest.mark.cluster

# Trajectory i (the suffix of its sandbox name) gets reward i % 2: a stride of 2 is one positive and one
# negative, so every group is recorded Balanced from its first stride.
RUNNER = (
    "i=${ORCHARD_SANDBOX##*-}\n"
    "printf '{\"reward\": %d, \"status\": \"completed\", \"length\": %d}' $(( i % 2 )) $(( 10 + i )) > result.json\n"
)
RUN_LABEL = "orchard-test-dispatch"


def template(cluster: Cluster, run: str, sleep: int = 0) -> dict[str, Any]:
    """A run-based template whose trajectory sandboxes carry the test run's label; each trajectory
    first sleeps ``sleep`` seconds (so a sampler polling every 0.2 s cannot miss it)."""
    runner = f"sleep {sleep}\n{RUNNER}" if sleep else RUNNER
    return {
        "metadata": {"labels": {RUN_LABEL: run}},
        "spec": {
            "image": cluster.image,
            "run": {"command": ["/bin/sh", "-c", runner], "timeoutSeconds": 60, "resultPath": "result.json"},
        },
    }


def request(cluster: Cluster, run: str, index: int, sleep: int = 0, **fields: Any) -> GroupRequest:
    return GroupRequest(
        template(cluster, run, sleep), key=index, generate_name=f"dispatch-{index}-", labels={RUN_LABEL: run},
        group_size=2, max_trajectories=4, stride=2, positive_fraction=(0.5, 0.5), filter=False, **fields,
    )


def existing(groups: list[GroupResult]) -> list[GroupResult]:
    """The groups not being deleted."""
    return [g for g in groups if not (g.raw.get("metadata") or {}).get("deletionTimestamp")]


def check_recorded(results: list[Any], count: int) -> None:
    assert sorted(r.key for r in results) == list(range(count))
    for done in results:
        assert done.ok, (done.error, done.result and done.result.raw.get("status"))
        assert done.result.selection == "Balanced"
        assert sorted(done.result.rewards) == [0.0, 1.0]


def test_dispatcher_runs_six_groups_at_most_three_at_a_time(client: SandboxClient, cluster: Cluster) -> None:
    run = uuid.uuid4().hex[:12]
    selector = f"{RUN_LABEL}={run}"
    peak = [0]
    errors: list[Exception] = []
    stop = threading.Event()

    def sample() -> None:
        try:
            while not stop.wait(0.2):
                peak[0] = max(peak[0], len(existing(client.list_rollout_groups(label_selector=selector))))
        except Exception as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results = []
    try:
        with Dispatcher(client, max_in_flight=3, timeout=240, progress=False) as dispatcher:
            for done in dispatcher.run(request(cluster, run, i) for i in range(6)):
                listed = existing(client.list_rollout_groups(label_selector=selector))
                assert len(listed) <= 3, [g.name for g in listed]
                peak[0] = max(peak[0], len(listed))
                results.append(done)
    finally:
        stop.set()
        sampler.join(timeout=30)
    assert not errors, errors
    check_recorded(results, 6)
    assert dispatcher.stats.peak_in_flight == 3
    assert (dispatcher.stats.completed, dispatcher.stats.failed) == (6, 0)
    assert 1 <= peak[0] <= 3, "no more than max_in_flight groups existed at once"
    assert existing(client.list_rollout_groups(label_selector=selector)) == [], "yielded groups are deleted"


async def test_async_dispatcher_with_a_rollout_queue(aclient: AsyncSandboxClient, cluster: Cluster) -> None:
    """Four groups in flight at once, but their queue admits 2 trajectory sandboxes (one stride) at a
    time: the others wait ``Queued`` with a position."""
    run = uuid.uuid4().hex[:12]
    queue = f"dispatch-{run}"
    kube = httpx.AsyncClient(
        base_url=cluster.kube_server, verify=ssl.create_default_context(cafile=cluster.kube_ca),
        headers={"Authorization": f"Bearer {cluster.token}"}, timeout=30.0,
    )
    path = f"/apis/orchard.dev/v1alpha1/namespaces/{cluster.namespace}/rolloutqueues"
    async with kube:
        created = await kube.post(path, json={
            "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutQueue", "metadata": {"name": queue},
            "spec": {"maxRunningTrajectories": 2, "admission": "FIFO"},
        })
        assert created.status_code != 403, "the test user may not create RolloutQueues (testcluster/src/test_support/sdk.rs grants it)"
        assert created.status_code != 404, "the RolloutQueue CRD is not installed"
        created.raise_for_status()
        peak_sandboxes = [0]
        queued: list[GroupResult] = []

        async def sample() -> None:
            while True:
                sandboxes = await aclient.list(label_selector=f"orchard.dev/rollout-queue={queue}")
                peak_sandboxes[0] = max(peak_sandboxes[0], len(sandboxes))
                groups = await aclient.list_rollout_groups(label_selector=f"{RUN_LABEL}={run}")
                queued.extend(g for g in groups if g.queued)
                await asyncio.sleep(0.2)

        sampler = asyncio.create_task(sample())
        try:
            async with AsyncDispatcher(aclient, max_in_flight=4, timeout=300, progress=False) as dispatcher:
                results = [done async for done in dispatcher.run(request(cluster, run, i, sleep=1, queue=queue) for i in range(4))]
        finally:
            sampler.cancel()
            sampled = (await asyncio.gather(sampler, return_exceptions=True))[0]
            await kube.delete(f"{path}/{queue}")
    if isinstance(sampled, Exception):
        raise sampled
    check_recorded(results, 4)
    assert dispatcher.stats.peak_in_flight == 4
    assert 1 <= peak_sandboxes[0] <= 2, "the queue bounds the trajectory sandboxes of all its groups"
    assert queued, "groups waited for admission"
    assert all(g.queue_position is not None and g.queue_position >= 1 for g in queued)
