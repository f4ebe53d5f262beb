"""The async driver: performs the core's steps with ``httpx.AsyncClient``, ``asyncio.sleep`` and tasks.

Written by hand, as its twin ``_sync_driver.py`` (same names): the few things that really differ between
the clients live in these two modules. ``aio.py``, generated from ``client.py`` by ``scripts/gen_aio.py``,
imports this module where ``client.py`` imports the sync one, and awaits every call of a coroutine
function defined here (by name: keep the names of this module's coroutine functions for them alone).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import IO, TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import httpx

from . import _core, _ops
from ._core import CHUNK

if TYPE_CHECKING:
    from .aio import AsyncRolloutGroup, AsyncSandbox
    from .models import EpisodeOutcome

T = TypeVar("T")


class _Closable(Protocol):
    def close(self) -> Awaitable[Any]: ...


H = TypeVar("H", bound=_Closable)


async def read_path(path: os.PathLike[str]) -> AsyncIterator[bytes]:
    """A local file's blocks, read in a worker thread."""
    handle = await asyncio.to_thread(open, path, "rb")
    try:
        while block := await asyncio.to_thread(handle.read, CHUNK):
            yield block
    finally:
        handle.close()


async def read_stream(stream: IO[bytes], start: int | None) -> AsyncIterator[bytes]:
    """A binary file object's blocks (from ``start`` when it can seek), read in a worker thread."""
    if start is not None:
        stream.seek(start)
    while block := await asyncio.to_thread(stream.read, CHUNK):
        yield block


async def write_blocks(response: httpx.Response, target: str | os.PathLike[str] | None, handle: IO[bytes] | None) -> int:
    """Writes a streamed answer's bytes to ``handle``, or to the file ``target`` (created, or truncated),
    in a worker thread; answers the byte count (``download_file``)."""
    out: IO[bytes] = handle if handle is not None else await asyncio.to_thread(open, target, "wb")  # type: ignore[arg-type]
    written = 0
    try:
        async for block in response.aiter_bytes(CHUNK):
            await asyncio.to_thread(out.write, block)
            written += len(block)
    finally:
        if handle is None:
            out.close()
    return written


async def send_once(http: httpx.AsyncClient, request: _core.Request) -> httpx.Response:
    response = await http.send(http.build_request(**request.build_args()), stream=request.stream)
    if response.status_code >= 400:
        await response.aread()
        await response.aclose()
    return response


class Driver:
    """Runs plans on the event loop (a base of :class:`~orchard_env.AsyncSandboxClient`)."""

    _http: httpx.AsyncClient

    def _open_http(self, timeout: httpx.Timeout, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=512, max_keepalive_connections=128), transport=transport)

    async def _close_http(self) -> None:
        await self._http.aclose()

    async def aclose(self) -> None:
        """Closes the client's HTTP connections (the asyncio spelling of :meth:`close`)."""
        await self._close_http()

    async def _run(self, plan: _core.Plan[T]) -> T:
        for step in (runner := _core.Runner(plan)):
            with runner:
                runner.value = await self._perform(step)
        return runner.result

    async def _perform(self, step: _core.Step) -> Any:
        if isinstance(step, _core.Send):
            return await send_once(self._http, step.request)
        if isinstance(step, _core.Sleep):
            return await asyncio.sleep(step.seconds, False)
        if isinstance(step, _core.Call):
            return await step.fn()
        return asyncio.get_running_loop().time()

    def _create_handle(self, plan: Callable[[], _core.Plan[H]]) -> Creating[H]:
        """What ``create`` and ``session`` answer: an awaitable of the handle that is also an async context
        manager."""
        return Creating(lambda: self._run(plan()))


