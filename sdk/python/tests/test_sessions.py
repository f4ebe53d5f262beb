"""Shell sessions and ``user=`` (sync and async). Without a cluster, against a fake agent behind a fake
gateway: the request bodies sent (``user`` as a string, ``timeout`` seconds as ``timeoutMs``, signals), the
answers parsed, ``check=True``, closing at the end of a ``with`` block, closing twice, the agent's refusals.
On the local cluster (marked ``cluster``): state carrying over between runs, a prompt answered with
``input`` and ``read``, a run interrupted by its timeout and by ``interrupt()`` from another thread or
task, ``signal("KILL")`` for a command that ignores SIGINT, commands as another uid, and the "Shell
sessions" block of docs/SDK.md as it is written there."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest

from orchard_env import (
    AsyncSandboxClient,
    AsyncSession,
    CommandFailed,
    Conflict,
    Forbidden,
    InvalidRequest,
    SandboxClient,
    Session,
    SessionInfo,
    SessionReadResult,
    SessionRunResult,
    SessionSignalResult,
)
from orchard_env import _ops

from conftest import DRIVERS, Cluster, done, run_sdk_doc_block, sandbox_of

BASE = "/v1/namespaces/ns/sandboxes/s1"
READY = {"metadata": {"name": "s1"}, "spec": {"image": "x"},
         "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]}}
STATUS = {"id": "s-3f9c", "shell": "/bin/sh", "pid": 42, "state": "running", "exitCode": None, "busy": False,
          "startedAt": "2025-05-01T12:00:00.000Z"}
RUN_OK = {"output": "/tmp\n1\n", "exitCode": 0, "timedOut": False, "outputTruncated": False, "outputLossy": False,
          "outputEncoding": "text", "durationMs": 15, "shellExited": False, "shellRestarted": False}
EXEC_OK = {"exitCode": 0, "stdout": "65534\n", "stderr": "", "timedOut": False, "stdoutTruncated": False,
           "stderrTruncated": False, "durationMs": 3}


class Agent:
    """A sandbox's agent behind the gateway: one session ``s-3f9c``; ``answers`` maps ``(method, route)``
    (the path after the sandbox's) to a list of responses handed out in turn (the last one repeats)."""

    def __init__(self, **answers: list[httpx.Response]) -> None:
        self.calls: list[tuple[str, str, Any, httpx.Headers]] = []
        self.answers: dict[tuple[str, str], list[httpx.Response]] = {}
        self.deleted = False
        for key, responses in answers.items():
            method, route = key.split(" ", 1)
            self.answers[(method, route)] = responses

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == BASE:
            return httpx.Response(200, json=READY)
        route = request.url.path.removeprefix(BASE)
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.method, route, body, request.headers))
        queued = self.answers.get((request.method, route))
        if queued:
            return queued.pop(0) if len(queued) > 1 else queued[0]
        if (request.method, route) == ("POST", "/sessions"):
            return httpx.Response(201, json=STATUS)
        if (request.method, route) == ("GET", "/sessions"):
            return httpx.Response(200, json={"sessions": [STATUS, {**STATUS, "id": "s-2", "busy": True}]})
        if route == "/sessions/s-3f9c" and request.method == "GET":
            return httpx.Response(200, json={**STATUS, "busy": True})
        if route == "/sessions/s-3f9c" and request.method == "DELETE":
            if self.deleted:
                return httpx.Response(404, json={"code": "NotFound", "message": "no session s-3f9c"})
            self.deleted = True
            return httpx.Response(200, json={**STATUS, "state": "exited", "exitCode": None})
        if route == "/sessions/s-3f9c/run":
            return httpx.Response(200, json=RUN_OK)
        if route == "/sessions/s-3f9c/input":
            return httpx.Response(200, json={**STATUS, "busy": True})
        if route == "/sessions/s-3f9c/signal":
            return httpx.Response(200, json={"running": True, "session": {**STATUS, "busy": True}})
        if route == "/sessions/s-3f9c/read":
            return httpx.Response(200, json={"output": "got:", "matched": True, "outputTruncated": False,
                                             "outputLossy": False, "outputEncoding": "text", "shellExited": False})
        if route in ("/exec", "/processes"):
            return httpx.Response(200 if route == "/exec" else 201, json={**EXEC_OK, "id": "p-1", "state": "running"})
        if route == "/exec/stream":
            return httpx.Response(200, content=b'{"type":"started","pid":7}\n{"type":"exit","exitCode":0}\n')
        return httpx.Response(404, json={"code": "NotFound", "message": route})

    def sent(self, method: str, route: str) -> list[Any]:
        """The bodies of the requests sent to ``method route``, in order."""
        return [body for m, r, body, _ in self.calls if (m, r) == (method, route)]


