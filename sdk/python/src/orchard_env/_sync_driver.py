"""The sync driver: performs the core's steps with ``httpx.Client``, ``time.sleep`` and threads.

Written by hand, as its twin ``_async_driver.py`` (same names, on ``httpx.AsyncClient``, ``asyncio.sleep``
and tasks): the few things that really differ between the clients live in these two modules. The public
classes of ``client.py`` use this one; ``aio.py``, generated from ``client.py`` by
``scripts/gen_aio.py``, imports the async twin in its place and awaits its coroutine functions.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, TypeVar

import httpx

from . import _core, _ops
from ._core import CHUNK

if TYPE_CHECKING:
    from .client import RolloutGroup, Sandbox
    from .models import EpisodeOutcome

T = TypeVar("T")


def read_path(path: os.PathLike[str]) -> Iterator[bytes]:
    """A local file's blocks (``upload_file`` of a path)."""
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            yield block


def read_stream(stream: IO[bytes], start: int | None) -> Iterator[bytes]:
    """A binary file object's blocks, from ``start`` when it can seek."""
    if start is not None:
        stream.seek(start)
    while block := stream.read(CHUNK):
        yield block


def write_blocks(response: httpx.Response, target: str | os.PathLike[str] | None, handle: IO[bytes] | None) -> int:
    """Writes a streamed answer's bytes to ``handle``, or to the file ``target`` (created, or truncated);
    answers the byte count (``download_file``)."""
    written = 0
    with contextlib.ExitStack() as stack:
        out: IO[bytes] = handle if handle is not None else stack.enter_context(open(target, "wb"))  # type: ignore[arg-type]
        for block in response.iter_bytes(CHUNK):
            out.write(block)
            written += len(block)
    return written


def send_once(http: httpx.Client, request: _core.Request) -> httpx.Response:
    response = http.send(http.build_request(**request.build_args()), stream=request.stream)
    if response.status_code >= 400:
        response.read()
        response.close()
    return response


class Driver:
    """Runs plans synchronously (a base of :class:`~orchard_env.SandboxClient`)."""

    _http: httpx.Client

    def _open_http(self, timeout: httpx.Timeout, transport: httpx.BaseTransport | None) -> httpx.Client:
        return httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=256, max_keepalive_connections=64), transport=transport)

    def _close_http(self) -> None:
        self._http.close()

    def _run(self, plan: _core.Plan[T], stop: threading.Event | None = None) -> T:
        """Performs the plan's steps; ``stop`` ends a heartbeat loop's idle pauses early."""
        for step in (runner := _core.Runner(plan)):
            with runner:
                runner.value = self._perform(step, stop)
        return runner.result

    def _perform(self, step: _core.Step, stop: threading.Event | None) -> Any:
        if isinstance(step, _core.Send):
            return send_once(self._http, step.request)
        if isinstance(step, _core.Sleep):
            return stop.wait(step.seconds) if step.idle and stop is not None else time.sleep(step.seconds)
        if isinstance(step, _core.Call):
            return step.fn()
        return time.monotonic()

    def _create_handle(self, plan: Callable[[], _core.Plan[T]]) -> T:
        """What ``create`` answers: the handle, once the plan ran (the async twin answers an awaitable
        that is also an async context manager)."""
        return self._run(plan())


