"""The sans-I/O core of both clients: every operation is written once here, as a *plan*.

A plan is a generator that yields :data:`Step` values (send this HTTP request, sleep, read the clock,
call a driver hook) and receives each step's outcome back: the answer through ``send``, or the
exception through ``throw``. Its return value is the operation's result. The sync client
(``client.py``, on ``httpx.Client``) and the async client (``aio.py``, on ``httpx.AsyncClient``) are
thin drivers that perform the steps, plus the few things that really differ: background heartbeats
(a thread or a task), local file reads and writes, and iterating over streamed answers.

Nothing here does I/O, so plans can be driven step by step in tests.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar, Generic, Protocol, TypeAlias, TypeVar

import httpx

from . import _cleanup, _ops
from ._config import Settings, TokenSource, resolve
from ._retry import NO_RETRY, RetryPolicy, retry_exception, retry_status
from .errors import (
    CommandFailed,
    Conflict,
    Forbidden,
    GatewayUnreachable,
    NotFound,
    OrchardError,
    SandboxFailed,
    SandboxStalled,
    Timeout,
    error_from_response,
    parse_body,
)
from .models import ExecEvent, ExecResult, FileEntry, GroupResult, PatchResult, ProcessInfo

log = logging.getLogger("orchard_env")

T = TypeVar("T")
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
#: The permission direct mode needs (``get``, API group ``orchard.dev``) to ask the gateway for an agent's token.
TOKEN_PERMISSION = "sandboxes/token"
#: The DeprecationWarning of the constructor's ``kube_server``/``kube_token``/``kube_ca_file``.
KUBE_ARGS_IGNORED = (
    "kube_server, kube_token and kube_ca_file are ignored: direct mode gets the agent's address and token from the gateway"
)


# -- steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One HTTP request of an operation; a retry sends it again (re-reading the token and re-opening
    ``content`` when it is a factory)."""

    method: str
    url: str
    token: TokenSource | str | None = None
    params: Mapping[str, Any] | None = None
    json_body: Any = None
    #: bytes, or a zero-argument factory of a (sync or async, to match the driver) byte iterator.
    content: Any = None
    headers: Mapping[str, str] | None = None
    #: Read timeout in seconds (the client's default when None).
    timeout: float | None = None
    stream: bool = False
    retry: bool = True

    def build_args(self) -> dict[str, Any]:
        """Keyword arguments of ``build_request`` for one attempt."""
        headers = dict(self.headers or {})
        secret = self.token.get() if isinstance(self.token, TokenSource) else self.token
        if secret:
            headers["Authorization"] = f"Bearer {secret}"
        args: dict[str, Any] = {"method": self.method, "url": self.url, "params": self.params, "headers": headers}
        if self.json_body is not None:
            args["json"] = self.json_body
        elif self.content is not None:
            args["content"] = self.content() if callable(self.content) else self.content
        if self.timeout is not None:
            args["timeout"] = http_timeout(self.timeout)
        return args


@dataclass(frozen=True)
class Send:
    """Step: send ``request`` once. The driver answers with the response (already read and closed when
    its status is >= 400) or throws the transport error."""

    request: Request


@dataclass(frozen=True)
class Sleep:
    """Step: sleep ``seconds``. ``idle`` marks the pause between heartbeats, which the sync driver ends
    early when the heartbeats are stopped: the answer is then True."""

    seconds: float
    idle: bool = False


@dataclass(frozen=True)
class Call:
    """Step: call a driver hook (``fn()``, awaited by the async driver) and answer its result."""

    fn: Callable[[], Any]


@dataclass(frozen=True)
class Now:
    """Step: answer the driver's monotonic clock, in seconds."""


NOW = Now()
Step: TypeAlias = Send | Sleep | Call | Now
Plan: TypeAlias = Generator[Step, Any, T]


class Runner(Generic[T]):
    """Steps a plan for a driver::

        for step in (runner := Runner(plan)):
            with runner:                      # an exception goes back into the plan
                runner.value = perform(step)  # the answer goes back into the plan
        return runner.result
    """

    def __init__(self, plan: Plan[T]) -> None:
        self._plan = plan
        self.value: Any = None
        self._error: BaseException | None = None
        self.result: T

    def __iter__(self) -> Runner[T]:
        return self

    def __next__(self) -> Step:
        value, error = self.value, self._error
        self.value = self._error = None
        try:
            return self._plan.throw(error) if error is not None else self._plan.send(value)
        except StopIteration as done:
            self.result = done.value
            raise StopIteration from None

    def __enter__(self) -> Runner[T]:
        return self

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> bool:
        if error is not None:
            self._error = error
        return True


