"""Pure parts of the SDK and its retry/error behaviour against a fake transport (no cluster)."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import time
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard_env import (
    AgentUnavailable,
    AsyncSandboxClient,
    Conflict,
    Forbidden,
    GatewayUnreachable,
    InvalidRequest,
    NotFound,
    NotReady,
    PatchConflict,
    QuotaExceeded,
    RetryPolicy,
    SandboxClient,
    Timeout,
    Unauthorized,
)
from orchard_env import _ops
from orchard_env._config import TokenSource
from orchard_env._retry import retry_exception, retry_status
from orchard_env.errors import error_from_response

FAST = RetryPolicy(attempts=4, backoff=0.001, max_backoff=0.002)


def test_shorthand_body() -> None:
    body = _ops.sandbox_body(
        "python:3.11", name="s", labels={"a": "b"}, env={"K": "V"}, cpu=2, memory="1Gi",
        ttl_seconds=60, heartbeat_timeout_seconds=0, network="AllowAll", extra={"working_dir": "/w"},
    )
    assert body == {
        "name": "s", "labels": {"a": "b"}, "image": "python:3.11", "env": {"K": "V"}, "cpu": "2",
        "memory": "1Gi", "ttlSeconds": 60, "heartbeatTimeoutSeconds": 0,
        "network": {"egress": "AllowAll"}, "workingDir": "/w",
    }
    assert _ops.sandbox_body(None, spec={"image": "x"}) == {"spec": {"image": "x"}}
    with pytest.raises(ValueError, match="not both"):
        _ops.sandbox_body("x", spec={"image": "x"})
    with pytest.raises(ValueError, match="image is required"):
        _ops.sandbox_body(None)


GPU_RESOURCES = {"memory": "16Gi", "gpu": {"count": 2, "types": ["H100", "a100"]}}


def gpu_gateway(bodies: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    """A gateway that records each create body and answers Ready at once."""
    def gateway(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/sandboxes"):
            bodies.append(json.loads(request.content))
            return httpx.Response(201, json={"metadata": {"name": "s1"}})
        if request.url.path.endswith("/wait"):
            return httpx.Response(200, json=SANDBOX)
        if request.method == "DELETE":
            return httpx.Response(200, json={"deleted": True})
        return httpx.Response(404, json={"code": "NotFound", "message": "?"})
    return httpx.MockTransport(gateway)


def test_resources_with_gpus_pass_through_create_unchanged() -> None:
    bodies: list[dict[str, Any]] = []
    with SandboxClient("http://gw", "t", namespace="ns", transport=gpu_gateway(bodies), retry=FAST) as client:
        with client.create("x", cpu=4, resources=GPU_RESOURCES, auto_heartbeat=False):
            pass
    assert bodies[0]["resources"] == GPU_RESOURCES
    assert bodies[0]["cpu"] == "4"


async def test_resources_with_gpus_pass_through_the_async_create_unchanged() -> None:
    bodies: list[dict[str, Any]] = []
    async with AsyncSandboxClient("http://gw", "t", namespace="ns", transport=gpu_gateway(bodies), retry=FAST) as client:
        async with client.create("x", resources=GPU_RESOURCES, auto_heartbeat=False):
            pass
    assert bodies[0]["resources"] == GPU_RESOURCES


def test_a_pool_stands_in_for_the_image() -> None:
    body = _ops.sandbox_body(None, extra={"pool": "py", "when_pool_empty": "Wait"})
    assert body == {"pool": "py", "whenPoolEmpty": "Wait"}


def test_exec_body_forms() -> None:
    assert _ops.exec_body(["ls", "-l"]) == {"argv": ["ls", "-l"]}
    assert _ops.exec_body("ls | wc", shell="/bin/bash", timeout=5) == {
        "command": "ls | wc", "shell": "/bin/bash", "timeoutSeconds": 5,
    }
    assert _ops.exec_body(["cat"], stdin=b"\x00\x01")["stdinBase64"] == "AAE="
    assert _ops.exec_body(["cat"], stdin="hi", env={"A": 1})["env"] == {"A": "1"}  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        _ops.exec_body([])
    with pytest.raises(ValueError):
        _ops.exec_body(["ls"], shell="/bin/sh")
    assert _ops.answer_timeout(None) == 630.0
    assert _ops.answer_timeout(10) == 40.0


def test_group_body_and_heartbeat_interval() -> None:
    body = _ops.group_body(
        {"image": "x", "working_dir": "/w"}, group_size=4, max_trajectories=8, stride=4,
        positive_fraction=(0.25, 0.75), filter=False,
    )
    assert body == {
        "template": {"image": "x", "workingDir": "/w"}, "groupSize": 4, "maxTrajectories": 8,
        "stride": 4, "positiveFraction": {"min": 0.25, "max": 0.75}, "filter": {"enabled": False},
    }
    assert _ops.heartbeat_interval(30) == 10.0
    assert _ops.heartbeat_interval(0) is None
    assert _ops.heartbeat_interval(None) is None
    assert _ops.spec_heartbeat_timeout({"spec": {"lifecycle": {"heartbeatTimeoutSeconds": 9}}}) == 9


def test_errors_map_to_exception_types() -> None:
    def err(status: int, body: object) -> Exception:
        return error_from_response(status, json.dumps(body).encode())

    assert isinstance(err(404, {"code": "NotFound", "message": "x"}), NotFound)
    ready = err(409, {"code": "NotReady", "message": "m", "phase": "Pending", "retryable": True})
    assert isinstance(ready, NotReady) and isinstance(ready, Conflict)
    assert ready.phase == "Pending" and ready.retryable
    patch = err(409, {"code": "PatchConflict", "message": "m", "failedHunks": [{"hunk": 2}]})
    assert isinstance(patch, PatchConflict) and patch.failed_hunks == [{"hunk": 2}]
    unavailable = err(502, {"code": "AgentUnreachable", "message": "m", "retryable": True})
    assert isinstance(unavailable, AgentUnavailable) and unavailable.retryable
    timeout = err(504, {"code": "AgentTimeout", "message": "m", "retryable": False})
    assert isinstance(timeout, Timeout) and isinstance(timeout, TimeoutError)
    assert isinstance(err(401, {"code": "Unauthorized", "message": "m"}), Unauthorized)
    assert isinstance(err(422, {"code": "Invalid", "message": "m"}), InvalidRequest)
    full = err(403, {"code": "QuotaExceeded", "message": "exceeded quota: snapshots", "retryable": False})
    assert isinstance(full, QuotaExceeded) and isinstance(full, Forbidden) and not full.retryable
    assert type(err(403, {"code": "Forbidden", "message": "m"})) is Forbidden
    plain = error_from_response(502, b"<html>bad gateway</html>")
    assert isinstance(plain, AgentUnavailable) and "bad gateway" in str(plain)


def test_retry_decisions() -> None:
    assert retry_status(503, True, "POST")
    assert not retry_status(504, False, "POST")
    assert retry_status(502, None, "GET") and not retry_status(502, None, "POST")
    assert retry_status(409, True, "GET") and retry_status(409, True, "DELETE"), "a retryable 409 of an idempotent request"
    assert not retry_status(409, True, "POST"), "a POST may have had effects"
    assert not retry_status(409, False, "GET") and not retry_status(409, None, "PUT")
    assert not retry_status(400, True, "GET") and not retry_status(404, True, "GET"), "other 4xx are never retried"
    assert retry_status(429, True, "POST")
    request = httpx.Request("POST", "http://x")
    assert retry_exception(httpx.ConnectError("refused", request=request), "POST")
    assert not retry_exception(httpx.ReadTimeout("slow", request=request), "POST")
    assert retry_exception(httpx.ReadTimeout("slow", request=request), "GET")
    delays = [RetryPolicy(backoff=1, max_backoff=3).delay(n) for n in range(6)]
    assert all(0 <= d <= 3 for d in delays)


def fake(handler):  # type: ignore[no-untyped-def]
    calls: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return handler(request, len(calls))

    return httpx.MockTransport(record), calls


def error(status: int, code: str, retryable: bool) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": code, "retryable": retryable})


SANDBOX = {"metadata": {"name": "s1"}, "spec": {"image": "x"}, "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}], "agentEndpoint": "http://10.0.0.1:9090"}}
EXEC_OK = {"exitCode": 0, "stdout": "ok\n", "stderr": "", "timedOut": False, "durationMs": 3}


def test_retryable_answers_are_retried_with_backoff() -> None:
    transport, calls = fake(lambda r, n: error(503, "AgentUnavailable", True) if n < 3 else httpx.Response(200, json=EXEC_OK))
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        result = client._gateway("POST", "/v1/namespaces/ns/sandboxes/s1/exec", json_body={"argv": ["true"]})
    assert result.json()["stdout"] == "ok\n"
    assert len(calls) == 3
    assert calls[0].headers["authorization"] == "Bearer t"


def test_client_errors_and_unsafe_timeouts_are_not_retried() -> None:
    transport, calls = fake(lambda r, n: error(400, "BadRequest", False))
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        with pytest.raises(InvalidRequest):
            client.get("s1")
    assert len(calls) == 1
    transport, calls = fake(lambda r, n: error(504, "AgentTimeout", False))
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        with pytest.raises(Timeout):
            client._gateway("POST", "/v1/namespaces/ns/sandboxes/s1/exec", json_body={})
    assert len(calls) == 1, "an exec that may have run is not sent twice"
    transport, calls = fake(lambda r, n: error(409, "NotReady", True))
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        with pytest.raises(NotReady):
            client._gateway("POST", "/v1/namespaces/ns/sandboxes/s1/exec", json_body={})
    assert len(calls) == 1, "a retryable 409 of a POST is not retried"


def test_retryable_conflicts_of_idempotent_requests_are_retried() -> None:
    transport, calls = fake(lambda r, n: error(409, "Conflict", True) if n < 3 else httpx.Response(200, json={"deleted": True}))
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        client.delete("s1")
    assert [c.method for c in calls] == ["DELETE"] * 3
    transport, calls = fake(lambda r, n: error(409, "NotReady", True))
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        with pytest.raises(NotReady):
            client._gateway("GET", "/v1/namespaces/ns/sandboxes/s1/files", params={"path": "x"})
    assert len(calls) == FAST.attempts, "retried until the policy's attempts run out"
    transport, calls = fake(lambda r, n: error(409, "ResultAlreadyRecorded", False))
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        with pytest.raises(Conflict):
            client._gateway("GET", "/v1/namespaces/ns/sandboxes/s1")
    assert len(calls) == 1, "a 409 not marked retryable is raised at once"


def test_connection_errors_are_retried_then_reported() -> None:
    def flaky(request: httpx.Request, n: int) -> httpx.Response:
        if n < 3:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=SANDBOX)

    transport, calls = fake(flaky)
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        assert client.get("s1")["metadata"]["name"] == "s1"
    assert len(calls) == 3

    def down(request: httpx.Request, n: int) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    transport, calls = fake(down)
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        with pytest.raises(GatewayUnreachable):
            client.get("s1")
    assert len(calls) == FAST.attempts


def test_context_manager_deletes_the_sandbox() -> None:
    def gateway(request: httpx.Request, n: int) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/sandboxes"):
            return httpx.Response(201, json={"metadata": {"name": "s1"}})
        if request.url.path.endswith("/wait"):
            return httpx.Response(200, json=SANDBOX)
        if request.url.path.endswith("/exec"):
            assert json.loads(request.content) == {"argv": ["true"], "timeoutSeconds": 5}
            assert request.headers["x-orchard-timeout"] == "35"
            return httpx.Response(200, json=EXEC_OK)
        if request.method == "DELETE":
            return httpx.Response(200, json={"deleted": True})
        return httpx.Response(404, json={"code": "NotFound", "message": "?"})

    transport, calls = fake(gateway)
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        with client.create(image="x", auto_heartbeat=False) as sbx:
            assert sbx.exec(["true"], timeout=5).ok
    methods = [(c.method, c.url.path) for c in calls]
    assert methods[-1] == ("DELETE", "/v1/namespaces/ns/sandboxes/s1")


async def test_async_client_retries_and_cleans_up() -> None:
    attempts = {"exec": 0}

    def gateway(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/sandboxes"):
            return httpx.Response(201, json={"metadata": {"name": "s1"}})
        if request.url.path.endswith("/wait"):
            return httpx.Response(200, json=SANDBOX)
        if request.url.path.endswith("/exec"):
            attempts["exec"] += 1
            if attempts["exec"] == 1:
                return error(502, "AgentUnreachable", True)
            return httpx.Response(200, json=EXEC_OK)
        if request.method == "DELETE":
            attempts["deleted"] = 1
            return httpx.Response(200, json={"deleted": True})
        return httpx.Response(404, json={"code": "NotFound", "message": "?"})

    async with AsyncSandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(gateway), retry=FAST) as client:
        async with client.create(image="x", auto_heartbeat=False) as sbx:
            assert (await sbx.exec("true")).stdout == "ok\n"
    assert attempts == {"exec": 2, "deleted": 1}


# -- direct mode: the agent's address and token come from the gateway -----------------------------------

AGENT_TOKEN = "0123456789abcdef" * 4
TARGET = {"endpoint": "http://10.0.0.7:9090", "token": AGENT_TOKEN}
TOKEN_PATH = "/v1/namespaces/ns/sandboxes/s1/token"


def direct_world(*token_answers: httpx.Response):  # type: ignore[no-untyped-def]
    """The gateway (``gw``) and the agent of the sandbox's own pod (``10.0.0.7:9090``); the token route
    answers ``token_answers`` in order. ``status.agentEndpoint`` (10.0.0.1) points elsewhere and must
    never be called."""
    answers = list(token_answers)

    def handle(request: httpx.Request, n: int) -> httpx.Response:
        host, path = request.url.netloc.decode(), request.url.path
        if host == "gw":
            assert request.headers["authorization"] == "Bearer t"
            if path == "/v1/namespaces/ns/sandboxes/s1":
                return httpx.Response(200, json={**SANDBOX, "metadata": {"name": "s1", "uid": "uid-s1"}})
            if path == TOKEN_PATH:
                return answers.pop(0)
            raise AssertionError(f"agent call through the gateway in direct mode: {request.method} {path}")
        assert host == "10.0.0.7:9090", f"direct call to {host}"
        assert request.headers["authorization"] == f"Bearer {AGENT_TOKEN}"
        if path == "/v1/exec":
            return httpx.Response(200, json=EXEC_OK)
        if path == "/v1/files/list":
            return httpx.Response(200, json={"entries": [{"name": "a", "type": "file"}]})
        if path == "/v1/processes/p1":
            return httpx.Response(200, json={"id": "p1", "state": "exited"})
        return httpx.Response(404, json={"code": "NotFound", "message": path})

    return handle


def routes(calls: list[httpx.Request]) -> list[tuple[str, str, str]]:
    return [(c.method, c.url.netloc.decode(), c.url.path) for c in calls]


@contextlib.asynccontextmanager
async def direct_client(mode: str, transport: httpx.MockTransport) -> AsyncIterator[Any]:
    """A direct-mode client of either driver on ``transport``; with :func:`done` a test runs as is on both."""
    if mode == "sync":
        with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST, direct=True) as client:
            yield client
    else:
        async with AsyncSandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST, direct=True) as aclient:
            yield aclient


async def done(value: Any) -> Any:
    """The result of a sync call, or of an async call's awaitable."""
    return await value if inspect.isawaitable(value) else value