class Creating(Generic[H]):
    """What :meth:`AsyncSandboxClient.create` and :meth:`AsyncSandbox.session` return: await it for the
    handle, or use it directly as ``async with client.create(...) as sbx:`` (the handle is closed at the
    end of the block)."""

    def __init__(self, make: Callable[[], Awaitable[H]]) -> None:
        self._make = make
        self._handle: H | None = None

    def __await__(self) -> Generator[Any, None, H]:
        return self._make().__await__()

    async def __aenter__(self) -> H:
        self._handle = await self._make()
        return self._handle

    async def __aexit__(self, *exc: object) -> None:
        if self._handle is not None:
            await self._handle.close()


class Heartbeats:
    """A task running a sandbox's heartbeat loop until stopped."""

    def __init__(self, sandbox: AsyncSandbox, loop: _core.Plan[None]) -> None:
        self._task = asyncio.create_task(sandbox.client._run(loop), name=f"orchard-heartbeat-{sandbox.name}")

    def halt(self) -> None:
        """Nothing (the exit cleanup may run in a signal handler, outside the event loop): the task ends
        with its loop, and the exit cleanup deletes the sandbox."""

    async def stop(self) -> None:
        """Cancels the task and waits for it."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


class EpisodeRunner:
    """Runs :meth:`AsyncRolloutGroup.drive`'s episodes as tasks (the core's ``Episodes``); the plan
    keeps at most ``concurrency`` of them running."""

    def __init__(self, group: AsyncRolloutGroup, episode: Callable[[AsyncSandbox], Any], concurrency: int | None) -> None:
        self._group = group
        self._episode = episode
        self._tasks: set[asyncio.Task[Any]] = set()

    async def _call(self, sandbox: AsyncSandbox) -> Any:
        value = self._episode(sandbox)
        return await value if inspect.isawaitable(value) else value

    async def start(self, sandbox: AsyncSandbox, record: Callable[[EpisodeOutcome], None]) -> None:
        plan = self._group._episode_plan(sandbox, self._call, record)
        self._tasks.add(asyncio.create_task(self._group.client._run(plan), name=f"orchard-episode-{sandbox.name}"))

    async def running(self) -> int:
        return sum(not t.done() for t in self._tasks)

    async def reap(self) -> builtins.list[BaseException]:
        done = {t for t in self._tasks if t.done()}
        self._tasks -= done
        return [error for t in done if not t.cancelled() and (error := t.exception()) is not None]

    async def settle(self) -> None:
        await self.abandon()

    async def abandon(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()


class PortForward:
    """A local TCP listener whose every connection is tunnelled to ``port`` inside a sandbox
    (:meth:`AsyncSandbox.forward_port`), served by tasks of the running event loop. An async context
    manager answering the local port; leaving it closes the listener and every open connection."""

    def __init__(self, sandbox: AsyncSandbox, port: int, local_port: int, host: str) -> None:
        _ops.tunnel_path(port)
        self._sandbox = sandbox
        self.port = port
        self._host = host
        #: The local port (the one asked for until the listener is open, then the one it got).
        self.local_port = local_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> int:
        self._server = await asyncio.start_server(self._serve, self._host, self.local_port)
        self.local_port = self._server.sockets[0].getsockname()[1]
        return self.local_port

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stops listening and ends every open connection (their tunnels close with them)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        response: httpx.Response | None = None
        try:
            response = await self._sandbox._run(self._sandbox._tunnel_plan(self.port))
            stream = _ops.upgraded_stream(response, self.port)
            back = asyncio.ensure_future(self._pump_back(stream, writer))
            try:
                while data := await reader.read(CHUNK):
                    await stream.write(data)
                _ops.half_close(stream)
                await back
            finally:
                back.cancel()
        except asyncio.CancelledError:
            pass
        except Exception as error:
            _core.log.warning("port %s of sandbox %s: the tunnel failed: %s", self.port, self._sandbox.name, error)
        finally:
            if response is not None:
                with contextlib.suppress(Exception):
                    await response.aclose()
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    @staticmethod
    async def _pump_back(stream: Any, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await stream.read(CHUNK):
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(Exception):
            writer.write_eof()

