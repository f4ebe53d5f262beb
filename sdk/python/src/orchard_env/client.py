"""The synchronous client: :class:`SandboxClient`, :class:`Sandbox`, :class:`Process` and
:class:`RolloutGroup`."""

from __future__ import annotations

import atexit
import base64
import builtins
import contextlib
import json
import logging
import ssl
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

import httpx

from . import _ops
from ._config import KubeSettings, Settings, TokenSource, resolve, resolve_kube
from ._retry import NO_RETRY, RetryPolicy, retry_exception, retry_status
from .errors import (
    CommandFailed,
    GatewayUnreachable,
    NotFound,
    OrchardError,
    SandboxFailed,
    Timeout,
    error_from_response,
    parse_body,
)
from .models import (
    ExecEvent,
    ExecResult,
    FileEntry,
    GroupResult,
    PatchResult,
    ProcessInfo,
)

log = logging.getLogger("orchard_env")

CHUNK = 256 * 1024
Upload = bytes | str | os.PathLike[str] | IO[bytes]
Content = bytes | Callable[[], Iterable[bytes]] | None


def _file_chunks(path: os.PathLike[str] | str) -> Callable[[], Iterator[bytes]]:
    def chunks() -> Iterator[bytes]:
        with open(path, "rb") as handle:
            while block := handle.read(CHUNK):
                yield block

    return chunks


def _upload_content(data: Upload) -> tuple[Content, bool]:
    """Request content for an upload and whether it can be sent again on a retry."""
    if isinstance(data, bytes):
        return data, True
    if isinstance(data, str):
        return data.encode(), True
    if isinstance(data, os.PathLike):
        return _file_chunks(data), True
    stream = data
    start = stream.tell() if stream.seekable() else None

    def chunks() -> Iterator[bytes]:
        if start is not None:
            stream.seek(start)
        while block := stream.read(CHUNK):
            yield block

    return chunks, start is not None


#: Open sandbox handles; at interpreter exit the ones with ``delete_on_exit`` are deleted (best effort;
#: heartbeat expiry is the safety net when the process dies without running exit handlers).
_OPEN: weakref.WeakSet[Sandbox] = weakref.WeakSet()


@atexit.register
def _close_open_handles() -> None:
    for sandbox in list(_OPEN):
        with contextlib.suppress(Exception):
            sandbox.close()


class _Transport:
    """HTTP with the bearer token, retries and error mapping."""

    def __init__(self, http: httpx.Client, retry: RetryPolicy) -> None:
        self.http = http
        self.retry = retry

    def send(
        self,
        method: str,
        url: str,
        *,
        token: TokenSource | str | None,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        content: Content = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stream: bool = False,
        retry: bool = True,
    ) -> httpx.Response:
        policy = self.retry if retry else NO_RETRY
        attempt = 0
        while True:
            request_headers = dict(headers or {})
            secret = token.get() if isinstance(token, TokenSource) else token
            if secret:
                request_headers["Authorization"] = f"Bearer {secret}"
            body: Any = content() if callable(content) else content
            kwargs: dict[str, Any] = {"params": params, "headers": request_headers}
            if json_body is not None:
                kwargs["json"] = json_body
            elif body is not None:
                kwargs["content"] = body
            if timeout is not None:
                kwargs["timeout"] = httpx.Timeout(timeout, connect=10.0)
            try:
                request = self.http.build_request(method, url, **kwargs)
                response = self.http.send(request, stream=stream)
            except httpx.TimeoutException as error:
                if attempt + 1 < policy.attempts and retry_exception(error, method):
                    self._sleep(policy, attempt, f"{method} {url}: {error!r}")
                    attempt += 1
                    continue
                raise Timeout(f"{method} {url}: no answer in time ({error!r})") from error
            except httpx.TransportError as error:
                if attempt + 1 < policy.attempts and retry_exception(error, method):
                    self._sleep(policy, attempt, f"{method} {url}: {error!r}")
                    attempt += 1
                    continue
                raise GatewayUnreachable(f"{method} {url}: {error!r}", retryable=True) from error
            if response.status_code < 400:
                return response
            content_bytes = response.read()
            response.close()
            failure = error_from_response(response.status_code, content_bytes)
            body_json = parse_body(content_bytes)
            flag = body_json.get("retryable") if isinstance(body_json, dict) else None
            if attempt + 1 < policy.attempts and retry_status(response.status_code, flag, method):
                self._sleep(policy, attempt, str(failure))
                attempt += 1
                continue
            raise failure

    @staticmethod
    def _sleep(policy: RetryPolicy, attempt: int, why: str) -> None:
        delay = policy.delay(attempt)
        log.info("retrying in %.2fs after: %s", delay, why)
        time.sleep(delay)


