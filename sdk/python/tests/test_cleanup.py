"""Sandboxes of handles created with ``delete_on_exit`` are deleted when the interpreter exits and on
SIGTERM, for both clients: a child Python process creates sandboxes against a fake gateway (an HTTP
server on 127.0.0.1 in this process that records every request), then exits, or gets SIGTERM. No cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import orchard_env
from orchard_env import _cleanup

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


class FakeGateway(ThreadingHTTPServer):
    """Creates sandboxes ``s1``, ``s2``... that are Ready at their first wait; records every request
    (method, path, JSON body)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, Any]] = []
        self.created = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def deleted(self) -> list[str]:
        with self.lock:
            return sorted(path.rsplit("/", 1)[-1] for method, path, _ in self.requests if method == "DELETE")

    def creates(self) -> list[Any]:
        with self.lock:
            return [body for method, path, body in self.requests if method == "POST" and path.endswith("/sandboxes")]


class Handler(BaseHTTPRequestHandler):
    server: FakeGateway
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        path = self.path.split("?", 1)[0]
        with self.server.lock:
            self.server.requests.append((self.command, path, body))
            if self.command == "POST" and path.endswith("/sandboxes"):
                self.server.created += 1
                name = f"s{self.server.created}"
                self.answer(201, {"metadata": {"name": name, "namespace": "ns"}, "spec": {"image": body.get("image")}})
                return
        name = path.split("/")[5] if len(path.split("/")) > 5 else ""
        if path.endswith("/wait"):
            self.answer(200, {"metadata": {"name": name, "namespace": "ns"},
                              "spec": {"image": "x", "lifecycle": {"heartbeatTimeoutSeconds": 600}},
                              "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}})
        elif path.endswith("/heartbeat"):
            self.answer(200, {"heartbeatTimeoutSeconds": 600, "written": True})
        elif self.command == "DELETE":
            self.answer(200, {"namespace": "ns", "name": name, "deleted": True})
        else:
            self.answer(404, {"code": "NotFound", "message": path})

    do_GET = do_POST = do_DELETE = do_PUT = handle_any


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    server = FakeGateway()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


SYNC = """
    from orchard_env import SandboxClient
    client = SandboxClient(URL, "t", namespace="ns")
    kept = [client.create(image="x"), client.create(image="x", heartbeat_timeout_seconds=0)]
    mine = client.create(image="x", delete_on_exit=False)
"""
ASYNC = """
    import asyncio
    from orchard_env import AsyncSandboxClient

    async def main():
        client = AsyncSandboxClient(URL, "t", namespace="ns")
        kept = [await client.create(image="x"), await client.create(image="x", heartbeat_timeout_seconds=0)]
        mine = await client.create(image="x", delete_on_exit=False)
        print("ready", flush=True)
        WAIT
"""


#: How a child waits for SIGTERM in its main thread. Not ``signal.pause()``: a signal that lands after
#: the interpreter's last check for pending signals and before the ``pause`` system call is handled
#: by the C handler only, and ``pause`` then sleeps forever (a 60 s time-out once in ``make test``
#: under load). A short sleep in a loop runs the Python handler within 50 ms whenever it arrives.
WAIT_FOR_SIGNALS = "import time\nwhile True:\n    time.sleep(0.05)"


def child(gateway: FakeGateway, script: str) -> subprocess.Popen[str]:
    """Runs ``script`` (its ``URL`` is the gateway's; ``WAIT_FOR_SIGNALS`` on a line of its own waits
    for signals) in a fresh interpreter."""
    code = textwrap.dedent(script).replace("URL", repr(gateway.url))
    code = "\n".join(
        WAIT_FOR_SIGNALS if line.strip() == "WAIT_FOR_SIGNALS" else line for line in code.splitlines()
    )
    # The child imports the same orchard_env as this process.
    src = os.path.dirname(os.path.dirname(os.path.abspath(orchard_env.__file__)))
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path},
    )


