"""The asyncio client: :class:`AsyncSandboxClient`, :class:`AsyncSandbox`, :class:`AsyncProcess` and
:class:`AsyncRolloutGroup`. Same surface as the sync client, with ``await``."""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import json
import logging
import ssl
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping, Sequence
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
from .models import ExecEvent, ExecResult, FileEntry, GroupResult, PatchResult, ProcessInfo

log = logging.getLogger("orchard_env")

CHUNK = 256 * 1024
Upload = bytes | str | os.PathLike[str] | IO[bytes]
AsyncContent = bytes | Callable[[], AsyncIterator[bytes]] | None


def _upload_content(data: Upload) -> tuple[AsyncContent, bool]:
    """Request content for an upload (read in a worker thread) and whether it can be resent."""
    if isinstance(data, bytes):
        return data, True
    if isinstance(data, str):
        return data.encode(), True
    if isinstance(data, os.PathLike):
        path = data

        async def from_path() -> AsyncIterator[bytes]:
            handle = await asyncio.to_thread(open, path, "rb")
            try:
                while block := await asyncio.to_thread(handle.read, CHUNK):
                    yield block
            finally:
                handle.close()

        return from_path, True
    stream = data
    start = stream.tell() if stream.seekable() else None

    async def from_stream() -> AsyncIterator[bytes]:
        if start is not None:
            stream.seek(start)
        while block := await asyncio.to_thread(stream.read, CHUNK):
            yield block

    return from_stream, start is not None