def http_timeout(seconds: float) -> httpx.Timeout:
    """An HTTP timeout of ``seconds`` with a 10 s connect timeout."""
    return httpx.Timeout(seconds, connect=10.0)


# -- requests with retries -----------------------------------------------------------------------


def exchange(request: Request, policy: RetryPolicy) -> Plan[httpx.Response]:
    """Sends ``request`` and answers its response (status < 400); retries connection errors and
    retryable answers with ``policy`` (never when ``request.retry`` is False) and raises the
    :class:`~orchard_env.errors.OrchardError` of the last failure."""
    if not request.retry:
        policy = NO_RETRY
    what = f"{request.method} {request.url}"
    attempt = 0
    while True:
        try:
            response = yield Send(request)
        except httpx.TransportError as error:
            if attempt + 1 < policy.attempts and retry_exception(error, request.method):
                yield from _backoff(policy, attempt, f"{what}: {error!r}")
                attempt += 1
                continue
            if isinstance(error, httpx.TimeoutException):
                raise Timeout(f"{what}: no answer in time ({error!r})") from error
            raise GatewayUnreachable(f"{what}: {error!r}", retryable=True) from error
        if response.status_code < 400:
            return response
        failure = error_from_response(response.status_code, response.content)
        body = parse_body(response.content)
        flag = body.get("retryable") if isinstance(body, dict) else None
        if attempt + 1 < policy.attempts and retry_status(response.status_code, flag, request.method):
            yield from _backoff(policy, attempt, str(failure))
            attempt += 1
            continue
        raise failure


def _backoff(policy: RetryPolicy, attempt: int, why: str) -> Plan[None]:
    delay = policy.delay(attempt)
    log.info("retrying in %.2fs after: %s", delay, why)
    yield Sleep(delay)


def until(
    timeout: float | None, attempt: Callable[[float], Plan[T | None]], expired: Callable[[], str | Timeout]
) -> Plan[T]:
    """Long-polls: repeats ``attempt(wait)`` (one server-side wait of at most ``wait`` seconds) until it
    answers something other than None; once ``timeout`` seconds have passed (None: never) raises
    ``expired()``: a :class:`Timeout`, or the message of one."""
    deadline = None if timeout is None else (yield NOW) + timeout
    while True:
        remaining = _ops.MAX_SERVER_WAIT if deadline is None else deadline - (yield NOW)
        if remaining <= 0:
            why = expired()
            raise why if isinstance(why, Timeout) else Timeout(why)
        value = yield from attempt(min(_ops.MAX_SERVER_WAIT, remaining))
        if value is not None:
            return value


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


# -- the operations ------------------------------------------------------------------------------


