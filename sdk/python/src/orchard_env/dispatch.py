"""Many prompts at once: submit one RolloutGroup per prompt with a bound on groups in flight and receive
each group as it completes (the shape of SkyRL-Agent's async pipeline).

>>> async with AsyncDispatcher(client, max_in_flight=16) as dispatcher:      # doctest: +SKIP
...     async for done in dispatcher.run(GroupRequest(template(p), key=p.id, group_size=8) for p in prompts):
...         if done.ok:
...             trainer.add(done.key, done.result.rewards, done.result.artifacts)

The rules, the same for :class:`AsyncDispatcher` and :class:`Dispatcher`:

- **Back-pressure.** ``run`` reads its requests lazily: it never holds more than ``max_in_flight`` groups
  that it created (or is creating) and has not yet handed to the caller. A completed group keeps its slot
  until the caller takes it, so a slow consumer slows submission instead of piling up groups.
- **Completion order.** Each group is created with ``create_rollout_group`` and waited for with the group's
  own ``wait`` (the gateway's watch-driven long-poll) until it is Complete or Failed; results come out in
  the order the groups finish.
- **Errors are yielded, never raised** (for the groups): a creation or a wait that raises an
  ``Exception`` (``InvalidRequest``, ``Forbidden``, ``Timeout`` after ``timeout`` seconds, ...) becomes a
  :class:`DispatchResult` with ``error`` set, and the other groups go on. A group the controller recorded
  ``Failed`` is a result without ``error`` whose ``ok`` is False. What does raise: an exception of the
  request iterable itself, a request that is not a :class:`GroupRequest` (``TypeError``), and
  ``KeyboardInterrupt``/cancellation.
- **Groups handed over.** A yielded group whose request has ``delete_on_exit=True`` (the default, as for
  ``create_rollout_group``) is deleted when the caller asks for the next result or leaves the loop: its
  :class:`~orchard_env.GroupResult` (rewards, artifacts, trajectories) was read before, so nothing the
  trainer needs is lost, and finished groups do not pile up in the namespace. With
  ``delete_on_exit=False`` the group is the caller's (delete it with ``client.rollout_group(name).delete()``).
- **Cancellation.** Leaving the ``with`` block early, an exception in the loop body, closing the
  iterator (``aclose()``/``close()``), ``KeyboardInterrupt`` or cancelling the task deletes every group
  the dispatcher created and has not yielded, including those whose create request was under way (best
  effort: failures are logged on the ``orchard_env`` logger, not raised). Use the dispatcher as a context
  manager (or ``contextlib.aclosing``/``closing`` on ``run``'s iterator): an iterator abandoned in a
  ``for`` loop is only closed when it is garbage-collected.
- **Progress.** With ``progress=True``, or by default when stderr is a terminal, one line on stderr is
  rewritten as groups are submitted and complete: submitted, in flight, completed, failed, and the count
  of each selection (Balanced, Relaxed, TopRanked, Dropped). ``progress=False`` turns it off.

``max_in_flight`` bounds groups; to bound the trajectory sandboxes across all groups, name a
RolloutQueue with ``queue=`` in the requests.

**Trainer-driven groups.** With ``episode=`` (groups whose template has no ``run``), each group is driven
with ``drive(episode, concurrency=episode_concurrency, timeout=timeout, poll_interval=poll_interval)``
instead of waited for, and its result is a :class:`~orchard_env.DriveResult` with the episodes' payloads.
Give it a pipeline's ``episode`` (:mod:`orchard_env.pipeline`) to bound each stage of the trajectories'
work across every group in flight. The dispatchers and the pipelines share their engine and its clean-up
(``orchard_env._flow``).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

# CLOSE_GRACE: seconds ``close`` waits for create requests under way (to delete what they created) and,
# in the sync dispatcher, for the worker threads to notice that their groups are gone.
from ._flow import CLOSE_GRACE, NOTHING, AsyncFlow, Slot, Step, ThreadFlow, log  # noqa: F401
from .aio import AsyncRolloutGroup, AsyncSandbox, AsyncSandboxClient
from .client import RolloutGroup, Sandbox, SandboxClient
from .models import GroupResult

#: Least seconds between two renders of the progress line (the last one is always rendered).
PROGRESS_INTERVAL = 0.1


@dataclass(frozen=True)
class GroupRequest:
    """One RolloutGroup for a dispatcher: ``template`` and the keyword arguments of
    :meth:`~orchard_env.SandboxClient.create_rollout_group`, plus ``key``, the caller's own payload (a
    prompt id, the prompt itself...), handed back untouched in :attr:`DispatchResult.request`."""

    template: Mapping[str, Any]
    _: KW_ONLY
    key: Any = None
    group_size: int | None = None
    max_trajectories: int | None = None
    stride: int | None = None
    positive_fraction: tuple[float, float] | Mapping[str, float] | None = None
    early_stop: str | None = None
    filter: Mapping[str, Any] | bool | None = None
    trajectory_timeout_seconds: int | None = None
    cleanup: str | None = None
    queue: str | None = None
    active_deadline_seconds: int | None = None
    retry: Mapping[str, Any] | None = None
    launch_jitter_seconds: float | None = None
    name: str | None = None
    generate_name: str | None = None
    labels: Mapping[str, str] | None = None
    namespace: str | None = None
    delete_on_exit: bool = True
    """Delete the group once it has been yielded (see the module's documentation)."""

    def create_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``create_rollout_group`` (every field but ``template`` and ``key``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("template", "key")}


@dataclass(frozen=True)
class DispatchResult:
    """What a dispatcher yields for one request: the recorded group, or the error that ended it."""

    request: GroupRequest
    result: GroupResult | None
    """The group as ``wait`` answered it (Complete or Failed); None when ``error`` is set."""
    error: Exception | None = None
    """Why the group could not be created or waited for (``InvalidRequest``, ``Timeout``...)."""
    name: str | None = None
    """The RolloutGroup's name; None when its creation failed."""
    namespace: str | None = None

    @property
    def key(self) -> Any:
        """The request's ``key``."""
        return self.request.key

    @property
    def ok(self) -> bool:
        """Whether the group was recorded (``Complete``; a ``Dropped`` selection included)."""
        return self.error is None and self.result is not None and self.result.complete


@dataclass
class DispatchStats:
    """A dispatcher's counts (also what the progress line shows)."""

    submitted: int = 0
    """Requests taken from the input (their group created or being created)."""
    in_flight: int = 0
    """Groups created (or being created) and not yet yielded."""
    completed: int = 0
    """Yielded results that are ``ok``."""
    failed: int = 0
    """Yielded results with an error or a ``Failed`` group."""
    peak_in_flight: int = 0
    """The most groups in flight at once so far (never more than ``max_in_flight``)."""
    selections: Counter[str] = field(default_factory=Counter)
    """Selections of the completed groups (Balanced, Relaxed, TopRanked, Dropped)."""

    def line(self) -> str:
        """The progress line's text."""
        text = (
            f"rollout groups: {self.submitted} submitted, {self.in_flight} in flight, "
            f"{self.completed} completed, {self.failed} failed"
        )
        if self.selections:
            text += " | " + ", ".join(f"{name} {count}" for name, count in sorted(self.selections.items()))
        return text


class _Progress:
    """The progress line: rewritten in place on stderr (``\\r``), at most every ``PROGRESS_INTERVAL``."""

    def __init__(self, enabled: bool | None) -> None:
        if enabled is None:
            isatty = getattr(sys.stderr, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._width = 0
        self._last = float("-inf")

    def update(self, stats: DispatchStats, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < PROGRESS_INTERVAL):
            return
        self._last = now
        text = stats.line()
        sys.stderr.write("\r" + text.ljust(self._width))
        sys.stderr.flush()
        self._width = len(text)

    def close(self, stats: DispatchStats) -> None:
        if self.enabled and self._width:
            self.update(stats, force=True)
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._width = 0


class _GroupSlot(Slot):
    """A group in flight: the slot of its request, and the namespace it goes to."""

    def __init__(self, request: GroupRequest, index: int, namespace: str) -> None:
        super().__init__(request, index)
        self.namespace = namespace


class _Dispatching:
    """What both dispatchers add to their engine (:mod:`._flow`): each group is an item whose first step
    creates it (the resource) and whose second waits for it (or drives it); the counts and the progress
    line."""

    _noun = "dispatcher"

    def _configure(
        self, client: Any, timeout: float | None, progress: bool | None, episode: Callable[[Any], Any] | None,
        episode_concurrency: int | None, poll_interval: float,
    ) -> None:
        self.client = client
        self.timeout = timeout
        #: With an episode, each group is driven (``drive``) rather than waited for.
        self.episode = episode
        self.episode_concurrency = episode_concurrency
        self.poll_interval = poll_interval
        self.stats = DispatchStats()
        self._progress = _Progress(progress)

    def _steps(self) -> list[Step]:
        return [Step("create", self._create, acquires=True), Step("wait", self._wait)]

    def _create(self, slot: Slot) -> Any:
        raise NotImplementedError

    def _wait(self, slot: Slot) -> Any:
        raise NotImplementedError

    def _admit(self, item: Any, index: int) -> Slot:
        if not isinstance(item, GroupRequest):
            raise TypeError(f"a dispatcher takes GroupRequest values, not {type(item).__name__}")
        return _GroupSlot(item, index, item.namespace or self.client.namespace)

    def _outcome(self, slot: _GroupSlot) -> DispatchResult:  # type: ignore[override]
        group = None if slot.resource is NOTHING else slot.resource
        result = None if slot.error else slot.values.get("wait")
        return DispatchResult(slot.item, result, slot.error, group.name if group is not None else None, slot.namespace)

    def _dispose_after_hand_over(self, slot: Slot) -> bool:
        return bool(slot.item.delete_on_exit)

    def _opened(self, slot: Slot) -> None:
        self.stats.submitted += 1
        self.stats.in_flight = self.in_flight  # type: ignore[attr-defined]
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        self._progress.update(self.stats)

    def _handed(self, slot: Slot, outcome: DispatchResult) -> None:
        self.stats.in_flight = self.in_flight  # type: ignore[attr-defined]
        if outcome.ok:
            self.stats.completed += 1
            self.stats.selections[outcome.result.selection or "Unknown"] += 1  # type: ignore[union-attr]
        else:
            self.stats.failed += 1
        self._progress.update(self.stats, force=not self.stats.in_flight)

    def _emptied(self) -> None:
        self.stats.in_flight = 0

    def _finished(self) -> None:
        self._progress.close(self.stats)


def _log_delete_failure(group: Any, error: Exception) -> None:
    log.warning("cannot delete rollout group %s/%s: %s", group.namespace, group.name, error)


# -- asyncio ---------------------------------------------------------------------------------------


class AsyncDispatcher(_Dispatching, AsyncFlow):
    """Submits RolloutGroups with at most ``max_in_flight`` in flight and yields each as it completes
    (see the module's documentation for back-pressure, errors, deletion and cancellation)::

        async with AsyncDispatcher(client, max_in_flight=16) as dispatcher:
            async for done in dispatcher.run(requests):    # an iterable or async iterable of GroupRequest
                ...

    ``timeout`` bounds each group's wait (then a ``Timeout`` error result); ``progress``: see above.
    Each group is a task: create, then ``AsyncRolloutGroup.wait``, or, with ``episode``, ``await
    group.drive(episode, concurrency=episode_concurrency, timeout=timeout, poll_interval=poll_interval)``
    (trainer-driven groups: the results are :class:`~orchard_env.DriveResult` values, with the episodes'
    payloads). One ``run`` at a time."""

    def __init__(
        self, client: AsyncSandboxClient, *, max_in_flight: int = 16, timeout: float | None = None,
        progress: bool | None = None, episode: Callable[[AsyncSandbox], Any] | None = None,
        episode_concurrency: int | None = None, poll_interval: float = 1.0,
    ) -> None:
        self._configure(client, timeout, progress, episode, episode_concurrency, poll_interval)
        AsyncFlow.__init__(self, max_in_flight, self._steps())

    def run(self, requests: Iterable[GroupRequest] | AsyncIterable[GroupRequest]) -> AsyncIterator[DispatchResult]:
        """The results, in completion order, of the groups of ``requests`` (read lazily)."""
        return self._start(requests)

    async def _create(self, slot: Slot) -> AsyncRolloutGroup:
        return await self.client.create_rollout_group(slot.item.template, **slot.item.create_kwargs())

    async def _wait(self, slot: Slot) -> GroupResult:
        if self.episode is not None:
            return await slot.resource.drive(
                self.episode, concurrency=self.episode_concurrency, timeout=self.timeout, poll_interval=self.poll_interval)
        return await slot.resource.wait(self.timeout)

    async def _dispose(self, slot: Slot) -> None:
        group = slot.resource
        try:
            await group.delete()
        except Exception as error:
            _log_delete_failure(group, error)

    async def aclose(self) -> None:
        """Ends the run under way: deletes the groups not yielded (and the last yielded one with
        ``delete_on_exit``)."""
        await AsyncFlow.aclose(self)

    async def __aenter__(self) -> AsyncDispatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- threads ---------------------------------------------------------------------------------------


class Dispatcher(_Dispatching, ThreadFlow):
    """The synchronous :class:`AsyncDispatcher`, with the same rules::

        with Dispatcher(client, max_in_flight=16) as dispatcher:
            for done in dispatcher.run(requests):           # an iterable of GroupRequest
                ...

    Like the rest of the sync client (``RolloutGroup.drive`` runs episodes in threads, heartbeats are
    threads), each group in flight is a worker thread running ``create_rollout_group`` and
    ``RolloutGroup.wait`` on the caller's :class:`~orchard_env.SandboxClient` (its HTTP pool is shared
    by threads), so a group's wait is one blocking long-poll and the caller's client, transport and
    settings are used as they are; running the async dispatcher in a private event loop would need a
    second, async client. Threads cannot be cancelled: on close the dispatcher deletes the groups not
    yielded, which ends their threads' waits (the gateway answers 404 at once), and a thread still
    creating a group deletes it as soon as its create request returns. ``close`` waits up to
    ``CLOSE_GRACE`` seconds for that. With ``episode``, each thread drives its group
    (``RolloutGroup.drive``, whose episodes run in threads of their own) instead of waiting for it."""

    def __init__(
        self, client: SandboxClient, *, max_in_flight: int = 16, timeout: float | None = None,
        progress: bool | None = None, episode: Callable[[Sandbox], Any] | None = None,
        episode_concurrency: int | None = None, poll_interval: float = 1.0,
    ) -> None:
        self._configure(client, timeout, progress, episode, episode_concurrency, poll_interval)
        ThreadFlow.__init__(self, max_in_flight, self._steps())

    def run(self, requests: Iterable[GroupRequest]) -> Iterator[DispatchResult]:
        """The results, in completion order, of the groups of ``requests`` (read lazily)."""
        return self._start(requests)

    def _create(self, slot: Slot) -> RolloutGroup:
        return self.client.create_rollout_group(slot.item.template, **slot.item.create_kwargs())

    def _wait(self, slot: Slot) -> GroupResult:
        if self.episode is not None:
            return slot.resource.drive(
                self.episode, concurrency=self.episode_concurrency, timeout=self.timeout, poll_interval=self.poll_interval)
        return slot.resource.wait(self.timeout)

    def _dispose(self, slot: Slot) -> None:
        group = slot.resource
        try:
            group.delete()
        except Exception as error:
            _log_delete_failure(group, error)

    def close(self) -> None:
        """Ends the run under way: deletes the groups not yielded (and the last yielded one with
        ``delete_on_exit``)."""
        ThreadFlow.close(self)

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AsyncDispatcher", "DispatchResult", "DispatchStats", "Dispatcher", "GroupRequest"]