class Heartbeats:
    """A daemon thread running a sandbox's heartbeat loop until stopped."""

    def __init__(self, sandbox: Sandbox, loop: _core.Plan[None]) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(sandbox.client, loop), name="orchard-heartbeat", daemon=True
        )
        self._thread.start()

    def _beat(self, client: Driver, loop: _core.Plan[None]) -> None:
        try:
            client._run(loop, self._stop)
        except Exception as error:  # e.g. the client was closed under a running episode
            _core.log.warning("heartbeats stopped: %r", error)

    def halt(self) -> None:
        """Ends the loop at its next pause, without waiting (the exit cleanup)."""
        self._stop.set()

    def stop(self) -> None:
        """Ends the loop and waits (at most 5 s) for the thread."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class EpisodeRunner:
    """Runs :meth:`RolloutGroup.drive`'s episodes in worker threads (the core's ``Episodes``)."""

    def __init__(self, group: RolloutGroup, episode: Callable[[Sandbox], Any], concurrency: int | None) -> None:
        self._group = group
        self._episode = episode
        self._pool = concurrent.futures.ThreadPoolExecutor(concurrency or 256, thread_name_prefix="orchard-episode")
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self._sandboxes: builtins.list[Sandbox] = []

    def start(self, sandbox: Sandbox, record: Callable[[EpisodeOutcome], None]) -> None:
        self._sandboxes.append(sandbox)
        plan = self._group._episode_plan(sandbox, self._episode, record)
        self._futures.add(self._pool.submit(self._group.client._run, plan))

    def running(self) -> int:
        return sum(not f.done() for f in self._futures)

    def reap(self) -> builtins.list[BaseException]:
        done = {f for f in self._futures if f.done()}
        self._futures -= done
        return [error for f in done if not f.cancelled() and (error := f.exception()) is not None]

    def settle(self) -> None:
        self._pool.shutdown(wait=True)

    def abandon(self) -> None:
        # Threads cannot be cancelled: the episodes still running end when their sandboxes are deleted.
        self._pool.shutdown(wait=False, cancel_futures=True)
        for sandbox in self._sandboxes:
            sandbox._closed = True  # an episode starting now does not start heartbeats
            sandbox.stop_heartbeats()


class PortForward:
    """A local TCP listener whose every connection is tunnelled to ``port`` inside a sandbox
    (:meth:`Sandbox.forward_port`): a thread accepts, and each connection gets a tunnel of its own and a
    thread per direction. A context manager answering the local port; leaving it closes the listener and
    every open connection."""

    def __init__(self, sandbox: Sandbox, port: int, local_port: int, host: str) -> None:
        _ops.tunnel_path(port)  # a bad port fails here, not in the accepting thread
        self._sandbox = sandbox
        self.port = port
        self._listener = socket.create_server((host, local_port))
        #: The local port (the one asked for, or the one the system picked for 0).
        self.local_port: int = self._listener.getsockname()[1]
        #: Open local connections, each with its tunnel's stream once there is one.
        self._open: dict[socket.socket, Any] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name=f"orchard-forward-{port}", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._open[conn] = None
            threading.Thread(target=self._serve, args=(conn,), name="orchard-tunnel", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            response = self._sandbox._run(self._sandbox._tunnel_plan(self.port))
        except Exception as error:
            _core.log.warning("port %s of sandbox %s: the tunnel was refused: %s", self.port, self._sandbox.name, error)
            self._forget(conn)
            return
        try:
            stream = _ops.upgraded_stream(response, self.port)
        except Exception as error:
            response.close()
            _core.log.warning("%s", error)
            self._forget(conn)
            return
        with self._lock:
            if conn not in self._open:  # closed meanwhile
                response.close()
                return
            self._open[conn] = stream
        back = threading.Thread(target=self._pump_back, args=(stream, conn), name="orchard-tunnel-back", daemon=True)
        back.start()
        try:
            while data := conn.recv(CHUNK):
                stream.write(data)
            _ops.half_close(stream)
        except OSError:
            pass
        finally:
            back.join()
            response.close()
            self._forget(conn)

    @staticmethod
    def _pump_back(stream: Any, conn: socket.socket) -> None:
        try:
            while data := stream.read(CHUNK):
                conn.sendall(data)
        except Exception:
            pass
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    def _forget(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.pop(conn, None)
        with contextlib.suppress(OSError):
            conn.close()

    def close(self) -> None:
        """Stops listening and ends every open connection (their tunnels close with them)."""
        with self._lock:
            self._closed = True
            open_now = list(self._open.items())
            self._open.clear()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (Linux)
        self._listener.close()
        for conn, stream in open_now:
            # Shutdowns, not closes: they wake the threads blocked reading either socket.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def __enter__(self) -> int:
        return self.local_port

    def __exit__(self, *exc: object) -> None:
        self.close()