class ClientCore:
    """What both clients share: settings, and the plans of the client-level operations. A driver adds
    ``_run(plan)``, sets ``_sandbox_type``/``_group_type`` and defines the public methods."""

    _sandbox_type: ClassVar[Callable[..., Any]]
    _group_type: ClassVar[Callable[..., Any]]

    def __init__(
        self, base_url: str | None = None, token: str | None = None, *, namespace: str | None = None,
        token_file: str | os.PathLike[str] | None = None, timeout: float = 60.0, retry: RetryPolicy | None = None,
        direct: bool = False, kube_server: str | None = None, kube_token: str | None = None,
        kube_ca_file: str | None = None, transport: Any = None,
    ) -> None:
        self.settings: Settings = resolve(base_url, token, token_file, namespace)
        self.namespace = self.settings.namespace
        self.direct = direct
        self._retry = retry or RetryPolicy()
        #: The transport the exit cleanup sends its DELETEs with (a sync one given for tests; else the default).
        self._exit_transport = transport if isinstance(transport, httpx.BaseTransport) else None
        if (kube_server, kube_token, kube_ca_file) != (None, None, None):
            warnings.warn(KUBE_ARGS_IGNORED, DeprecationWarning, stacklevel=2)
        self._http = self._open_http(http_timeout(timeout), transport)

    def _open_http(self, timeout: httpx.Timeout, transport: Any) -> Any:
        """The driver's HTTP client (``transport``: an httpx transport of the driver's kind, for tests)."""
        raise NotImplementedError

    def _gateway_plan(self, method: str, path: str, **fields: Any) -> Plan[httpx.Response]:
        """A request to the gateway (``fields`` as in :class:`Request`)."""
        return exchange(Request(method, self.settings.base_url + path, self.settings.token, **fields), self._retry)

    def _agent_target_plan(self, namespace: str, name: str) -> Plan[tuple[str, str]]:
        """Direct mode: the agent's URL at the sandbox's own Ready pod and its bearer token, from the
        gateway (``GET .../sandboxes/{name}/token``, RBAC ``get sandboxes/token``). The gateway finds the
        pod (a claimed pool member's included) and checks it is the sandbox's own; a sandbox without a
        Ready pod answers ``NotReady``."""
        try:
            response = yield from self._gateway_plan("GET", _ops.sandbox_path(namespace, name, "/token"))
        except Forbidden as error:
            if TOKEN_PERMISSION in error.message:
                raise
            raise Forbidden(
                f"{error.message} (direct mode needs RBAC get on {TOKEN_PERMISSION} in namespace {namespace})",
                status=error.status, code=error.code, retryable=error.retryable, body=error.body,
            ) from error
        target = _ops.agent_target(response.json())
        if target is None:
            raise OrchardError(f"the gateway answered no agent endpoint and token for sandbox {namespace}/{name}")
        return target

    def _server_wait_plan(self, path: str, wait: float) -> Plan[tuple[bool, Any]]:
        """One watch-driven wait of the gateway (``GET .../wait``): ``(True, the object)``, or
        ``(False, the error body)`` when the server-side wait ran out (``WaitTimeout``)."""
        try:
            response = yield from self._gateway_plan(
                "GET", path, params={"timeoutSeconds": f"{wait:.3f}"}, timeout=wait + 30.0, retry=False
            )
        except Timeout as error:
            if isinstance(error.body, dict) and error.body.get("code") == "WaitTimeout":
                return False, error.body
            raise
        return True, response.json()

    def _handle(
        self, name: str, namespace: str, raw: Any, delete_on_exit: bool, auto_heartbeat: bool, direct: bool | None
    ) -> Any:
        return self._sandbox_type(
            self, name, namespace, raw, delete_on_exit=delete_on_exit, auto_heartbeat=auto_heartbeat,
            direct=self.direct if direct is None else direct,
        )

    def _create_plan(
        self, namespace: str | None, *, wait: bool, wait_timeout: float | None, delete_on_exit: bool,
        auto_heartbeat: bool, direct: bool | None, **body_fields: Any,
    ) -> Callable[[], Plan[Any]]:
        """Checks the request now (``ValueError``) and answers a factory of the create plan: POST, then,
        with ``wait``, wait until Ready, deleting the sandbox again when that fails (``delete_on_exit``)."""
        ns = namespace or self.namespace
        body = _ops.sandbox_body(**body_fields)
        if body_fields.get("heartbeat_timeout_seconds") is None:
            body = _ops.with_default_heartbeat(body)
        # A retried create could make a second sandbox with a generated name: only named creates retry.
        retry = bool(body_fields.get("name"))

        def plan() -> Plan[Any]:
            response = yield from self._gateway_plan("POST", f"/v1/namespaces/{ns}/sandboxes", json_body=body, retry=retry)
            created = response.json()
            sandbox = self._handle(created["metadata"]["name"], ns, created, delete_on_exit, auto_heartbeat, direct)
            if wait:
                try:
                    yield from sandbox._wait_ready_plan(wait_timeout)
                except BaseException:
                    if delete_on_exit:
                        with contextlib.suppress(OrchardError):
                            yield from sandbox._delete_plan()
                    raise
            return sandbox

        return plan

    def _connect_plan(
        self, name: str, namespace: str | None, delete_on_exit: bool, auto_heartbeat: bool, direct: bool | None
    ) -> Plan[Any]:
        ns = namespace or self.namespace
        raw = yield from self._get_plan(name, ns)
        sandbox = self._handle(name, ns, raw, delete_on_exit, auto_heartbeat, direct)
        if _ops.is_ready(sandbox.raw):
            sandbox._start_heartbeats()
        return sandbox

    def _get_plan(self, name: str, namespace: str | None) -> Plan[dict[str, Any]]:
        response = yield from self._gateway_plan("GET", _ops.sandbox_path(namespace or self.namespace, name))
        return _ops.json_object(response.json())

    def _list_plan(self, kind: str, label_selector: str | None, namespace: str | None) -> Plan[list[Any]]:
        """The items of ``GET .../<kind>`` (``sandboxes`` or ``rolloutgroups``)."""
        params = {"labelSelector": label_selector} if label_selector else None
        path = f"/v1/namespaces/{namespace or self.namespace}/{kind}"
        data = (yield from self._gateway_plan("GET", path, params=params)).json()
        return list(data.get("items") or [])

    def _delete_plan(self, name: str, namespace: str | None) -> Plan[None]:
        yield from self._gateway_plan("DELETE", _ops.sandbox_path(namespace or self.namespace, name))

    def _create_group_plan(
        self, template: Mapping[str, Any], namespace: str | None, delete_on_exit: bool, **body_fields: Any
    ) -> Plan[Any]:
        ns = namespace or self.namespace
        body = _ops.group_body(template, **body_fields)
        retry = bool(body_fields.get("name"))
        created = (yield from self._gateway_plan("POST", f"/v1/namespaces/{ns}/rolloutgroups", json_body=body, retry=retry)).json()
        return self._group_type(self, created["metadata"]["name"], ns, created, delete_on_exit=delete_on_exit)

    def _list_groups_plan(self, label_selector: str | None, namespace: str | None) -> Plan[list[GroupResult]]:
        items = yield from self._list_plan("rolloutgroups", label_selector, namespace)
        return [GroupResult.from_json(g) for g in items]


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

    def _wait_ready_plan(self, timeout: float | None) -> Plan[Any]:
        """Waits until Ready with the gateway's watch-driven waits. Raises as soon as the sandbox settles
        otherwise: :class:`SandboxStalled` (``Stalled=True``), :class:`SandboxFailed` (Failed,
        Succeeded, Expired); after ``timeout`` seconds :class:`Timeout` with the phase, reason and
        condition message last seen."""
        last: dict[str, str | None] = {}

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
                return None
            self.raw = answer
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

        return until(timeout, attempt, expired)

    def _heartbeat_plan(self) -> Plan[dict[str, Any]]:
        return _ops.json_object((yield from self._gateway("POST", "/heartbeat")).json())

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
        """An agent call: straight to the pod in direct mode, else through the gateway."""
        if self.direct:
            endpoint, token = yield from self._target_plan()
            request = Request(method, f"{endpoint}/v1{path}", token, **fields)
            return (yield from exchange(request, self.client._retry))
        return (yield from self._gateway(method, path, **fields))

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
        body = _ops.exec_body(cmd, **fields)
        if id is not None:
            body["id"] = id
        info = ProcessInfo.from_json((yield from self._agent("POST", "/processes", json_body=body)).json())
        return handle(self, info.id, info)

    def _list_processes_plan(self, output: bool) -> Plan[list[ProcessInfo]]:
        data = (yield from self._agent("GET", "/processes", params={"output": str(output).lower()})).json()
        return [ProcessInfo.from_json(p) for p in data.get("processes") or []]

    def _get_process_plan(self, id: str, wait: float | None = None) -> Plan[ProcessInfo]:
        params = {"wait": f"{min(wait, _ops.MAX_SERVER_WAIT):.3f}"} if wait else None
        response = yield from self._agent("GET", f"/processes/{id}", params=params, timeout=(wait or 0) + 90.0)
        return ProcessInfo.from_json(response.json())

    def _signal_process_plan(self, id: str, signal: str | int) -> Plan[ProcessInfo]:
        response = yield from self._agent("POST", f"/processes/{id}/signal", json_body={"signal": signal}, retry=False)
        return ProcessInfo.from_json(response.json())

    def _kill_process_plan(self, id: str) -> Plan[ProcessInfo]:
        return ProcessInfo.from_json((yield from self._agent("DELETE", f"/processes/{id}")).json())

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


