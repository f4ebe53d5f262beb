"""Staged rollouts (the shape of SkyRL-Agent's async pipeline): each item goes through ``init`` (create or
claim a sandbox, prepare it), ``run`` (the agent loop, bounded by the inference server's concurrency) and
``reward`` (evaluation), each stage with its own bound, and moves on to the next stage as soon as it is
done: no batch waits for its slowest member.

>>> pipeline = AsyncPipeline(                                                # doctest: +SKIP
...     init=Stage(lambda task: client.create(image=task.image), concurrency=16),        # CPU, the cluster
...     run=Stage(agent_loop, concurrency=8),                                         # the GPU
...     reward=Stage(run_tests, concurrency=16),                                      # CPU
... )
>>> async with pipeline:                                                     # doctest: +SKIP
...     async for done in pipeline.run(tasks):            # in completion order
...         trainer.add(done.item, done.payload, done.reward) if done.ok else print(done.stage, done.error)

The rules, the same for :class:`AsyncPipeline` (tasks) and :class:`Pipeline` (worker threads); the engine
and its clean-up are the dispatchers' (``orchard_env._flow``):

- **Stages.** ``init(item) -> state``, ``run(item, state) -> payload``, ``reward(item, state, payload) ->
  reward``; ``init`` and ``reward`` are optional (without ``init`` the state is None). Each
  :class:`Stage` has its ``concurrency``: at most that many items in the stage at once. An item waits for a
  place in the next stage while holding its state (its sandbox), so ``max_in_flight`` (default: the sum of
  the stages' bounds) caps the items read from the input and not yet handed back.
- **Results** come out in completion order, one :class:`PipelineResult` per item: its ``payload`` (what
  ``run`` returned), ``reward``, ``index`` in the input, seconds per stage, or the ``error`` and the
  ``stage`` that raised it. A failing item never stops the others; an exception of the input iterable, and
  cancellation, are raised.
- **Release.** The state ``init`` returned is released once the item is done (or failed), before it is
  handed back: ``release(item, state)`` if given, else ``state.close()`` when the state has a ``close``
  (a sandbox from ``client.create()`` is deleted by its ``close``; the async one awaited). A state that is
  the item itself, or None, is never released.
- **Cancellation.** Leaving the ``with`` block early, an exception in the loop, ``aclose()``/``close()``,
  ``KeyboardInterrupt`` or cancelling the task releases the state of every item not handed back, an
  ``init`` under way included once it returns (the async pipeline runs it as a task of its own and waits up
  to ``CLOSE_GRACE`` seconds; the sync one's worker thread releases it itself). The async pipeline cancels
  the stages under way; the sync one cannot stop a stage function that is running (it ends when its
  sandbox is gone), but starts no further stage, and ``close`` waits up to ``CLOSE_GRACE`` seconds for its
  threads.
- **RolloutGroups (BAR).** ``pipeline.episode`` is an episode for :meth:`~orchard_env.RolloutGroup.drive`
  (or the dispatchers' ``episode=``): the controller creates the trajectory sandboxes, and each runs
  through ``init(sandbox)``, ``run`` and ``reward`` within the same per-stage bounds, shared by every group
  the pipeline serves. It answers ``(reward, payload)``: ``drive`` records the reward stage's value (BAR
  decides with it) and hands the run stage's payload back in the group's ``episodes`` and ``payloads``.
  A stage that raises raises :class:`StageFailed` (the trajectory is recorded aborted, ``EpisodeFailed``).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._flow import CLOSE_GRACE, NOTHING, AsyncFlow, Flow, Slot, Step, ThreadFlow, log

#: The stages, in order.
STAGES = ("init", "run", "reward")


@dataclass(frozen=True)
class Stage:
    """A stage of a pipeline: ``fn`` and the most items in it at once."""

    fn: Callable[..., Any]
    concurrency: int

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"a stage's fn must be callable, not {type(self.fn).__name__}")
        if self.concurrency < 1:
            raise ValueError("a stage's concurrency must be at least 1")


@dataclass(frozen=True)
class PipelineResult:
    """What a pipeline hands back for one input item."""

    item: Any
    index: int
    """The item's position in the input (results come in completion order)."""
    payload: Any = field(default=None, repr=False)
    """What ``run`` returned (tokens, logprobs, messages); None when it did not return."""
    reward: Any = None
    """What ``reward`` returned; None without a reward stage or when it did not return."""
    error: BaseException | None = None
    """The exception that ended the item (an ``Exception``; in a sync pipeline's worker thread also
    ``SystemExit`` and the like); None when every stage returned."""
    stage: str | None = None
    """The stage that raised ``error`` (``init``, ``run`` or ``reward``)."""
    seconds: Mapping[str, float] = field(default_factory=dict)
    """Seconds the item spent in each stage it entered (waits for a place in a stage not included)."""

    @property
    def ok(self) -> bool:
        """Whether every stage returned."""
        return self.error is None


