"""``RolloutGroup.drive`` (sync and async) against a fake gateway that plays the controller: trajectory
Sandboxes appear stride by stride, become Ready (or fail, or vanish) and the group completes once every
launched trajectory has a result. No cluster."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from orchard_env import (
    AsyncSandbox,
    AsyncSandboxClient,
    DriveResult,
    Forbidden,
    GroupResult,
    RetryPolicy,
    Sandbox,
    SandboxClient,
    TrajectoryResult,
)
from orchard_env import _core, _ops

FAST = RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002)
NS = "ns"
GROUP = "g"
LABEL = {"orchard.dev/rollout-group": GROUP}


def ready(name: str, uid: str, stride: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": {**LABEL, "orchard.dev/stride": str(stride)}},
        "spec": {"image": "x"},
        "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]},
    }


class FakeGateway:
    """The gateway plus a minimal controller: stride k (``stride`` sandboxes) is launched once every
    trajectory of stride k-1 has a result; a new sandbox is Starting at its first listing and Ready (or
    Failed, or deleted: ``fates``) at the next; the group completes when all ``total`` have results."""

    def __init__(self, total: int = 8, stride: int = 4, fates: dict[int, str] | None = None, run: bool = False) -> None:
        self.total, self.stride, self.fates, self.run = total, stride, fates or {}, run
        self.lock = threading.Lock()
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.posts: list[str] = []
        self.deleted: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.launched = 0
        self.interrupt: Callable[[], bool] = lambda: False
        self.forbid_results = False
        #: The balanced group the fake records at completion (trajectory names, in rank order).
        self.members: list[str] = []
        #: Every request's method, URL, headers and body, to check what left the trainer.
        self.sent: list[str] = []
        #: When set, the group completes once this answers True (else once every trajectory has a result).
        self.complete_when: Callable[[], bool] | None = None

    def group(self, complete: bool = False) -> dict[str, Any]:
        template: dict[str, Any] = {"spec": {"image": "x"}}
        if self.run:
            template["spec"]["run"] = {"command": ["true"]}
        status: dict[str, Any] = {"phase": "Generating"}
        if complete:
            status = {
                "phase": "Complete",
                "selection": "Balanced",
                "conditions": [{"type": "Complete", "status": "True"}],
                "trajectories": [{"name": n, "stride": 0, **r} for n, r in sorted(self.results.items())],
                "group": [{"name": n, **self.results[n]} for n in self.members],
            }
        return {"metadata": {"name": GROUP, "namespace": NS}, "spec": {"groupSize": 4, "template": template}, "status": status}

    def _launch(self) -> None:
        for index in range(self.launched, min(self.launched + self.stride, self.total)):
            name = f"{GROUP}-{index}"
            raw = ready(name, f"uid-{index}", index // self.stride)
            raw["status"] = {"phase": "Starting"}
            self.sandboxes[name] = raw
        self.launched = min(self.launched + self.stride, self.total)

    def _tick(self) -> None:
        """Called at every listing: Starting sandboxes move on, the next stride launches when due."""
        for name, raw in list(self.sandboxes.items()):
            if raw["status"].get("phase") != "Starting":
                continue
            index = int(name.rsplit("-", 1)[1])
            fate = self.fates.get(index, "ready")
            if fate == "fail":
                raw["status"] = {"phase": "Failed", "result": {"status": "aborted", "reason": "SandboxFailed"}}
                self.results[name] = raw["status"]["result"]
            elif fate == "vanish":
                del self.sandboxes[name]
                self.results[name] = {"status": "aborted", "reason": "SandboxDeleted"}
            else:
                raw["status"] = ready(name, "", 0)["status"]
        if self.launched < self.total and all(f"{GROUP}-{i}" in self.results for i in range(self.launched)):
            self._launch()

    def complete(self) -> bool:
        if self.complete_when is not None:
            return self.complete_when()
        return self.launched == self.total and len(self.results) == self.total

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        with self.lock:
            self.calls.append((request.method, path))
            self.sent.append(f"{request.method} {request.url} {dict(request.headers)} {request.content!r}")
            base = f"/v1/namespaces/{NS}"
            if path == f"{base}/rolloutgroups/{GROUP}":
                return httpx.Response(200, json=self.group())
            if path == f"{base}/rolloutgroups/{GROUP}/wait":
                if self.interrupt():
                    raise KeyboardInterrupt
                if self.complete():
                    return httpx.Response(200, json=self.group(complete=True))
                return httpx.Response(504, json={"code": "WaitTimeout", "message": "wait", "retryable": True})
            if path == f"{base}/sandboxes" and request.method == "GET":
                assert request.url.params["labelSelector"] == "orchard.dev/rollout-group=g"
                if not self.launched:
                    self._launch()
                else:
                    self._tick()
                # Someone else's sandbox carrying the label but not named like a trajectory: ignored.
                stray = ready("other", "uid-other", 0)
                return httpx.Response(200, json={"items": [*self.sandboxes.values(), stray]})
            name = path.removeprefix(f"{base}/sandboxes/").split("/")[0]
            if name not in self.sandboxes:
                return httpx.Response(404, json={"code": "NotFound", "message": name})
            if path.endswith("/heartbeat"):
                return httpx.Response(200, json={"heartbeatTimeoutSeconds": 0})
            if path.endswith("/exec"):
                return httpx.Response(200, json={"exitCode": 0, "stdout": name, "stderr": "", "timedOut": False})
            if path.endswith("/result"):
                if self.forbid_results:
                    return httpx.Response(403, json={"code": "Forbidden", "message": "no"})
                body = json.loads(request.content)
                self.posts.append(name)
                if name in self.results and self.results[name] != body:
                    return httpx.Response(409, json={"code": "ResultAlreadyRecorded", "message": name})
                self.results[name] = body
                self.sandboxes[name]["status"]["result"] = body
                return httpx.Response(200, json={"recorded": True, "result": body})
            if request.method == "DELETE":
                self.deleted.append(name)
                del self.sandboxes[name]
                self.results.setdefault(name, {"status": "aborted", "reason": "SandboxDeleted"})
                return httpx.Response(200, json={"deleted": True})
        return httpx.Response(404, json={"code": "NotFound", "message": path})


def outcome(index: int) -> Any:
    """What the episode of trajectory ``index`` returns (or raises): every accepted form."""
    forms: dict[int, Any] = {
        0: 1.0, 1: {"reward": 0, "length": 3}, 4: TrajectoryResult(reward=1.0, length=5), 6: True, 7: 0,
    }
    if index in forms:
        return forms[index]
    raise RuntimeError(f"episode {index} broke")


EXPECTED = {
    "g-0": {"reward": 1.0, "status": "completed"},
    "g-1": {"reward": 0, "length": 3, "status": "completed"},
    "g-2": {"status": "aborted", "reason": "SandboxFailed"},
    "g-3": {"status": "aborted", "reason": "EpisodeFailed", "message": "RuntimeError: episode 3 broke"},
    "g-4": {"reward": 1.0, "status": "completed", "length": 5},
    "g-5": {"status": "aborted", "reason": "SandboxDeleted"},
    "g-6": {"reward": 1.0, "status": "completed"},
    "g-7": {"reward": 0.0, "status": "completed"},
}


def sync_client(fake: FakeGateway) -> SandboxClient:
    return SandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake), retry=FAST)


def async_transport(fake: FakeGateway) -> httpx.MockTransport:
    """``fake`` for the async client: a group wait takes a moment, so the episodes' tasks get to run."""

    async def gateway(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/wait"):
            await asyncio.sleep(0.005)
        return fake(request)

    return httpx.MockTransport(gateway)


def test_drive_runs_each_ready_trajectory_once_over_strides_and_records_its_result() -> None:
    fake = FakeGateway(fates={2: "fail", 5: "vanish"})
    ran: list[str] = []
    active, peak = [0], [0]
    lock = threading.Lock()

    def episode(sandbox: Sandbox) -> Any:
        with lock:
            ran.append(sandbox.name)
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            assert sandbox.exec("true").stdout == sandbox.name
            time.sleep(0.02)
            return outcome(int(sandbox.name.rsplit("-", 1)[1]))
        finally:
            with lock:
                active[0] -= 1

    with sync_client(fake) as client:
        group = client.rollout_group(GROUP)
        result = group.drive(episode, concurrency=2, poll_interval=0.01)
    assert result.complete and result.selection == "Balanced"
    assert sorted(ran) == ["g-0", "g-1", "g-3", "g-4", "g-6", "g-7"], "failed and vanished sandboxes are skipped"
    assert len(set(ran)) == len(ran), "one episode per sandbox"
    assert peak[0] <= 2, "never more than `concurrency` episodes at once"
    assert sorted(fake.posts) == sorted(ran), "exactly one result post per episode"
    assert fake.results == EXPECTED
    assert not fake.deleted, "a completed drive deletes nothing"
    assert ("GET", "/v1/namespaces/ns/rolloutgroups/g") in fake.calls, "a bare handle reads the template first"


async def test_async_drive_runs_each_ready_trajectory_once_and_records_its_result() -> None:
    fake = FakeGateway(fates={2: "fail", 5: "vanish"})
    ran: list[str] = []
    active, peak = [0], [0]

    async def episode(sandbox: AsyncSandbox) -> Any:
        ran.append(sandbox.name)
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        try:
            assert (await sandbox.exec("true")).stdout == sandbox.name
            await asyncio.sleep(0.02)
            return outcome(int(sandbox.name.rsplit("-", 1)[1]))
        finally:
            active[0] -= 1

    async def gateway(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/wait"):
            await asyncio.sleep(0.005)
        return fake(request)

    async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(gateway), retry=FAST) as client:
        result = await client.rollout_group(GROUP).drive(episode, concurrency=3, poll_interval=0.01)
    assert result.complete
    assert sorted(ran) == ["g-0", "g-1", "g-3", "g-4", "g-6", "g-7"]
    assert 1 < peak[0] <= 3
    assert sorted(fake.posts) == sorted(ran)
    assert fake.results == EXPECTED
    assert not fake.deleted


def test_drive_refuses_groups_whose_template_runs_a_command() -> None:
    fake = FakeGateway(run=True)
    with sync_client(fake) as client, pytest.raises(ValueError, match="template.spec.run"):
        client.rollout_group(GROUP).drive(lambda s: 1.0)
    assert not any(path.endswith("/sandboxes") for _, path in fake.calls), "nothing listed, nothing run"


def test_an_interrupted_drive_deletes_the_unfinished_trajectories() -> None:
    fake = FakeGateway()
    running: set[str] = set()
    release = threading.Event()
    # Ctrl-C arrives while the driver waits on the group, once g-0 has its result and g-1..g-3 run.
    # They hold until the drive was interrupted, so they are still running then however slow the
    # machine is (no episode length to race against).
    fake.interrupt = lambda: {"g-1", "g-2", "g-3"} <= running and "g-0" in fake.results

    def episode(sandbox: Sandbox) -> float:
        if sandbox.name == "g-0":
            return 1.0
        running.add(sandbox.name)
        release.wait(60)
        return 0.0

    with sync_client(fake) as client, pytest.raises(KeyboardInterrupt):
        try:
            client.rollout_group(GROUP).drive(episode, poll_interval=0.05, timeout=60)
        finally:
            release.set()
    assert running == {"g-1", "g-2", "g-3"}
    assert "g-0" not in fake.deleted, "a trajectory with a result is left alone"
    assert sorted(fake.deleted) == ["g-1", "g-2", "g-3"], "the running ones are deleted"


async def test_cancelling_an_async_drive_cancels_episodes_and_deletes_their_sandboxes() -> None:
    fake = FakeGateway()
    running = asyncio.Event()
    cancelled: list[str] = []

    async def episode(sandbox: AsyncSandbox) -> float:
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(sandbox.name)
            raise
        return 1.0

    async def gateway(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/wait"):
            await asyncio.sleep(0.005)
        return fake(request)

    async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(gateway), retry=FAST) as client:
        task = asyncio.create_task(client.rollout_group(GROUP).drive(episode, poll_interval=0.01))
        await asyncio.wait_for(running.wait(), 5)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert sorted(cancelled) == ["g-0", "g-1", "g-2", "g-3"]
    assert sorted(fake.deleted) == ["g-0", "g-1", "g-2", "g-3"]
    assert not fake.posts, "a cancelled episode records nothing"


def test_a_result_that_cannot_be_posted_stops_the_drive_and_cleans_up() -> None:
    fake = FakeGateway()
    fake.forbid_results = True
    with sync_client(fake) as client, pytest.raises(Forbidden):
        client.rollout_group(GROUP).drive(lambda s: 1.0, timeout=10, poll_interval=0.01)
    assert sorted(fake.deleted) == ["g-0", "g-1", "g-2", "g-3"]


def test_drive_times_out_and_cleans_up() -> None:
    fake = FakeGateway()
    with sync_client(fake) as client, pytest.raises(Exception, match="not complete after"):
        client.rollout_group(GROUP).drive(lambda s: time.sleep(0.3) or 1.0, timeout=0.1, poll_interval=0.01)
    assert fake.deleted, "the unfinished trajectories are deleted"


# -- payloads back to the trainer -------------------------------------------------------------------


def payload_of(index: int) -> dict[str, Any]:
    """A payload as a policy would return it; its marker must never reach the gateway."""
    return {"tokens": [index, index + 1], "logprobs": [-0.5, -0.25], "marker": f"PAYLOAD-SECRET-{index}"}


def paid(index: int, fake: FakeGateway) -> Any:
    """What the episode of trajectory ``index`` returns in the payload tests: ``(result, payload)`` pairs
    of every result form, a result alone (1), a raise (3); trajectory 6's result is recorded by "the
    controller" (aborted, TimeExceeded) while its episode runs, so drive's post gets 409."""
    if index == 6:
        with fake.lock:
            fake.results["g-6"] = {"status": "aborted", "reason": "TimeExceeded"}
            fake.sandboxes["g-6"]["status"]["result"] = fake.results["g-6"]
    value = outcome(index)
    return value if index == 1 else (value, payload_of(index))


def check_payloads(result: Any, fake: FakeGateway) -> None:
    assert isinstance(result, DriveResult) and isinstance(result, GroupResult), "a GroupResult, as before"
    assert result.complete and result.selection == "Balanced"
    # BAR's group (rank order): 4 and 0 positive, 2 an aborted backfill (no episode ran), 7 negative.
    assert [m.name for m in result.group] == ["g-4", "g-0", "g-2", "g-7"]
    assert result.rewards == [1.0, 1.0, 0.0, 0.0]
    assert result.payloads == [payload_of(4), payload_of(0), None, payload_of(7)], "in group order, as rewards"
    episodes = result.episodes
    assert sorted(episodes) == ["g-0", "g-1", "g-3", "g-4", "g-6", "g-7"], "one per episode run, by name"
    assert [e.index for e in episodes.values()] == [0, 1, 3, 4, 6, 7]
    assert {n for n, e in episodes.items() if e.in_group} == {"g-0", "g-4", "g-7"}
    kept = episodes["g-1"]  # not in the group: kept all the same, flagged
    assert not kept.in_group and kept.payload is None, "a result alone has no payload"
    assert kept.result == TrajectoryResult(reward=0, length=3) and kept.recorded and kept.error is None
    assert kept.trajectory is not None and kept.trajectory.reward == 0
    failed = episodes["g-3"]
    assert failed.payload is None and isinstance(failed.error, RuntimeError) and failed.recorded
    assert failed.result == TrajectoryResult(status="aborted", reason="EpisodeFailed", message="RuntimeError: episode 3 broke")
    refused = episodes["g-6"]  # the controller recorded another result first: the payload stays
    assert refused.payload == payload_of(6) and not refused.recorded and refused.error is None
    assert refused.result == TrajectoryResult(reward=1.0)
    assert refused.trajectory is not None and refused.trajectory.reason == "TimeExceeded"
    member = episodes["g-4"]
    assert member.in_group and member.member is not None and member.member.reward == 1.0
    assert member.payload == payload_of(4) and member.result == TrajectoryResult(reward=1.0, length=5)
    assert "PAYLOAD-SECRET" not in "".join(fake.sent), "payloads never leave the trainer"
    assert fake.results["g-4"] == {"reward": 1.0, "status": "completed", "length": 5}, "only the result is posted"
    assert "PAYLOAD-SECRET" not in repr(result), "payloads stay out of reprs (they may be large)"


def test_drive_hands_back_each_episodes_payload_by_trajectory_and_never_sends_it() -> None:
    fake = FakeGateway(fates={2: "fail", 5: "vanish"})
    fake.members = ["g-4", "g-0", "g-2", "g-7"]
    with sync_client(fake) as client:
        result = client.rollout_group(GROUP).drive(
            lambda sandbox: paid(int(sandbox.name.rsplit("-", 1)[1]), fake), concurrency=3, poll_interval=0.01)
    check_payloads(result, fake)


async def test_async_drive_hands_back_each_episodes_payload_by_trajectory_and_never_sends_it() -> None:
    fake = FakeGateway(fates={2: "fail", 5: "vanish"})
    fake.members = ["g-4", "g-0", "g-2", "g-7"]

    async def episode(sandbox: AsyncSandbox) -> Any:
        await asyncio.sleep(0.001)
        return paid(int(sandbox.name.rsplit("-", 1)[1]), fake)

    async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=async_transport(fake), retry=FAST) as client:
        result = await client.rollout_group(GROUP).drive(episode, concurrency=3, poll_interval=0.01)
    check_payloads(result, fake)


