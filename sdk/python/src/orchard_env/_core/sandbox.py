"""The plans of a sandbox handle (:class:`SandboxCore`): state, heartbeats, agent calls (exec, processes,
sessions, files, patches), results and lifecycle; and the pure helpers of exec streams and file transfers."""

from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

from .. import _cleanup, _ops
from ..errors import (
    AgentUnavailable,
    CommandFailed,
    NotFound,
    OrchardError,
    SandboxFailed,
    SandboxStalled,
    Timeout,
    Unauthorized,
    error_from_response,
)
from ..models import ExecEvent, ExecResult, FileEntry, PatchResult, ProcessInfo, SandboxProgress, SessionInfo
from .steps import NOW, Call, Plan, Request, Sleep, T, exchange, log, until

#: Bytes read or written per block when streaming files.
CHUNK = 256 * 1024
#: What ``upload`` writes: the file's content, bytes or text (a ``str`` is text, never a local path).
Content = bytes | str
#: What ``upload_file`` reads and ``download_file`` writes: a local path or a binary file object.
LocalFile = str | os.PathLike[str] | IO[bytes]
#: Deprecated: ``upload``'s former argument type (a path or a file object now go to ``upload_file``).
Upload = bytes | str | os.PathLike[str] | IO[bytes]
#: The ``TypeError`` of ``upload(path, <a local path>)``.
UPLOAD_GOT_A_PATH = (
    "upload(path, data) writes data, the file's content (bytes or str); {what} is a local path: "
    "use upload_file(path, local_path) to copy a local file"
)
#: The ``DeprecationWarning`` of ``upload(path, <a file object>)``.
UPLOAD_GOT_A_FILE = "upload(path, <file object>) is deprecated: use upload_file(path, file_object)"
#: The ``DeprecationWarning`` of ``download(path, dest)``.
DOWNLOAD_DEST = "download(path, dest) is deprecated: use download_file(path, dest), which answers the byte count"

# -- small pure helpers --------------------------------------------------------------------------


def exec_event(line: str) -> ExecEvent | None:
    """The event of one NDJSON line of ``/exec/stream`` (None for a blank line). A last ``error`` event
    (the gateway ended the stream, e.g. ``AccessRevoked`` when the caller's access was revoked) raises
    the matching :class:`OrchardError`."""
    if not line.strip():
        return None
    data = json.loads(line)
    if isinstance(data, dict) and data.get("type") == "error":
        status = int(data.get("status") or 500)
        raise error_from_response(status, json.dumps(data).encode())
    return ExecEvent.from_json(data)


def is_file_object(value: Any) -> bool:
    """Whether ``value`` is a file object (it has ``read`` or ``write``), not a path or content."""
    return hasattr(value, "read") or hasattr(value, "write")


def check_binary(handle: Any, function: str) -> None:
    """Raises ``TypeError`` when ``handle`` is a text-mode file object (it reads or writes ``str``)."""
    if isinstance(handle, io.TextIOBase):
        raise TypeError(f"{function}() needs a binary file object: open the file with 'rb' or 'wb', not text mode")


