"""Port forwarding (``sbx.forward_port``), sync and async. Without a cluster, against a fake gateway that
speaks the tunnel protocol on a real socket (``101`` then an echo of the bytes): many connections at once,
each on a tunnel of its own with the caller's token; a refused tunnel closes its connection; leaving the
block ends open connections; bad ports fail before anything. On the local cluster (marked ``cluster``):
an HTTP server bound to the sandbox's 127.0.0.1, reached through a forward by both clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import socket
import socketserver
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from orchard_env import AsyncSandboxClient, RetryPolicy, SandboxClient

from conftest import Cluster, run_sdk_doc_block

FAST = RetryPolicy(attempts=2, backoff=0.001, max_backoff=0.002)
BASE = "/v1/namespaces/ns/sandboxes/s1"
READY = {"metadata": {"name": "s1"}, "spec": {"image": "x"},
         "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
ECHO_PORT = 7000
CLOSED_PORT = 9


class FakeGateway(socketserver.ThreadingTCPServer):
    """The gateway's tunnel route on a real socket: ``GET BASE`` answers a Ready sandbox; a tunnel to
    :data:`ECHO_PORT` switches protocols and echoes; one to :data:`CLOSED_PORT` is refused with 502."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.tunnels = 0
        self.heads: list[dict[str, str]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(socketserver.BaseRequestHandler):
    server: FakeGateway

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.request.recv(1)
            if not chunk:
                return
            head += chunk
        lines = head.decode().split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
        with self.server.lock:
            self.server.heads.append({"method": method, "path": path, **headers})
        if path == BASE:
            return self.answer(200, READY)
        upgrade = headers.get("connection", "").lower() == "upgrade" and headers.get("upgrade") == "tcp"
        if path == f"{BASE}/ports/{CLOSED_PORT}/tunnel":
            return self.answer(502, {"code": "BadGateway", "message": f"nothing accepts connections on port {CLOSED_PORT}"})
        if path != f"{BASE}/ports/{ECHO_PORT}/tunnel" or not upgrade:
            return self.answer(400, {"code": "BadRequest", "message": "not a tunnel"})
        self.request.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
        with self.server.lock:
            self.server.tunnels += 1
        while data := self.request.recv(65536):
            self.request.sendall(data)

    def answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.request.sendall(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n\r\n".encode() + data
        )


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    server = FakeGateway()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def echo_once(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while data := conn.recv(65536):
                received += data
        except ConnectionResetError:  # closed with the payload unread (a refused tunnel)
            pass
        return received


def test_every_connection_gets_a_tunnel_of_its_own(gateway: FakeGateway) -> None:
    with SandboxClient(gateway.url, "t0ken", namespace="ns", retry=FAST) as client:
        sbx = client.connect("s1", auto_heartbeat=False)
        with sbx.forward_port(ECHO_PORT) as local_port:
            assert isinstance(local_port, int) and local_port > 0
            payloads = [f"hello {i} ".encode() * (i + 1) for i in range(100)]
            with concurrent.futures.ThreadPoolExecutor(50) as pool:
                echoed = list(pool.map(lambda p: echo_once(local_port, p), payloads))
    assert echoed == payloads
    assert gateway.tunnels == 100
    tunnels = [h for h in gateway.heads if h["path"].endswith("/tunnel")]
    assert all(h["authorization"] == "Bearer t0ken" and h["method"] == "GET" for h in tunnels)


def test_a_refused_tunnel_closes_its_connection_and_says_why(gateway: FakeGateway, caplog: pytest.LogCaptureFixture) -> None:
    with SandboxClient(gateway.url, "t", namespace="ns", retry=FAST) as client:
        sbx = client.connect("s1", auto_heartbeat=False)
        with caplog.at_level(logging.WARNING), sbx.forward_port(CLOSED_PORT) as local_port:
            assert echo_once(local_port, b"x") == b""
            deadline = time.monotonic() + 5
            while "nothing accepts connections" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.02)
    assert "nothing accepts connections on port 9" in caplog.text


def test_leaving_the_block_ends_open_connections(gateway: FakeGateway) -> None:
    with SandboxClient(gateway.url, "t", namespace="ns", retry=FAST) as client:
        sbx = client.connect("s1", auto_heartbeat=False)
        with sbx.forward_port(ECHO_PORT) as local_port:
            conn = socket.create_connection(("127.0.0.1", local_port), timeout=5)
            conn.sendall(b"ping")
            assert conn.recv(4) == b"ping"
        assert conn.recv(4) == b"", "the connection ended with the block"
        conn.close()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", local_port), timeout=1).close()


@pytest.mark.parametrize("port", [0, 65536, -1, "80", True])
def test_bad_ports_fail_before_anything(gateway: FakeGateway, port: Any) -> None:
    with SandboxClient(gateway.url, "t", namespace="ns", retry=FAST) as client:
        sbx = client.connect("s1", auto_heartbeat=False)
        with pytest.raises(ValueError, match="1 to 65535"):
            sbx.forward_port(port)


async def test_the_async_forward_serves_connections_on_the_loop(gateway: FakeGateway) -> None:
    async with AsyncSandboxClient(gateway.url, "t", namespace="ns", retry=FAST) as client:
        sbx = await client.connect("s1", auto_heartbeat=False)

        async def echo(port: int, payload: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(payload)
            writer.write_eof()
            received = await reader.read()
            writer.close()
            return received

        async with sbx.forward_port(ECHO_PORT) as local_port:
            payloads = [f"async {i}".encode() for i in range(30)]
            echoed = await asyncio.gather(*(echo(local_port, p) for p in payloads))
            held_reader, held_writer = await asyncio.open_connection("127.0.0.1", local_port)
            held_writer.write(b"ping")
            assert await held_reader.readexactly(4) == b"ping"
        assert list(echoed) == payloads
        assert await asyncio.wait_for(held_reader.read(), 5) == b"", "the connection ended with the block"
        held_writer.close()
    assert gateway.tunnels == 31


# -- on the local cluster ------------------------------------------------------------------------


SERVER = "import http.server, sys; http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.cluster
def test_a_loopback_http_server_in_the_sandbox_is_reached_through_a_forward(client: SandboxClient, cluster: Cluster) -> None:
    port = free_port()
    with client.create(image=cluster.python_image, ttl_seconds=600) as sbx:
        sbx.upload("site/index.html", "<h1>from the sandbox</h1>")
        sbx.start_process(["python3", "-c", SERVER, str(port)], cwd="site")
        with sbx.forward_port(port) as local_port:
            deadline = time.monotonic() + 20
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{local_port}/index.html", timeout=10) as answer:
                        assert answer.read() == b"<h1>from the sandbox</h1>"
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            with concurrent.futures.ThreadPoolExecutor(20) as pool:
                bodies = list(pool.map(
                    lambda _: urllib.request.urlopen(f"http://127.0.0.1:{local_port}/index.html", timeout=20).read(),
                    range(40),
                ))
            assert set(bodies) == {b"<h1>from the sandbox</h1>"}


@pytest.mark.cluster
async def test_the_async_forward_reaches_the_sandbox(aclient: AsyncSandboxClient, cluster: Cluster) -> None:
    port = free_port()
    async with await aclient.create(image=cluster.python_image, ttl_seconds=600) as sbx:
        await sbx.upload("site/index.html", "async hello")
        await sbx.start_process(["python3", "-c", SERVER, str(port)], cwd="site")
        async with sbx.forward_port(port) as local_port:
            deadline = time.monotonic() + 20
            while True:
                try:
                    reader, writer = await asyncio.open_connection("127.0.0.1", local_port)
                    writer.write(b"GET /index.html HTTP/1.0\r\n\r\n")
                    answer = await asyncio.wait_for(reader.read(), 10)
                    writer.close()
                    if answer.startswith(b"HTTP/1.0 200"):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError("the server in the sandbox never answered through the forward")
                await asyncio.sleep(0.2)
            assert answer.endswith(b"async hello")


@pytest.mark.cluster
def test_the_port_forwarding_block_of_the_docs_runs(cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The "Port forwarding" block of docs/SDK.md, as written there (port 8000 becomes a free one, since
    sandboxes of the local cluster share this machine's loopback)."""
    replacements = {"8000": str(free_port()), '"python:3.11"': repr(cluster.python_image)}
    run_sdk_doc_block("Port forwarding", cluster, monkeypatch, replacements)
    assert capsys.readouterr().out == "<h1>from the sandbox</h1>\n"
