"""The staged pipelines (``Pipeline`` with threads, ``AsyncPipeline`` with tasks): per-stage bounds, items
flowing on without lockstep, errors per item, release and clean-up on every way out (against the fake
controller's sandboxes), lazy reading, and ``episode`` with ``drive()`` and the dispatchers (BAR groups with
payloads). No cluster, except the block of docs/SDK.md ("Staged rollouts"), which runs as written on the
fake controller and, marked ``cluster``, against the local cluster. Most tests run for both pipelines."""

from __future__ import annotations

import ast
import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import orchard_env
from conftest import Cluster, run_sdk_doc_block, sdk_doc_block
from fake_controller import FakeController
from orchard_env import (
    AsyncDispatcher,
    AsyncPipeline,
    AsyncSandboxClient,
    Dispatcher,
    DriveResult,
    GroupRequest,
    Pipeline,
    PipelineResult,
    RetryPolicy,
    SandboxClient,
    Stage,
    StageFailed,
)

FAST = RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002)
KINDS = ["sync", "async"]
#: Seconds a test's pipeline may take before the test fails (instead of hanging).
LIMIT = 30.0
BREAK = object()


class Meter:
    """Counts the items inside each stage (measured by the stage functions themselves) and logs events."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.events: list[tuple[float, str, Any, str]] = []

    def enter(self, stage: str, item: Any) -> None:
        with self.lock:
            self.now[stage] = self.now.get(stage, 0) + 1
            self.peak[stage] = max(self.peak.get(stage, 0), self.now[stage])
            self.events.append((time.monotonic(), stage, item, "start"))

    def leave(self, stage: str, item: Any) -> None:
        with self.lock:
            self.now[stage] -= 1
            self.events.append((time.monotonic(), stage, item, "end"))

    def at(self, stage: str, item: Any, what: str) -> float:
        return next(t for t, s, i, w in self.events if (s, i, w) == (stage, item, what))


def stage_fn(kind: str, meter: Meter, name: str, seconds: Callable[[Any], float],
             value: Callable[..., Any], fail: Callable[[Any], bool] = lambda item: False) -> Callable[..., Any]:
    """A stage function of ``kind`` that is metered, sleeps ``seconds(item)``, may raise, then answers
    ``value(item, *rest)``."""
    if kind == "sync":
        def sync_fn(item: Any, *rest: Any) -> Any:
            meter.enter(name, item)
            try:
                time.sleep(seconds(item))
                if fail(item):
                    raise RuntimeError(f"{name} of {item} broke")
                return value(item, *rest)
            finally:
                meter.leave(name, item)
        return sync_fn

    async def async_fn(item: Any, *rest: Any) -> Any:
        meter.enter(name, item)
        try:
            await asyncio.sleep(seconds(item))
            if fail(item):
                raise RuntimeError(f"{name} of {item} broke")
            return value(item, *rest)
        finally:
            meter.leave(name, item)
    return async_fn


def make(kind: str, **stages: Any) -> Any:
    return Pipeline(**stages) if kind == "sync" else AsyncPipeline(**stages)


def consume(kind: str, pipeline: Any, items: Any, body: Callable[[PipelineResult], Any] | None = None) -> list[PipelineResult]:
    """Runs ``pipeline`` over ``items`` inside its ``with`` block, within ``LIMIT`` seconds; ``body(done)``
    runs for every result (``BREAK`` leaves the loop; raising propagates)."""
    out: list[PipelineResult] = []

    def take(done: PipelineResult) -> bool:
        out.append(done)
        return body is not None and body(done) is BREAK

    if kind == "sync":
        def main_sync() -> None:
            with pipeline:
                for done in pipeline.run(items):
                    if take(done):
                        break

        within_limit(main_sync)
        return out

    async def main() -> None:
        async with pipeline:
            async for done in pipeline.run(items):
                if take(done):
                    break

    async def limited() -> None:
        try:
            await asyncio.wait_for(main(), LIMIT)
        except TimeoutError:
            pytest.fail(f"the pipeline did not finish in {LIMIT}s")

    asyncio.run(limited())
    return out


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
        pytest.fail(f"the pipeline did not finish in {LIMIT}s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


class State:
    """What ``init`` returns in the tests: closed (released) at most once."""

    def __init__(self, item: Any) -> None:
        self.item = item
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


# -- bounds and flow ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_each_stage_stays_within_its_bound_and_reaches_it(kind: str) -> None:
    meter = Meter()
    states: dict[int, State] = {}

    def init_value(item: int) -> State:
        states[item] = State(item)
        return states[item]

    pipeline = make(
        kind,
        init=Stage(stage_fn(kind, meter, "init", lambda i: 0.02, init_value), concurrency=3),
        run=Stage(stage_fn(kind, meter, "run", lambda i: 0.02, lambda i, s: {"tokens": [i], "state": s.item}), concurrency=2),
        reward=Stage(stage_fn(kind, meter, "reward", lambda i: 0.08, lambda i, s, p: 10.0 * p["tokens"][0]), concurrency=4),
    )
    results = consume(kind, pipeline, range(16))
    assert sorted(r.index for r in results) == list(range(16))
    for r in results:
        assert r.ok and r.item == r.index and r.payload == {"tokens": [r.item], "state": r.item} and r.reward == 10.0 * r.item
        assert set(r.seconds) == {"init", "run", "reward"} and r.seconds["reward"] >= 0.07
    assert meter.peak == {"init": 3, "run": 2, "reward": 4}, "every bound reached, none exceeded (measured by the stages)"
    assert pipeline.stats.peak_running == meter.peak
    assert pipeline.stats.running == {"init": 0, "run": 0, "reward": 0}
    assert (pipeline.stats.submitted, pipeline.stats.completed, pipeline.stats.failed, pipeline.stats.in_flight) == (16, 16, 0, 0)
    assert pipeline.max_in_flight == 9 and pipeline.stats.peak_in_flight <= 9, "by default the sum of the bounds"
    assert all(s.closed == 1 for s in states.values()), "each state released once, by its close()"


@pytest.mark.parametrize("kind", KINDS)
def test_items_move_on_without_waiting_for_the_others(kind: str) -> None:
    meter = Meter()
    pipeline = make(
        kind,
        init=Stage(stage_fn(kind, meter, "init", lambda i: 0.0, lambda i: None), concurrency=6),
        run=Stage(stage_fn(kind, meter, "run", lambda i: 0.6 if i == 0 else 0.02, lambda i, s: f"p{i}"), concurrency=3),
        reward=Stage(stage_fn(kind, meter, "reward", lambda i: 0.01, lambda i, s, p: 1.0), concurrency=6),
    )
    results = consume(kind, pipeline, range(6))
    assert [r.item for r in results][-1] == 0, "in completion order: the slow item last"
    slow_run_ends = meter.at("run", 0, "end")
    for item in range(1, 6):
        assert meter.at("reward", item, "end") < slow_run_ends, f"item {item} went through reward while item 0 ran"
    assert meter.at("run", 3, "start") < slow_run_ends, "a run slot freed by a fast item is taken at once"
    assert all(r.payload == f"p{r.item}" for r in results)


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_item_is_reported_with_its_stage_and_the_others_go_on(kind: str) -> None:
    meter = Meter()
    states: dict[int, State] = {}

    def init_value(item: int) -> State:
        states[item] = State(item)
        return states[item]

    pipeline = make(
        kind,
        init=Stage(stage_fn(kind, meter, "init", lambda i: 0.001, init_value, fail=lambda i: i == 1), concurrency=2),
        run=Stage(stage_fn(kind, meter, "run", lambda i: 0.001, lambda i, s: f"p{i}", fail=lambda i: i == 2), concurrency=2),
        reward=Stage(stage_fn(kind, meter, "reward", lambda i: 0.001, lambda i, s, p: 1.0, fail=lambda i: i == 3), concurrency=2),
    )
    by_item = {r.item: r for r in consume(kind, pipeline, range(6))}
    assert sorted(by_item) == list(range(6))
    for item, stage in ((1, "init"), (2, "run"), (3, "reward")):
        failed = by_item[item]
        assert not failed.ok and failed.stage == stage and isinstance(failed.error, RuntimeError)
        assert str(failed.error) == f"{stage} of {item} broke"
    assert by_item[1].payload is None and by_item[2].payload is None and by_item[2].reward is None
    assert by_item[3].payload == "p3" and by_item[3].reward is None, "the run's payload is kept when reward fails"
    assert all(by_item[i].ok and by_item[i].reward == 1.0 for i in (0, 4, 5))
    assert sorted(states) == [0, 2, 3, 4, 5] and all(s.closed == 1 for s in states.values()), "released, failed or not"
    assert (pipeline.stats.completed, pipeline.stats.failed) == (3, 3)


@pytest.mark.parametrize("kind", KINDS)
def test_release_gets_item_and_state_once_and_never_the_item_itself(kind: str) -> None:
    released: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def release(item: int, state: Any) -> None:
        with lock:
            released.append((item, state))

    def init(item: int) -> Any:
        return item if item % 2 else f"state-{item}"  # odd items: init hands back the item itself

    pipeline = make(kind, init=Stage(init, 2), run=Stage(lambda item, state: state, 2), release=release)
    results = consume(kind, pipeline, range(6))
    assert sorted((r.item, r.payload) for r in results) == [(0, "state-0"), (1, 1), (2, "state-2"), (3, 3), (4, "state-4"), (5, 5)]
    assert all(r.reward is None for r in results), "no reward stage"
    assert sorted(released) == [(0, "state-0"), (2, "state-2"), (4, "state-4")]


@pytest.mark.parametrize("kind", KINDS)
def test_items_are_read_lazily_and_at_most_max_in_flight_are_held(kind: str) -> None:
    pulled: list[int] = []
    seen: list[int] = []

    def source() -> Iterator[int]:
        for item in range(8):
            pulled.append(item)
            yield item

    pipeline = make(kind, run=Stage(lambda item, state: item, 4), max_in_flight=2)
    results = consume(kind, pipeline, source(), body=lambda done: seen.append(len(pulled)))
    assert sorted(r.item for r in results) == list(range(8))
    assert seen == [min(8, 2 + k) for k in range(8)], "at the k-th result, max_in_flight + k - 1 items read"
    assert pipeline.stats.peak_in_flight == 2


def test_a_system_exit_in_a_sync_worker_ends_its_item_not_the_pipeline() -> None:
    def run(item: int, state: Any) -> int:
        if item == 1:
            raise SystemExit(3)  # a worker thread: nothing but the pipeline would see it
        return item

    by_item = {r.item: r for r in consume("sync", Pipeline(run=Stage(run, 2)), range(3))}
    assert isinstance(by_item[1].error, SystemExit) and by_item[1].stage == "run"
    assert by_item[0].ok and by_item[2].ok


def test_the_sync_and_async_pipelines_have_the_same_surface() -> None:
    def surface(cls: type) -> dict[str, Any]:
        return {name: member for name in dir(cls) if not name.startswith("_")
                and (callable(member := inspect.getattr_static(cls, name)) or isinstance(member, property))}

    sync, aio = surface(Pipeline), surface(AsyncPipeline)
    assert set(sync) - {"close"} == set(aio) - {"aclose"}, "close is aclose in asyncio, as for the dispatchers"
    for name in ("run", "episode"):
        assert list(inspect.signature(sync[name]).parameters) == list(inspect.signature(aio[name]).parameters)
    assert inspect.signature(Pipeline.__init__) == inspect.signature(AsyncPipeline.__init__)
    assert inspect.iscoroutinefunction(AsyncPipeline.episode) and inspect.iscoroutinefunction(AsyncPipeline.aclose)
    assert not inspect.iscoroutinefunction(Pipeline.episode)


def test_the_stages_are_checked() -> None:
    with pytest.raises(TypeError, match="AsyncPipeline"):
        Pipeline(run=Stage(asyncio.sleep, 1))
    with pytest.raises(ValueError, match="at least 1"):
        Stage(print, 0)
    with pytest.raises(TypeError, match="Stage"):
        AsyncPipeline(run=print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_in_flight"):
        Pipeline(run=Stage(print, 1), max_in_flight=0)
    pipeline = Pipeline(run=Stage(lambda item, state: item, 1))
    pipeline.run([])
    with pytest.raises(RuntimeError, match="one run"):
        pipeline.run([])
    pipeline.close()
    assert list(pipeline.run([3])) and pipeline.stats.completed == 1


# -- clean-up: sandboxes on the fake controller -----------------------------------------------------


def controller_client(kind: str, fake: FakeController) -> Any:
    if kind == "sync":
        return SandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(fake.handle), retry=FAST)
    return AsyncSandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(fake.ahandle), retry=FAST)


def sandbox_pipeline(kind: str, client: Any, fake: FakeController) -> Any:
    """``init`` creates a sandbox per item (``item-<i>-``); ``run`` returns at once for item 0 and works on
    its sandbox until it is gone for the others (the sync run sees the deletion as ``NotFound``)."""
    if kind == "sync":
        def run(item: int, sandbox: Any) -> str:
            while item != 0:
                sandbox.exec(["true"])  # NotFound once the pipeline deleted it
                time.sleep(0.005)
            return f"p{item}"

        return Pipeline(init=Stage(lambda item: client.create(image="x", generate_name=f"item-{item}-"), 4),
                        run=Stage(run, 4), reward=Stage(lambda item, sandbox, payload: 1.0, 4))

    async def arun(item: int, sandbox: Any) -> str:
        while item != 0:
            await sandbox.exec(["true"])
            await asyncio.sleep(0.005)
        return f"p{item}"

    async def ainit(item: int) -> Any:
        return await client.create(image="x", generate_name=f"item-{item}-")

    return AsyncPipeline(init=Stage(ainit, 4), run=Stage(arun, 4), reward=Stage(lambda item, sandbox, payload: 1.0, 4))


def run_with_sandboxes(kind: str, fake: FakeController, body: Callable[[PipelineResult], Any], items: int = 4) -> list[PipelineResult]:
    out: list[PipelineResult] = []
    if kind == "sync":
        def main_sync() -> None:
            with controller_client(kind, fake) as client, sandbox_pipeline(kind, client, fake) as pipeline:
                for done in pipeline.run(range(items)):
                    out.append(done)
                    if body(done) is BREAK:
                        break

        within_limit(main_sync)
        return out

    async def main() -> None:
        async with controller_client(kind, fake) as client, sandbox_pipeline(kind, client, fake) as pipeline:
            async for done in pipeline.run(range(items)):
                out.append(done)
                if body(done) is BREAK:
                    break

    asyncio.run(asyncio.wait_for(main(), LIMIT))
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_leaving_early_deletes_every_sandbox_it_created_one_being_created_included(kind: str) -> None:
    fake = FakeController(create_delay={"item-2-": 0.3})  # item 2's create answers late
    results = run_with_sandboxes(kind, fake, lambda done: BREAK)
    assert [(r.item, r.payload, r.reward) for r in results] == [(0, "p0", 1.0)]
    assert len(fake.created) == 4, "items 0-3 were created (item 2's create was under way when the loop was left)"
    assert sorted(fake.deleted) == sorted(fake.created), "every sandbox it created is deleted"
    assert not fake.sandboxes


@pytest.mark.parametrize("kind", KINDS)
def test_an_exception_in_the_loop_deletes_every_sandbox_and_is_raised(kind: str) -> None:
    fake = FakeController()

    def body(done: PipelineResult) -> None:
        raise KeyboardInterrupt if kind == "sync" else RuntimeError("trainer crashed")

    with pytest.raises(KeyboardInterrupt if kind == "sync" else RuntimeError):
        run_with_sandboxes(kind, fake, body)
    assert len(fake.created) == 4 and sorted(fake.deleted) == sorted(fake.created)


async def test_cancelling_the_task_deletes_every_sandbox() -> None:
    fake = FakeController()
    first = asyncio.Event()

    async def consumer(client: AsyncSandboxClient) -> None:
        async with sandbox_pipeline("async", client, fake) as pipeline:
            async for _ in pipeline.run(range(5)):
                first.set()

    async with controller_client("async", fake) as client:
        task = asyncio.create_task(consumer(client))
        await asyncio.wait_for(first.wait(), 10)
        while len(fake.created) < 5:  # item 4 takes item 0's place once item 0 was handed back
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert sorted(fake.deleted) == sorted(fake.created) and len(fake.created) == 5


async def test_aclose_of_the_iterator_and_close_of_the_sync_one_delete_every_sandbox() -> None:
    fake = FakeController()
    async with controller_client("async", fake) as client:
        pipeline = sandbox_pipeline("async", client, fake)  # no `async with`
        results = pipeline.run(range(4))
        assert (await anext(results)).item == 0
        await results.aclose()  # type: ignore[attr-defined]
    assert len(fake.created) == 4 and sorted(fake.deleted) == sorted(fake.created)

    fake = FakeController()

    def sync_part() -> None:
        with controller_client("sync", fake) as client:
            pipeline = sandbox_pipeline("sync", client, fake)
            results = pipeline.run(range(4))
            assert next(results).item == 0
            results.close()  # type: ignore[attr-defined]

    within_limit(sync_part)
    assert len(fake.created) == 4 and sorted(fake.deleted) == sorted(fake.created)


# -- RolloutGroups: episode with drive() and the dispatchers ------------------------------------------


def group_stages(kind: str, meter: Meter) -> dict[str, Stage]:
    """Stages for trajectory sandboxes: ``init`` writes the question into the sandbox, ``run`` (the
    "policy") reads it through the gateway and answers tokens, ``reward`` scores: trajectories 1 and 2 of
    each stride of 4 are right, trajectory 3 of the second stride breaks in ``run``."""

    def index(sandbox: Any) -> int:
        return int(sandbox.name.rsplit("-", 1)[1])

    def payload(sandbox: Any, question: str) -> dict[str, Any]:
        return {"question": question, "tokens": [index(sandbox)] * 3, "secret": f"PAYLOAD-SECRET-{sandbox.name}"}

    def score(sandbox: Any, payload: dict[str, Any]) -> dict[str, Any]:
        return {"reward": 1.0 if index(sandbox) % 4 in (1, 2) else 0.0, "length": len(payload["tokens"]) + index(sandbox)}

    if kind == "sync":
        def init(sandbox: Any) -> str:
            meter.enter("init", sandbox.name)
            try:
                sandbox.upload("task/question.txt", f"question of {sandbox.name}")
                return "task/question.txt"
            finally:
                meter.leave("init", sandbox.name)

        def run(sandbox: Any, path: str) -> dict[str, Any]:
            meter.enter("run", sandbox.name)
            try:
                time.sleep(0.02)
                if index(sandbox) == 7:
                    raise RuntimeError("the policy broke")
                return payload(sandbox, sandbox.exec(["cat", path]).stdout)
            finally:
                meter.leave("run", sandbox.name)

        return {"init": Stage(init, 8), "run": Stage(run, 3), "reward": Stage(lambda s, path, p: score(s, p), 8)}

    async def ainit(sandbox: Any) -> str:
        meter.enter("init", sandbox.name)
        try:
            await sandbox.upload("task/question.txt", f"question of {sandbox.name}")
            return "task/question.txt"
        finally:
            meter.leave("init", sandbox.name)

    async def arun(sandbox: Any, path: str) -> dict[str, Any]:
        meter.enter("run", sandbox.name)
        try:
            await asyncio.sleep(0.02)
            if index(sandbox) == 7:
                raise RuntimeError("the policy broke")
            return payload(sandbox, (await sandbox.exec(["cat", path])).stdout)
        finally:
            meter.leave("run", sandbox.name)

    return {"init": Stage(ainit, 8), "run": Stage(arun, 3), "reward": Stage(lambda s, path, p: score(s, p), 8)}


def check_driven(result: Any, fake: FakeController) -> None:
    """A group of 4 (2 positives) from two strides of 4: the first has 2 positives and 2 negatives."""
    assert isinstance(result, DriveResult) and result.complete and result.selection == "Balanced"
    name = result.name
    assert [m.name for m in result.group] == [f"{name}-1", f"{name}-2", f"{name}-0", f"{name}-3"]
    assert [p["tokens"] for p in result.payloads] == [[1] * 3, [2] * 3, [0] * 3, [3] * 3], "payloads in group order"
    assert all(p["question"] == f"question of {m.name}" for p, m in zip(result.payloads, result.group)), "matched by trajectory"
    assert all(e.in_group for e in result.episodes.values())
    assert "PAYLOAD-SECRET" not in "".join(fake.sent), "payloads never leave the trainer"


@pytest.mark.parametrize("kind", KINDS)
def test_episode_drives_a_group_within_the_stage_bounds_and_hands_back_payloads(kind: str) -> None:
    fake = FakeController()
    meter = Meter()
    template = {"image": "x"}
    size = {"group_size": 4, "max_trajectories": 8, "stride": 4, "positive_fraction": (0.25, 0.5)}

    if kind == "sync":
        pipeline = Pipeline(**group_stages(kind, meter))

        def main_sync() -> Any:
            with controller_client(kind, fake) as client, client.create_rollout_group(template, name="g", **size) as group:
                return group.drive(pipeline.episode, poll_interval=0.01, timeout=20)

        result = within_limit(main_sync)
    else:
        pipeline = AsyncPipeline(**group_stages(kind, meter))

        async def main() -> Any:
            async with controller_client(kind, fake) as client:
                async with await client.create_rollout_group(template, name="g", **size) as group:
                    return await group.drive(pipeline.episode, poll_interval=0.01, timeout=20)

        result = asyncio.run(main())
    check_driven(result, fake)
    assert sorted(result.episodes) == ["g-0", "g-1", "g-2", "g-3"], "one stride sufficed"
    assert meter.peak["run"] == 3, "the run stage's bound holds for the group's episodes (4 Ready at once)"
    assert pipeline.stats.peak_running["run"] == 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_dispatcher_with_a_pipeline_episode_hands_back_bar_groups_with_payloads(kind: str) -> None:
    fake = FakeController()
    meter = Meter()
    # Prompt 1's first stride has 2 positives, enough; prompt 0's group asks 3 positives of 4, which needs
    # the second stride (where trajectory 7 breaks in run: aborted).
    requests = [
        GroupRequest({"image": "x"}, key=0, name="p0", group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.75, 0.75)),
        GroupRequest({"image": "x"}, key=1, name="p1", group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.25, 0.5)),
    ]
    out: list[Any] = []
    if kind == "sync":
        pipeline = Pipeline(**group_stages(kind, meter))

        def main_sync() -> None:
            with controller_client(kind, fake) as client, Dispatcher(
                client, max_in_flight=2, episode=pipeline.episode, poll_interval=0.01, timeout=20, progress=False,
            ) as dispatcher:
                out.extend(dispatcher.run(requests))

        within_limit(main_sync)
    else:
        pipeline = AsyncPipeline(**group_stages(kind, meter))

        async def main() -> None:
            async with controller_client(kind, fake) as client, AsyncDispatcher(
                client, max_in_flight=2, episode=pipeline.episode, poll_interval=0.01, timeout=20, progress=False,
            ) as dispatcher:
                out.extend([done async for done in dispatcher.run(requests)])

        asyncio.run(main())
    by_key = {done.key: done for done in out}
    assert sorted(by_key) == [0, 1] and all(done.ok for done in out), [d.error for d in out]
    check_driven(by_key[1].result, fake)
    two_strides = by_key[0].result
    assert isinstance(two_strides, DriveResult) and two_strides.selection == "Balanced"
    assert sorted(two_strides.episodes) == [f"p0-{i}" for i in range(8)]
    broken = two_strides.episodes["p0-7"]
    assert isinstance(broken.error, StageFailed) and broken.error.stage == "run" and broken.payload is None
    assert broken.result is not None and broken.result.status == "aborted"
    assert broken.result.message == "StageFailed: run: RuntimeError: the policy broke"
    assert [m.name for m in two_strides.group] == ["p0-1", "p0-2", "p0-5", "p0-0"]
    assert [p["tokens"][0] for p in two_strides.payloads] == [1, 2, 5, 0]
    assert not two_strides.episodes["p0-3"].in_group and two_strides.episodes["p0-3"].payload["tokens"] == [3] * 3, "kept, flagged"
    assert meter.peak["run"] == 3, "one bound for the run stage across both groups (8 trajectories Ready at once)"
    assert sorted(fake.groups_deleted) == ["p0", "p1"], "handed-over groups are deleted (delete_on_exit)"


# -- the block of docs/SDK.md -------------------------------------------------------------------------

DOC_SECTION = "Staged rollouts: `Pipeline`"


def test_the_pipeline_block_of_the_docs_runs_on_the_fake_controller(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeController()
    monkeypatch.setattr(orchard_env, "SandboxClient", lambda: SandboxClient(
        "http://gw", "t", namespace="ns", transport=httpx.MockTransport(fake.handle), retry=FAST))
    within_limit(lambda: exec(compile(sdk_doc_block(DOC_SECTION), "docs/SDK.md", "exec"), {}))
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines[:-1], key=lambda line: int(line.split()[0])) == [
        f"{i} {2 * i + i % 2} {1.0 if i % 2 == 0 else 0.0}" for i in range(6)]
    completed, peaks = lines[-1].split(" ", 1)
    assert completed == "6" and all(peak <= bound for peak, bound in zip(ast.literal_eval(peaks).values(), (4, 2, 4)))
    assert len(fake.created) == 6 and sorted(fake.deleted) == sorted(fake.created), "each task's sandbox deleted"


@pytest.mark.cluster
def test_the_pipeline_block_of_the_docs_runs(cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    run_sdk_doc_block(DOC_SECTION, cluster, monkeypatch, {'"busybox"': repr(cluster.image)})
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines[:-1], key=lambda line: int(line.split()[0])) == [
        f"{i} {2 * i + i % 2} {1.0 if i % 2 == 0 else 0.0}" for i in range(6)]
    assert lines[-1].startswith("6 ")
