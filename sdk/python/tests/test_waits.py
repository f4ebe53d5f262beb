"""Waits that explain themselves (sync and async, fake gateway, no cluster): ``create()`` and
``wait_ready()`` return early on a ``Stalled`` or ``Failed`` sandbox with a typed error carrying its phase,
reason and condition message, and a timeout carries the same three as last seen."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from orchard_env import (
    AsyncSandboxClient,
    OrchardError,
    SandboxClient,
    SandboxFailed,
    SandboxProgress,
    SandboxStalled,
    Timeout,
)
from orchard_env import _ops
from orchard_env.errors import error_from_response

from conftest import DRIVERS, client_of, done

BASE = "/v1/namespaces/ns/sandboxes"
POOL_MESSAGE = 'SandboxPool "py" does not exist in namespace ns'


def condition(type_: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def sandbox(phase: str, *conditions: dict[str, str], **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "s1", "namespace": "ns"}, "spec": {"image": "x"},
            "status": {"phase": phase, "conditions": list(conditions), **status}}


STALLED = sandbox(
    "Pending",
    condition("Ready", "False", "NotScheduled", "waiting for a member of SandboxPool py"),
    condition("Stalled", "True", "PoolNotFound", POOL_MESSAGE),
)
FAILED = sandbox(
    "Failed",
    condition("Ready", "False", "ImagePullBackOff", 'Back-off pulling image "nope"'),
    condition("Stalled", "True", "ImagePullBackOff", 'Back-off pulling image "nope"'),
    reason="ImagePullBackOff", message='Back-off pulling image "nope"',
)
READY = sandbox("Ready", condition("Ready", "True", "SandboxReady"))
STARTING_MESSAGE = "waiting for the agent to answer /healthz (it answers once the sandbox's NetworkPolicies are enforced)"


def wait_timeout(phase: str = "Starting", reason: str | None = "AgentStarting",
                 message: str | None = STARTING_MESSAGE) -> httpx.Response:
    """The gateway's 504 ``WaitTimeout``; ``reason``/``conditionMessage`` left out when None (an older gateway)."""
    body: dict[str, Any] = {"code": "WaitTimeout", "message": f"Sandbox ns/s1 did not settle in time (phase {phase}); wait again",
                            "retryable": True, "phase": phase}
    if reason is not None:
        body["reason"] = reason
    if message is not None:
        body["conditionMessage"] = message
    return httpx.Response(504, json=body)


class Gateway:
    """Creates ``s1``; its waits answer ``waits`` in order (the last one again when they run out);
    deletes are recorded."""

    def __init__(self, *waits: httpx.Response | dict[str, Any]) -> None:
        self.waits = list(waits)
        self.calls: list[tuple[str, str]] = []
        self.asked: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        if request.url.path.endswith("/wait"):
            self.asked.append(request.url.params.get("timeoutSeconds", ""))
        if (request.method, request.url.path) == ("POST", BASE):
            return httpx.Response(201, json={"metadata": {"name": "s1", "namespace": "ns"}})
        if request.url.path == f"{BASE}/s1/wait":
            answer = self.waits.pop(0) if len(self.waits) > 1 else self.waits[0]
            return answer if isinstance(answer, httpx.Response) else httpx.Response(200, json=answer)
        if request.method == "DELETE":
            return httpx.Response(200, json={"deleted": True})
        if request.url.path == f"{BASE}/s1":
            return httpx.Response(200, json=json.loads(json.dumps(STALLED)))
        return httpx.Response(404, json={"code": "NotFound", "message": request.url.path})

    @property
    def wait_seconds(self) -> list[str]:
        """The ``timeoutSeconds`` of each wait, as asked."""
        return self.asked

    @property
    def waited(self) -> int:
        return sum(path.endswith("/wait") for _, path in self.calls)

    @property
    def deleted(self) -> bool:
        return ("DELETE", f"{BASE}/s1") in self.calls


