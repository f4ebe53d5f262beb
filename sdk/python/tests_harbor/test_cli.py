"""``harbor run`` itself (Harbor 0.25's CLI, a subprocess) with ``--env
orchard_env.integrations.harbor:OrchardEnvironment`` and the ``oracle`` and ``nop`` agents over a local
task directory, against the fake gateway served on the loopback: the exact command line of
docs/HARNESSES.md (Harbor), with its preflight and its job results. No Docker, no cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from conftest import NS, FakeGateway
from test_trial import Task, write_task

HARBOR = Path(sys.executable).with_name("harbor")


def serve(gateway: FakeGateway) -> tuple[ThreadingHTTPServer, threading.Lock]:
    """The fake gateway as an HTTP server on 127.0.0.1 (one request at a time: it keeps plain dicts)."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def body(self) -> bytes:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                data = b""
                while (size := int(self.rfile.readline().strip().split(b";")[0], 16)) > 0:
                    data += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
                return data
            return self.rfile.read(int(self.headers.get("content-length") or 0))

        def answer(self) -> None:
            content = self.body()
            if self.path == "/healthz":
                response = httpx.Response(200, text="ok")
            else:
                request = httpx.Request(self.command, f"http://gw{self.path}", headers=dict(self.headers.items()),
                                        content=content)
                with lock:
                    response = gateway(request)
            data = response.content
            self.send_response(response.status_code)
            self.send_header("content-type", response.headers.get("content-type", "application/json"))
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = answer

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, lock


@pytest.fixture
def served() -> Iterator[tuple[FakeGateway, Task, str]]:
    gateway = FakeGateway()
    task = Task(gateway)
    gateway.exec = task
    server, _ = serve(gateway)
    try:
        yield gateway, task, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
def test_harbor_run_with_the_orchard_environment(tmp_path: Path, served: tuple[FakeGateway, Task, str], agent: str,
                                                 reward: float) -> None:
    gateway, task, url = served
    tasks = tmp_path / "tasks"
    write_task(tasks)
    env = {**os.environ, "ORCHARD_GATEWAY_URL": url, "ORCHARD_TOKEN": "t", "ORCHARD_NAMESPACE": NS,
           "HARBOR_TELEMETRY": "0", "HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    command = [str(HARBOR), "run", "--path", str(tasks / "hello"), "--agent", agent,
               "--env", "orchard_env.integrations.harbor:OrchardEnvironment",
               "--ek", f"namespace={NS}", "--ek", "ttl_seconds=7200",
               "--n-concurrent", "1", "--jobs-dir", str(tmp_path / "jobs"), "--job-name", "orchard", "--yes"]
    run = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [result_file] = [p for p in (tmp_path / "jobs" / "orchard").glob("*/result.json")]
    result = json.loads(result_file.read_text())
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"]["rewards"] == {"reward": reward}
    [created] = gateway.created
    assert created["ttlSeconds"] == 7200 and created["image"] == "registry.local/tasks/hello:1"
    probes = [r for r in gateway.requests if "harbor-preflight-" in r[1]]
    assert len(probes) == 7, "the preflight checked the caller's access first"
    assert gateway.deleted and not gateway.sandboxes, "the sandbox is deleted at the end"
    assert task.solved == (agent == "oracle")


def test_harbor_run_stops_at_the_preflight_naming_what_is_missing(tmp_path: Path) -> None:
    env = {**os.environ, "ORCHARD_GATEWAY_URL": "http://127.0.0.1:9", "ORCHARD_TOKEN": "t", "ORCHARD_NAMESPACE": NS,
           "HARBOR_TELEMETRY": "0", "HOME": str(tmp_path / "home"), "COLUMNS": "200"}
    tasks = tmp_path / "tasks"
    write_task(tasks)
    run = subprocess.run(
        [str(HARBOR), "run", "-p", str(tasks / "hello"), "-a", "nop", "-e", "orchard_env.integrations.harbor:OrchardEnvironment",
         "-o", str(tmp_path / "jobs"), "-y"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode != 0
    assert "Orchard Env preflight failed (gateway http://127.0.0.1:9, namespace ns)" in run.stdout + run.stderr
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").rglob("result.json"))


def test_harbor_run_refuses_a_task_without_a_prebuilt_image(tmp_path: Path, served: tuple[FakeGateway, Task, str]) -> None:
    gateway, _, url = served
    task = write_task(tmp_path / "tasks")
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(toml.replace('docker_image = "registry.local/tasks/hello:1"\n', ""))
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm\n")
    env = {**os.environ, "ORCHARD_GATEWAY_URL": url, "ORCHARD_TOKEN": "t", "ORCHARD_NAMESPACE": NS,
           "HARBOR_TELEMETRY": "0", "HOME": str(tmp_path / "home"), "COLUMNS": "400"}
    run = subprocess.run(
        [str(HARBOR), "run", "-p", str(task), "-a", "oracle", "-e", "orchard_env.integrations.harbor:OrchardEnvironment",
         "-o", str(tmp_path / "jobs"), "-y"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )
    output = " ".join((run.stdout + run.stderr).split())
    assert run.returncode != 0
    assert "DockerImageRequired: task hello has no docker_image" in output, output[-2000:]
    assert not gateway.created, "refused before any sandbox exists"