def error(status: int, code: str, message: str, retryable: bool = False) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": message, "retryable": retryable})


# -- user= on exec, streamed exec and processes ------------------------------------------------------


@DRIVERS
async def test_user_is_sent_as_a_string_on_exec_streams_and_processes(mode: str) -> None:
    agent = Agent()
    async with sandbox_of(mode, agent) as sbx:
        assert (await done(sbx.exec("id -u", user=65534))).stdout == "65534\n"
        await done(sbx.exec(["id"], user="dev:wheel"))
        await done(sbx.exec(["id"]))
        stream = sbx.exec_stream("id -u", user="1000:50")
        events = [e async for e in stream] if mode == "async" else list(stream)
        assert [e.type for e in events] == ["started", "exit"]
        await done(sbx.start_process("sleep 1", id="bg", user=0))
    assert [b.get("user") for b in agent.sent("POST", "/exec")] == ["65534", "dev:wheel", None]
    assert "user" not in agent.sent("POST", "/exec")[2], "left out when not given"
    assert agent.sent("POST", "/exec/stream")[0]["user"] == "1000:50"
    assert agent.sent("POST", "/processes")[0] == {"command": "sleep 1", "id": "bg", "user": "0"}


def test_user_takes_names_and_uids_only() -> None:
    assert _ops.exec_body("id", user=65534)["user"] == "65534"
    assert _ops.session_body(user="nobody") == {"user": "nobody"}
    for wrong in (True, 1.5, ["root"]):
        with pytest.raises(TypeError, match="user="):
            _ops.exec_body("id", user=wrong)  # type: ignore[arg-type]


@DRIVERS
async def test_the_agents_refusals_of_user_are_typed(mode: str) -> None:
    not_root = "the agent runs as uid 1000, not root, so it cannot run commands as uid 65534:65534; leave out `user`"
    agent = Agent(**{"POST /exec": [error(403, "Forbidden", not_root), error(400, "BadRequest", "no user `dev` in the image's /etc/passwd")],
                     "POST /sessions": [error(403, "Forbidden", not_root)]})
    async with sandbox_of(mode, agent) as sbx:
        with pytest.raises(Forbidden, match="not root"):
            await done(sbx.exec("id -u", user=65534))
        with pytest.raises(InvalidRequest, match="no user `dev`") as raised:
            await done(sbx.exec("id -u", user="dev"))
        assert raised.value.status == 400 and raised.value.code == "BadRequest"
        with pytest.raises(Forbidden):
            await done(sbx.session(user=65534))
    assert len(agent.sent("POST", "/exec")) == 2, "never retried"


# -- sessions -------------------------------------------------------------------------------------------