async def close(client: SandboxClient | AsyncSandboxClient) -> None:
    if isinstance(client, AsyncSandboxClient):
        await client.aclose()
    else:
        client.close()


DRIVERS = pytest.mark.parametrize("mode", ["sync", "async"])


@DRIVERS
async def test_direct_mode_gets_the_agent_address_and_token_from_the_gateway_once(mode: str) -> None:
    transport, calls = fake(direct_world(httpx.Response(200, json=TARGET)))
    async with direct_client(mode, transport) as client:
        sbx = await done(client.connect("s1", auto_heartbeat=False))
        assert (await done(sbx.exec(["true"], timeout=5))).ok
        assert [e.name for e in await done(sbx.list_files("."))] == ["a"]
        assert (await done(sbx.kill_process("p1"))).state == "exited"
    assert routes(calls) == [
        ("GET", "gw", "/v1/namespaces/ns/sandboxes/s1"),
        ("GET", "gw", TOKEN_PATH),  # once per handle, with the gateway token
        ("POST", "10.0.0.7:9090", "/v1/exec"),  # then straight to the agent, with its token
        ("GET", "10.0.0.7:9090", "/v1/files/list"),
        ("DELETE", "10.0.0.7:9090", "/v1/processes/p1"),
    ]


@DRIVERS
async def test_direct_mode_without_rbac_on_sandboxes_token_raises_forbidden(mode: str) -> None:
    message = "user alice cannot get sandboxes/token in namespace ns"
    denied = {"code": "Forbidden", "message": message, "retryable": False}
    transport, calls = fake(direct_world(httpx.Response(403, json=denied), httpx.Response(403, json={"code": "Forbidden", "message": "forbidden"})))
    async with direct_client(mode, transport) as client:
        sbx = await done(client.connect("s1", auto_heartbeat=False))
        with pytest.raises(Forbidden) as raised:
            await done(sbx.exec(["true"]))
        assert raised.value.status == 403 and str(raised.value) == f"403 Forbidden: {message}"
        # A 403 whose message does not name the permission gets it named.
        with pytest.raises(Forbidden, match=r"^403 Forbidden: forbidden \(direct mode needs RBAC get on sandboxes/token in namespace ns\)$"):
            await done(sbx.list_files("."))
    assert routes(calls)[1:] == [("GET", "gw", TOKEN_PATH)] * 2, "never retried, nothing sent to an agent"