class ProcessCore:
    """State and plans of a background process handle; each plan keeps :attr:`info` up to date."""

    def __init__(self, sandbox: Any, id: str, info: ProcessInfo | None) -> None:
        self.sandbox = sandbox
        self.id = id
        self.info = info

    def _run(self, plan: Plan[T]) -> Any:
        return self.sandbox._run(plan)

    def _track(self, plan: Plan[ProcessInfo]) -> Plan[ProcessInfo]:
        self.info = yield from plan
        return self.info

    def _wait_plan(self, timeout: float | None) -> Plan[ProcessInfo]:
        def attempt(wait: float) -> Plan[ProcessInfo | None]:
            info = yield from self._track(self.sandbox._get_process_plan(self.id, wait=max(0.001, wait)))
            return None if info.running else info

        return until(timeout, attempt, lambda: f"process {self.id} still running after {timeout}s")


# -- trainer-driven rollout groups ----------------------------------------------------------------


class Episodes(Protocol):
    """The driver's side of :meth:`GroupCore._drive_plan`: runs episode plans concurrently (threads or
    tasks). Every method is a :class:`Call` hook (a coroutine function for the async driver)."""

    def start(self, sandbox: Any) -> Any:
        """Starts running ``GroupCore._episode_plan`` for ``sandbox`` in the background."""

    def running(self) -> Any:
        """How many started episodes have not ended."""

    def reap(self) -> Any:
        """Forgets the episodes that ended; answers the exceptions that escaped them (their result
        could not be posted)."""

    def settle(self) -> Any:
        """The group is complete: lets the episodes still running end (sync: waits for them; async:
        cancels them), then releases the workers."""

    def abandon(self) -> Any:
        """``drive`` is failing or cancelled: cancels what can be cancelled, without waiting."""