class _Heartbeats:
    """A daemon thread that heartbeats a sandbox every third of its heartbeat timeout."""

    def __init__(self, beat: Callable[[], Mapping[str, Any]], timeout_seconds: int | None) -> None:
        self._beat = beat
        self._timeout = timeout_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orchard-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        timeout = self._timeout
        if timeout is None:
            try:
                timeout = int(self._beat().get("heartbeatTimeoutSeconds") or 0)
            except OrchardError as error:
                log.warning("heartbeat failed: %s", error)
                return
        interval = _ops.heartbeat_interval(timeout)
        if interval is None:
            return
        while not self._stop.wait(interval):
            try:
                self._beat()
            except NotFound:
                return
            except OrchardError as error:
                log.warning("heartbeat failed (will retry): %s", error)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


class Sandbox:
    """A handle on one sandbox. A context manager: leaving the ``with`` block deletes the sandbox
    (unless created with ``delete_on_exit=False``). While the handle is open it heartbeats the sandbox
    in the background (``auto_heartbeat``), so it does not expire while the trainer holds it."""

    def __init__(
        self,
        client: SandboxClient,
        name: str,
        namespace: str,
        raw: Mapping[str, Any] | None = None,
        *,
        delete_on_exit: bool = True,
        auto_heartbeat: bool = True,
        direct: bool = False,
    ) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.raw: dict[str, Any] = dict(raw or {})
        self.delete_on_exit = delete_on_exit
        self.auto_heartbeat = auto_heartbeat
        self.direct = direct
        self._heartbeats: _Heartbeats | None = None
        self._direct_target: tuple[str, str] | None = None
        self._closed = False
        _OPEN.add(self)

    def __repr__(self) -> str:
        return f"Sandbox({self.namespace}/{self.name}, phase={self.phase})"

    # -- state -------------------------------------------------------------------------------

    @property
    def phase(self) -> str | None:
        """``status.phase`` as last read."""
        return _ops.phase_of(self.raw)

    @property
    def agent_endpoint(self) -> str | None:
        """``status.agentEndpoint`` (the pod IP and agent port) as last read."""
        return (self.raw.get("status") or {}).get("agentEndpoint")

    def refresh(self) -> dict[str, Any]:
        """Reads the Sandbox object again."""
        self.raw = self.client._gateway("GET", _ops.sandbox_path(self.namespace, self.name)).json()
        return self.raw

    def wait_ready(self, timeout: float | None = 300.0) -> Sandbox:
        """Blocks until the sandbox is Ready (server-side, watch-driven wait). Raises
        :class:`SandboxFailed` when it failed and :class:`Timeout` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = _ops.MAX_SERVER_WAIT if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout(f"sandbox {self.namespace}/{self.name} not Ready after {timeout}s (phase {self.phase})")
            wait = min(_ops.MAX_SERVER_WAIT, remaining)
            try:
                response = self.client._gateway(
                    "GET",
                    _ops.sandbox_path(self.namespace, self.name, "/wait"),
                    params={"timeoutSeconds": f"{wait:.3f}"},
                    timeout=wait + 30.0,
                    retry=False,
                )
            except Timeout as error:
                if isinstance(error.body, dict) and error.body.get("code") == "WaitTimeout":
                    if isinstance(error.body.get("phase"), str):
                        self.raw.setdefault("status", {})["phase"] = error.body["phase"]
                    continue
                raise
            self.raw = response.json()
            if _ops.is_ready(self.raw):
                self._start_heartbeats()
                return self
            status = self.raw.get("status") or {}
            raise SandboxFailed(
                f"sandbox {self.namespace}/{self.name} is {status.get('phase')}: "
                f"{status.get('reason') or ''} {status.get('message') or ''}".strip(),
                reason=status.get("reason"),
                body=self.raw,
            )

    # -- heartbeats ------------------------------------------------------------------------

    def heartbeat(self) -> dict[str, Any]:
        """Refreshes the sandbox's expiry now (the gateway coalesces writes)."""
        return _ops.json_object(self.client._gateway(
            "POST", _ops.sandbox_path(self.namespace, self.name, "/heartbeat")
        ).json())

    def _start_heartbeats(self) -> None:
        if self.auto_heartbeat and self._heartbeats is None and not self._closed:
            self._heartbeats = _Heartbeats(self.heartbeat, _ops.spec_heartbeat_timeout(self.raw))

    def stop_heartbeats(self) -> None:
        """Stops the background heartbeats (the sandbox then expires after its heartbeat timeout)."""
        if self._heartbeats is not None:
            self._heartbeats.stop()
            self._heartbeats = None

    # -- agent calls -----------------------------------------------------------------------

    def _target(self) -> tuple[str, str]:
        if self._direct_target is None:
            endpoint = self.agent_endpoint
            if not endpoint or not _ops.is_ready(self.raw):
                self.refresh()
                endpoint = self.agent_endpoint
            if not endpoint:
                raise OrchardError(f"sandbox {self.namespace}/{self.name} has no agent endpoint yet; wait_ready() first")
            self._direct_target = (endpoint, self.client._agent_token(self.namespace, self.name))
        return self._direct_target

    def _agent(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        content: Content = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stream: bool = False,
        retry: bool = True,
    ) -> httpx.Response:
        if self.direct:
            endpoint, token = self._target()
            return self.client._transport.send(
                method, f"{endpoint}/v1{path}", token=token, params=params, json_body=json_body,
                content=content, headers=headers, timeout=timeout, stream=stream, retry=retry,
            )
        return self.client._gateway(
            method, _ops.sandbox_path(self.namespace, self.name, path), params=params,
            json_body=json_body, content=content, headers=headers, timeout=timeout, stream=stream,
            retry=retry,
        )

    def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        shell: str | None = None,
        max_output_bytes: int | None = None,
        check: bool = False,
    ) -> ExecResult:
        """Runs a command: a list is an argv run directly (no shell needed in the image), a string
        runs with ``shell -c`` (default ``/bin/sh``). ``timeout`` kills the whole process group."""
        body = _ops.exec_body(
            cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell,
            max_output_bytes=max_output_bytes,
        )
        answer = _ops.answer_timeout(timeout)
        response = self._agent(
            "POST", "/exec", json_body=body, headers={"X-Orchard-Timeout": f"{answer:.0f}"},
            timeout=answer + 10.0,
        )
        result = ExecResult.from_json(response.json())
        if check and not result.ok:
            raise CommandFailed(
                f"{cmd!r} exited with {result.exit_code}{' (timed out)' if result.timed_out else ''}: {result.stderr[-500:]}",
                result,
            )
        return result

    def exec_stream(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        shell: str | None = None,
    ) -> Iterator[ExecEvent]:
        """Runs a command and yields its events as they happen: ``started``, ``stdout``/``stderr``
        chunks, then ``exit``. Closing the iterator early kills the command."""
        body = _ops.exec_body(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell)
        read_timeout = _ops.answer_timeout(timeout) + 10.0
        response = self._agent("POST", "/exec/stream", json_body=body, timeout=read_timeout, stream=True)
        try:
            for line in response.iter_lines():
                if line.strip():
                    yield ExecEvent.from_json(json.loads(line))
        finally:
            response.close()

    def start_process(
        self,
        cmd: str | Sequence[str],
        *,
        id: str | None = None,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        shell: str | None = None,
    ) -> Process:
        """Starts a background process and returns its handle (no timeout unless given)."""
        body = _ops.exec_body(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell)
        if id is not None:
            body["id"] = id
        info = ProcessInfo.from_json(self._agent("POST", "/processes", json_body=body).json())
        return Process(self, info.id, info)

    def list_processes(self, *, output: bool = False) -> list[ProcessInfo]:
        """Every background process, oldest first."""
        data = self._agent("GET", "/processes", params={"output": str(output).lower()}).json()
        return [ProcessInfo.from_json(p) for p in data.get("processes") or []]

    def get_process(self, id: str, *, wait: float | None = None) -> ProcessInfo:
        """A process's status; with ``wait`` the agent holds the answer until it exits (max 300 s)."""
        params = {"wait": f"{min(wait, _ops.MAX_SERVER_WAIT):.3f}"} if wait else None
        return ProcessInfo.from_json(
            self._agent("GET", f"/processes/{id}", params=params, timeout=(wait or 0) + 90.0).json()
        )

    def signal_process(self, id: str, signal: str | int = "TERM") -> ProcessInfo:
        """Signals the process's whole group."""
        return ProcessInfo.from_json(
            self._agent("POST", f"/processes/{id}/signal", json_body={"signal": signal}, retry=False).json()
        )

    def kill_process(self, id: str) -> ProcessInfo:
        """SIGKILLs the process's group (if it runs) and forgets it; returns the final status."""
        return ProcessInfo.from_json(self._agent("DELETE", f"/processes/{id}").json())

    def upload(self, path: str, data: Upload, *, mode: int | str | None = None) -> dict[str, Any]:
        """Writes ``data`` (bytes, text, a local file path or a binary file object) to ``path``,
        streamed and atomic. ``mode`` is octal (``0o755`` or ``"0755"``)."""
        content, repeatable = _upload_content(data)
        params: dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o") if isinstance(mode, int) else mode
        return _ops.json_object(self._agent(
            "PUT", "/files", params=params, content=content,
            headers={"Content-Type": "application/octet-stream"}, timeout=600.0, retry=repeatable,
        ).json())

    def download(self, path: str, dest: str | os.PathLike[str] | IO[bytes] | None = None) -> bytes | int:
        """Reads ``path``: its bytes, or, with ``dest`` (a local path or binary file object), streams it
        there and returns the byte count."""
        response = self._agent("GET", "/files", params={"path": path}, timeout=600.0, stream=True)
        try:
            if dest is None:
                return response.read()
            written = 0
            with contextlib.ExitStack() as stack:
                handle: IO[bytes] = (
                    stack.enter_context(open(dest, "wb")) if isinstance(dest, (str, os.PathLike)) else dest
                )
                for block in response.iter_bytes(CHUNK):
                    handle.write(block)
                    written += len(block)
            return written
        finally:
            response.close()

    def list_files(self, path: str = ".") -> list[FileEntry]:
        """Entries of a directory, sorted by name."""
        data = self._agent("GET", "/files/list", params={"path": path}).json()
        return [FileEntry.from_json(e) for e in data.get("entries") or []]

    def delete_file(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a file, or a directory (non-empty ones with ``recursive=True``)."""
        params: dict[str, Any] = {"path": path}
        if recursive:
            params["recursive"] = "true"
        self._agent("DELETE", "/files", params=params)

    def apply_patch(self, patch: str, *, cwd: str | None = None, strip: int | None = None) -> PatchResult:
        """Applies a unified diff (``git diff`` output) natively: every hunk or nothing
        (:class:`~orchard_env.errors.PatchConflict` lists the failed hunks)."""
        body: dict[str, Any] = {"patch": patch}
        if cwd is not None:
            body["cwd"] = cwd
        if strip is not None:
            body["strip"] = strip
        return PatchResult.from_json(self._agent("POST", "/patch", json_body=body, retry=False).json())

    # -- results and lifecycle -----------------------------------------------------------------

    def record_result(
        self,
        reward: float | None = None,
        status: str = "completed",
        *,
        length: int | None = None,
        artifact: str | None = None,
        exit_code: int | None = None,
        reason: str | None = None,
        message: str | None = None,
    ) -> dict[str, Any]:
        """Records this trajectory's outcome in ``status.result`` (write-once: a different second
        result raises :class:`~orchard_env.errors.Conflict`)."""
        body: dict[str, Any] = {"status": status}
        for key, value in (
            ("reward", reward), ("length", length), ("artifact", artifact),
            ("exitCode", exit_code), ("reason", reason), ("message", message),
        ):
            if value is not None:
                body[key] = value
        return _ops.json_object(self.client._gateway(
            "POST", _ops.sandbox_path(self.namespace, self.name, "/result"), json_body=body
        ).json())

    def delete(self) -> None:
        """Deletes the sandbox (already gone is fine) and stops its heartbeats."""
        self.stop_heartbeats()
        with contextlib.suppress(NotFound):
            self.client._gateway("DELETE", _ops.sandbox_path(self.namespace, self.name))

    def close(self) -> None:
        """Stops heartbeats and, with ``delete_on_exit``, deletes the sandbox."""
        if self._closed:
            return
        self._closed = True
        _OPEN.discard(self)
        if self.delete_on_exit:
            self.delete()
        else:
            self.stop_heartbeats()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Process:
    """A background process in a sandbox."""

    def __init__(self, sandbox: Sandbox, id: str, info: ProcessInfo | None = None) -> None:
        self.sandbox = sandbox
        self.id = id
        self.info = info

    def __repr__(self) -> str:
        return f"Process({self.id}, state={self.info.state if self.info else '?'})"

    def status(self) -> ProcessInfo:
        self.info = self.sandbox.get_process(self.id)
        return self.info

    def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Blocks until the process exits (long-polls the agent); :class:`Timeout` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = _ops.MAX_SERVER_WAIT if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout(f"process {self.id} still running after {timeout}s")
            self.info = self.sandbox.get_process(self.id, wait=max(0.001, min(remaining, _ops.MAX_SERVER_WAIT)))
            if not self.info.running:
                return self.info

    def signal(self, signal: str | int = "TERM") -> ProcessInfo:
        self.info = self.sandbox.signal_process(self.id, signal)
        return self.info

    def kill(self) -> ProcessInfo:
        self.info = self.sandbox.kill_process(self.id)
        return self.info


class RolloutGroup:
    """A handle on a RolloutGroup (BAR): wait for its reward-balanced group. A context manager that
    deletes the group (and its trajectory sandboxes) on exit when ``delete_on_exit``."""

    def __init__(self, client: SandboxClient, name: str, namespace: str, raw: Mapping[str, Any] | None = None, *, delete_on_exit: bool = True) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.raw: dict[str, Any] = dict(raw or {})
        self.delete_on_exit = delete_on_exit

    def __repr__(self) -> str:
        return f"RolloutGroup({self.namespace}/{self.name})"

    def get(self) -> GroupResult:
        self.raw = self.client._gateway("GET", _ops.group_path(self.namespace, self.name)).json()
        return GroupResult.from_json(self.raw)

    def wait(self, timeout: float | None = None) -> GroupResult:
        """Blocks until the group is recorded (``Complete``) or ``Failed``, with the gateway's
        watch-driven wait (long-polls of up to 300 s in a loop); :class:`Timeout` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = _ops.MAX_SERVER_WAIT if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout(f"rollout group {self.namespace}/{self.name} not complete after {timeout}s")
            wait = min(_ops.MAX_SERVER_WAIT, remaining)
            try:
                response = self.client._gateway(
                    "GET", _ops.group_path(self.namespace, self.name, "/wait"),
                    params={"timeoutSeconds": f"{wait:.3f}"}, timeout=wait + 30.0, retry=False,
                )
            except Timeout as error:
                if isinstance(error.body, dict) and error.body.get("code") == "WaitTimeout":
                    continue
                raise
            self.raw = response.json()
            return GroupResult.from_json(self.raw)

    def delete(self) -> None:
        with contextlib.suppress(NotFound):
            self.client._gateway("DELETE", _ops.group_path(self.namespace, self.name))

    def __enter__(self) -> RolloutGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.delete_on_exit:
            self.delete()