def upload_content(
    data: Content,
    from_path: Callable[[os.PathLike[str]], Any],
    from_stream: Callable[[IO[bytes], int | None], Any],
) -> tuple[Any, bool]:
    """Request content of ``upload(path, data)`` and whether a retry can send it again: bytes, or text
    (UTF-8). A local path is a ``TypeError`` naming ``upload_file``; a binary file object still works
    (deprecated: :func:`upload_file_content`)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data), True
    if isinstance(data, str):
        return data.encode(), True
    if isinstance(data, os.PathLike):
        raise TypeError(UPLOAD_GOT_A_PATH.format(what=f"{type(data).__name__}({os.fspath(data)!r})"))
    if is_file_object(data):
        warnings.warn(UPLOAD_GOT_A_FILE, DeprecationWarning, stacklevel=3)
        return upload_file_content(data, from_path, from_stream, "upload")
    raise TypeError(f"upload(path, data) takes bytes or str, not {type(data).__name__}")


def upload_file_content(
    local: LocalFile,
    from_path: Callable[[os.PathLike[str]], Any],
    from_stream: Callable[[IO[bytes], int | None], Any],
    function: str = "upload_file",
) -> tuple[Any, bool]:
    """Request content of ``upload_file(path, local)`` and whether a retry can send it again. A local
    path (``str`` or ``PathLike``) is read by the driver's ``from_path(path)``, a binary file object by
    ``from_stream(stream, start)`` (``start``: where to seek back to on every attempt, None when the
    stream cannot seek, and then a retry cannot send it again)."""
    if isinstance(local, (str, os.PathLike)):
        path = Path(local)
        return (lambda: from_path(path)), True
    if not is_file_object(local):
        raise TypeError(
            f"{function}(path, local_path) takes a local path or a binary file object, not {type(local).__name__}"
            + ("; to write content use upload(path, data)" if isinstance(local, (bytes, bytearray, memoryview)) else "")
        )
    check_binary(local, function)
    stream = local
    start = stream.tell() if stream.seekable() else None
    return (lambda: from_stream(stream, start)), start is not None


def download_target(local: LocalFile) -> tuple[str | os.PathLike[str] | None, IO[bytes] | None]:
    """Where ``download_file`` writes: ``(path, None)`` for a local path, ``(None, handle)`` for a binary
    file object; anything else is a ``TypeError``."""
    if isinstance(local, (str, os.PathLike)):
        return local, None
    if not hasattr(local, "write"):
        raise TypeError(f"download_file(path, local_path) takes a local path or a binary file object, not {type(local).__name__}")
    check_binary(local, "download_file")
    return None, local

class SandboxCore:
    """State and plans of a sandbox handle. A driver adds ``_beat_in_background`` (a thread or a task
    running the heartbeat loop), ``stop_heartbeats`` and the public methods."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.namespace}/{self.name}, phase={self.phase})"

    @property
    def phase(self) -> str | None:
        """``status.phase`` as last read."""
        return _ops.phase_of(self.raw)

    @property
    def agent_endpoint(self) -> str | None:
        """``status.agentEndpoint`` (the pod IP and agent port) as last read."""
        return _ops.agent_endpoint_of(self.raw)

    def __init__(
        self, client: Any, name: str, namespace: str, raw: Mapping[str, Any] | None, *,
        delete_on_exit: bool, auto_heartbeat: bool, direct: bool,
    ) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.raw: dict[str, Any] = dict(raw or {})
        self.delete_on_exit = delete_on_exit
        self.auto_heartbeat = auto_heartbeat
        self.direct = direct
        self._heartbeats: Any = None
        self._direct_target: tuple[str, str] | None = None
        self._closed = False
        _cleanup.register(self)

    def _run(self, plan: Plan[T]) -> Any:
        return self.client._run(plan)

    def _exit_delete(self) -> tuple[str, dict[str, str], Any]:
        """The exit cleanup's DELETE of this sandbox: URL, headers (the token as last read, without
        waiting for a lock: this may run in a signal handler) and the transport to send it with."""
        token = self.client.settings.token.cached()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = self.client.settings.base_url + _ops.sandbox_path(self.namespace, self.name)
        return url, headers, self.client._exit_transport

    def _halt_heartbeats(self) -> None:
        """Ends the background heartbeats without waiting (the exit cleanup; a driver may override)."""

    def _gateway(self, method: str, rest: str = "", **fields: Any) -> Plan[httpx.Response]:
        return self.client._gateway_plan(method, _ops.sandbox_path(self.namespace, self.name, rest), **fields)

    # -- state and heartbeats ----------------------------------------------------------------------

    def _refresh_plan(self) -> Plan[dict[str, Any]]:
        self.raw = (yield from self._gateway("GET")).json()
        return self.raw

    def _wait_ready_plan(
        self, timeout: float | None, on_progress: Callable[[SandboxProgress], None] | None = None
    ) -> Plan[Any]:
        """Waits until Ready with the gateway's watch-driven waits. Raises as soon as the sandbox settles
        otherwise: :class:`SandboxStalled` (``Stalled=True``), :class:`SandboxFailed` (Failed,
        Succeeded, Expired); after ``timeout`` seconds :class:`Timeout` with the phase, reason and
        condition message last seen. Each change of phase, reason or message seen on the way is logged
        at INFO and handed to ``on_progress`` (which makes the server-side waits
        :data:`~orchard_env._ops.PROGRESS_POLL` seconds long, so a change is seen that soon)."""
        last: dict[str, str | None] = {}
        started = yield NOW
        reported: list[SandboxProgress] = []

        def progress(phase: str | None, reason: str | None, message: str | None) -> Plan[None]:
            seen = reported[-1] if reported else None
            if seen is not None and (seen.phase, seen.reason, seen.message) == (phase, reason, message):
                return
            now = yield NOW
            update = SandboxProgress(self.name, self.namespace, phase, reason, message, max(0.0, now - started))
            reported.append(update)
            log.info("%s", update)
            if on_progress is not None:
                on_progress(update)

        def attempt(wait: float) -> Plan[Any]:
            done, answer = yield from self.client._server_wait_plan(
                _ops.sandbox_path(self.namespace, self.name, "/wait"), wait
            )
            if not done:
                phase = answer.get("phase")
                if isinstance(phase, str):
                    self.raw.setdefault("status", {})["phase"] = phase
                for key, field in (("reason", "reason"), ("message", "conditionMessage")):
                    value = answer.get(field)
                    last[key] = value if isinstance(value, str) and value else None
                yield from progress(phase if isinstance(phase, str) else None, last.get("reason"), last.get("message"))
                return None
            self.raw = answer
            yield from progress(*_ops.why_not_ready(self.raw))
            if _ops.is_ready(self.raw):
                self._start_heartbeats()
                return self
            phase, reason, message = _ops.why_not_ready(self.raw)
            where = _ops.explain(phase, reason, message)
            if phase not in _ops.FINAL_PHASES and _ops.is_stalled(self.raw):
                raise SandboxStalled(
                    f"sandbox {self.namespace}/{self.name} is stalled ({where})",
                    phase=phase, reason=reason, condition_message=message, body=self.raw,
                )
            raise SandboxFailed(
                f"sandbox {self.namespace}/{self.name} will not become Ready ({where})",
                phase=phase, reason=reason, condition_message=message, body=self.raw,
            )

        def expired() -> Timeout:
            phase, reason, message = _ops.phase_of(self.raw), last.get("reason"), last.get("message")
            return Timeout(
                f"sandbox {self.namespace}/{self.name} not Ready after {timeout}s ({_ops.explain(phase, reason, message)})",
                phase=phase, reason=reason, condition_message=message,
            )

        return (yield from until(timeout, attempt, expired, _ops.PROGRESS_POLL if on_progress else _ops.MAX_SERVER_WAIT))

    def _heartbeat_plan(self) -> Plan[dict[str, Any]]:
        return _ops.json_object((yield from self._gateway("POST", "/heartbeat")).json())

    def _set_timeout_plan(self, seconds: float) -> Plan[dict[str, Any]]:
        body = {"timeoutSeconds": _ops.timeout_seconds(seconds)}
        return _ops.json_object((yield from self._gateway("POST", "/timeout", json_body=body)).json())

    def _set_network_plan(
        self, egress: str, allow: Sequence[str | Mapping[str, Any]], deny: Sequence[str | Mapping[str, Any]], wait: float
    ) -> Plan[dict[str, Any]]:
        body = _ops.network_body(egress, allow, deny)
        params = {"timeoutSeconds": _ops.network_wait(wait)}
        timeout = min(float(wait), _ops.NETWORK_MAX_WAIT) + _ops.ANSWER_MARGIN
        response = yield from self._gateway("PUT", "/network", json_body=body, params=params, timeout=timeout)
        return _ops.json_object(response.json())

    def _start_heartbeats(self) -> None:
        if self.auto_heartbeat and self._heartbeats is None and not self._closed:
            self._heartbeats = self._beat_in_background(self._heartbeat_loop(_ops.spec_heartbeat_timeout(self.raw)))

    def _beat_in_background(self, loop: Plan[None]) -> Any:
        raise NotImplementedError

    def _heartbeat_loop(self, timeout: int | None) -> Plan[None]:
        """Heartbeats every third of the heartbeat timeout (read from the first heartbeat's answer when
        the spec does not say) until the sandbox is gone or the driver ends the idle pause."""
        if timeout is None:
            try:
                timeout = int((yield from self._heartbeat_plan()).get("heartbeatTimeoutSeconds") or 0)
            except OrchardError as error:
                log.warning("heartbeat failed: %s", error)
                return
        interval = _ops.heartbeat_interval(timeout)
        if interval is None:
            return
        while not (yield Sleep(interval, idle=True)):
            try:
                yield from self._heartbeat_plan()
            except NotFound:
                return
            except OrchardError as error:
                log.warning("heartbeat failed (will retry): %s", error)

    # -- agent calls -------------------------------------------------------------------------------

    def _target_plan(self) -> Plan[tuple[str, str]]:
        """Direct mode: the agent's endpoint at the sandbox's own pod and its token, asked of the gateway
        once per handle (again only while asking fails). Never ``status.agentEndpoint``: anyone allowed
        to patch the status could point it, and so the token, anywhere."""
        if self._direct_target is None:
            self._direct_target = yield from self.client._agent_target_plan(self.namespace, self.name)
        return self._direct_target

    def _agent(self, method: str, path: str, **fields: Any) -> Plan[httpx.Response]:
        """An agent call: straight to the pod in direct mode, else through the gateway.

        In direct mode a call the pod does not answer, or answers ``Unauthorized``, asks the gateway
        for the target again: a sandbox with ``spec.retry`` may have a new pod (another address and
        token). The call is sent once more only when the target changed."""
        if not self.direct:
            return (yield from self._gateway(method, path, **fields))
        endpoint, token = yield from self._target_plan()
        try:
            return (yield from exchange(Request(method, f"{endpoint}/v1{path}", token, **fields), self.client._retry))
        except (AgentUnavailable, Unauthorized):
            stale, self._direct_target = self._direct_target, None
            fresh = yield from self._target_plan()
            if fresh == stale:
                raise
        endpoint, token = fresh
        return (yield from exchange(Request(method, f"{endpoint}/v1{path}", token, **fields), self.client._retry))

    def _exec_plan(self, cmd: str | Sequence[str], *, check: bool, **fields: Any) -> Plan[ExecResult]:
        body = _ops.exec_body(cmd, **fields)
        answer = _ops.answer_timeout(fields.get("timeout"))
        response = yield from self._agent(
            "POST", "/exec", json_body=body, headers={"X-Orchard-Timeout": f"{answer:.0f}"}, timeout=answer + 10.0
        )
        result = ExecResult.from_json(response.json())
        if check and not result.ok:
            why = " (timed out)" if result.timed_out else " (killed by the out-of-memory killer)" if result.oom_killed else ""
            raise CommandFailed(f"{cmd!r} exited with {result.exit_code}{why}: {result.stderr[-500:]}", result)
        return result

    def _exec_stream_plan(self, cmd: str | Sequence[str], **fields: Any) -> Plan[httpx.Response]:
        """The streamed answer of ``/exec/stream``: NDJSON lines, see :func:`exec_event`."""
        body = _ops.exec_body(cmd, **fields)
        read_timeout = _ops.answer_timeout(fields.get("timeout")) + 10.0
        return (yield from self._agent("POST", "/exec/stream", json_body=body, timeout=read_timeout, stream=True))

    def _start_process_plan(
        self, handle: Callable[..., T], cmd: str | Sequence[str], id: str | None, **fields: Any
    ) -> Plan[T]:
        keep_stdin, pty = fields.pop("keep_stdin", False), fields.pop("pty", None)
        body = _ops.exec_body(cmd, **fields)
        if id is not None:
            body["id"] = id
        if keep_stdin:
            body["keepStdin"] = True
        if pty is not None:
            body["pty"] = _ops.terminal_size(pty)
        info = ProcessInfo.from_json((yield from self._agent("POST", "/processes", json_body=body)).json())
        return handle(self, info.id, info)

    def _list_processes_plan(self, output: bool) -> Plan[list[ProcessInfo]]:
        data = (yield from self._agent("GET", "/processes", params={"output": str(output).lower()})).json()
        return [ProcessInfo.from_json(p) for p in data.get("processes") or []]

    def _get_process_plan(self, id: str, wait: float | None = None) -> Plan[ProcessInfo]:
        params = {"wait": f"{min(wait, _ops.MAX_SERVER_WAIT):.3f}"} if wait else None
        response = yield from self._agent("GET", f"/processes/{id}", params=params, timeout=(wait or 0) + 90.0)
        return ProcessInfo.from_json(response.json())

    def _process_stdin_plan(self, id: str, data: str | bytes, close: bool) -> Plan[ProcessInfo]:
        """Writes to a process's stdin; never retried (the bytes would be written twice)."""
        body = _ops.stdin_body(data, close)
        response = yield from self._agent("POST", f"/processes/{id}/stdin", json_body=body, retry=False)
        return ProcessInfo.from_json(response.json())

    def _resize_process_plan(self, id: str, rows: int, cols: int) -> Plan[ProcessInfo]:
        body = _ops.terminal_size((rows, cols))
        return ProcessInfo.from_json((yield from self._agent("POST", f"/processes/{id}/resize", json_body=body)).json())

    def _signal_process_plan(self, id: str, signal: str | int) -> Plan[ProcessInfo]:
        response = yield from self._agent("POST", f"/processes/{id}/signal", json_body={"signal": signal}, retry=False)
        return ProcessInfo.from_json(response.json())

    def _kill_process_plan(self, id: str) -> Plan[ProcessInfo]:
        return ProcessInfo.from_json((yield from self._agent("DELETE", f"/processes/{id}")).json())

    def _start_session_plan(self, handle: Callable[..., T], **fields: Any) -> Plan[T]:
        body = _ops.session_body(**fields)
        info = SessionInfo.from_json((yield from self._agent("POST", "/sessions", json_body=body)).json())
        return handle(self, info.id, info)

    def _list_sessions_plan(self) -> Plan[list[SessionInfo]]:
        data = (yield from self._agent("GET", "/sessions")).json()
        return [SessionInfo.from_json(s) for s in data.get("sessions") or []]

    def _upload_plan(self, path: str, content: tuple[Any, bool], mode: int | str | None) -> Plan[dict[str, Any]]:
        """``content``: what :func:`upload_content` or :func:`upload_file_content` answers."""
        body, repeatable = content
        params: dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o") if isinstance(mode, int) else mode
        response = yield from self._agent(
            "PUT", "/files", params=params, content=body,
            headers={"Content-Type": "application/octet-stream"}, timeout=600.0, retry=repeatable,
        )
        return _ops.json_object(response.json())

    def _download_plan(self, path: str) -> Plan[httpx.Response]:
        """The streamed answer of ``GET /files``: the file's bytes."""
        return (yield from self._agent("GET", "/files", params={"path": path}, timeout=600.0, stream=True))

    def _list_files_plan(self, path: str) -> Plan[list[FileEntry]]:
        data = (yield from self._agent("GET", "/files/list", params={"path": path})).json()
        return [FileEntry.from_json(e) for e in data.get("entries") or []]

    def _delete_file_plan(self, path: str, recursive: bool) -> Plan[None]:
        params: dict[str, Any] = {"path": path}
        if recursive:
            params["recursive"] = "true"
        yield from self._agent("DELETE", "/files", params=params)

    def _stat_plan(self, path: str) -> Plan[dict[str, Any]]:
        return _ops.json_object((yield from self._agent("GET", "/files/stat", params={"path": path})).json())

    def _make_dir_plan(self, path: str, parents: bool) -> Plan[dict[str, Any]]:
        body = {"path": path, "parents": parents}
        return _ops.json_object((yield from self._agent("POST", "/files/mkdir", json_body=body)).json())

    def _rename_plan(self, source: str, target: str, overwrite: bool) -> Plan[dict[str, Any]]:
        body = {"from": source, "to": target, "overwrite": overwrite}
        return _ops.json_object((yield from self._agent("POST", "/files/rename", json_body=body, retry=False)).json())

    def _upload_dir_plan(self, local: str | os.PathLike[str], path: str) -> Plan[dict[str, Any]]:
        body = _ops.tar_of_directory(local)
        response = yield from self._agent(
            "PUT", "/files/tar", params={"path": path}, content=body,
            headers={"Content-Type": "application/x-tar"}, timeout=600.0, retry=True,
        )
        return _ops.json_object(response.json())

    def _download_dir_plan(self, path: str) -> Plan[httpx.Response]:
        """The streamed answer of ``GET /files/tar``: a tar stream of the directory."""
        return (yield from self._agent("GET", "/files/tar", params={"path": path}, timeout=600.0, stream=True))

    def _metrics_plan(self) -> Plan[dict[str, Any]]:
        return _ops.json_object((yield from self._agent("GET", "/metrics")).json())

    def _tunnel_plan(self, port: int) -> Plan[httpx.Response]:
        """A tunnel request to ``port`` inside the sandbox, answered: the open ``101`` answer, whose
        ``network_stream`` extension carries the port's bytes (the driver checks it is one, see
        :func:`~orchard_env._ops.upgraded_stream`). Refusals (nothing listens: 502) raise before any
        upgrade."""
        path = _ops.tunnel_path(port)
        return (yield from self._agent("GET", path, headers=_ops.TUNNEL_HEADERS, timeout=30.0, stream=True))

    def _apply_patch_plan(self, patch: str, cwd: str | None, strip: int | None) -> Plan[PatchResult]:
        body: dict[str, Any] = {"patch": patch}
        if cwd is not None:
            body["cwd"] = cwd
        if strip is not None:
            body["strip"] = strip
        return PatchResult.from_json((yield from self._agent("POST", "/patch", json_body=body, retry=False)).json())

    # -- results and lifecycle ---------------------------------------------------------------------

    def _record_result_plan(
        self, reward: float | None, status: str, length: int | None, artifact: str | None,
        exit_code: int | None, reason: str | None, message: str | None,
    ) -> Plan[dict[str, Any]]:
        body: dict[str, Any] = {"status": status}
        for key, value in (
            ("reward", reward), ("length", length), ("artifact", artifact),
            ("exitCode", exit_code), ("reason", reason), ("message", message),
        ):
            if value is not None:
                body[key] = value
        return _ops.json_object((yield from self._gateway("POST", "/result", json_body=body)).json())

    def _delete_plan(self) -> Plan[None]:
        _cleanup.forget(self)
        yield Call(self.stop_heartbeats)  # type: ignore[attr-defined]
        with contextlib.suppress(NotFound):
            yield from self._gateway("DELETE")

    def _close_plan(self) -> Plan[None]:
        _cleanup.forget(self)
        if self._closed:
            return
        self._closed = True
        if self.delete_on_exit:
            yield from self._delete_plan()
        else:
            yield Call(self.stop_heartbeats)  # type: ignore[attr-defined]