class DriveBook:
    """Which trajectory Sandboxes of group ``group`` an episode ran for, by UID (pure): an episode runs at
    most once per Sandbox UID, and never for one that failed, expired, is being deleted or already has a
    result before its episode started (the controller records those aborted)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.started: set[str] = set()
        self.skipped: set[str] = set()

    def select(self, items: Sequence[Mapping[str, Any]], slots: int | None) -> list[Mapping[str, Any]]:
        """The listed Sandboxes to start an episode for now: Ready ones not seen before, in index order,
        at most ``slots`` (None: all); they are marked started."""
        chosen: list[Mapping[str, Any]] = []
        trajectories = []
        for item in items:
            meta = item.get("metadata") or {}
            index = _ops.trajectory_index(self.group, str(meta.get("name", "")))
            uid = meta.get("uid")
            if index is not None and uid and uid not in self.started and uid not in self.skipped:
                trajectories.append((index, str(uid), meta, item))
        for _, uid, meta, item in sorted(trajectories, key=lambda t: t[0]):
            status = item.get("status") or {}
            if meta.get("deletionTimestamp") or status.get("result") or status.get("phase") in _ops.FINAL_PHASES:
                self.skipped.add(uid)
            elif _ops.is_ready(item) and (slots is None or len(chosen) < slots):
                chosen.append(item)
                self.started.add(uid)
        return chosen


class GroupCore:
    """State and plans of a RolloutGroup handle."""

    def __init__(self, client: Any, name: str, namespace: str, raw: Mapping[str, Any] | None, delete_on_exit: bool) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.raw: dict[str, Any] = dict(raw or {})
        self.delete_on_exit = delete_on_exit

    def _run(self, plan: Plan[T]) -> Any:
        return self.client._run(plan)

    def _get_plan(self) -> Plan[GroupResult]:
        self.raw = (yield from self.client._gateway_plan("GET", _ops.group_path(self.namespace, self.name))).json()
        return GroupResult.from_json(self.raw)

    def _wait_plan(self, timeout: float | None) -> Plan[GroupResult]:
        def attempt(wait: float) -> Plan[GroupResult | None]:
            done, answer = yield from self.client._server_wait_plan(_ops.group_path(self.namespace, self.name, "/wait"), wait)
            if not done:
                return None
            self.raw = answer
            return GroupResult.from_json(self.raw)

        return until(timeout, attempt, lambda: f"rollout group {self.namespace}/{self.name} not complete after {timeout}s")

    def _delete_plan(self) -> Plan[None]:
        with contextlib.suppress(NotFound):
            yield from self.client._gateway_plan("DELETE", _ops.group_path(self.namespace, self.name))

    def _drive_plan(
        self, episodes: Episodes, concurrency: int | None, timeout: float | None, poll_interval: float
    ) -> Plan[GroupResult]:
        """Runs an episode for every trajectory Sandbox of the group as it becomes Ready (later strides
        included), at most ``concurrency`` at once, until the group is recorded; answers the group. On
        any exception (a cancellation included), deletes the group's trajectory Sandboxes that have no
        result yet, then raises it."""
        if concurrency is not None and concurrency < 1:
            raise ValueError("concurrency must be at least 1 (or None: no limit)")
        if not (self.raw.get("spec") or {}).get("template"):
            yield from self._get_plan()
        if _ops.template_runs(self.raw):
            raise ValueError(
                f"rollout group {self.namespace}/{self.name} has template.spec.run: the operator runs each "
                "trajectory and records its result; drive() is for groups whose template has no run"
            )
        book = DriveBook(self.name)
        selector = f"{_ops.ROLLOUT_GROUP_LABEL}={self.name}"
        deadline = None if timeout is None else (yield NOW) + timeout
        try:
            while True:
                failures = yield Call(episodes.reap)
                if failures:
                    raise failures[0]
                items = yield from self.client._list_plan("sandboxes", selector, self.namespace)
                slots = None if concurrency is None else concurrency - (yield Call(episodes.running))
                for raw in book.select(items, slots):
                    sandbox = self.client._handle(raw["metadata"]["name"], self.namespace, raw, False, True, None)
                    yield Call(functools.partial(episodes.start, sandbox))
                wait = poll_interval
                if deadline is not None:
                    remaining = deadline - (yield NOW)
                    if remaining <= 0:
                        raise Timeout(f"rollout group {self.namespace}/{self.name} not complete after {timeout}s")
                    wait = min(wait, remaining)
                done, answer = yield from self.client._server_wait_plan(
                    _ops.group_path(self.namespace, self.name, "/wait"), wait
                )
                if done:
                    self.raw = answer
                    yield Call(episodes.settle)
                    return GroupResult.from_json(self.raw)
        except BaseException:
            yield Call(episodes.abandon)
            yield from self._delete_unfinished_plan(selector)
            raise

    def _delete_unfinished_plan(self, selector: str) -> Plan[None]:
        """Best effort: deletes the group's trajectory Sandboxes that have no result (still running)."""
        try:
            items = yield from self.client._list_plan("sandboxes", selector, self.namespace)
        except OrchardError as error:
            log.warning("cannot list the trajectories of %s/%s to delete them: %s", self.namespace, self.name, error)
            return
        for item in items:
            meta = item.get("metadata") or {}
            name = str(meta.get("name", ""))
            if _ops.trajectory_index(self.name, name) is None or meta.get("deletionTimestamp"):
                continue
            if (item.get("status") or {}).get("result"):
                continue
            try:
                yield from self.client._delete_plan(name, self.namespace)
            except NotFound:
                pass
            except OrchardError as error:
                log.warning("cannot delete trajectory %s/%s: %s", self.namespace, name, error)

    def _episode_plan(self, sandbox: Any, episode: Callable[[Any], Any]) -> Plan[dict[str, Any]]:
        """Runs ``episode(sandbox)`` once (a :class:`Call`: never retried) while heartbeating the sandbox,
        and records its outcome: what it returned (:func:`_ops.result_body`), or ``aborted`` with the
        exception when it raised. A sandbox already gone, or a result already recorded (the controller
        aborted the trajectory meanwhile), is logged, not raised. Answers the body it posted."""
        sandbox._start_heartbeats()
        try:
            try:
                body = _ops.result_body((yield Call(functools.partial(episode, sandbox))))
            except Exception as error:
                log.warning("episode of %s/%s failed: %r", sandbox.namespace, sandbox.name, error)
                body = _ops.aborted_body(error)
            try:
                yield from sandbox._gateway("POST", "/result", json_body=body)
            except (NotFound, Conflict) as error:
                log.info("result of %s/%s not recorded: %s", sandbox.namespace, sandbox.name, error)
        finally:
            yield Call(sandbox.stop_heartbeats)
        return body
