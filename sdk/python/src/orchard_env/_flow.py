"""Items through bounded stages, with clean-up: the one engine of the dispatchers (``dispatch.py``) and the
pipelines (``pipeline.py``), for asyncio (:class:`AsyncFlow`, a task per item) and for threads
(:class:`ThreadFlow`, a worker thread per item). Nothing here talks to the gateway: a stage is a callable.

An item goes through the flow's steps in order, each step within its gate (at most ``limit`` items in
that step at once), and is handed to the caller, in completion order, once it went through every step or
one raised (an ``Exception`` ends the item, recorded in its :class:`Slot`; the others go on). At most
``max_in_flight`` items are taken from the input and not yet handed over: a finished item keeps its place
until the caller takes it, so a slow consumer slows the reading of the input.

The first step may *acquire* a resource (a RolloutGroup, a sandbox): what it answers is kept in
``Slot.resource`` and disposed of exactly once, by ``_dispose``: after the last step or after the hand-over,
as the subclass says, and always when the flow closes before handing the item over (leaving the loop, an
exception, ``close()``/``aclose()``, ``KeyboardInterrupt``, cancelling the task). An acquiring step under way
when the flow closes is not lost: the async flow runs it as a task of its own, shielded from the
cancellation, and waits up to ``CLOSE_GRACE`` seconds for it; a worker thread that gets its resource after
the close disposes of it at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("orchard_env")

#: Seconds a closing flow waits for acquiring steps under way (to dispose of what they acquire) and, for
#: threads, for the worker threads to end.
CLOSE_GRACE = 60.0

#: ``Slot.resource`` before a resource was acquired (None may be a resource).
NOTHING: Any = object()


@dataclass(frozen=True)
class Step:
    """One step of a flow: ``call(slot)`` answers the step's value (a coroutine function for
    :class:`AsyncFlow`, a blocking function for :class:`ThreadFlow`); at most ``limit`` items in it at
    once (None: only ``max_in_flight`` bounds it). ``acquires``: its value is the item's resource (the
    first step only)."""

    name: str
    call: Callable[[Slot], Any]
    limit: int | None = None
    acquires: bool = False


class Slot:
    """One item in flight: what its steps answered, its resource, and how it ended."""

    def __init__(self, item: Any, index: int) -> None:
        self.item = item
        #: Its position in the input (0-based; -1 for an item outside a run).
        self.index = index
        #: Each finished step's value, by step name.
        self.values: dict[str, Any] = {}
        self.resource: Any = NOTHING
        #: The exception that ended it, and the step that raised it.
        self.error: BaseException | None = None
        self.stage: str | None = None
        #: Seconds spent in each step it entered (the wait for the step's gate not included).
        self.seconds: dict[str, float] = {}
        #: Its worker (a task, or a thread's future).
        self.worker: Any = None
        #: Async: the acquiring step's own task.
        self.acquiring: asyncio.Future[Any] | None = None
        #: Async: the disposal's task; threads: True once a thread took the disposal on.
        self.disposal: Any = None


class Flow:
    """What both engines share: the steps, the slots not yet handed over and the count of items in each
    step. Subclasses (the dispatchers and pipelines) fill in the hooks."""

    #: What the subclass is called in messages ("dispatcher", "pipeline").
    _noun = "flow"

    def __init__(self, max_in_flight: int, steps: Iterable[Step]) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.steps = list(steps)
        for step in self.steps:
            if step.limit is not None and step.limit < 1:
                raise ValueError(f"the {step.name} stage's concurrency must be at least 1")
        if any(step.acquires for step in self.steps[1:]):
            raise ValueError("only the first step may acquire a resource")
        self.max_in_flight = max_in_flight
        self._slots: dict[int, Slot] = {}
        self._submitted = 0
        #: Items in each step now, and the most there were at once.
        self._running = {step.name: 0 for step in self.steps}
        self._peak_running = {step.name: 0 for step in self.steps}

    # -- hooks -----------------------------------------------------------------------------------------

    def _admit(self, item: Any, index: int) -> Slot:
        """The slot of an item read from the input (raise to refuse it: the run raises, after clean-up)."""
        return Slot(item, index)

    def _outcome(self, slot: Slot) -> Any:
        """What the run yields for a finished slot."""
        raise NotImplementedError

    def _dispose_after_steps(self) -> bool:
        """Whether a slot's resource is disposed of by its worker once its steps are done (else only
        after the hand-over, when :meth:`_dispose_after_hand_over` says so, or on close)."""
        return False

    def _dispose_after_hand_over(self, slot: Slot) -> bool:
        """Whether the resource of a slot handed over is disposed of when the consumer asks for the next."""
        return False

    def _opened(self, slot: Slot) -> None:
        """A slot was opened (counts, progress)."""

    def _handed(self, slot: Slot, outcome: Any) -> None:
        """A slot was handed over as ``outcome`` (counts, progress)."""

    def _emptied(self) -> None:
        """The flow closed: no slot is in flight any more."""

    def _finished(self) -> None:
        """A run ended (the progress line)."""

    # -- bookkeeping -----------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Items taken from the input (or being taken) and not yet handed over."""
        return len(self._slots)

    def _has_room(self) -> bool:
        return len(self._slots) < self.max_in_flight

    def _open(self, item: Any) -> Slot:
        slot = self._admit(item, self._submitted)
        self._submitted += 1
        self._slots[id(slot)] = slot
        self._opened(slot)
        return slot

    def _hand_over(self, slot: Slot) -> Any:
        """``slot`` is being yielded: it leaves the slots."""
        self._slots.pop(id(slot), None)
        outcome = self._outcome(slot)
        self._handed(slot, outcome)
        return outcome

    def _take_unyielded(self) -> list[Slot]:
        slots = list(self._slots.values())
        self._slots.clear()
        self._emptied()
        return slots

    def _enter(self, step: Step) -> None:
        self._running[step.name] += 1
        self._peak_running[step.name] = max(self._peak_running[step.name], self._running[step.name])

    def _leave(self, step: Step) -> None:
        self._running[step.name] -= 1

    def _record(self, slot: Slot, step: Step, started: float) -> None:
        slot.seconds[step.name] = time.monotonic() - started


