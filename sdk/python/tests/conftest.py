"""Fixtures of the SDK tests. Cluster tests need the environment ``e2e/tests/hollow_shared/python_sdk.rs`` sets
(a local cluster with the real operator, a namespace with RBAC for the test user); without it they are
skipped, except under ``CI=true`` where they fail."""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchard_env import AsyncSandboxClient, RetryPolicy, SandboxClient, _cleanup


@dataclass(frozen=True)
class Cluster:
    gateway: str
    token: str
    namespace: str
    other_namespace: str
    bob_token: str
    kube_server: str
    kube_ca: str
    metrics_url: str
    # The images sandboxes are created from: any image with a POSIX shell, and one with python3.
    image: str = "busybox"
    python_image: str = "python:3.11"
    # Whether this process may reach agents at their pod IPs (direct mode). Not where NetworkPolicies
    # are enforced: there only the operator's pods reach agents.
    direct: bool = True


def _need(name: str) -> str:
    value = os.environ.get(name)
    if value:
        return value
    message = f"{name} is not set: run the SDK tests with `make test-sdk` (driven by e2e/tests/hollow_shared/python_sdk.rs)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    return Cluster(
        gateway=_need("ORCHARD_TEST_GATEWAY_URL"),
        token=_need("ORCHARD_TEST_TOKEN"),
        namespace=_need("ORCHARD_TEST_NAMESPACE"),
        other_namespace=_need("ORCHARD_TEST_OTHER_NAMESPACE"),
        bob_token=_need("ORCHARD_TEST_BOB_TOKEN"),
        kube_server=_need("ORCHARD_TEST_KUBE_SERVER"),
        kube_ca=_need("ORCHARD_TEST_KUBE_CA"),
        metrics_url=_need("ORCHARD_TEST_METRICS_URL"),
        image=os.environ.get("ORCHARD_TEST_IMAGE", "busybox"),
        python_image=os.environ.get("ORCHARD_TEST_PYTHON_IMAGE", "python:3.11"),
        direct=os.environ.get("ORCHARD_TEST_DIRECT", "1") != "0",
    )


@pytest.fixture
def client(cluster: Cluster) -> Iterator[SandboxClient]:
    with SandboxClient(cluster.gateway, cluster.token, namespace=cluster.namespace) as c:
        yield c


@pytest.fixture
async def aclient(cluster: Cluster) -> AsyncIterator[AsyncSandboxClient]:
    async with AsyncSandboxClient(cluster.gateway, cluster.token, namespace=cluster.namespace) as c:
        yield c


@pytest.fixture(autouse=True)
def _forget_handles_of_fake_gateways() -> Iterator[None]:
    """Handles a test left open on a fake gateway are forgotten afterwards, so the exit cleanup of the
    test process (``orchard_env._cleanup``) does not try to delete their sandboxes."""
    yield
    cluster = (os.environ.get("ORCHARD_TEST_GATEWAY_URL") or "").rstrip("/")
    for handle in list(_cleanup.OPEN):
        if handle.client.settings.base_url != cluster:
            _cleanup.forget(handle)


# -- unit tests on a fake gateway, run as is on both clients ------------------------------------------

#: Retries without waiting, for fake gateways.
FAST = RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002)
#: Runs a test once per client.
DRIVERS = pytest.mark.parametrize("mode", ["sync", "async"])


@contextlib.asynccontextmanager
async def client_of(mode: str, handler: Callable[[httpx.Request], httpx.Response]) -> AsyncIterator[Any]:
    """A client of either driver (``mode``: ``sync`` or ``async``) on a fake gateway answering with
    ``handler``, namespace ``ns``; with :func:`done` a test runs as is on both."""
    transport = httpx.MockTransport(handler)
    if mode == "sync":
        with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
            yield client
    else:
        async with AsyncSandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as aclient:
            yield aclient


@contextlib.asynccontextmanager
async def sandbox_of(mode: str, handler: Callable[[httpx.Request], httpx.Response]) -> AsyncIterator[Any]:
    """A handle on sandbox ``ns/s1`` of either client (``mode``: ``sync`` or ``async``) on a fake gateway
    answering with ``handler``; with :func:`done` a test runs as is on both."""
    transport = httpx.MockTransport(handler)
    if mode == "sync":
        with SandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as client:
            yield client.connect("s1", auto_heartbeat=False)
    else:
        async with AsyncSandboxClient("http://gw", "t", namespace="ns", transport=transport, retry=FAST) as aclient:
            yield await aclient.connect("s1", auto_heartbeat=False)


async def done(value: Any) -> Any:
    """The result of a sync call, or of an async call's awaitable."""
    return await value if inspect.isawaitable(value) else value


def sdk_doc_block(section: str) -> str:
    """The first Python block under ``## {section}`` of docs/SDK.md, as it is written there."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "SDK.md").read_text()
    return doc.split(f"## {section}\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def run_sdk_doc_block(section: str, cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                      replacements: dict[str, str] | None = None) -> None:
    """Runs the first Python block under ``## {section}`` of docs/SDK.md as it is written there (after the
    literal ``replacements``), its client configured by the environment for ``cluster``; closes a
    ``client`` it left open."""
    block = sdk_doc_block(section)
    for old, new in (replacements or {}).items():
        block = block.replace(old, new)
    monkeypatch.setenv("ORCHARD_GATEWAY_URL", cluster.gateway)
    monkeypatch.setenv("ORCHARD_TOKEN", cluster.token)
    monkeypatch.setenv("ORCHARD_NAMESPACE", cluster.namespace)
    scope: dict[str, Any] = {}
    try:
        exec(compile(block, "docs/SDK.md", "exec"), scope)
    finally:
        if isinstance(scope.get("client"), SandboxClient):
            scope["client"].close()