@DRIVERS
async def test_a_session_sends_the_agents_fields_and_parses_its_answers(mode: str) -> None:
    agent = Agent()
    async with sandbox_of(mode, agent) as sbx:
        sh = await done(sbx.session(shell="/bin/sh", cwd="/w", env={"A": 1}, user=1000, max_output_bytes=1024))
        assert isinstance(sh, Session if mode == "sync" else AsyncSession)
        assert sh.id == "s-3f9c" and sh.info == SessionInfo.from_json(STATUS)
        assert (sh.info.shell, sh.info.pid, sh.info.running, sh.info.busy, sh.info.exit_code) == ("/bin/sh", 42, True, False, None)
        assert sh.info.started_at == "2025-05-01T12:00:00.000Z"

        result = await done(sh.run("pwd; echo $X", timeout=1.5))
        assert isinstance(result, SessionRunResult) and result.ok
        assert (result.output, result.exit_code, result.timed_out, result.duration) == ("/tmp\n1\n", 0, False, 0.015)
        assert not (result.output_truncated or result.output_lossy or result.shell_exited or result.shell_restarted)
        assert result.output_encoding == "text" and result.raw == RUN_OK
        await done(sh.run("true"))

        status = await done(sh.input("yes\n"))
        assert status.busy and sh.info is status, "input keeps the status it answers"
        read = await done(sh.read(until="got:", timeout=2))
        assert isinstance(read, SessionReadResult)
        assert (read.output, read.matched, read.shell_exited, read.output_truncated) == ("got:", True, False, False)
        await done(sh.read())
        await done(sh.read(timeout=0))
        assert (await done(sh.status())).busy and sh.info.busy
        listed = await done(sbx.list_sessions())
        assert [(s.id, s.busy) for s in listed] == [("s-3f9c", False), ("s-2", True)]
        final = await done(sh.close())
        assert final.state == "exited" and not final.running and sh.info is final

    assert agent.sent("POST", "/sessions") == [
        {"shell": "/bin/sh", "cwd": "/w", "env": {"A": "1"}, "maxOutputBytes": 1024, "user": "1000"}
    ]
    assert agent.sent("POST", "/sessions/s-3f9c/run") == [{"command": "pwd; echo $X", "timeoutMs": 1500}, {"command": "true"}]
    assert agent.sent("POST", "/sessions/s-3f9c/input") == [{"text": "yes\n"}]
    assert agent.sent("POST", "/sessions/s-3f9c/read") == [{"until": "got:", "timeoutMs": 2000}, {}, {"timeoutMs": 0}]
    headers = {route: h.get("x-orchard-timeout") for m, route, _, h in agent.calls if m == "POST" and "/s-3f9c/" in route}
    # The gateway waits for the answer the command's timeout (else the agent's 600 s) plus a margin; a
    # read waits its own (else the agent's 10 s).
    run_headers = [h.get("x-orchard-timeout") for m, r, _, h in agent.calls if r == "/sessions/s-3f9c/run"]
    assert run_headers == ["32", "630"]
    read_headers = [h.get("x-orchard-timeout") for m, r, _, h in agent.calls if r == "/sessions/s-3f9c/read"]
    assert read_headers == ["32", "40", "30"]
    assert headers["/sessions/s-3f9c/input"] is None


@DRIVERS
async def test_interrupt_and_signal_send_the_signal_and_keep_the_status(mode: str) -> None:
    idle = {"running": False, "session": STATUS}
    agent = Agent(**{"POST /sessions/s-3f9c/signal": [
        httpx.Response(200, json={"running": True, "session": {**STATUS, "busy": True}}),
        httpx.Response(200, json=idle), httpx.Response(200, json=idle),
        error(400, "BadRequest", "unknown signal `BOGUS`; use one of HUP, INT, ... or a number"),
        error(503, "AgentUnavailable", "agent restarting", retryable=True),
        error(409, "Conflict", "the shell of session `s-3f9c` has exited with code 0")]})
    async with sandbox_of(mode, agent) as sbx:
        sh = await done(sbx.session())
        answer = await done(sh.interrupt())
        assert isinstance(answer, SessionSignalResult) and answer.running
        assert answer.session.busy and sh.info is answer.session, "the status answered is kept"
        quiet = await done(sh.signal("KILL"))
        assert not quiet.running and not quiet.session.busy and quiet.raw == idle
        await done(sh.signal(9))
        with pytest.raises(InvalidRequest, match="unknown signal"):
            await done(sh.signal("BOGUS"))
        with pytest.raises(Exception, match="agent restarting"):
            await done(sh.interrupt())
        with pytest.raises(Conflict, match="has exited"):
            await done(sh.interrupt())
        for wrong in (True, 2.0, None):
            with pytest.raises(TypeError, match="signal"):
                await done(sh.signal(wrong))  # type: ignore[arg-type]
    assert agent.sent("POST", "/sessions/s-3f9c/signal") == [
        {"signal": "INT"}, {"signal": "KILL"}, {"signal": 9}, {"signal": "BOGUS"}, {"signal": "INT"}, {"signal": "INT"}
    ], "never retried, nothing sent for a wrong type"