@DRIVERS
async def test_direct_mode_not_ready_and_not_found_behave_as_for_other_calls(mode: str) -> None:
    not_ready = {"code": "NotReady", "message": "sandbox ns/s1 is Pending", "phase": "Pending", "retryable": True}
    transport, calls = fake(direct_world(
        *[httpx.Response(409, json=not_ready)] * FAST.attempts,  # a retryable 409 of a GET: retried
        httpx.Response(404, json={"code": "NotFound", "message": "no sandbox"}),
        error(503, "Unavailable", True), httpx.Response(200, json=TARGET),
    ))
    async with direct_client(mode, transport) as client:
        sbx = await done(client.connect("s1", auto_heartbeat=False))
        with pytest.raises(NotReady) as raised:
            await done(sbx.exec(["true"]))
        assert raised.value.phase == "Pending" and raised.value.retryable
        with pytest.raises(NotFound):
            await done(sbx.exec(["true"]))
        # Nothing was kept from the failures: the next call asks again (a retryable 503 is retried as
        # for every gateway call), then goes to the agent.
        assert (await done(sbx.exec(["true"]))).ok
    assert routes(calls)[1:] == [("GET", "gw", TOKEN_PATH)] * (FAST.attempts + 3) + [("POST", "10.0.0.7:9090", "/v1/exec")]