def ready(process: subprocess.Popen[str]) -> None:
    """Blocks until the child printed ``ready`` (it created its sandboxes)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        _, err = process.communicate(timeout=30)
        pytest.fail(f"the child did not get ready ({line!r}):\n{err}")


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def test_sync_sandboxes_are_deleted_on_sigterm(gateway: FakeGateway) -> None:
    process = child(gateway, SYNC + """
    print("ready", flush=True)
    WAIT_FOR_SIGNALS
    """)
    ready(process)
    process.send_signal(signal.SIGTERM)
    code, out, err = finish(process)
    assert code == -signal.SIGTERM, f"the process ends by SIGTERM as it would without the SDK: {code}\n{err}"
    assert gateway.deleted() == ["s1", "s2"], "delete_on_exit=False (s3) is kept"
    creates = gateway.creates()
    assert [c.get("heartbeatTimeoutSeconds") for c in creates] == [600, 0, 600], "600 s unless the caller sets one"


def test_async_sandboxes_are_deleted_on_sigterm(gateway: FakeGateway) -> None:
    process = child(gateway, ASYNC.replace("WAIT", "await asyncio.Event().wait()") + """
    asyncio.run(main())
    """)
    ready(process)
    process.send_signal(signal.SIGTERM)
    code, out, err = finish(process)
    assert code == -signal.SIGTERM, f"{code}\n{err}"
    assert gateway.deleted() == ["s1", "s2"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_sandboxes_are_deleted_at_interpreter_exit(gateway: FakeGateway, kind: str) -> None:
    if kind == "sync":
        script = SYNC + """
    print("ready", flush=True)
    """
    else:
        script = ASYNC.replace("WAIT", "") + """
    asyncio.run(main())   # the loop is gone when the exit handler runs
    """
    code, out, err = finish(child(gateway, script))
    assert (code, out) == (0, "ready\n"), err
    assert gateway.deleted() == ["s1", "s2"]


def test_a_previous_sigterm_handler_runs_after_the_cleanup(gateway: FakeGateway) -> None:
    process = child(gateway, """
    import signal, sys
    def previous(signum, frame):
        print("previous handler", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, previous)
    """ + SYNC + """
    print("ready", flush=True)
    WAIT_FOR_SIGNALS
    """)
    ready(process)
    process.send_signal(signal.SIGTERM)
    code, out, err = finish(process)
    assert (code, out) == (3, "previous handler\n"), err
    assert gateway.deleted() == ["s1", "s2"], "each deleted once: the exit handler finds nothing left"


def test_a_process_that_ignores_sigterm_keeps_its_sandboxes_until_it_exits(gateway: FakeGateway) -> None:
    process = child(gateway, """
    import signal, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    """ + SYNC + """
    print("ready", flush=True)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN, "not replaced"
    sys.stdin.readline()
    """)
    ready(process)
    process.send_signal(signal.SIGTERM)
    assert process.stdin is not None
    process.stdin.write("exit\n")
    process.stdin.flush()
    code, out, err = finish(process)
    assert code == 0, err
    assert gateway.deleted() == ["s1", "s2"], "deleted at exit, not on the ignored SIGTERM"


def test_handles_opened_in_a_worker_thread_install_no_handler(gateway: FakeGateway) -> None:
    process = child(gateway, """
    import signal, threading
    from orchard_env import SandboxClient
    client = SandboxClient(URL, "t", namespace="ns")
    worker = threading.Thread(target=lambda: client.create(image="x", auto_heartbeat=False))
    worker.start()
    worker.join()
    print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    client.create(image="x", auto_heartbeat=False)
    print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
    """)
    code, out, err = finish(process)
    assert (code, out.split()) == (0, ["True", "False"]), err


def test_drain_never_raises_and_skips_closed_handles() -> None:
    class Broken:
        name, namespace, delete_on_exit, _closed = "b", "ns", True, False

        def _halt_heartbeats(self) -> None:
            pass

        def _exit_delete(self) -> tuple[str, dict[str, str], Any]:
            raise RuntimeError("boom")

    class Closed(Broken):
        _closed = True

    broken, closed = Broken(), Closed()
    _cleanup.OPEN.add(broken)
    _cleanup.OPEN.add(closed)
    try:
        assert _cleanup.drain() == 0
        assert broken._closed and broken not in _cleanup.OPEN
    finally:
        _cleanup.forget(broken)
        _cleanup.forget(closed)