@dataclass
class PipelineStats:
    """A pipeline's counts (live)."""

    submitted: int = 0
    """Items taken from the input."""
    in_flight: int = 0
    """Items taken and not yet handed back."""
    completed: int = 0
    """Items handed back that went through every stage."""
    failed: int = 0
    """Items handed back with an error."""
    peak_in_flight: int = 0
    running: dict[str, int] = field(default_factory=dict)
    """Items in each stage now."""
    peak_running: dict[str, int] = field(default_factory=dict)
    """The most items there were in each stage at once (never more than its ``concurrency``)."""


class StageFailed(Exception):
    """A stage of :meth:`AsyncPipeline.episode` (or :meth:`Pipeline.episode`) raised ``error``."""

    def __init__(self, stage: str, error: BaseException) -> None:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        super().__init__(f"{stage}: {text}")
        self.stage = stage
        self.error = error


class _Staging(Flow):
    """What both pipelines add to the engine: the stages as steps, the release, results and counts."""

    _noun = "pipeline"

    def _configure(
        self, init: Stage | None, run: Stage, reward: Stage | None, release: Callable[[Any, Any], Any] | None,
        max_in_flight: int | None,
    ) -> tuple[int, list[Step]]:
        stages = {"init": init, "run": run, "reward": reward}
        for name, stage in stages.items():
            if stage is not None and not isinstance(stage, Stage):
                raise TypeError(f"{name}= takes a Stage(fn, concurrency), not {type(stage).__name__}")
        if run is None:
            raise TypeError("a pipeline needs a run stage")
        #: The stages given, by name.
        self.stages: dict[str, Stage] = {name: stage for name, stage in stages.items() if stage is not None}
        self.release = release
        steps = [
            Step(name, getattr(self, f"_{name}_step"), stage.concurrency, acquires=name == "init")
            for name, stage in self.stages.items()
        ]
        if max_in_flight is None:
            max_in_flight = sum(stage.concurrency for stage in self.stages.values())
        self.stats = PipelineStats()
        return max_in_flight, steps

    def _after_init(self) -> None:
        self.stats.running = self._running
        self.stats.peak_running = self._peak_running

    @staticmethod
    def _state(slot: Slot) -> Any:
        return None if slot.resource is NOTHING else slot.resource

    def _dispose_after_steps(self) -> bool:
        return True

    def _releasing(self, slot: Slot) -> Any:
        """Starts releasing the slot's state: the release function's answer (maybe an awaitable)."""
        state = slot.resource
        if state is None or state is slot.item:
            return None
        if self.release is not None:
            return self.release(slot.item, state)
        close = getattr(state, "close", None)
        return close() if callable(close) else None

    def _outcome(self, slot: Slot) -> PipelineResult:
        return PipelineResult(
            slot.item, slot.index, payload=slot.values.get("run"), reward=slot.values.get("reward"),
            error=slot.error, stage=slot.stage, seconds=dict(slot.seconds),
        )

    def _opened(self, slot: Slot) -> None:
        self.stats.submitted += 1
        self.stats.in_flight = self.in_flight
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)

    def _handed(self, slot: Slot, outcome: PipelineResult) -> None:
        self.stats.in_flight = self.in_flight
        if outcome.ok:
            self.stats.completed += 1
        else:
            self.stats.failed += 1

    def _emptied(self) -> None:
        self.stats.in_flight = 0

    def _episode_value(self, slot: Slot) -> Any:
        if slot.error is not None:
            raise StageFailed(slot.stage or "?", slot.error) from slot.error
        if "reward" in self.stages:
            return slot.values["reward"], slot.values["run"]
        return slot.values["run"]


def _log_release_failure(slot: Slot, error: Exception) -> None:
    log.warning("pipeline: cannot release the state of item %s: %r", slot.index, error)


async def _called(fn: Callable[..., Any], *args: Any) -> Any:
    value = fn(*args)
    return await value if inspect.isawaitable(value) else value


# -- asyncio ---------------------------------------------------------------------------------------