class SandboxClient:
    """Synchronous client of the Orchard Env gateway.

    ``base_url`` and ``token`` default to ``ORCHARD_GATEWAY_URL`` and ``ORCHARD_TOKEN`` (or
    ``ORCHARD_TOKEN_FILE``), then to the in-cluster gateway Service and the pod's service-account
    token; ``namespace`` to ``ORCHARD_NAMESPACE``, then the pod's namespace. With ``direct=True``,
    sandboxes send exec/file calls straight to the agent at the pod IP with the sandbox's own token,
    read from its Secret through the Kubernetes API (``kube_server``/``kube_token``/``kube_ca_file``,
    in-cluster defaults); lifecycle calls still go through the gateway.
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        namespace: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        direct: bool = False,
        kube_server: str | None = None,
        kube_token: str | None = None,
        kube_ca_file: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings: Settings = resolve(base_url, token, token_file, namespace)
        self.namespace = self.settings.namespace
        self.direct = direct
        self._kube_args = (kube_server, kube_token, kube_ca_file)
        self._kube: KubeSettings | None = None
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            transport=transport,
        )
        self._transport = _Transport(self._http, retry or RetryPolicy())

    # -- plumbing ----------------------------------------------------------------------------

    def _gateway(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._transport.send(method, self.settings.base_url + path, token=self.settings.token, **kwargs)

    def _agent_token(self, namespace: str, name: str) -> str:
        if self._kube is None:
            self._kube = resolve_kube(*self._kube_args)
        kube = self._kube
        with httpx.Client(verify=ssl.create_default_context(cafile=kube.ca_file) if kube.ca_file else True, timeout=30.0) as http:
            response = _Transport(http, RetryPolicy()).send(
                "GET", f"{kube.server}/api/v1/namespaces/{namespace}/secrets/{name}-agent-token",
                token=kube.token,
            )
        data = response.json().get("data") or {}
        return base64.b64decode(data.get("token", "")).decode().strip()

    # -- sandboxes ------------------------------------------------------------------------------

    def create(
        self,
        image: str | None = None,
        *,
        name: str | None = None,
        generate_name: str | None = None,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        cpu: str | int | float | None = None,
        memory: str | None = None,
        ttl_seconds: int | None = None,
        heartbeat_timeout_seconds: int | None = None,
        network: str | Mapping[str, Any] | None = None,
        spec: Mapping[str, Any] | None = None,
        wait: bool = True,
        wait_timeout: float | None = 300.0,
        delete_on_exit: bool = True,
        auto_heartbeat: bool = True,
        direct: bool | None = None,
        **spec_fields: Any,
    ) -> Sandbox:
        """Creates a sandbox from ``image`` (or a full ``spec``) and, with ``wait`` (default), blocks
        until it is Ready. Other spec fields go as keywords (``working_dir=``, ``run=``,
        ``startup=``, ``node_selector=``...). The handle deletes the sandbox when closed."""
        ns = namespace or self.namespace
        body = _ops.sandbox_body(
            image, name=name, generate_name=generate_name, labels=labels, annotations=annotations,
            env=env, cpu=cpu, memory=memory, ttl_seconds=ttl_seconds,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds, network=network, spec=spec,
            extra=spec_fields,
        )
        # A retried create could make a second sandbox with a generated name: only named creates retry.
        created = self._gateway(
            "POST", f"/v1/namespaces/{ns}/sandboxes", json_body=body, retry=bool(name)
        ).json()
        sandbox = Sandbox(
            self, created["metadata"]["name"], ns, created, delete_on_exit=delete_on_exit,
            auto_heartbeat=auto_heartbeat, direct=self.direct if direct is None else direct,
        )
        if wait:
            try:
                sandbox.wait_ready(wait_timeout)
            except BaseException:
                if delete_on_exit:
                    with contextlib.suppress(OrchardError):
                        sandbox.delete()
                raise
        return sandbox

    def connect(
        self, name: str, *, namespace: str | None = None, delete_on_exit: bool = False,
        auto_heartbeat: bool = True, direct: bool | None = None,
    ) -> Sandbox:
        """A handle on an existing sandbox (not deleted on close unless ``delete_on_exit``)."""
        ns = namespace or self.namespace
        sandbox = Sandbox(
            self, name, ns, self.get(name, namespace=ns), delete_on_exit=delete_on_exit,
            auto_heartbeat=auto_heartbeat, direct=self.direct if direct is None else direct,
        )
        if _ops.is_ready(sandbox.raw):
            sandbox._start_heartbeats()
        return sandbox

    def get(self, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        """The Sandbox object."""
        return _ops.json_object(self._gateway("GET", _ops.sandbox_path(namespace or self.namespace, name)).json())

    def list(self, *, label_selector: str | None = None, namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        """Sandboxes of the namespace (optionally filtered by a label selector)."""
        params = {"labelSelector": label_selector} if label_selector else None
        data = self._gateway("GET", f"/v1/namespaces/{namespace or self.namespace}/sandboxes", params=params).json()
        return list(data.get("items") or [])

    def delete(self, name: str, *, namespace: str | None = None) -> None:
        """Deletes a sandbox by name."""
        self._gateway("DELETE", _ops.sandbox_path(namespace or self.namespace, name))

    # -- rollout groups -------------------------------------------------------------------------

    def create_rollout_group(
        self,
        template: Mapping[str, Any],
        *,
        group_size: int | None = None,
        max_trajectories: int | None = None,
        stride: int | None = None,
        positive_fraction: tuple[float, float] | Mapping[str, float] | None = None,
        early_stop: str | None = None,
        filter: Mapping[str, Any] | bool | None = None,
        trajectory_timeout_seconds: int | None = None,
        cleanup: str | None = None,
        name: str | None = None,
        generate_name: str | None = None,
        labels: Mapping[str, str] | None = None,
        namespace: str | None = None,
        delete_on_exit: bool = True,
    ) -> RolloutGroup:
        """Creates a RolloutGroup whose trajectories run in sandboxes made from ``template`` (a
        sandbox shorthand such as ``{"image": ..., "run": {"command": [...]}}``, or
        ``{"metadata": ..., "spec": ...}``). Returns at once; call :meth:`RolloutGroup.wait`."""
        ns = namespace or self.namespace
        body = _ops.group_body(
            template, name=name, generate_name=generate_name, labels=labels, group_size=group_size,
            max_trajectories=max_trajectories, stride=stride, positive_fraction=positive_fraction,
            early_stop=early_stop, filter=filter, trajectory_timeout_seconds=trajectory_timeout_seconds,
            cleanup=cleanup,
        )
        created = self._gateway("POST", f"/v1/namespaces/{ns}/rolloutgroups", json_body=body, retry=bool(name)).json()
        return RolloutGroup(self, created["metadata"]["name"], ns, created, delete_on_exit=delete_on_exit)

    def rollout_group(self, name: str, *, namespace: str | None = None, delete_on_exit: bool = False) -> RolloutGroup:
        """A handle on an existing RolloutGroup."""
        return RolloutGroup(self, name, namespace or self.namespace, delete_on_exit=delete_on_exit)

    def list_rollout_groups(self, *, label_selector: str | None = None, namespace: str | None = None) -> builtins.list[GroupResult]:
        """RolloutGroups of the namespace."""
        params = {"labelSelector": label_selector} if label_selector else None
        data = self._gateway("GET", f"/v1/namespaces/{namespace or self.namespace}/rolloutgroups", params=params).json()
        return [GroupResult.from_json(g) for g in data.get("items") or []]

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Process", "RolloutGroup", "Sandbox", "SandboxClient"]
