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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Generator, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from ._core import log
from .aio import AsyncRolloutGroup, AsyncSandboxClient
from .client import RolloutGroup, SandboxClient
from .models import GroupResult

#: Seconds ``close`` waits for create requests under way (to delete what they created) and, in the sync
#: dispatcher, for the worker threads to notice that their groups are gone.
CLOSE_GRACE = 60.0
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


class _Slot:
    """One request in flight: its group handle once created, and its outcome."""

    def __init__(self, request: GroupRequest, namespace: str) -> None:
        self.request = request
        self.namespace = namespace
        self.group: Any = None
        self.result: GroupResult | None = None
        self.error: Exception | None = None
        #: The worker (a task or a thread's future) and, async only, the create request's own task.
        self.worker: Any = None
        self.creating: asyncio.Future[Any] | None = None

    def outcome(self) -> DispatchResult:
        name = self.group.name if self.group is not None else None
        return DispatchResult(self.request, None if self.error else self.result, self.error, name, self.namespace)


class _Book:
    """What both dispatchers share: the slots not yet yielded, the counts and the progress line."""

    def __init__(self, max_in_flight: int, timeout: float | None, progress: bool | None) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self.timeout = timeout
        self.stats = DispatchStats()
        self._progress = _Progress(progress)
        self._slots: dict[int, _Slot] = {}

    def _has_room(self) -> bool:
        return len(self._slots) < self.max_in_flight

    def _open(self, request: Any, namespace: str) -> _Slot:
        if not isinstance(request, GroupRequest):
            raise TypeError(f"a dispatcher takes GroupRequest values, not {type(request).__name__}")
        slot = _Slot(request, request.namespace or namespace)
        self._slots[id(slot)] = slot
        self.stats.submitted += 1
        self.stats.in_flight = len(self._slots)
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        self._progress.update(self.stats)
        return slot

    def _hand_over(self, slot: _Slot) -> DispatchResult:
        """``slot`` is being yielded: it leaves the slots and is counted."""
        self._slots.pop(id(slot), None)
        done = slot.outcome()
        self.stats.in_flight = len(self._slots)
        if done.ok:
            self.stats.completed += 1
            self.stats.selections[done.result.selection or "Unknown"] += 1  # type: ignore[union-attr]
        else:
            self.stats.failed += 1
        self._progress.update(self.stats, force=not self._slots)
        return done

    def _take_unyielded(self) -> list[_Slot]:
        slots = list(self._slots.values())
        self._slots.clear()
        self.stats.in_flight = 0
        return slots


def _log_delete_failure(group: Any, error: Exception) -> None:
    log.warning("cannot delete rollout group %s/%s: %s", group.namespace, group.name, error)


# -- asyncio ---------------------------------------------------------------------------------------


async def _requests_of(requests: Iterable[GroupRequest] | AsyncIterable[GroupRequest]) -> AsyncIterator[GroupRequest]:
    if isinstance(requests, AsyncIterable):
        async for request in requests:
            yield request
    else:
        for request in requests:
            yield request


class AsyncDispatcher(_Book):
    """Submits RolloutGroups with at most ``max_in_flight`` in flight and yields each as it completes
    (see the module's documentation for back-pressure, errors, deletion and cancellation)::

        async with AsyncDispatcher(client, max_in_flight=16) as dispatcher:
            async for done in dispatcher.run(requests):    # an iterable or async iterable of GroupRequest
                ...

    ``timeout`` bounds each group's wait (then a ``Timeout`` error result); ``progress``: see above.
    Each group is a task: create, then ``AsyncRolloutGroup.wait``. One ``run`` at a time."""

    def __init__(
        self, client: AsyncSandboxClient, *, max_in_flight: int = 16, timeout: float | None = None,
        progress: bool | None = None,
    ) -> None:
        super().__init__(max_in_flight, timeout, progress)
        self.client = client
        self._active: AsyncGenerator[DispatchResult, None] | None = None

    def run(self, requests: Iterable[GroupRequest] | AsyncIterable[GroupRequest]) -> AsyncIterator[DispatchResult]:
        """The results, in completion order, of the groups of ``requests`` (read lazily)."""
        if self._active is not None:
            raise RuntimeError("this dispatcher is already running; one run() at a time")
        self._active = self._run(requests)
        return self._active

    async def _run(self, requests: Iterable[GroupRequest] | AsyncIterable[GroupRequest]) -> AsyncGenerator[DispatchResult, None]:
        source = _requests_of(requests)
        finished: asyncio.Queue[_Slot] = asyncio.Queue()
        handed: _Slot | None = None
        try:
            exhausted = False
            while True:
                while not exhausted and self._has_room():
                    try:
                        request = await anext(source)
                    except StopAsyncIteration:
                        exhausted = True
                        break
                    slot = self._open(request, self.client.namespace)
                    slot.worker = asyncio.create_task(self._work(slot, finished), name="orchard-dispatch")
                if not self._slots:
                    break
                handed = await finished.get()
                yield self._hand_over(handed)
                await self._release(handed)
                handed = None
        finally:
            self._active = None
            if handed is not None:
                await self._release(handed)
            await self._abort()
            await source.aclose()  # type: ignore[attr-defined]
            self._progress.close(self.stats)

    async def _work(self, slot: _Slot, finished: asyncio.Queue[_Slot]) -> None:
        try:
            # Its own task, shielded: a cancellation while the create request is under way must not lose
            # the name of a group the gateway created anyway (_abort waits for it and deletes the group).
            slot.creating = asyncio.ensure_future(
                self.client.create_rollout_group(slot.request.template, **slot.request.create_kwargs())
            )
            slot.group = await asyncio.shield(slot.creating)
            slot.result = await slot.group.wait(self.timeout)
        except Exception as error:
            slot.error = error
        finished.put_nowait(slot)

    async def _release(self, slot: _Slot) -> None:
        if slot.request.delete_on_exit and slot.group is not None:
            await self._delete(slot.group)

    async def _delete(self, group: AsyncRolloutGroup) -> None:
        try:
            await group.delete()
        except Exception as error:
            _log_delete_failure(group, error)

    async def _abort(self) -> None:
        """Cancels the groups not yielded and deletes those that exist (best effort)."""
        slots = self._take_unyielded()
        if not slots:
            return
        for slot in slots:
            slot.worker.cancel()
        await asyncio.gather(*(slot.worker for slot in slots), return_exceptions=True)
        await asyncio.gather(*(self._abort_slot(slot) for slot in slots))

    async def _abort_slot(self, slot: _Slot) -> None:
        group = slot.group
        if group is None and slot.creating is not None:
            try:
                group = await asyncio.wait_for(asyncio.shield(slot.creating), CLOSE_GRACE)
            except TimeoutError:
                log.warning("a rollout group of %s was still being created after %ss; not deleted", slot.namespace, CLOSE_GRACE)
                return
            except Exception:
                return  # never created
        if group is not None:
            await self._delete(group)

    async def aclose(self) -> None:
        """Ends the run under way: deletes the groups not yielded (and the last yielded one with
        ``delete_on_exit``)."""
        active = self._active
        if active is not None:
            with contextlib.suppress(RuntimeError):  # running in another task: it cleans up when it ends
                await active.aclose()
            self._active = None
        await self._abort()

    async def __aenter__(self) -> AsyncDispatcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- threads ---------------------------------------------------------------------------------------