def _never() -> bool:
    return False


# -- asyncio ---------------------------------------------------------------------------------------


async def _items_of(items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
    if isinstance(items, AsyncIterable):
        async for item in items:
            yield item
    else:
        for item in items:
            yield item


class AsyncFlow(Flow):
    """The asyncio engine: a task per item, an ``asyncio.Semaphore`` per bounded step. One ``run`` at a time;
    a flow belongs to the event loop it first runs on."""

    def __init__(self, max_in_flight: int, steps: Iterable[Step]) -> None:
        super().__init__(max_in_flight, steps)
        self._gates = {step.name: asyncio.Semaphore(step.limit) for step in self.steps if step.limit is not None}
        self._active: AsyncGenerator[Any, None] | None = None

    async def _dispose(self, slot: Slot) -> None:
        """Disposes of ``slot.resource`` (best effort: log failures, never raise)."""
        raise NotImplementedError

    def _start(self, items: Iterable[Any] | AsyncIterable[Any]) -> AsyncIterator[Any]:
        if self._active is not None:
            raise RuntimeError(f"this {self._noun} is already running; one run() at a time")
        self._active = self._run(items)
        return self._active

    async def _run(self, items: Iterable[Any] | AsyncIterable[Any]) -> AsyncGenerator[Any, None]:
        source = _items_of(items)
        finished: asyncio.Queue[Slot] = asyncio.Queue()
        handed: Slot | None = None
        try:
            exhausted = False
            while True:
                while not exhausted and self._has_room():
                    try:
                        item = await anext(source)
                    except StopAsyncIteration:
                        exhausted = True
                        break
                    slot = self._open(item)
                    slot.worker = asyncio.create_task(self._work(slot, finished), name=f"orchard-{self._noun}")
                if not self._slots:
                    break
                handed = await finished.get()
                yield self._hand_over(handed)
                await self._after_hand_over(handed)
                handed = None
        finally:
            self._active = None
            if handed is not None:
                await self._after_hand_over(handed)
            await self._abort()
            await source.aclose()  # type: ignore[attr-defined]
            self._finished()

    @contextlib.asynccontextmanager
    async def _gate(self, step: Step) -> AsyncIterator[None]:
        gate = self._gates.get(step.name)
        if gate is not None:
            await gate.acquire()
        self._enter(step)
        try:
            yield
        finally:
            self._leave(step)
            if gate is not None:
                gate.release()

    async def _through(self, slot: Slot) -> None:
        """Runs ``slot`` through the steps, each within its gate; an ``Exception`` of a step ends it
        (recorded in the slot). An acquiring step runs as a task of its own, shielded: cancelled meanwhile,
        the flow still learns what it acquired (:meth:`_release` waits for it)."""
        for step in self.steps:
            async with self._gate(step):
                started = time.monotonic()
                try:
                    if step.acquires:
                        slot.acquiring = asyncio.ensure_future(step.call(slot))
                        value = await asyncio.shield(slot.acquiring)
                        slot.resource = value
                    else:
                        value = await step.call(slot)
                except Exception as error:
                    slot.error, slot.stage = error, step.name
                    return
                finally:
                    self._record(slot, step, started)
            slot.values[step.name] = value

    async def _work(self, slot: Slot, finished: asyncio.Queue[Slot]) -> None:
        await self._through(slot)
        if self._dispose_after_steps():
            await self._release(slot)
        finished.put_nowait(slot)

    async def _release(self, slot: Slot) -> None:
        """Disposes of the slot's resource once (a disposal under way is waited for, not repeated); an
        acquiring step under way is waited for first, up to ``CLOSE_GRACE`` seconds."""
        acquiring = slot.acquiring
        if slot.resource is NOTHING and acquiring is not None:
            if acquiring.cancelled():
                return
            try:
                slot.resource = await asyncio.wait_for(asyncio.shield(acquiring), CLOSE_GRACE)
            except TimeoutError:
                log.warning("%s: an item's %s was still under way after %ss; what it makes is not cleaned up",
                            self._noun, self.steps[0].name, CLOSE_GRACE)
                return
            except Exception:
                return  # nothing acquired
        if slot.resource is NOTHING:
            return
        if slot.disposal is None:
            slot.disposal = asyncio.ensure_future(self._disposing(slot))
        await asyncio.shield(slot.disposal)

    async def _disposing(self, slot: Slot) -> None:
        try:
            await self._dispose(slot)
        except Exception as error:  # the subclass logs its own; this is the safety net
            log.warning("%s: cannot clean up after item %s: %r", self._noun, slot.index, error)

    async def _after_hand_over(self, slot: Slot) -> None:
        if self._dispose_after_hand_over(slot):
            await self._release(slot)

    async def _abort(self) -> None:
        """Cancels the slots not handed over and disposes of their resources (best effort)."""
        slots = self._take_unyielded()
        if not slots:
            return
        for slot in slots:
            slot.worker.cancel()
        await asyncio.gather(*(slot.worker for slot in slots), return_exceptions=True)
        await asyncio.gather(*(self._release(slot) for slot in slots))

    async def aclose(self) -> None:
        """Ends the run under way: cleans up every item not handed over (and the last one handed over,
        when the subclass disposes after the hand-over)."""
        active = self._active
        if active is not None:
            with contextlib.suppress(RuntimeError):  # running in another task: it cleans up when it ends
                await active.aclose()
            self._active = None
        await self._abort()


# -- threads ---------------------------------------------------------------------------------------


class ThreadFlow(Flow):
    """The threaded engine: a worker thread per item in flight (a pool of ``max_in_flight``), a
    ``threading.BoundedSemaphore`` per bounded step. Threads cannot be cancelled: on close the flow
    disposes of the resources of the items not handed over (which ends their gateway calls: the objects
    are gone), a worker that acquires after the close disposes of its resource itself, and workers stop
    before their next step. ``close`` waits up to ``CLOSE_GRACE`` seconds for the worker threads."""

    def __init__(self, max_in_flight: int, steps: Iterable[Step]) -> None:
        super().__init__(max_in_flight, steps)
        self._gates = {step.name: threading.BoundedSemaphore(step.limit) for step in self.steps if step.limit is not None}
        self._active: Generator[Any, None, None] | None = None
        self._lock = threading.Lock()
        self._closing = False
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _dispose(self, slot: Slot) -> None:
        """Disposes of ``slot.resource`` (best effort: log failures, never raise)."""
        raise NotImplementedError

    def _start(self, items: Iterable[Any]) -> Iterator[Any]:
        if self._active is not None:
            raise RuntimeError(f"this {self._noun} is already running; one run() at a time")
        self._active = self._run(items)
        return self._active

    def _run(self, items: Iterable[Any]) -> Generator[Any, None, None]:
        source = iter(items)
        finished: queue.SimpleQueue[Slot] = queue.SimpleQueue()
        self._closing = False
        self._pool = concurrent.futures.ThreadPoolExecutor(self.max_in_flight, thread_name_prefix=f"orchard-{self._noun}")
        handed: Slot | None = None
        try:
            exhausted = False
            while True:
                while not exhausted and self._has_room():
                    try:
                        item = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    with self._lock:
                        slot = self._open(item)
                    slot.worker = self._pool.submit(self._work, slot, finished)
                if not self._slots:
                    break
                handed = finished.get()
                with self._lock:
                    outcome = self._hand_over(handed)
                yield outcome
                self._after_hand_over(handed)
                handed = None
        finally:
            self._active = None
            if handed is not None:
                self._after_hand_over(handed)
            self._abort()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self._finished()

    @contextlib.contextmanager
    def _gate(self, step: Step) -> Iterator[None]:
        gate = self._gates.get(step.name)
        if gate is not None:
            gate.acquire()
        with self._lock:
            self._enter(step)
        try:
            yield
        finally:
            with self._lock:
                self._leave(step)
            if gate is not None:
                gate.release()

    def _through(self, slot: Slot, closing: Callable[[], bool] = _never) -> bool:
        """Runs ``slot`` through the steps, each within its gate; an ``Exception`` of a step ends it
        (recorded in the slot). False when ``closing()`` said the flow closed before a step after the first
        (the slot is no longer anyone's), or while the first acquired its resource (which is then disposed
        of here: nobody else knows it)."""
        for step in self.steps:
            with self._gate(step):
                if closing() and not step.acquires:  # (an acquiring step runs: what it makes is disposed of)
                    return False
                started = time.monotonic()
                try:
                    value = step.call(slot)
                except Exception as error:
                    slot.error, slot.stage = error, step.name
                    return True
                except BaseException as error:
                    if threading.current_thread() is threading.main_thread():
                        raise  # KeyboardInterrupt where the caller is
                    # SystemExit and the like in a worker thread: nothing above it would notice.
                    slot.error, slot.stage = error, step.name
                    return True
                finally:
                    self._record(slot, step, started)
                if step.acquires:
                    with self._lock:
                        slot.resource = value
                        closed = closing()
                    if closed:  # the flow closed while it was being acquired: nobody else knows it
                        self._release(slot)
                        return False
            slot.values[step.name] = value
        return True

    def _is_closing(self) -> bool:
        return self._closing

    def _work(self, slot: Slot, finished: queue.SimpleQueue[Slot]) -> None:
        if not self._through(slot, self._is_closing):
            return
        if self._dispose_after_steps():
            self._release(slot)
        finished.put(slot)

    def _release(self, slot: Slot) -> None:
        """Disposes of the slot's resource once (whichever thread comes first)."""
        with self._lock:
            if slot.resource is NOTHING or slot.disposal:
                return
            slot.disposal = True
        try:
            self._dispose(slot)
        except Exception as error:  # the subclass logs its own; this is the safety net
            log.warning("%s: cannot clean up after item %s: %r", self._noun, slot.index, error)

    def _after_hand_over(self, slot: Slot) -> None:
        if self._dispose_after_hand_over(slot):
            self._release(slot)

    def _abort(self) -> None:
        """Disposes of the resources of the slots not handed over (best effort) and waits for their
        threads."""
        with self._lock:
            self._closing = True
            slots = self._take_unyielded()
        for slot in slots:
            self._release(slot)
        workers = [slot.worker for slot in slots if slot.worker is not None]
        _, stuck = concurrent.futures.wait(workers, timeout=CLOSE_GRACE)
        if stuck:
            log.warning("%d %s threads still busy %ss after close", len(stuck), self._noun, CLOSE_GRACE)

    def close(self) -> None:
        """Ends the run under way: cleans up every item not handed over (and the last one handed over,
        when the subclass disposes after the hand-over)."""
        active = self._active
        if active is not None:
            with contextlib.suppress(ValueError):  # running in another thread: it cleans up when it ends
                active.close()
            self._active = None
        self._abort()