@DRIVERS
async def test_kube_arguments_are_deprecated_and_ignored(mode: str) -> None:
    kind = SandboxClient if mode == "sync" else AsyncSandboxClient
    kubes: list[dict[str, Any]] = [{"kube_server": "https://kube:6443"}, {"kube_token": "k"}, {"kube_ca_file": "/ca.crt"}]
    for kube in kubes:
        with pytest.warns(DeprecationWarning, match="ignored: direct mode gets the agent's address and token from the gateway") as caught:
            client = kind("http://gw", "t", namespace="ns", direct=True, **kube)
        assert caught[0].filename == __file__, "the warning points at the caller"
        await close(client)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        await close(kind("http://gw", "t", namespace="ns", direct=True))


def test_token_files_are_reread_when_rotated(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    source = TokenSource(path=path)
    assert source.get() == "first"
    path.write_text("second\n")
    os.utime(path, (time.time() + 5, time.time() + 5))
    source._checked = 0.0  # as if 10 s had passed
    assert source.get() == "second"


def test_exec_models_carry_the_agents_oom_lossy_and_encoding_flags() -> None:
    from orchard_env import ExecEvent, ExecResult, ProcessInfo

    answer = {**EXEC_OK, "exitCode": None, "signal": 9, "oomKilled": True, "stdoutLossy": True,
              "stderrLossy": False, "outputEncoding": "text"}
    result = ExecResult.from_json(answer)
    assert (result.oom_killed, result.signal, result.stdout_lossy, result.stderr_lossy) == (True, 9, True, False)
    assert result.output_encoding == "text" and not result.ok
    encoded = ExecResult.from_json({**EXEC_OK, "outputEncoding": "base64", "stdout": "AAE="})
    assert encoded.output_encoding == "base64" and not encoded.oom_killed and not encoded.stdout_lossy
    assert ExecResult.from_json({}).output_encoding == "text", "an older agent's answer"
    exit_event = ExecEvent.from_json({"type": "exit", "exitCode": None, "signal": 9, "timedOut": False, "oomKilled": True})
    assert (exit_event.signal, exit_event.oom_killed, exit_event.exit_code) == (9, True, None)
    assert not ExecEvent.from_json({"type": "stdout", "data": "x"}).oom_killed
    process = ProcessInfo.from_json({"id": "p", "state": "exited", "signal": 9, "oomKilled": True})
    assert (process.signal, process.oom_killed) == (9, True)


def test_check_names_the_out_of_memory_killer() -> None:
    from orchard_env import CommandFailed

    killed = {**EXEC_OK, "exitCode": None, "signal": 9, "oomKilled": True, "stderr": ""}
    transport, _ = fake(lambda r, n: httpx.Response(200, json=killed))
    with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
        sbx = client._sandbox_type(client, "s1", "ns", SANDBOX, delete_on_exit=False, auto_heartbeat=False)
        with pytest.raises(CommandFailed, match=r"exited with None \(killed by the out-of-memory killer\)") as failed:
            sbx.exec(["python3", "-c", "x = ' ' * 2**40"], check=True)
    assert failed.value.result.oom_killed


async def test_async_client_close_is_aclose() -> None:
    client = AsyncSandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(lambda r: httpx.Response(404)))
    await client.close()
    assert client._http.is_closed
    sync = SandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(lambda r: httpx.Response(404)))
    sync.close()
    assert sync._http.is_closed