async def test_an_episode_cancelled_when_the_group_completes_has_no_result_and_no_payload() -> None:
    fake = FakeGateway(total=4, stride=4)
    fake.members = ["g-0", "g-1"]
    fake.complete_when = lambda: {"g-0", "g-1", "g-2"} <= set(fake.results)  # as with earlyStop: Eager

    async def episode(sandbox: AsyncSandbox) -> Any:
        if sandbox.name == "g-3":
            await asyncio.sleep(60)
        return 1.0, payload_of(int(sandbox.name[-1]))

    async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=async_transport(fake), retry=FAST) as client:
        result = await client.rollout_group(GROUP).drive(episode, poll_interval=0.01, timeout=10)
    assert result.payloads == [payload_of(0), payload_of(1)]
    cancelled = result.episodes["g-3"]
    assert isinstance(cancelled.error, asyncio.CancelledError)
    assert cancelled.result is None and cancelled.payload is None and not cancelled.recorded and not cancelled.in_group
    assert not result.episodes["g-2"].in_group and result.episodes["g-2"].payload == payload_of(2)


def test_a_group_result_without_episodes_has_no_payloads() -> None:
    group = GroupResult.from_json({"metadata": {"name": "g"}, "status": {"phase": "Complete", "group": [{"name": "g-0", "reward": 1}]}})
    driven = DriveResult.of(group, [])
    assert driven.payloads == [None] and driven.episodes == {}
    assert driven.group == group.group and driven.raw is group.raw and driven.complete
    assert _ops.split_episode_value((1.0, "p")) == (1.0, "p")
    assert _ops.split_episode_value({"reward": 1}) == ({"reward": 1}, None)
    assert _ops.split_episode_value((1.0, 2, 3)) == ((1.0, 2, 3), None), "only a pair is split"


