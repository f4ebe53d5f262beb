"""The dispatchers (``Dispatcher`` with threads, ``AsyncDispatcher`` with tasks) against a fake gateway that
plays the controller for RolloutGroups: a group completes after a scripted time, in a scripted order, or
never; creations and waits can fail. No cluster. Most tests run for both dispatchers."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import httpx
import pytest

from orchard_env import (
    AsyncDispatcher,
    AsyncSandboxClient,
    Dispatcher,
    DispatchResult,
    DispatchStats,
    Forbidden,
    GroupRequest,
    GroupResult,
    InvalidRequest,
    RetryPolicy,
    SandboxClient,
    Timeout,
)
from orchard_env import _ops

FAST = RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002)
NS = "ns"
NEVER = float("inf")
KINDS = ["sync", "async"]
BASE = f"/v1/namespaces/{NS}/rolloutgroups"


class FakeGateway:
    """The gateway's RolloutGroup routes plus a scripted controller. Group ``name`` completes
    ``durations[name]`` seconds after its creation (``default`` when absent; ``NEVER``: never), or, when it
    is in ``sequence``, only after the consumer received every group before it in ``sequence`` (not merely
    after the gateway answered them: a worker thread that was answered first may hand its result over
    later on a busy machine, so only the consumer's receipt fixes the order). Creations
    of ``fail_create`` answer 422, waits of ``fail_wait`` 403, groups of ``failed_phase`` end ``Failed``;
    the create answer of a group in ``slow_create`` comes ``slow_create[name]`` seconds after the group
    exists. ``received`` is what the test's consumer got; ``peak_unreceived`` the most groups created and
    not yet received, measured at each creation."""

    def __init__(
        self, durations: dict[str, float] | None = None, *, default: float = 0.0, sequence: Iterable[str] = (),
        fail_create: Iterable[str] = (), fail_wait: Iterable[str] = (), failed_phase: Iterable[str] = (),
        slow_create: dict[str, float] | None = None,
    ) -> None:
        self.durations = durations or {}
        self.default = default
        self.sequence = list(sequence)
        self.fail_create, self.fail_wait, self.failed_phase = set(fail_create), set(fail_wait), set(failed_phase)
        self.slow_create = slow_create or {}
        self.lock = threading.Lock()
        self.bodies: list[dict[str, Any]] = []
        self.created: list[str] = []
        self.created_at: dict[str, float] = {}
        self.deleted: list[str] = []
        self.received = 0
        self.received_names: list[str | None] = []
        self.peak_unreceived = 0

    def got(self, name: str | None = None) -> None:
        """The consumer received a result (of group ``name``)."""
        with self.lock:
            self.received += 1
            self.received_names.append(name)

    def group(self, name: str, phase: str) -> dict[str, Any]:
        status: dict[str, Any] = {"phase": phase}
        if phase == "Complete":
            status.update(
                selection="Dropped" if name.endswith("d") else "Balanced",
                conditions=[{"type": "Complete", "status": "True"}],
                group=[{"name": f"{name}-0", "reward": 1.0, "status": "completed", "length": 3}],
            )
        return {"metadata": {"name": name, "namespace": NS}, "status": status}

    def _create(self, request: httpx.Request) -> tuple[httpx.Response, float]:
        body = json.loads(request.content)
        name = body["name"]
        with self.lock:
            self.bodies.append(body)
            if name in self.fail_create:
                return httpx.Response(422, json={"code": "Invalid", "message": f"{name} is invalid"}), 0.0
            self.created.append(name)
            self.created_at[name] = time.monotonic()
            self.peak_unreceived = max(self.peak_unreceived, len(self.created) - self.received)
        return httpx.Response(201, json=self.group(name, "Pending")), self.slow_create.get(name, 0.0)

    def _wait_step(self, name: str, waited: float, wait: float) -> httpx.Response | None:
        """The answer of a ``/wait`` of ``name`` after ``waited`` seconds; None: not yet."""
        with self.lock:
            if name in self.deleted or name not in self.created:
                return httpx.Response(404, json={"code": "NotFound", "message": name})
            if name in self.fail_wait:
                return httpx.Response(403, json={"code": "Forbidden", "message": "no get"})
            if name in self.sequence:
                index = self.sequence.index(name)
                due = all(before in self.received_names for before in self.sequence[:index])
            else:
                due = time.monotonic() >= self.created_at[name] + self.durations.get(name, self.default)
            if due:
                return httpx.Response(200, json=self.group(name, "Failed" if name in self.failed_phase else "Complete"))
        if waited >= wait:
            return httpx.Response(504, json={"code": "WaitTimeout", "message": "wait", "retryable": True})
        return None

    def _route(self, request: httpx.Request) -> tuple[str, str | None]:
        path = request.url.path
        assert path.startswith(BASE), path
        name = path.removeprefix(BASE).strip("/").split("/")[0] or None
        if request.method == "POST" and name is None:
            return "create", None
        if path.endswith("/wait"):
            return "wait", name
        if request.method == "DELETE":
            return "delete", name
        raise AssertionError(f"unexpected {request.method} {path}")

    def _delete(self, name: str) -> httpx.Response:
        with self.lock:
            if name not in self.created or name in self.deleted:
                return httpx.Response(404, json={"code": "NotFound", "message": name})
            self.deleted.append(name)
        return httpx.Response(200, json={"deleted": True})

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Sync transport handler (called from the dispatcher's worker threads)."""
        route, name = self._route(request)
        if route == "create":
            response, delay = self._create(request)
            time.sleep(delay)
            return response
        if route == "delete":
            return self._delete(name or "")
        wait, start = float(request.url.params["timeoutSeconds"]), time.monotonic()
        while (answer := self._wait_step(name or "", time.monotonic() - start, wait)) is None:
            time.sleep(0.002)
        return answer

    async def ahandle(self, request: httpx.Request) -> httpx.Response:
        """Async transport handler."""
        route, name = self._route(request)
        if route == "create":
            response, delay = self._create(request)
            await asyncio.sleep(delay)
            return response
        if route == "delete":
            return self._delete(name or "")
        wait, start = float(request.url.params["timeoutSeconds"]), time.monotonic()
        while (answer := self._wait_step(name or "", time.monotonic() - start, wait)) is None:
            await asyncio.sleep(0.002)
        return answer


def requests(count: int, **fields: Any) -> list[GroupRequest]:
    return [GroupRequest({"image": "x"}, key=i, name=f"g{i}", group_size=2, **fields) for i in range(count)]


BREAK = object()


def dispatch(
    kind: str, fake: FakeGateway, source: Any, *, max_in_flight: int, body: Callable[[DispatchResult], Any] | None = None,
    progress: bool | None = False, timeout: float | None = None,
) -> tuple[list[DispatchResult], DispatchStats]:
    """Runs a dispatcher of ``kind`` over ``source`` inside its ``with`` block; ``body(done)`` runs for every
    result (returning ``BREAK`` leaves the loop, raising propagates)."""
    out: list[DispatchResult] = []

    def consume(done: DispatchResult) -> bool:
        fake.got(done.name)
        out.append(done)
        return body is not None and body(done) is BREAK

    if kind == "sync":
        def main_sync() -> DispatchStats:
            with (
                SandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.handle), retry=FAST) as client,
                Dispatcher(client, max_in_flight=max_in_flight, progress=progress, timeout=timeout) as dispatcher,
            ):
                for done in dispatcher.run(source):
                    if consume(done):
                        break
            return dispatcher.stats

        return out, within_limit(main_sync)

    async def main() -> DispatchStats:
        async with (
            AsyncSandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.ahandle), retry=FAST) as client,
            AsyncDispatcher(client, max_in_flight=max_in_flight, progress=progress, timeout=timeout) as dispatcher,
        ):
            async for done in dispatcher.run(source):
                if consume(done):
                    break
        return dispatcher.stats

    async def limited() -> DispatchStats:
        try:
            return await asyncio.wait_for(main(), LIMIT)
        except TimeoutError:
            pytest.fail(f"the dispatcher did not finish in {LIMIT}s")

    return out, asyncio.run(limited())