class _AsyncTransport:
    """HTTP with the bearer token, retries and error mapping (async)."""

    def __init__(self, http: httpx.AsyncClient, retry: RetryPolicy) -> None:
        self.http = http
        self.retry = retry

    async def send(
        self,
        method: str,
        url: str,
        *,
        token: TokenSource | str | None,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        content: AsyncContent = None,
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
                response = await self.http.send(request, stream=stream)
            except httpx.TimeoutException as error:
                if attempt + 1 < policy.attempts and retry_exception(error, method):
                    await self._sleep(policy, attempt, f"{method} {url}: {error!r}")
                    attempt += 1
                    continue
                raise Timeout(f"{method} {url}: no answer in time ({error!r})") from error
            except httpx.TransportError as error:
                if attempt + 1 < policy.attempts and retry_exception(error, method):
                    await self._sleep(policy, attempt, f"{method} {url}: {error!r}")
                    attempt += 1
                    continue
                raise GatewayUnreachable(f"{method} {url}: {error!r}", retryable=True) from error
            if response.status_code < 400:
                return response
            content_bytes = await response.aread()
            await response.aclose()
            failure = error_from_response(response.status_code, content_bytes)
            body_json = parse_body(content_bytes)
            flag = body_json.get("retryable") if isinstance(body_json, dict) else None
            if attempt + 1 < policy.attempts and retry_status(response.status_code, flag, method):
                await self._sleep(policy, attempt, str(failure))
                attempt += 1
                continue
            raise failure

    @staticmethod
    async def _sleep(policy: RetryPolicy, attempt: int, why: str) -> None:
        delay = policy.delay(attempt)
        log.info("retrying in %.2fs after: %s", delay, why)
        await asyncio.sleep(delay)


class AsyncSandbox:
    """A handle on one sandbox (async). ``async with`` deletes it on exit (unless
    ``delete_on_exit=False``); while open, a background task heartbeats it."""

    def __init__(
        self,
        client: AsyncSandboxClient,
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
        self._heartbeats: asyncio.Task[None] | None = None
        self._direct_target: tuple[str, str] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.namespace}/{self.name}, phase={self.phase})"

    @property
    def phase(self) -> str | None:
        return _ops.phase_of(self.raw)

    @property
    def agent_endpoint(self) -> str | None:
        return (self.raw.get("status") or {}).get("agentEndpoint")

    async def refresh(self) -> dict[str, Any]:
        self.raw = (await self.client._gateway("GET", _ops.sandbox_path(self.namespace, self.name))).json()
        return self.raw

    async def wait_ready(self, timeout: float | None = 300.0) -> AsyncSandbox:
        """Waits until Ready (server-side, watch-driven); :class:`SandboxFailed` or :class:`Timeout`."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = _ops.MAX_SERVER_WAIT if deadline is None else deadline - loop.time()
            if remaining <= 0:
                raise Timeout(f"sandbox {self.namespace}/{self.name} not Ready after {timeout}s (phase {self.phase})")
            wait = min(_ops.MAX_SERVER_WAIT, remaining)
            try:
                response = await self.client._gateway(
                    "GET", _ops.sandbox_path(self.namespace, self.name, "/wait"),
                    params={"timeoutSeconds": f"{wait:.3f}"}, timeout=wait + 30.0, retry=False,
                )
            except Timeout as error:
                if isinstance(error.body, dict) and error.body.get("code") == "WaitTimeout":
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

    async def heartbeat(self) -> dict[str, Any]:
        """Refreshes the sandbox's expiry now (the gateway coalesces writes)."""
        return _ops.json_object((await self.client._gateway("POST", _ops.sandbox_path(self.namespace, self.name, "/heartbeat"))).json())

    async def _beat_forever(self, timeout: int | None) -> None:
        if timeout is None:
            try:
                timeout = int((await self.heartbeat()).get("heartbeatTimeoutSeconds") or 0)
            except OrchardError as error:
                log.warning("heartbeat failed: %s", error)
                return
        interval = _ops.heartbeat_interval(timeout)
        if interval is None:
            return
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except NotFound:
                return
            except OrchardError as error:
                log.warning("heartbeat failed (will retry): %s", error)

    def _start_heartbeats(self) -> None:
        if self.auto_heartbeat and self._heartbeats is None and not self._closed:
            self._heartbeats = asyncio.create_task(
                self._beat_forever(_ops.spec_heartbeat_timeout(self.raw)), name=f"orchard-heartbeat-{self.name}"
            )

    async def stop_heartbeats(self) -> None:
        """Stops the background heartbeats."""
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeats
            self._heartbeats = None

    async def _target(self) -> tuple[str, str]:
        if self._direct_target is None:
            if not self.agent_endpoint or not _ops.is_ready(self.raw):
                await self.refresh()
            endpoint = self.agent_endpoint
            if not endpoint:
                raise OrchardError(f"sandbox {self.namespace}/{self.name} has no agent endpoint yet; wait_ready() first")
            self._direct_target = (endpoint, await self.client._agent_token(self.namespace, self.name))
        return self._direct_target

    async def _agent(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self.direct:
            endpoint, token = await self._target()
            return await self.client._transport.send(method, f"{endpoint}/v1{path}", token=token, **kwargs)
        return await self.client._gateway(method, _ops.sandbox_path(self.namespace, self.name, path), **kwargs)

    async def exec(
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
        """Runs a command (argv list, or a string for ``shell -c``) and returns its result."""
        body = _ops.exec_body(
            cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell, max_output_bytes=max_output_bytes
        )
        answer = _ops.answer_timeout(timeout)
        response = await self._agent(
            "POST", "/exec", json_body=body, headers={"X-Orchard-Timeout": f"{answer:.0f}"}, timeout=answer + 10.0
        )
        result = ExecResult.from_json(response.json())
        if check and not result.ok:
            raise CommandFailed(f"{cmd!r} exited with {result.exit_code}: {result.stderr[-500:]}", result)
        return result

    async def exec_stream(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        shell: str | None = None,
    ) -> AsyncIterator[ExecEvent]:
        """Runs a command and yields its events as they happen."""
        body = _ops.exec_body(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell)
        response = await self._agent(
            "POST", "/exec/stream", json_body=body, timeout=_ops.answer_timeout(timeout) + 10.0, stream=True
        )
        try:
            async for line in response.aiter_lines():
                if line.strip():
                    yield ExecEvent.from_json(json.loads(line))
        finally:
            await response.aclose()

    async def start_process(
        self,
        cmd: str | Sequence[str],
        *,
        id: str | None = None,
        timeout: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        shell: str | None = None,
    ) -> AsyncProcess:
        """Starts a background process."""
        body = _ops.exec_body(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell)
        if id is not None:
            body["id"] = id
        info = ProcessInfo.from_json((await self._agent("POST", "/processes", json_body=body)).json())
        return AsyncProcess(self, info.id, info)

    async def list_processes(self, *, output: bool = False) -> list[ProcessInfo]:
        data = (await self._agent("GET", "/processes", params={"output": str(output).lower()})).json()
        return [ProcessInfo.from_json(p) for p in data.get("processes") or []]

    async def get_process(self, id: str, *, wait: float | None = None) -> ProcessInfo:
        params = {"wait": f"{min(wait, _ops.MAX_SERVER_WAIT):.3f}"} if wait else None
        response = await self._agent("GET", f"/processes/{id}", params=params, timeout=(wait or 0) + 90.0)
        return ProcessInfo.from_json(response.json())

    async def signal_process(self, id: str, signal: str | int = "TERM") -> ProcessInfo:
        response = await self._agent("POST", f"/processes/{id}/signal", json_body={"signal": signal}, retry=False)
        return ProcessInfo.from_json(response.json())

    async def kill_process(self, id: str) -> ProcessInfo:
        return ProcessInfo.from_json((await self._agent("DELETE", f"/processes/{id}")).json())

    async def upload(self, path: str, data: Upload, *, mode: int | str | None = None) -> dict[str, Any]:
        """Writes ``data`` (bytes, text, a local path or a binary file object) to ``path``, streamed."""
        content, repeatable = _upload_content(data)
        params: dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o") if isinstance(mode, int) else mode
        response = await self._agent(
            "PUT", "/files", params=params, content=content,
            headers={"Content-Type": "application/octet-stream"}, timeout=600.0, retry=repeatable,
        )
        return _ops.json_object(response.json())

    async def download(self, path: str, dest: str | os.PathLike[str] | None = None) -> bytes | int:
        """The bytes of ``path``, or, with ``dest``, streams them to that local file (byte count)."""
        response = await self._agent("GET", "/files", params={"path": path}, timeout=600.0, stream=True)
        try:
            if dest is None:
                return await response.aread()
            written = 0
            handle = await asyncio.to_thread(open, dest, "wb")
            try:
                async for block in response.aiter_bytes(CHUNK):
                    await asyncio.to_thread(handle.write, block)
                    written += len(block)
            finally:
                handle.close()
            return written
        finally:
            await response.aclose()

    async def list_files(self, path: str = ".") -> list[FileEntry]:
        data = (await self._agent("GET", "/files/list", params={"path": path})).json()
        return [FileEntry.from_json(e) for e in data.get("entries") or []]

    async def delete_file(self, path: str, *, recursive: bool = False) -> None:
        params: dict[str, Any] = {"path": path}
        if recursive:
            params["recursive"] = "true"
        await self._agent("DELETE", "/files", params=params)

    async def apply_patch(self, patch: str, *, cwd: str | None = None, strip: int | None = None) -> PatchResult:
        body: dict[str, Any] = {"patch": patch}
        if cwd is not None:
            body["cwd"] = cwd
        if strip is not None:
            body["strip"] = strip
        return PatchResult.from_json((await self._agent("POST", "/patch", json_body=body, retry=False)).json())

    async def record_result(
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
        """Records this trajectory's outcome in ``status.result`` (write-once)."""
        body: dict[str, Any] = {"status": status}
        for key, value in (
            ("reward", reward), ("length", length), ("artifact", artifact),
            ("exitCode", exit_code), ("reason", reason), ("message", message),
        ):
            if value is not None:
                body[key] = value
        response = await self.client._gateway(
            "POST", _ops.sandbox_path(self.namespace, self.name, "/result"), json_body=body
        )
        return _ops.json_object(response.json())

    async def delete(self) -> None:
        await self.stop_heartbeats()
        with contextlib.suppress(NotFound):
            await self.client._gateway("DELETE", _ops.sandbox_path(self.namespace, self.name))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.delete_on_exit:
            await self.delete()
        else:
            await self.stop_heartbeats()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncProcess:
    """A background process in a sandbox (async)."""

    def __init__(self, sandbox: AsyncSandbox, id: str, info: ProcessInfo | None = None) -> None:
        self.sandbox = sandbox
        self.id = id
        self.info = info

    async def status(self) -> ProcessInfo:
        self.info = await self.sandbox.get_process(self.id)
        return self.info

    async def wait(self, timeout: float | None = None) -> ProcessInfo:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = _ops.MAX_SERVER_WAIT if deadline is None else deadline - loop.time()
            if remaining <= 0:
                raise Timeout(f"process {self.id} still running after {timeout}s")
            self.info = await self.sandbox.get_process(self.id, wait=max(0.001, min(remaining, _ops.MAX_SERVER_WAIT)))
            if not self.info.running:
                return self.info

    async def signal(self, signal: str | int = "TERM") -> ProcessInfo:
        self.info = await self.sandbox.signal_process(self.id, signal)
        return self.info

    async def kill(self) -> ProcessInfo:
        self.info = await self.sandbox.kill_process(self.id)
        return self.info


class AsyncRolloutGroup:
    """A handle on a RolloutGroup (async)."""

    def __init__(self, client: AsyncSandboxClient, name: str, namespace: str, raw: Mapping[str, Any] | None = None, *, delete_on_exit: bool = True) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.raw: dict[str, Any] = dict(raw or {})
        self.delete_on_exit = delete_on_exit

    async def get(self) -> GroupResult:
        self.raw = (await self.client._gateway("GET", _ops.group_path(self.namespace, self.name))).json()
        return GroupResult.from_json(self.raw)

    async def wait(self, timeout: float | None = None) -> GroupResult:
        """Waits until the group is recorded (``Complete``) or ``Failed`` (watch-driven long-polls)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            remaining = _ops.MAX_SERVER_WAIT if deadline is None else deadline - loop.time()
            if remaining <= 0:
                raise Timeout(f"rollout group {self.namespace}/{self.name} not complete after {timeout}s")
            wait = min(_ops.MAX_SERVER_WAIT, remaining)
            try:
                response = await self.client._gateway(
                    "GET", _ops.group_path(self.namespace, self.name, "/wait"),
                    params={"timeoutSeconds": f"{wait:.3f}"}, timeout=wait + 30.0, retry=False,
                )
            except Timeout as error:
                if isinstance(error.body, dict) and error.body.get("code") == "WaitTimeout":
                    continue
                raise
            self.raw = response.json()
            return GroupResult.from_json(self.raw)

    async def delete(self) -> None:
        with contextlib.suppress(NotFound):
            await self.client._gateway("DELETE", _ops.group_path(self.namespace, self.name))

    async def __aenter__(self) -> AsyncRolloutGroup:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.delete_on_exit:
            await self.delete()


class _Creating:
    """What :meth:`AsyncSandboxClient.create` returns: await it for the handle, or use it directly
    as ``async with client.create(...) as sbx:``."""

    def __init__(self, make: Callable[[], Awaitable[AsyncSandbox]]) -> None:
        self._make = make
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._make().__await__()

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._make()
        return self._sandbox

    async def __aexit__(self, *exc: object) -> None:
        if self._sandbox is not None:
            await self._sandbox.close()


class AsyncSandboxClient:
    """Asyncio client of the Orchard Env gateway (same arguments and defaults as
    :class:`~orchard_env.SandboxClient`)."""

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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings: Settings = resolve(base_url, token, token_file, namespace)
        self.namespace = self.settings.namespace
        self.direct = direct
        self._kube_args = (kube_server, kube_token, kube_ca_file)
        self._kube: KubeSettings | None = None
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
            transport=transport,
        )
        self._transport = _AsyncTransport(self._http, retry or RetryPolicy())

    async def _gateway(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self._transport.send(method, self.settings.base_url + path, token=self.settings.token, **kwargs)

    async def _agent_token(self, namespace: str, name: str) -> str:
        if self._kube is None:
            self._kube = resolve_kube(*self._kube_args)
        kube = self._kube
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=kube.ca_file) if kube.ca_file else True, timeout=30.0) as http:
            response = await _AsyncTransport(http, RetryPolicy()).send(
                "GET", f"{kube.server}/api/v1/namespaces/{namespace}/secrets/{name}-agent-token", token=kube.token
            )
        data = response.json().get("data") or {}
        return base64.b64decode(data.get("token", "")).decode().strip()

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
    ) -> _Creating:
        """Creates a sandbox; ``await`` it for the handle, or ``async with client.create(...) as sbx``."""
        ns = namespace or self.namespace
        body = _ops.sandbox_body(
            image, name=name, generate_name=generate_name, labels=labels, annotations=annotations,
            env=env, cpu=cpu, memory=memory, ttl_seconds=ttl_seconds,
            heartbeat_timeout_seconds=heartbeat_timeout_seconds, network=network, spec=spec,
            extra=spec_fields,
        )

        async def make() -> AsyncSandbox:
            created = (
                await self._gateway("POST", f"/v1/namespaces/{ns}/sandboxes", json_body=body, retry=bool(name))
            ).json()
            sandbox = AsyncSandbox(
                self, created["metadata"]["name"], ns, created, delete_on_exit=delete_on_exit,
                auto_heartbeat=auto_heartbeat, direct=self.direct if direct is None else direct,
            )
            if wait:
                try:
                    await sandbox.wait_ready(wait_timeout)
                except BaseException:
                    if delete_on_exit:
                        with contextlib.suppress(OrchardError):
                            await sandbox.delete()
                    raise
            return sandbox

        return _Creating(make)

    async def connect(
        self, name: str, *, namespace: str | None = None, delete_on_exit: bool = False,
        auto_heartbeat: bool = True, direct: bool | None = None,
    ) -> AsyncSandbox:
        ns = namespace or self.namespace
        sandbox = AsyncSandbox(
            self, name, ns, await self.get(name, namespace=ns), delete_on_exit=delete_on_exit,
            auto_heartbeat=auto_heartbeat, direct=self.direct if direct is None else direct,
        )
        if _ops.is_ready(sandbox.raw):
            sandbox._start_heartbeats()
        return sandbox

    async def get(self, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        return _ops.json_object((await self._gateway("GET", _ops.sandbox_path(namespace or self.namespace, name))).json())

    async def list(self, *, label_selector: str | None = None, namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        data = (await self._gateway("GET", f"/v1/namespaces/{namespace or self.namespace}/sandboxes", params=params)).json()
        return list(data.get("items") or [])

    async def delete(self, name: str, *, namespace: str | None = None) -> None:
        await self._gateway("DELETE", _ops.sandbox_path(namespace or self.namespace, name))

    async def create_rollout_group(
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
    ) -> AsyncRolloutGroup:
        """Creates a RolloutGroup from a sandbox ``template``; returns at once."""
        ns = namespace or self.namespace
        body = _ops.group_body(
            template, name=name, generate_name=generate_name, labels=labels, group_size=group_size,
            max_trajectories=max_trajectories, stride=stride, positive_fraction=positive_fraction,
            early_stop=early_stop, filter=filter, trajectory_timeout_seconds=trajectory_timeout_seconds,
            cleanup=cleanup,
        )
        created = (await self._gateway("POST", f"/v1/namespaces/{ns}/rolloutgroups", json_body=body, retry=bool(name))).json()
        return AsyncRolloutGroup(self, created["metadata"]["name"], ns, created, delete_on_exit=delete_on_exit)

    def rollout_group(self, name: str, *, namespace: str | None = None, delete_on_exit: bool = False) -> AsyncRolloutGroup:
        return AsyncRolloutGroup(self, name, namespace or self.namespace, delete_on_exit=delete_on_exit)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