def test_session_bodies_are_checked_before_any_request() -> None:
    assert _ops.session_body() == {}
    assert _ops.session_run_body("ls", 0.0001) == {"command": "ls", "timeoutMs": 1}, "rounded up, never 0"
    assert _ops.session_run_body("ls", 600) == {"command": "ls", "timeoutMs": 600000}
    for wrong in (0, -1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="run"):
            _ops.session_run_body("ls", wrong)
    with pytest.raises(TypeError, match="shell code"):
        _ops.session_run_body(["ls"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        _ops.session_read_body("")
    with pytest.raises(ValueError, match="non-negative"):
        _ops.session_read_body("x", -1)
    assert _ops.read_answer_timeout(None) == 40.0 and _ops.read_answer_timeout(1000) == 330.0


@DRIVERS
async def test_check_raises_command_failed_on_a_non_zero_exit_or_a_timeout(mode: str) -> None:
    failed = {**RUN_OK, "output": "boom\n", "exitCode": 3}
    timed_out = {**RUN_OK, "output": "", "exitCode": 130, "timedOut": True}
    agent = Agent(**{"POST /sessions/s-3f9c/run": [httpx.Response(200, json=failed), httpx.Response(200, json=timed_out),
                                                   httpx.Response(200, json=failed)]})
    async with sandbox_of(mode, agent) as sbx:
        sh = await done(sbx.session())
        with pytest.raises(CommandFailed, match=r"'false' exited with 3: boom") as raised:
            await done(sh.run("false", check=True))
        assert raised.value.result.exit_code == 3 and raised.value.code == "CommandFailed"
        with pytest.raises(CommandFailed, match=r"'sleep 1000' exited with 130 \(timed out\)") as raised:
            await done(sh.run("sleep 1000", timeout=1, check=True))
        assert raised.value.result.timed_out
        result = await done(sh.run("false"))
        assert result.exit_code == 3 and not result.ok, "without check the result is answered"


@DRIVERS
async def test_the_end_of_a_with_block_closes_the_session_and_closing_twice_is_fine(mode: str) -> None:
    agent = Agent()
    async with sandbox_of(mode, agent) as sbx:
        if mode == "sync":
            with sbx.session() as sh:
                sh.run("true")
        else:
            async with sbx.session() as sh:
                await sh.run("true")
        assert [(m, r) for m, r, _, _ in agent.calls] == [
            ("POST", "/sessions"), ("POST", "/sessions/s-3f9c/run"), ("DELETE", "/sessions/s-3f9c")]
        # Closed already: the agent answers 404, swallowed; the final status seen is answered again.
        again = await done(sh.close())
        assert again is not None and again.state == "exited"
        if mode == "async":
            agent.deleted = False
            handle = await sbx.session()  # awaited, then used as an async context manager itself
            async with handle as same:
                assert same is handle
    deletes = [r for m, r, _, _ in agent.calls if m == "DELETE"]
    assert deletes == ["/sessions/s-3f9c"] * (2 if mode == "sync" else 3)


@DRIVERS
async def test_runs_and_input_are_never_retried_and_conflicts_are_typed(mode: str) -> None:
    busy = error(409, "Conflict", "another run is in progress in session s-3f9c")
    unavailable = error(503, "AgentUnavailable", "agent restarting", retryable=True)
    agent = Agent(**{"POST /sessions/s-3f9c/run": [unavailable, busy],
                     "POST /sessions/s-3f9c/input": [unavailable],
                     "GET /sessions/s-3f9c": [unavailable, httpx.Response(200, json=STATUS)]})
    async with sandbox_of(mode, agent) as sbx:
        sh = await done(sbx.session())
        with pytest.raises(Exception, match="agent restarting"):
            await done(sh.run("make"))
        with pytest.raises(Conflict, match="another run"):
            await done(sh.run("make"))
        with pytest.raises(Exception, match="agent restarting"):
            await done(sh.input("y\n"))
        assert (await done(sh.status())).id == "s-3f9c", "a status read is retried"
    assert len(agent.sent("POST", "/sessions/s-3f9c/run")) == 2
    assert len(agent.sent("POST", "/sessions/s-3f9c/input")) == 1
    assert len(agent.sent("GET", "/sessions/s-3f9c")) == 2


def test_session_models_read_an_exited_shell() -> None:
    info = SessionInfo.from_json({**STATUS, "state": "exited", "exitCode": 3, "pid": None})
    assert (info.running, info.exit_code, info.pid) == (False, 3, None)
    run = SessionRunResult.from_json({**RUN_OK, "exitCode": None, "shellExited": True})
    assert run.shell_exited and not run.ok and run.exit_code is None
    assert SessionRunResult.from_json({}).output_encoding == "text"
    read = SessionReadResult.from_json({"output": "x", "matched": False, "shellExited": True})
    assert (read.matched, read.shell_exited, read.output_encoding) == (False, True, "text")
    signalled = SessionSignalResult.from_json({"running": True, "session": {**STATUS, "busy": True}})
    assert signalled.running and signalled.session == SessionInfo.from_json({**STATUS, "busy": True})
    assert not SessionSignalResult.from_json({}).running


# -- on the local cluster -------------------------------------------------------------------------------

PROMPT = "printf 'line? '; read -r line; echo got:$line"


@pytest.mark.cluster
def test_a_session_keeps_its_state_answers_prompts_and_survives_a_timeout(client: SandboxClient, cluster: Cluster) -> None:
    with client.create(image=cluster.image, ttl_seconds=600) as sbx:
        with sbx.session() as sh:
            assert sh.run("cd /tmp; export X=1").ok
            carried = sh.run("pwd; echo $X")
            assert (carried.output, carried.exit_code) == ("/tmp\n1\n", 0), carried

            answers: list[SessionRunResult] = []
            runner = threading.Thread(target=lambda: answers.append(sh.run(PROMPT, timeout=60)))
            runner.start()
            try:
                assert sh.read(until="line? ", timeout=30).matched, "the prompt came"
                assert sh.status().busy
                sh.input("bob\n")
                got = sh.read(until="got:", timeout=30)
                assert got.matched and got.output.endswith("got:"), got
            finally:
                runner.join(60)
            assert answers and answers[0].output == "line? got:bob\n" and answers[0].exit_code == 0, answers

            slow = sh.run("sleep 1000", timeout=1)
            assert slow.timed_out and slow.exit_code == 130 and not slow.shell_restarted, slow
            with pytest.raises(CommandFailed, match="timed out"):
                sh.run("sleep 1000", timeout=1, check=True)
            assert sh.run("echo ok", check=True).output == "ok\n"
            assert sh.run("pwd").output == "/tmp\n", "the interrupted runs left the state as it was"
            assert sh.id in [s.id for s in sbx.list_sessions()]
        assert sh.id not in [s.id for s in sbx.list_sessions()], "the with block closed it"
        sh.close()  # again: fine


@pytest.mark.cluster
def test_interrupt_stops_a_run_from_another_thread_and_kill_one_that_ignores_it(client: SandboxClient,
                                                                                cluster: Cluster) -> None:
    with client.create(image=cluster.image, ttl_seconds=600) as sbx, sbx.session() as sh:
        sh.run("cd /tmp; X=kept")
        assert not sh.interrupt().running, "nothing runs: nothing is signalled"
        for command in ("echo started; sleep 1000", "echo started; yes | head -c 100000000000 | wc -c",
                        "sh -c 'trap \"\" INT; echo started; sleep 1000'; echo after"):
            answers: list[SessionRunResult] = []
            runner = threading.Thread(target=lambda: answers.append(sh.run(command, timeout=300)))
            runner.start()
            try:
                assert sh.read(until="started", timeout=30).matched, command
                time.sleep(0.2)
                signalled = sh.interrupt()
                assert signalled.running and signalled.session.busy, signalled
                runner.join(5)
                if runner.is_alive():  # only the command that ignores SIGINT is still running
                    assert "trap" in command
                    assert sh.signal("KILL").running
                    runner.join(5)
                assert not runner.is_alive(), f"{command!r} still runs"
            finally:
                runner.join(60)
            result = answers[0]
            assert (result.exit_code, result.timed_out, result.shell_restarted) == (130, False, False), result
            assert "after" not in result.output, result
            assert sh.run("echo $X; pwd").output == "kept\n/tmp\n", "the same shell carries on"


@pytest.mark.cluster
def test_commands_and_sessions_run_as_another_uid(client: SandboxClient, cluster: Cluster) -> None:
    with client.create(image=cluster.image, ttl_seconds=600) as sbx:
        assert sbx.exec("id -u", user=65534).stdout == "65534\n"
        assert sbx.exec(["id", "-u"], user="65534:65534").stdout == "65534\n"
        assert sbx.exec("id -u").stdout == "0\n", "the agent (and so commands without user) runs as root here"
        process = sbx.start_process("id -u", user=65534)
        assert process.wait(timeout=30).stdout == "65534\n"
        with sbx.session(user=65534) as sh:
            assert sh.run("id -u").output == "65534\n"
        with pytest.raises(InvalidRequest):
            sbx.exec("id -u", user="no-such-user-here")


@pytest.mark.cluster
async def test_async_sessions(aclient: AsyncSandboxClient, cluster: Cluster) -> None:
    async with aclient.create(image=cluster.image, ttl_seconds=600) as sbx:
        async with sbx.session() as sh:
            await sh.run("cd /tmp; export X=1")
            assert (await sh.run("pwd; echo $X")).output == "/tmp\n1\n"
            pending = asyncio.create_task(sh.run(PROMPT, timeout=60))
            assert (await sh.read(until="line? ", timeout=30)).matched
            await sh.input("bob\n")
            assert (await sh.read(until="got:", timeout=30)).matched
            assert (await pending).output == "line? got:bob\n"
            assert (await sh.run("sleep 1000", timeout=1)).timed_out
            pending = asyncio.create_task(sh.run("echo started; sleep 1000", timeout=300))
            assert (await sh.read(until="started", timeout=30)).matched
            await asyncio.sleep(0.2)
            assert (await sh.interrupt()).running
            interrupted = await asyncio.wait_for(pending, 10)
            assert (interrupted.exit_code, interrupted.timed_out) == (130, False), interrupted
            assert (await sh.run("echo ok")).output == "ok\n"
            assert (await sbx.exec("id -u", user=65534)).stdout == "65534\n"
        assert sh.id not in [s.id for s in await sbx.list_sessions()]
        await sh.close()


@pytest.mark.cluster
def test_the_shell_sessions_block_of_the_docs_runs(cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The "Shell sessions" block of docs/SDK.md, as it is written there."""
    run_sdk_doc_block("Shell sessions", cluster, monkeypatch, {'"busybox"': repr(cluster.image)})
    out = capsys.readouterr().out.splitlines()
    assert out == ["/tmp", "hello", "True", "name? hi bob", "True 130", "True", "130", "ok", "65534"], out