@DRIVERS
async def test_create_returns_at_once_with_sandbox_stalled(mode: str) -> None:
    gateway = Gateway(STALLED)
    async with client_of(mode, gateway) as client:
        with pytest.raises(SandboxStalled) as raised:
            await done(client.create(image="x", wait_timeout=600))
    error = raised.value
    assert isinstance(error, SandboxFailed), "a SandboxStalled is a SandboxFailed"
    assert (error.phase, error.reason, error.condition_message) == ("Pending", "PoolNotFound", POOL_MESSAGE)
    assert error.code == "SandboxStalled" and error.body["metadata"]["name"] == "s1"
    assert str(error) == f"SandboxStalled: sandbox ns/s1 is stalled (phase Pending, reason PoolNotFound: {POOL_MESSAGE})"
    assert gateway.waited == 1, "one settled wait, not a wait until the timeout"
    assert gateway.deleted, "delete_on_exit deletes a sandbox that will not start"


@DRIVERS
async def test_create_returns_at_once_with_sandbox_failed(mode: str) -> None:
    gateway = Gateway(wait_timeout("Pending", "NotScheduled", "0/3 nodes are available"), FAILED)
    async with client_of(mode, gateway) as client:
        with pytest.raises(SandboxFailed) as raised:
            await done(client.create(image="nope", delete_on_exit=False))
    error = raised.value
    assert not isinstance(error, SandboxStalled), "Failed wins over its Stalled condition"
    assert (error.phase, error.reason, error.condition_message) == ("Failed", "ImagePullBackOff", 'Back-off pulling image "nope"')
    assert "will not become Ready (phase Failed, reason ImagePullBackOff: Back-off pulling image \"nope\")" in str(error)
    assert gateway.waited == 2 and not gateway.deleted, "delete_on_exit=False keeps it for inspection"


@DRIVERS
async def test_wait_ready_timeout_carries_the_last_phase_reason_and_condition_message(mode: str) -> None:
    gateway = Gateway(wait_timeout("Pending", "NotScheduled", "0/3 nodes are available"), wait_timeout())
    async with client_of(mode, gateway) as client:
        sbx = await done(client.create(image="x", wait=False))
        with pytest.raises(Timeout) as raised:
            await done(sbx.wait_ready(timeout=0.2))
        assert sbx.phase == "Starting"
    error = raised.value
    assert isinstance(error, TimeoutError) and error.status is None
    assert (error.phase, error.reason, error.condition_message) == ("Starting", "AgentStarting", STARTING_MESSAGE)
    assert str(error).startswith("sandbox ns/s1 not Ready after 0.2s (phase Starting, reason AgentStarting: waiting for the agent")


@DRIVERS
async def test_a_wait_timeout_without_reason_still_names_the_phase(mode: str) -> None:
    gateway = Gateway(wait_timeout("Starting", None, None))
    async with client_of(mode, gateway) as client:
        sbx = await done(client.create(image="x", wait=False))
        with pytest.raises(Timeout, match=r"not Ready after 0.1s \(phase Starting\)$") as raised:
            await done(sbx.wait_ready(timeout=0.1))
    assert (raised.value.phase, raised.value.reason, raised.value.condition_message) == ("Starting", None, None)


@DRIVERS
async def test_a_ready_sandbox_is_returned(mode: str) -> None:
    gateway = Gateway(wait_timeout(), READY)
    async with client_of(mode, gateway) as client:
        sbx = await done(client.create(image="x", auto_heartbeat=False, delete_on_exit=False))
        assert sbx.phase == "Ready" and gateway.waited == 2


