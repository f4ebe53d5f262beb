"""The plans of the client-level operations (:class:`ClientCore`): create, connect, get, list and delete
sandboxes, create and list rollout groups, get and list snapshots, and the gateway calls they share."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import httpx

from .. import _ops
from .._config import Settings, resolve
from .._retry import RetryPolicy
from ..models import SandboxProgress
from ..errors import (
    Forbidden,
    OrchardError,
    Timeout,
)
from ..models import GroupResult
from .steps import Plan, Request, exchange, http_timeout

#: The permission direct mode needs (``get``, API group ``orchard.dev``) to ask the gateway for an agent's token.
TOKEN_PERMISSION = "sandboxes/token"
#: The DeprecationWarning of the constructor's ``kube_server``/``kube_token``/``kube_ca_file``.
KUBE_ARGS_IGNORED = (
    "kube_server, kube_token and kube_ca_file are ignored: direct mode gets the agent's address and token from the gateway"
)

# -- the operations ------------------------------------------------------------------------------


class ClientCore:
    """What both clients share: settings, and the plans of the client-level operations. A driver adds
    ``_run(plan)``, sets ``_sandbox_type``/``_group_type`` and defines the public methods."""

    _sandbox_type: ClassVar[Callable[..., Any]]
    _group_type: ClassVar[Callable[..., Any]]
    _snapshot_type: ClassVar[Callable[..., Any]]

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
        auto_heartbeat: bool, direct: bool | None, on_progress: Callable[[SandboxProgress], None] | None = None,
        **body_fields: Any,
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
                    yield from sandbox._wait_ready_plan(wait_timeout, on_progress)
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
        """The items of ``GET .../<kind>`` (``sandboxes``, ``rolloutgroups`` or ``sandboxsnapshots``)."""
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

    def _get_snapshot_plan(self, name: str, namespace: str | None) -> Plan[Any]:
        ns = namespace or self.namespace
        handle = self._snapshot_type(self, name, ns)
        yield from handle._refresh_plan()
        return handle

    def _list_snapshots_plan(self, label_selector: str | None, namespace: str | None) -> Plan[list[Any]]:
        ns = namespace or self.namespace
        items = yield from self._list_plan("sandboxsnapshots", label_selector, ns)
        return [self._snapshot_type(self, s["metadata"]["name"], ns, s) for s in items]