class AsyncPipeline(_Staging, AsyncFlow):
    """Items through ``init``, ``run`` and ``reward``, each stage bounded, as tasks (see the module's
    documentation for the stages, results, release and cancellation)::

        async with AsyncPipeline(init=Stage(create, 16), run=Stage(agent, 8), reward=Stage(score, 16)) as p:
            async for done in p.run(items):                 # an iterable or async iterable
                ...

    Stage functions may be coroutine functions or plain ones (a plain one runs on the event loop: use
    ``asyncio.to_thread`` inside it for blocking work). A pipeline belongs to the event loop it first runs
    on. One ``run`` at a time; :meth:`episode` may be used meanwhile, within the same bounds."""

    def __init__(
        self, *, init: Stage | None = None, run: Stage, reward: Stage | None = None,
        release: Callable[[Any, Any], Any] | None = None, max_in_flight: int | None = None,
    ) -> None:
        limit, steps = self._configure(init, run, reward, release, max_in_flight)
        AsyncFlow.__init__(self, limit, steps)
        self._after_init()

    def run(self, items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[PipelineResult]:
        """The results, in completion order, of ``items`` (read lazily)."""
        return self._start(items)

    async def episode(self, item: Any) -> Any:
        """Runs one item (for :meth:`~orchard_env.AsyncRolloutGroup.drive`, a trajectory's sandbox) through
        the stages within the pipeline's bounds, releases its state, and answers ``(reward, payload)`` (the
        run stage's value alone without a reward stage); :class:`StageFailed` when a stage raises."""
        slot = Slot(item, -1)
        try:
            await self._through(slot)
        finally:
            await self._release(slot)
        return self._episode_value(slot)

    async def _init_step(self, slot: Slot) -> Any:
        return await _called(self.stages["init"].fn, slot.item)

    async def _run_step(self, slot: Slot) -> Any:
        return await _called(self.stages["run"].fn, slot.item, self._state(slot))

    async def _reward_step(self, slot: Slot) -> Any:
        return await _called(self.stages["reward"].fn, slot.item, self._state(slot), slot.values["run"])

    async def _dispose(self, slot: Slot) -> None:
        try:
            value = self._releasing(slot)
            if inspect.isawaitable(value):
                await value
        except Exception as error:
            _log_release_failure(slot, error)

    async def aclose(self) -> None:
        """Ends the run under way: releases the state of every item not handed back."""
        await AsyncFlow.aclose(self)

    async def __aenter__(self) -> AsyncPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- threads ---------------------------------------------------------------------------------------


class Pipeline(_Staging, ThreadFlow):
    """The synchronous :class:`AsyncPipeline`: each item in flight is a worker thread going through the
    stages, each stage bounded by a semaphore::

        with Pipeline(init=Stage(create, 16), run=Stage(agent, 8), reward=Stage(score, 16)) as pipeline:
            for done in pipeline.run(items):                # an iterable
                ...

    Stage functions are plain (blocking) functions; coroutine functions are refused (``TypeError``: use
    :class:`AsyncPipeline`). One ``run`` at a time; :meth:`episode` may be used meanwhile (from
    ``drive``'s worker threads), within the same bounds."""

    def __init__(
        self, *, init: Stage | None = None, run: Stage, reward: Stage | None = None,
        release: Callable[[Any, Any], Any] | None = None, max_in_flight: int | None = None,
    ) -> None:
        limit, steps = self._configure(init, run, reward, release, max_in_flight)
        for name, stage in self.stages.items():
            if inspect.iscoroutinefunction(stage.fn):
                raise TypeError(f"the {name} stage is a coroutine function: use AsyncPipeline")
        ThreadFlow.__init__(self, limit, steps)
        self._after_init()

    def run(self, items: Iterable[Any]) -> Iterator[PipelineResult]:
        """The results, in completion order, of ``items`` (read lazily)."""
        return self._start(items)

    def episode(self, item: Any) -> Any:
        """Runs one item (for :meth:`~orchard_env.RolloutGroup.drive`, a trajectory's sandbox) through the
        stages within the pipeline's bounds, releases its state, and answers ``(reward, payload)`` (the run
        stage's value alone without a reward stage); :class:`StageFailed` when a stage raises."""
        slot = Slot(item, -1)
        try:
            self._through(slot)
        finally:
            self._release(slot)
        return self._episode_value(slot)

    def _init_step(self, slot: Slot) -> Any:
        return self.stages["init"].fn(slot.item)

    def _run_step(self, slot: Slot) -> Any:
        return self.stages["run"].fn(slot.item, self._state(slot))

    def _reward_step(self, slot: Slot) -> Any:
        return self.stages["reward"].fn(slot.item, self._state(slot), slot.values["run"])

    def _dispose(self, slot: Slot) -> None:
        try:
            self._releasing(slot)
        except Exception as error:
            _log_release_failure(slot, error)

    def close(self) -> None:
        """Ends the run under way: releases the state of every item not handed back."""
        ThreadFlow.close(self)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["CLOSE_GRACE", "AsyncPipeline", "Pipeline", "PipelineResult", "PipelineStats", "Stage", "StageFailed"]
