"""Stdin and terminals of background processes (sync and async): ``start_process(keep_stdin=, pty=)``,
``Process.write_stdin``, ``close_stdin`` and ``resize``. Without a cluster, against a fake agent: the
bodies sent, local refusals before any request, no retry of writes. On the local cluster (marked
``cluster``): ``cat`` echoing what was written until its stdin closes; a program on a terminal of the
asked size answering a prompt."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from orchard_env import Conflict, SandboxClient

from conftest import DRIVERS, FAST, Cluster, done, sandbox_of

BASE = "/v1/namespaces/ns/sandboxes/s1"
READY = {"metadata": {"name": "s1"}, "spec": {"image": "x"},
         "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
STATUS = {"id": "p-1", "state": "running", "pid": 7, "exitCode": None, "stdout": "", "stderr": "",
          "timedOut": False, "stdinOpen": True, "pty": True}


class Agent:
    """Records ``(method, route, body)``; answers process routes with :data:`STATUS`, and a stdin
    write with ``stdin_answer``."""

    def __init__(self, stdin_answer: httpx.Response | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.stdin_answer = stdin_answer

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == BASE:
            return httpx.Response(200, json=READY)
        route = request.url.path.removeprefix(BASE)
        self.calls.append((request.method, route, json.loads(request.content) if request.content else None))
        if route == "/processes/p-1/stdin" and self.stdin_answer is not None:
            return self.stdin_answer
        return httpx.Response(201 if route == "/processes" else 200, json=STATUS)

    def bodies(self, route: str) -> list[Any]:
        return [body for _, r, body in self.calls if r == route]


@DRIVERS
async def test_stdin_and_terminal_requests(mode: str) -> None:
    agent = Agent()
    async with sandbox_of(mode, agent) as sbx:
        process = await done(sbx.start_process("cat", keep_stdin=True, pty=(40, 132)))
        info = await done(process.write_stdin("hello\n"))
        assert info.stdin_open and info.pty
        await done(process.write_stdin(b"\x00\xff", close=True))
        await done(process.close_stdin())
        await done(process.resize(50, 100))
        with pytest.raises(ValueError, match="rows, cols"):
            await done(process.resize(0, 100))
        with pytest.raises(TypeError):
            await done(process.write_stdin(42))  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await done(sbx.start_process("top", pty=(24,)))  # type: ignore[arg-type]
    started = agent.bodies("/processes")
    assert len(started) == 1, "refused sizes are never sent"
    assert started[0]["keepStdin"] is True and started[0]["pty"] == {"rows": 40, "cols": 132}
    assert agent.bodies("/processes/p-1/stdin") == [
        {"data": "hello\n"}, {"dataBase64": "AP8=", "close": True}, {"close": True},
    ]
    assert agent.bodies("/processes/p-1/resize") == [{"rows": 50, "cols": 100}]


@DRIVERS
async def test_a_write_is_never_retried(mode: str) -> None:
    agent = Agent(httpx.Response(503, json={"code": "Unavailable", "message": "busy", "retryable": True}))
    async with sandbox_of(mode, agent) as sbx:
        process = await done(sbx.start_process("cat", keep_stdin=True))
        with pytest.raises(Exception):
            await done(process.write_stdin("once\n"))
    assert len(agent.bodies("/processes/p-1/stdin")) == 1


@DRIVERS
async def test_a_closed_stdin_is_a_conflict(mode: str) -> None:
    agent = Agent(httpx.Response(409, json={"code": "Conflict", "message": "process p-1 has no open stdin"}))
    async with sandbox_of(mode, agent) as sbx:
        process = await done(sbx.start_process("cat", keep_stdin=True))
        with pytest.raises(Conflict, match="no open stdin"):
            await done(process.write_stdin("late\n"))


def test_plain_starts_send_neither_field() -> None:
    agent = Agent()
    with SandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(agent), retry=FAST) as client:
        client.connect("s1", auto_heartbeat=False).start_process("sleep 1")
    body = agent.bodies("/processes")[0]
    assert "keepStdin" not in body and "pty" not in body


# -- on the local cluster -------------------------------------------------------------------------------


@pytest.mark.cluster
def test_cat_echoes_what_is_written_until_its_stdin_closes(client: SandboxClient, cluster: Cluster) -> None:
    with client.create(image=cluster.image, ttl_seconds=600) as sbx:
        process = sbx.start_process(["cat"], keep_stdin=True)
        assert process.write_stdin("one\n").stdin_open
        process.write_stdin(b"two\n", close=True)
        final = process.wait(timeout=30)
        assert (final.exit_code, final.stdout) == (0, "one\ntwo\n"), final
        with pytest.raises(Conflict):
            process.write_stdin("three\n")


@pytest.mark.cluster
def test_a_program_on_a_terminal_sees_its_size_and_answers_a_prompt(client: SandboxClient, cluster: Cluster) -> None:
    with client.create(image=cluster.image, ttl_seconds=600) as sbx:
        script = "stty size; printf 'name? '; read n; echo got $n"
        process = sbx.start_process(["/bin/sh", "-c", script], pty=(40, 132))
        assert process.status().pty
        deadline = time.monotonic() + 20
        while "name? " not in process.status().stdout and time.monotonic() < deadline:
            time.sleep(0.1)
        process.resize(50, 100)
        process.write_stdin("bob\n")
        final = process.wait(timeout=30)
        assert "40 132" in final.stdout and "got bob" in final.stdout, final