@DRIVERS
async def test_on_progress_sees_each_change_once_within_short_waits(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    gateway = Gateway(
        wait_timeout("Pending", "NotScheduled", "0/3 nodes are available"),
        wait_timeout("Pending", "NotScheduled", "0/3 nodes are available"),
        wait_timeout(),
        wait_timeout(),
        READY,
    )
    seen: list[SandboxProgress] = []
    caplog.set_level("INFO", logger="orchard_env")
    async with client_of(mode, gateway) as client:
        sbx = await done(client.create(image="x", auto_heartbeat=False, delete_on_exit=False, on_progress=seen.append))
        assert sbx.phase == "Ready"
    assert [(p.phase, p.reason) for p in seen] == [
        ("Pending", "NotScheduled"), ("Starting", "AgentStarting"), ("Ready", "SandboxReady")
    ], "one call per change, the last one Ready"
    assert seen[0].message == "0/3 nodes are available" and seen[1].message == STARTING_MESSAGE
    assert all(p.name == "s1" and p.namespace == "ns" for p in seen)
    assert [p.elapsed for p in seen] == sorted(p.elapsed for p in seen) and seen[0].elapsed >= 0
    asked = [float(request_wait) for request_wait in gateway.wait_seconds]
    assert asked and max(asked) <= _ops.PROGRESS_POLL, f"server-side waits of at most {_ops.PROGRESS_POLL}s: {asked}"
    logged = [r.getMessage() for r in caplog.records if r.name == "orchard_env" and r.levelname == "INFO"]
    assert any(m.startswith("sandbox ns/s1: phase Pending, reason NotScheduled: 0/3 nodes") for m in logged), logged


@DRIVERS
async def test_without_on_progress_the_waits_stay_long(mode: str) -> None:
    gateway = Gateway(wait_timeout(), READY)
    async with client_of(mode, gateway) as client:
        await done(client.create(image="x", auto_heartbeat=False, delete_on_exit=False))
    assert [float(w) for w in gateway.wait_seconds][0] > _ops.PROGRESS_POLL


def test_gateway_wait_timeout_becomes_a_timeout_with_the_three_fields() -> None:
    body = {"code": "WaitTimeout", "message": "Sandbox ns/s1 did not settle in time (phase Pending); wait again",
            "retryable": True, "phase": "Pending", "reason": "QuotaExceeded", "conditionMessage": "exceeded quota: q"}
    error = error_from_response(504, json.dumps(body).encode())
    assert isinstance(error, Timeout) and error.retryable and error.code == "WaitTimeout"
    assert (error.phase, error.reason, error.condition_message) == ("Pending", "QuotaExceeded", "exceeded quota: q")
    other = error_from_response(504, json.dumps({"code": "AgentTimeout", "message": "m"}).encode())
    assert isinstance(other, Timeout) and (other.phase, other.reason, other.condition_message) == (None, None, None)


def test_sandbox_failed_keeps_its_old_constructor() -> None:
    error = SandboxFailed("sandbox ns/s1 is Failed", reason="ImagePullBackOff")
    assert isinstance(error, OrchardError) and error.reason == "ImagePullBackOff" and error.code == "SandboxFailed"
    assert (error.phase, error.condition_message, error.message) == (None, None, "sandbox ns/s1 is Failed")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (STALLED, ("Pending", "PoolNotFound", POOL_MESSAGE)),
        (FAILED, ("Failed", "ImagePullBackOff", 'Back-off pulling image "nope"')),
        (sandbox("Starting", condition("Ready", "False", "AgentStarting", "waiting"), condition("Stalled", "False", "Progressing")),
         ("Starting", "AgentStarting", "waiting")),
        (sandbox("Expired", reason="HeartbeatTimeout"), ("Expired", "HeartbeatTimeout", None)),
        ({"metadata": {"name": "s1"}}, (None, None, None)),
    ],
)
def test_why_not_ready(raw: dict[str, Any], expected: tuple[str | None, ...]) -> None:
    assert _ops.why_not_ready(raw) == expected


def test_the_default_wait_outlasts_the_operators_startup_timeout() -> None:
    methods: list[Callable[..., Any]] = [SandboxClient.create, AsyncSandboxClient.create]
    for method in methods:
        assert inspect.signature(method).parameters["wait_timeout"].default == 630.0
    from orchard_env import AsyncSandbox, Sandbox

    for method in (Sandbox.wait_ready, AsyncSandbox.wait_ready):
        assert inspect.signature(method).parameters["timeout"].default == 630.0
    assert _ops.DEFAULT_WAIT_TIMEOUT > 600, "the chart's sandboxDefaults.startupTimeoutSeconds"