#: Seconds a test's dispatcher may take before the test fails (instead of hanging).
LIMIT = 20.0


def within_limit(run: Callable[[], Any]) -> Any:
    """``run()`` in a thread: its result or exception, or a test failure after ``LIMIT`` seconds."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append((True, run()))
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            outcome.append((False, error))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(LIMIT)
    if not outcome:
        pytest.fail(f"the dispatcher did not finish in {LIMIT}s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


# -- the new RolloutGroup fields ---------------------------------------------------------------------


def test_queue_and_deadline_reach_the_request_body_and_queued_status_is_read() -> None:
    body = _ops.group_body({"image": "x"}, group_size=2, queue="gpu-pool", active_deadline_seconds=600)
    assert body == {"template": {"image": "x"}, "groupSize": 2, "queue": "gpu-pool", "activeDeadlineSeconds": 600}
    assert "queue" not in _ops.group_body({"image": "x"}) and "activeDeadlineSeconds" not in _ops.group_body({"image": "x"})

    fake = FakeGateway()
    with SandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.handle), retry=FAST) as client:
        client.create_rollout_group({"image": "x"}, name="s", queue="q1", active_deadline_seconds=60, delete_on_exit=False)

    async def create_async() -> None:
        async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.ahandle), retry=FAST) as client:
            await client.create_rollout_group({"image": "x"}, name="a", queue="q2", active_deadline_seconds=7)

    asyncio.run(create_async())
    assert [(b["queue"], b["activeDeadlineSeconds"]) for b in fake.bodies] == [("q1", 60), ("q2", 7)]

    queued = GroupResult.from_json({"metadata": {"name": "g"}, "status": {
        "phase": "Queued", "queuePosition": 3, "queuedSince": "2026-11-24T19:00:00Z",
        "conditions": [{"type": "Admitted", "status": "False", "reason": "Queued"}]}})
    assert queued.queued and queued.queue_position == 3 and not queued.complete
    running = GroupResult.from_json({"metadata": {"name": "g"}, "status": {"phase": "Generating"}})
    assert not running.queued and running.queue_position is None


def test_retry_and_launch_jitter_reach_the_request_body_spelled_as_the_api_spells_them() -> None:
    body = _ops.group_body({"image": "x"}, launch_jitter_seconds=2, retry={
        "max_attempts": 3, "on_oom": {"memory_factor": 2, "max_memory": "8Gi", "cpu_factor": 1.5, "max_cpu": "4"},
        "on_eviction": True})
    assert body["launchJitterSeconds"] == 2.0
    assert body["retry"] == {"maxAttempts": 3, "onOOM": {"memoryFactor": 2, "maxMemory": "8Gi", "cpuFactor": 1.5, "maxCpu": "4"},
                             "onEviction": True}
    api_spelling = {"maxAttempts": 2, "onOOM": {"maxMemory": "1Gi"}}
    assert _ops.group_body({"image": "x"}, retry=api_spelling)["retry"] == api_spelling
    assert "retry" not in _ops.group_body({"image": "x"}) and "launchJitterSeconds" not in _ops.group_body({"image": "x"})
    with pytest.raises(ValueError, match=r"unknown retry key\(s\) \['attempts'\]"):
        _ops.group_body({"image": "x"}, retry={"attempts": 3})
    with pytest.raises(ValueError, match="unknown retry on_oom key"):
        _ops.group_body({"image": "x"}, retry={"on_oom": {"factor": 2}})
    with pytest.raises(ValueError, match="retry must be a mapping"):
        _ops.group_body({"image": "x"}, retry=3)  # type: ignore[arg-type]

    fake = FakeGateway()
    with SandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.handle), retry=FAST) as client:
        client.create_rollout_group({"image": "x"}, name="s", retry={"on_eviction": True}, launch_jitter_seconds=0,
                                    delete_on_exit=False)
    assert [(b["retry"], b["launchJitterSeconds"]) for b in fake.bodies] == [({"onEviction": True}, 0.0)]
    request = GroupRequest({"image": "x"}, retry={"max_attempts": 2}, launch_jitter_seconds=0.5)
    assert request.create_kwargs()["retry"] == {"max_attempts": 2} and request.create_kwargs()["launch_jitter_seconds"] == 0.5


def test_a_retried_trajectory_shows_its_attempts_and_what_it_waits_for() -> None:
    why = "Unschedulable: 0/2 nodes are available: 2 Insufficient memory."
    result = GroupResult.from_json({"metadata": {"name": "g"}, "status": {"phase": "Generating", "trajectories": [
        {"name": "g-0", "stride": 0, "attempts": 2, "waiting": why,
         "previousAttempts": [{"reason": "OOMKilled", "memory": "2Gi"}]},
        {"name": "g-1", "stride": 0, "status": "completed", "reward": 1.0}]}})
    retried, first = result.trajectories
    assert (retried.attempts, retried.waiting) == (2, why)
    assert retried.raw["previousAttempts"][0]["reason"] == "OOMKilled"
    assert (first.attempts, first.waiting) == (1, None)


def test_a_sandboxs_retry_keyword_is_spelled_as_the_api_spells_it() -> None:
    body = _ops.sandbox_body("x", memory="64Mi", extra={"retry": {"max_attempts": 2, "on_oom": {"max_memory": "256Mi"}}})
    assert body["retry"] == {"maxAttempts": 2, "onOOM": {"maxMemory": "256Mi"}} and body["memory"] == "64Mi"
    with pytest.raises(ValueError, match=r"unknown retry key\(s\) \['tries'\]"):
        _ops.sandbox_body("x", extra={"retry": {"tries": 2}})


def test_group_request_has_exactly_the_keywords_of_create_rollout_group() -> None:
    fields = {f.name for f in dataclasses.fields(GroupRequest)} - {"key", "_"}
    for create in (SandboxClient.create_rollout_group, AsyncSandboxClient.create_rollout_group):
        assert fields == set(inspect.signature(create).parameters) - {"self"}
    with pytest.raises(TypeError):
        GroupRequest({"image": "x"}, "positional key")  # type: ignore[misc]
    with SandboxClient("http://gw", "t", namespace=NS) as client, pytest.raises(ValueError, match="max_in_flight"):
        Dispatcher(client, max_in_flight=0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_that_is_not_a_group_request_raises(kind: str) -> None:
    fake = FakeGateway({"g0": 0.0}, default=NEVER)
    with pytest.raises(TypeError, match="GroupRequest"):
        dispatch(kind, fake, [*requests(2), {"image": "x"}], max_in_flight=4)
    assert sorted(fake.deleted) == sorted(fake.created), "what it had created is deleted"


# -- back-pressure and order ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_never_more_than_max_in_flight_groups_exist_unyielded(kind: str) -> None:
    # Each group of three completes last-first, so the third is created before the first two can be yielded.
    fake = FakeGateway(sequence=[f"g{i + j}" for i in range(0, 12, 3) for j in (2, 0, 1)])
    slow_consumer = lambda done: time.sleep(0.005)  # noqa: E731
    results, stats = dispatch(kind, fake, requests(12), max_in_flight=3, body=slow_consumer)
    assert sorted(r.key for r in results) == list(range(12)) and all(r.ok for r in results)
    assert fake.peak_unreceived == 3, "the bound is reached and never exceeded (measured by the gateway)"
    assert stats.peak_in_flight == 3 and stats.in_flight == 0
    assert (stats.submitted, stats.completed, stats.failed) == (12, 12, 0)


@pytest.mark.parametrize("kind", KINDS)
def test_requests_are_read_lazily(kind: str) -> None:
    fake = FakeGateway()
    pulled: list[int] = []
    seen: list[int] = []

    def source() -> Iterator[GroupRequest]:
        for request in requests(8):
            pulled.append(request.key)
            yield request

    def body(done: DispatchResult) -> None:
        seen.append(len(pulled))

    results, _ = dispatch(kind, fake, source(), max_in_flight=2, body=body)
    assert len(results) == 8
    # At the k-th result (k from 1) the dispatcher has read exactly max_in_flight + k - 1 requests.
    assert seen == [min(8, 2 + k) for k in range(8)]

    # An endless source works, and nothing more is read once the consumer leaves.
    fake = FakeGateway()
    endless_pulls = itertools.count()

    def endless() -> Iterator[GroupRequest]:
        for i in endless_pulls:
            yield GroupRequest({"image": "x"}, key=i, name=f"e{i}")

    results, _ = dispatch(kind, fake, endless(), max_in_flight=3, body=lambda d: BREAK if fake.received == 5 else None)
    assert len(results) == 5
    assert next(endless_pulls) == 5 + 3 - 1, "read: the 5 yielded, and 2 more in flight while the 5th was held"


def test_async_requests_may_be_an_async_iterable() -> None:
    fake = FakeGateway()
    pulled: list[int] = []

    async def source() -> AsyncIterator[GroupRequest]:
        for request in requests(5):
            pulled.append(request.key)
            yield request

    seen: list[int] = []
    results, _ = dispatch("async", fake, source(), max_in_flight=2, body=lambda d: seen.append(len(pulled)))
    assert sorted(r.key for r in results) == list(range(5))
    assert seen == [2, 3, 4, 5, 5]


@pytest.mark.parametrize("kind", KINDS)
def test_results_come_in_completion_order(kind: str) -> None:
    order = ["g3", "g1", "g0", "g4", "g2"]
    fake = FakeGateway(sequence=order)
    results, _ = dispatch(kind, fake, requests(5), max_in_flight=5)
    assert [r.name for r in results] == order
    assert [r.key for r in results] == [3, 1, 0, 4, 2], "each result carries its own request"
    assert all(r.result is not None and r.result.name == r.name for r in results)


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_failures_are_yielded_and_the_other_groups_complete(kind: str) -> None:
    fake = FakeGateway(fail_create={"g1"}, fail_wait={"g2"}, failed_phase={"g3"})
    results, stats = dispatch(kind, fake, requests(6), max_in_flight=2)
    by_key = {r.key: r for r in results}
    assert sorted(by_key) == list(range(6))
    assert isinstance(by_key[1].error, InvalidRequest) and by_key[1].name is None and by_key[1].result is None
    assert isinstance(by_key[2].error, Forbidden) and by_key[2].name == "g2" and not by_key[2].ok
    assert by_key[3].error is None and by_key[3].result is not None and by_key[3].result.phase == "Failed"
    assert not by_key[3].ok
    assert all(by_key[k].ok and by_key[k].result.selection == "Balanced" for k in (0, 4, 5))  # type: ignore[union-attr]
    assert (stats.completed, stats.failed, dict(stats.selections)) == (3, 3, {"Balanced": 3})
    assert sorted(fake.deleted) == ["g0", "g2", "g3", "g4", "g5"], "every yielded group with delete_on_exit, and only those"


@pytest.mark.parametrize("kind", KINDS)
def test_a_wait_timeout_is_yielded_as_an_error(kind: str) -> None:
    fake = FakeGateway({"g0": NEVER})
    results, _ = dispatch(kind, fake, requests(2), max_in_flight=2, timeout=0.2)
    by_key = {r.key: r for r in results}
    assert isinstance(by_key[0].error, Timeout) and by_key[0].name == "g0"
    assert by_key[1].ok
    assert sorted(fake.deleted) == ["g0", "g1"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_of_the_request_iterable_is_raised_after_cleanup(kind: str) -> None:
    fake = FakeGateway({"g0": 0.0}, default=NEVER)

    def source() -> Iterator[GroupRequest]:
        yield from requests(2)
        raise LookupError("dataset broke")  # read once g0 was yielded and its slot is free

    got: list[str | None] = []
    with pytest.raises(LookupError, match="dataset broke"):
        dispatch(kind, fake, source(), max_in_flight=2, body=lambda d: got.append(d.name))
    assert got == ["g0"]
    assert sorted(fake.deleted) == sorted(fake.created) == ["g0", "g1"]


# -- what happens to groups --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_yielded_groups_are_deleted_when_the_consumer_moves_on_unless_kept(kind: str) -> None:
    fake = FakeGateway(sequence=["g0", "g1", "g2", "g3"])
    source = [dataclasses.replace(r, delete_on_exit=r.key % 2 == 0) for r in requests(4)]
    deleted_during: list[list[str]] = []
    results, _ = dispatch(kind, fake, source, max_in_flight=4, body=lambda d: deleted_during.append(list(fake.deleted)))
    assert [r.name for r in results] == ["g0", "g1", "g2", "g3"]
    # While the consumer holds result k, the groups before it with delete_on_exit are gone, not k itself.
    assert deleted_during == [[], ["g0"], ["g0"], ["g0", "g2"]]
    assert fake.deleted == ["g0", "g2"], "delete_on_exit=False groups are left to the caller"


@pytest.mark.parametrize("kind", KINDS)
def test_breaking_out_deletes_exactly_the_unfinished_groups(kind: str) -> None:
    fake = FakeGateway({"g0": 0.0}, default=NEVER)
    source = requests(6, delete_on_exit=False)
    results, stats = dispatch(kind, fake, source, max_in_flight=3, body=lambda d: BREAK)
    assert [r.name for r in results] == ["g0"]
    assert sorted(fake.created) == ["g0", "g1", "g2"], "nothing beyond max_in_flight was created"
    assert sorted(fake.deleted) == ["g1", "g2"], "the unfinished groups, not the yielded one (kept)"
    assert stats.in_flight == 0


@pytest.mark.parametrize("kind", KINDS)
def test_an_exception_in_the_loop_deletes_the_unfinished_groups(kind: str) -> None:
    fake = FakeGateway({"g0": 0.0}, default=NEVER)

    def body(done: DispatchResult) -> None:
        raise RuntimeError("trainer crashed")

    with pytest.raises(RuntimeError, match="trainer crashed"):
        dispatch(kind, fake, requests(6), max_in_flight=3, body=body)
    assert sorted(fake.deleted) == ["g0", "g1", "g2"], "the unfinished ones, and the yielded one (delete_on_exit)"


@pytest.mark.parametrize("kind", KINDS)
def test_a_group_still_being_created_when_the_consumer_leaves_is_deleted_once_created(kind: str) -> None:
    fake = FakeGateway({"g0": 0.0}, default=NEVER, slow_create={"g1": 0.3})
    dispatch(kind, fake, requests(2, delete_on_exit=False), max_in_flight=2, body=lambda d: BREAK)
    # Both creates are in flight at once: the threaded dispatcher's two workers may reach the gateway
    # in either order.
    assert sorted(fake.created) == ["g0", "g1"]
    assert fake.deleted == ["g1"], "its create answer came after the consumer left; it was deleted then"


async def test_cancelling_the_consumer_task_deletes_the_unfinished_groups() -> None:
    fake = FakeGateway({"g0": 0.0}, default=NEVER)
    first = asyncio.Event()

    async def consumer(client: AsyncSandboxClient) -> None:
        async with AsyncDispatcher(client, max_in_flight=3, progress=False) as dispatcher:
            async for _ in dispatcher.run(requests(6, delete_on_exit=False)):
                first.set()

    async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.ahandle), retry=FAST) as client:
        task = asyncio.create_task(consumer(client))
        await asyncio.wait_for(first.wait(), 5)
        while len(fake.created) < 4:  # g3 takes g0's slot; the consumer then waits for the next result
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # g0 was yielded (and kept: delete_on_exit=False), so g3 took its slot; g1-g3 never finished.
    assert sorted(fake.created) == ["g0", "g1", "g2", "g3"]
    assert sorted(fake.deleted) == ["g1", "g2", "g3"]


async def test_aclose_of_the_iterator_deletes_the_unfinished_groups() -> None:
    fake = FakeGateway({"g0": 0.0, "again": 0.0, "h0": 0.0}, default=NEVER)
    async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.ahandle), retry=FAST) as client:
        dispatcher = AsyncDispatcher(client, max_in_flight=3, progress=False)  # no `async with`
        results = dispatcher.run(requests(6, delete_on_exit=False))
        assert (await anext(results)).name == "g0"
        await results.aclose()  # type: ignore[attr-defined]
        assert sorted(fake.deleted) == ["g1", "g2"]
        # The dispatcher can run again once the previous run ended.
        assert [d.name async for d in dispatcher.run([GroupRequest({"image": "x"}, name="again", delete_on_exit=False)])] == ["again"]
        assert sorted(fake.deleted) == ["g1", "g2"]

        # Leaving `async with` closes the run even while the caller still holds its iterator.
        fake.deleted.clear()
        async with AsyncDispatcher(client, max_in_flight=3, progress=False) as dispatcher:
            held = dispatcher.run([GroupRequest({"image": "x"}, name=n) for n in ("h0", "h1", "h2")])
            assert (await anext(held)).name == "h0"
        assert sorted(fake.deleted) == ["h0", "h1", "h2"], "unfinished ones, and h0 (yielded, delete_on_exit)"
        del held


def test_close_of_the_sync_iterator_deletes_the_unfinished_groups() -> None:
    fake = FakeGateway({"g0": 0.0}, default=NEVER)
    with SandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.handle), retry=FAST) as client:
        dispatcher = Dispatcher(client, max_in_flight=3, progress=False)
        results = dispatcher.run(requests(6, delete_on_exit=False))
        assert next(results).name == "g0"
        results.close()  # type: ignore[attr-defined]
        assert sorted(fake.deleted) == ["g1", "g2"]
        again = dispatcher.run([])
        with pytest.raises(RuntimeError, match="one run"):
            dispatcher.run([])
        dispatcher.close()
        assert list(again) == []

    # Leaving the `with` block closes the run even while the caller still holds its iterator.
    fake = FakeGateway({"g0": 0.0}, default=NEVER)
    with SandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(fake.handle), retry=FAST) as client:
        with Dispatcher(client, max_in_flight=3, progress=False) as dispatcher:
            held = dispatcher.run(requests(6))
            assert next(held).name == "g0"
        assert sorted(fake.deleted) == ["g0", "g1", "g2"], "unfinished ones, and g0 (yielded, delete_on_exit)"
        del held


# -- progress ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_the_progress_line_renders_on_stderr(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeGateway({"g3d": 0.0}, fail_create={"g1"})
    source = [*requests(3), GroupRequest({"image": "x"}, key=3, name="g3d")]
    dispatch(kind, fake, source, max_in_flight=2, progress=True)
    err = capsys.readouterr().err
    assert err.startswith("\rrollout groups: 1 submitted, 1 in flight, 0 completed, 0 failed")
    final = err.rstrip("\n").rsplit("\r", 1)[1].rstrip()
    assert final == "rollout groups: 4 submitted, 0 in flight, 3 completed, 1 failed | Balanced 2, Dropped 1"
    assert err.endswith("\n") and err.count("\n") == 1, "one line, rewritten in place"

    for progress in (False, None):  # None: only when stderr is a terminal (not under capsys)
        dispatch(kind, FakeGateway(), requests(2), max_in_flight=2, progress=progress)
        assert capsys.readouterr().err == ""
