"""The plans of a SandboxSnapshot handle (:class:`SnapshotCore`), and of taking a snapshot of a sandbox
and forking it (used by :class:`~orchard_env._core.sandbox.SandboxCore`)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _ops
from ..errors import NotFound, OrchardError, SnapshotFailed, Timeout
from .steps import Plan, T, until

#: How long a snapshot made by ``fork`` is kept once no sandbox starts from it any more (seconds).
FORK_SNAPSHOT_TTL = 3600


class SnapshotCore:
    """State and plans of a SandboxSnapshot handle: :attr:`raw` is the object as last read."""

    def __init__(self, client: Any, name: str, namespace: str, raw: Mapping[str, Any] | None = None) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.raw: dict[str, Any] = dict(raw or {})

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.namespace}/{self.name}, phase={self.phase})"

    @property
    def phase(self) -> str | None:
        """``status.phase`` as last read: ``Pending``, ``Committing``, ``Ready`` or ``Failed``."""
        return _ops.snapshot_state(self.raw)[0]

    @property
    def image(self) -> str | None:
        """``status.image`` as last read: the digest-pinned image sandboxes started from it run."""
        status = self.raw.get("status") or {}
        image = status.get("image") if isinstance(status, Mapping) else None
        return image if isinstance(image, str) else None

    @property
    def size_bytes(self) -> int | None:
        """``status.sizeBytes`` as last read: bytes of the committed changes, uncompressed."""
        status = self.raw.get("status") or {}
        size = status.get("sizeBytes") if isinstance(status, Mapping) else None
        return size if isinstance(size, int) else None

    def _run(self, plan: Plan[T]) -> Any:
        return self.client._run(plan)

    def _path(self, rest: str = "") -> str:
        return _ops.snapshot_path(self.namespace, self.name, rest)

    def _refresh_plan(self) -> Plan[dict[str, Any]]:
        self.raw = _ops.json_object((yield from self.client._gateway_plan("GET", self._path())).json())
        return self.raw

    def _wait_plan(self, timeout: float | None) -> Plan[Any]:
        """Waits (the gateway's watch-driven waits) until the snapshot is Ready and returns this handle;
        :class:`SnapshotFailed` when it failed, :class:`Timeout` after ``timeout`` seconds."""

        def attempt(wait: float) -> Plan[Any]:
            done, answer = yield from self.client._server_wait_plan(self._path("/wait"), wait)
            if not done:
                return None
            self.raw = _ops.json_object(answer)
            phase, reason, message = _ops.snapshot_state(self.raw)
            if phase == "Ready":
                return self
            raise SnapshotFailed(
                f"snapshot {self.namespace}/{self.name} failed ({reason}: {message})",
                reason=reason, condition_message=message, body=self.raw,
            )

        def expired() -> Timeout:
            phase, reason, message = _ops.snapshot_state(self.raw)
            return Timeout(
                f"snapshot {self.namespace}/{self.name} not Ready after {timeout}s ({_ops.explain(phase, reason, message)})",
                phase=phase, reason=reason, condition_message=message,
            )

        return (yield from until(timeout, attempt, expired))

    def _delete_plan(self) -> Plan[None]:
        with contextlib.suppress(NotFound):
            yield from self.client._gateway_plan("DELETE", self._path())


def snapshot_plan(
    sandbox: Any, name: str | None, paths: Sequence[str] | None, ttl_seconds_after_unused: int | None,
    wait: bool, timeout: float | None,
) -> Plan[Any]:
    """Creates a SandboxSnapshot of ``sandbox`` and, with ``wait``, waits until it is Ready."""
    body = _ops.snapshot_body(
        sandbox.name, name=name, generate_name=None if name else f"{sandbox.name[:50]}-snap-",
        paths=paths, ttl_seconds_after_unused=ttl_seconds_after_unused,
    )
    client = sandbox.client
    path = f"/v1/namespaces/{sandbox.namespace}/sandboxsnapshots"
    created = _ops.json_object(
        (yield from client._gateway_plan("POST", path, json_body=body, retry=bool(name))).json()
    )
    handle = client._snapshot_type(client, created["metadata"]["name"], sandbox.namespace, created)
    if wait:
        yield from handle._wait_plan(timeout)
    return handle


def fork_plan(
    sandbox: Any, count: int, snapshot: Any, paths: Sequence[str] | None, timeout: float | None,
    delete_on_exit: bool, create_fields: Mapping[str, Any],
) -> Plan[list[Any]]:
    """Snapshots ``sandbox`` (unless ``snapshot`` is given; the snapshot ``fork`` makes is deleted
    :data:`FORK_SNAPSHOT_TTL` seconds after its last fork), creates ``count`` sandboxes from it at once,
    then waits until each is Ready. ``create_fields`` are :func:`~orchard_env._ops.sandbox_body`'s keyword
    arguments (``labels``, ``env``, ``cpu``...; ``extra`` for other spec fields). On any failure the forks
    created so far are deleted and the error raised."""
    if count < 1:
        raise ValueError("count must be at least 1")
    if snapshot is None:
        snapshot = yield from snapshot_plan(
            sandbox, f"{sandbox.name[:40]}-fork-{secrets.token_hex(3)}", paths, FORK_SNAPSHOT_TTL, True, timeout
        )
    elif snapshot.phase != "Ready":
        yield from snapshot._wait_plan(timeout)
    client = sandbox.client
    fields = dict(create_fields)
    extra = {**dict(fields.pop("extra", None) or {}), "from_snapshot": snapshot.name}
    fields.setdefault("generate_name", f"{sandbox.name[:50]}-fork-")
    forks: list[Any] = []
    try:
        for _ in range(count):
            plan = client._create_plan(
                sandbox.namespace, wait=False, wait_timeout=timeout, delete_on_exit=delete_on_exit,
                auto_heartbeat=True, direct=None, image=None, extra=extra, **fields,
            )
            forks.append((yield from plan()))
        for fork in forks:
            yield from fork._wait_ready_plan(timeout)
    except BaseException:
        for fork in forks:
            with contextlib.suppress(OrchardError):
                yield from fork._delete_plan()
        raise
    return forks