# -- the pure parts ----------------------------------------------------------------------------------


def test_result_bodies_of_every_episode_return_form() -> None:
    assert _ops.result_body(0.5) == {"reward": 0.5, "status": "completed"}
    assert _ops.result_body(False) == {"reward": 0.0, "status": "completed"}
    assert _ops.result_body({"reward": 1, "exit_code": 2, "artifact": None}) == {"reward": 1, "exitCode": 2, "status": "completed"}
    assert _ops.result_body({"status": "aborted", "reason": "X"}) == {"status": "aborted", "reason": "X"}
    assert _ops.result_body(TrajectoryResult(reward=1.0, status="truncated", length=9)) == {
        "reward": 1.0, "status": "truncated", "length": 9}
    with pytest.raises(ValueError, match="unknown result keys"):
        _ops.result_body({"reward": 1, "score": 2})
    with pytest.raises(TypeError):
        _ops.result_body(None)
    assert _ops.aborted_body(RuntimeError("x" * 5000))["message"] == ("RuntimeError: " + "x" * 5000)[:4096]
    assert _ops.aborted_body(KeyError()) == {"status": "aborted", "reason": "EpisodeFailed", "message": "KeyError"}


def test_the_drive_book_starts_each_uid_once_and_skips_dead_sandboxes() -> None:
    book = _core.DriveBook("g")
    items = [ready(f"g-{i}", f"u{i}", 0) for i in (3, 1, 0, 2)]
    items[0]["status"] = {"phase": "Starting"}  # g-3
    items[3]["status"]["phase"] = "Failed"  # g-2
    stray = [ready("g-x", "ux", 0), ready("gg-1", "uy", 0), ready("g-4", "", 0)]
    assert [s["metadata"]["name"] for s in book.select(items + stray, 1)] == ["g-0"]
    assert [s["metadata"]["name"] for s in book.select(items, None)] == ["g-1"]
    assert book.skipped == {"u2"} and book.select(items, None) == []
    items[0]["status"] = ready("g-3", "u3", 0)["status"]
    assert [s["metadata"]["name"] for s in book.select(items, 0)] == []
    assert [s["metadata"]["name"] for s in book.select(items, 5)] == ["g-3"]
    replaced = ready("g-3", "u3-new", 0)
    replaced["status"]["result"] = {"status": "aborted"}
    assert book.select([replaced], None) == [], "a sandbox that already has a result is not run"
    assert _ops.template_runs({"spec": {"template": {"spec": {"run": {"command": ["x"]}}}}})
    assert _ops.template_runs({"spec": {"template": {"image": "x", "run": {"command": ["x"]}}}})
    assert not _ops.template_runs({"spec": {"template": {"spec": {"image": "x"}}}})
