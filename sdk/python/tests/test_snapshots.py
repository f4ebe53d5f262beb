"""Snapshots and forks (sync and async, fake gateway, no cluster): ``sbx.snapshot()`` creates a
SandboxSnapshot and waits until it is Ready, a failed one raises ``SnapshotFailed`` with its reason and
message, ``client.create(from_snapshot=...)`` sends ``fromSnapshot`` instead of an image, and
``sbx.fork(count=N)`` snapshots once, creates N sandboxes from it at once, waits for each, and deletes
them all when one cannot start."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from orchard_env import (
    AsyncSnapshot,
    SandboxFailed,
    Snapshot,
    SnapshotFailed,
)
from orchard_env import _ops

from conftest import DRIVERS, client_of, done

SANDBOXES = "/v1/namespaces/ns/sandboxes"
SNAPSHOTS = "/v1/namespaces/ns/sandboxsnapshots"


def ready_condition(status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": "Ready", "status": status, "reason": reason, "message": message}


def snapshot_object(name: str, phase: str, reason: str, message: str = "", image: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": [ready_condition("True" if phase == "Ready" else "False", reason, message)]}
    if image:
        status["image"] = image
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"sandbox": "prep"}, "status": status}


def sandbox_object(name: str, phase: str, reason: str = "SandboxReady", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec,
            "status": {"phase": phase, "reason": None if phase == "Ready" else reason,
                       "conditions": [ready_condition("True" if phase == "Ready" else "False", reason)]}}


class Gateway:
    """A gateway holding the sandbox ``prep`` (Ready); snapshots it is asked for settle as ``snapshot_phase``
    says; sandboxes created settle Ready, but for the names in ``failing``."""

    def __init__(self, snapshot_phase: str = "Ready", failing: tuple[str, ...] = ()) -> None:
        self.snapshot_phase = snapshot_phase
        self.failing = failing
        self.calls: list[tuple[str, str, Any]] = []
        self.created = 0
        self.snapshots: dict[str, dict[str, Any]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.calls.append((request.method, path, body))
        if (request.method, path) == ("POST", SNAPSHOTS):
            name = body.get("name") or f"{body['generateName']}abcde"
            self.snapshots[name] = body
            return httpx.Response(201, json={"metadata": {"name": name, "namespace": "ns"}, "spec": body})
        if path.startswith(SNAPSHOTS + "/") and path.endswith("/wait"):
            name = path.split("/")[-2]
            if self.snapshot_phase == "Ready":
                return httpx.Response(200, json=snapshot_object(name, "Ready", "Committed", "pushed", f"r/ns/{name}@sha256:aa"))
            return httpx.Response(200, json=snapshot_object(name, "Failed", "PushRefused", "dial tcp: connection refused"))
        if (request.method, path) == ("POST", SANDBOXES):
            self.created += 1
            name = f"{body.get('generateName', 'sbx-')}{self.created}"
            return httpx.Response(201, json={"metadata": {"name": name, "namespace": "ns"}, "spec": body})
        if path.startswith(SANDBOXES + "/") and path.endswith("/wait"):
            name = path.split("/")[-2]
            if name in self.failing:
                return httpx.Response(200, json=sandbox_object(name, "Failed", "SnapshotFailed"))
            return httpx.Response(200, json=sandbox_object(name, "Ready"))
        if path == f"{SANDBOXES}/prep":
            return httpx.Response(200, json=sandbox_object("prep", "Ready", image="x"))
        if request.method == "DELETE":
            return httpx.Response(200, json={"deleted": True})
        if request.method == "POST" and path.endswith("/heartbeat"):
            return httpx.Response(200, json={"heartbeatTimeoutSeconds": 600, "written": True})
        return httpx.Response(404, json={"code": "NotFound", "message": path})

    def posted(self, path: str) -> list[Any]:
        return [body for method, p, body in self.calls if (method, p) == ("POST", path)]

    def deleted(self) -> list[str]:
        return [p.rsplit("/", 1)[-1] for method, p, _ in self.calls if method == "DELETE"]


@DRIVERS
async def test_a_snapshot_is_created_and_waited_for(mode: str) -> None:
    gateway = Gateway()
    async with client_of(mode, gateway) as client:
        sbx = await done(client.connect("prep"))
        snap = await done(sbx.snapshot(name="prepared", paths=["/work"], ttl_seconds_after_unused=60))
        await done(sbx.close())
    assert gateway.posted(SNAPSHOTS) == [{"sandbox": "prep", "name": "prepared", "paths": ["/work"], "ttlSecondsAfterUnused": 60}]
    assert (snap.name, snap.phase, snap.image) == ("prepared", "Ready", "r/ns/prepared@sha256:aa")
    assert type(snap).__name__ == ("Snapshot" if mode == "sync" else "AsyncSnapshot")


@DRIVERS
async def test_a_failed_snapshot_raises_with_its_reason(mode: str) -> None:
    gateway = Gateway(snapshot_phase="Failed")
    async with client_of(mode, gateway) as client:
        sbx = await done(client.connect("prep"))
        with pytest.raises(SnapshotFailed) as raised:
            await done(sbx.snapshot())
        await done(sbx.close())
    error = raised.value
    assert (error.reason, error.condition_message) == ("PushRefused", "dial tcp: connection refused")
    assert gateway.posted(SNAPSHOTS)[0]["generateName"] == "prep-snap-"


@DRIVERS
async def test_a_sandbox_starts_from_a_snapshot_instead_of_an_image(mode: str) -> None:
    gateway = Gateway()
    async with client_of(mode, gateway) as client:
        by_name = await done(client.create(from_snapshot="prepared", wait=False, delete_on_exit=False))
        handle = (Snapshot if mode == "sync" else AsyncSnapshot)(client, "prepared", "ns")
        by_handle = await done(client.create(from_snapshot=handle, wait=False, delete_on_exit=False))
        for sbx in (by_name, by_handle):
            await done(sbx.close())
    bodies = gateway.posted(SANDBOXES)
    assert bodies[0]["fromSnapshot"] == "prepared" and "image" not in bodies[0]
    assert bodies[1]["fromSnapshot"] == "prepared"
    with pytest.raises(ValueError, match="not both"):
        _ops.sandbox_body("python:3.11", extra={"from_snapshot": "prepared"})
    with pytest.raises(ValueError, match="absolute"):
        _ops.snapshot_body("prep", paths=["work"])


@DRIVERS
async def test_fork_snapshots_once_and_starts_every_fork_from_it(mode: str) -> None:
    gateway = Gateway()
    async with client_of(mode, gateway) as client:
        sbx = await done(client.connect("prep"))
        forks = await done(sbx.fork(3, labels={"suite": "fork"}, delete_on_exit=False))
        for fork in forks:
            await done(fork.close())
        await done(sbx.close())
    [snapshot] = gateway.posted(SNAPSHOTS)
    assert snapshot["name"].startswith("prep-fork-") and snapshot["ttlSecondsAfterUnused"] == 3600
    bodies = gateway.posted(SANDBOXES)
    assert len(bodies) == 3
    assert all(b["fromSnapshot"] == snapshot["name"] and b["labels"] == {"suite": "fork"} for b in bodies)
    assert all(b["generateName"] == "prep-fork-" for b in bodies)
    assert [f.phase for f in forks] == ["Ready"] * 3
    creates = [i for i, (m, p, _) in enumerate(gateway.calls) if (m, p) == ("POST", SANDBOXES)]
    waits = [i for i, (m, p, _) in enumerate(gateway.calls) if p.startswith(SANDBOXES + "/") and p.endswith("/wait")]
    assert max(creates) < min(waits), "every fork is created before the first is waited for"


@DRIVERS
async def test_a_fork_that_cannot_start_takes_the_others_with_it(mode: str) -> None:
    gateway = Gateway(failing=("prep-fork-2",))
    async with client_of(mode, gateway) as client:
        sbx = await done(client.connect("prep"))
        with pytest.raises(SandboxFailed):
            await done(sbx.fork(3))
        await done(sbx.close())
    assert sorted(gateway.deleted()) == ["prep-fork-1", "prep-fork-2", "prep-fork-3"]