class Dispatcher(_Book):
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
    ``CLOSE_GRACE`` seconds for that."""

    def __init__(
        self, client: SandboxClient, *, max_in_flight: int = 16, timeout: float | None = None,
        progress: bool | None = None,
    ) -> None:
        super().__init__(max_in_flight, timeout, progress)
        self.client = client
        self._active: Generator[DispatchResult, None, None] | None = None
        self._lock = threading.Lock()
        self._closing = False
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def run(self, requests: Iterable[GroupRequest]) -> Iterator[DispatchResult]:
        """The results, in completion order, of the groups of ``requests`` (read lazily)."""
        if self._active is not None:
            raise RuntimeError("this dispatcher is already running; one run() at a time")
        self._active = self._run(requests)
        return self._active

    def _run(self, requests: Iterable[GroupRequest]) -> Generator[DispatchResult, None, None]:
        source = iter(requests)
        finished: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._closing = False
        self._pool = concurrent.futures.ThreadPoolExecutor(self.max_in_flight, thread_name_prefix="orchard-dispatch")
        handed: _Slot | None = None
        try:
            exhausted = False
            while True:
                while not exhausted and self._has_room():
                    try:
                        request = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    with self._lock:
                        slot = self._open(request, self.client.namespace)
                    slot.worker = self._pool.submit(self._work, slot, finished)
                if not self._slots:
                    break
                handed = finished.get()
                with self._lock:
                    done = self._hand_over(handed)
                yield done
                self._release(handed)
                handed = None
        finally:
            self._active = None
            if handed is not None:
                self._release(handed)
            self._abort()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self._progress.close(self.stats)

    def _work(self, slot: _Slot, finished: queue.SimpleQueue[_Slot]) -> None:
        try:
            group = self.client.create_rollout_group(slot.request.template, **slot.request.create_kwargs())
            with self._lock:
                slot.group = group
                closing = self._closing
            if closing:  # the dispatcher closed while the group was being created: nobody else knows it
                self._delete(group)
                return
            slot.result = group.wait(self.timeout)
        except Exception as error:
            slot.error = error
        finished.put(slot)

    def _release(self, slot: _Slot) -> None:
        if slot.request.delete_on_exit and slot.group is not None:
            self._delete(slot.group)

    def _delete(self, group: RolloutGroup) -> None:
        try:
            group.delete()
        except Exception as error:
            _log_delete_failure(group, error)

    def _abort(self) -> None:
        """Deletes the groups not yielded (best effort) and waits for their threads."""
        with self._lock:
            self._closing = True
            slots = self._take_unyielded()
            groups = [slot.group for slot in slots if slot.group is not None]
        for group in groups:
            self._delete(group)
        workers = [slot.worker for slot in slots if slot.worker is not None]
        _, stuck = concurrent.futures.wait(workers, timeout=CLOSE_GRACE)
        if stuck:
            log.warning("%d dispatcher threads still busy %ss after close", len(stuck), CLOSE_GRACE)

    def close(self) -> None:
        """Ends the run under way: deletes the groups not yielded (and the last yielded one with
        ``delete_on_exit``)."""
        active = self._active
        if active is not None:
            with contextlib.suppress(ValueError):  # running in another thread: it cleans up when it ends
                active.close()
            self._active = None
        self._abort()

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["AsyncDispatcher", "DispatchResult", "DispatchStats", "Dispatcher", "GroupRequest"]
