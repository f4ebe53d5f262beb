"""Exceptions of the Orchard Env client.

Every error the gateway or an agent answers with is JSON ``{"code", "message", "retryable", ...}``;
:func:`error_from_response` turns it into the matching exception class, keeping the status, code,
message and the whole body.
"""

from __future__ import annotations

import json
from typing import Any


class OrchardError(Exception):
    """Base class of every error raised by ``orchard_env``."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        retryable: bool = False,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.retryable = retryable
        self.body = body

    def __str__(self) -> str:
        prefix = " ".join(str(p) for p in (self.status, self.code) if p)
        return f"{prefix}: {self.message}" if prefix else self.message


class InvalidRequest(OrchardError):
    """400/413/415/422: the request itself is wrong (unknown field, invalid spec, bad path...)."""


class Unauthorized(OrchardError):
    """401: the bearer token is missing or not accepted by the Kubernetes API."""


class Forbidden(OrchardError):
    """403: RBAC denies the operation (the message names the missing permission), or the agent cannot do
    it (``user=`` on an agent that does not run as root)."""


class QuotaExceeded(Forbidden):
    """403 ``QuotaExceeded``: a ResourceQuota of the namespace refuses the object (e.g.
    ``count/sandboxsnapshots.orchard.dev``); the message names the quota, what is used and the limit. A
    snapshot refused by the size quota (``orchard.dev/snapshot-bytes``) is created and then fails:
    :class:`SnapshotFailed` with reason ``QuotaExceeded``."""


class NotFound(OrchardError):
    """404: no such sandbox, group, file, process or session."""


class Conflict(OrchardError):
    """409: the request conflicts with the object's state (name taken, result already recorded...)."""


class NotReady(Conflict):
    """409 ``NotReady``: the sandbox cannot take calls in its current phase (see :attr:`phase`)."""

    @property
    def phase(self) -> str | None:
        """Phase of the sandbox when the call was refused."""
        return self.body.get("phase") if isinstance(self.body, dict) else None


class PatchConflict(Conflict):
    """409 ``PatchConflict``: hunks did not apply; nothing was written."""

    @property
    def failed_hunks(self) -> list[dict[str, Any]]:
        """The hunks that failed, with ``path``, ``hunk``, ``header`` and ``reason``."""
        if isinstance(self.body, dict):
            return list(self.body.get("failedHunks") or [])
        return []


class TooManyRequests(OrchardError):
    """429: the agent or the API server is at its concurrency limit (retryable)."""


class AgentUnavailable(OrchardError):
    """502/503: the sandbox's agent (or the gateway's dependencies) did not answer; usually retryable."""


class GatewayUnreachable(AgentUnavailable):
    """The gateway itself could not be reached (connection refused, DNS, TLS)."""


class Timeout(OrchardError, TimeoutError):
    """504 or a client-side timeout: no answer in time (a wait, or an agent that stopped answering).

    A sandbox wait that ran out (``create()``, ``wait_ready()``, or the gateway's 504 ``WaitTimeout``)
    says where the sandbox was when last seen: :attr:`phase`, :attr:`reason` and
    :attr:`condition_message` (the ``Stalled`` condition's when it is True, else the ``Ready``
    condition's), also quoted in the message. They are None for other timeouts."""

    def __init__(
        self,
        message: str,
        *,
        phase: str | None = None,
        reason: str | None = None,
        condition_message: str | None = None,
        status: int | None = None,
        code: str | None = None,
        retryable: bool = False,
        body: Any = None,
    ) -> None:
        super().__init__(message, status=status, code=code, retryable=retryable, body=body)
        fields = body if isinstance(body, dict) else {}
        #: Phase of the sandbox when last seen (``Pending``, ``Starting``...).
        self.phase: str | None = phase or _text(fields.get("phase"))
        #: Reason of its ``Stalled`` condition (when True) or of its ``Ready`` condition.
        self.reason: str | None = reason or _text(fields.get("reason"))
        #: Message of that condition (the scheduler's "0/3 nodes are available...", the agent's wait...).
        self.condition_message: str | None = condition_message or _text(fields.get("conditionMessage"))


class SandboxFailed(OrchardError):
    """A wait found the sandbox in a phase it will not leave for Ready: ``Failed`` (also ``Succeeded``
    or ``Expired``). :attr:`phase`, :attr:`reason` (e.g. ``ImagePullBackOff``, ``StartupTimeout``) and
    :attr:`condition_message` say why; ``body`` is the Sandbox object."""

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        body: Any = None,
        phase: str | None = None,
        condition_message: str | None = None,
    ) -> None:
        super().__init__(message, code=type(self).__name__, body=body)
        #: Phase of the sandbox (``Failed``, ``Succeeded``, ``Expired``; a stalled one's is usually ``Pending``).
        self.phase = phase
        #: Why, in CamelCase: ``status.reason``, or the ``Stalled`` condition's reason.
        self.reason = reason
        #: The human-readable explanation: ``status.message``, or the ``Stalled`` condition's message.
        self.condition_message = condition_message


class SandboxStalled(SandboxFailed):
    """A wait found the sandbox ``Stalled``: it cannot progress without outside help (a missing pool
    ``PoolNotFound``, a template mismatch ``PoolTemplateMismatch``, a full quota ``QuotaExceeded``...).
    It is not Failed (yet): fixing the cause lets it start. :attr:`reason` and :attr:`condition_message`
    are the ``Stalled`` condition's."""


class SnapshotFailed(OrchardError):
    """A wait found the SandboxSnapshot ``Failed``: it will never be Ready. :attr:`reason` is its ``Ready``
    condition's (``SandboxNotReady``, ``SandboxNotFound``, ``PushRefused``, ``CommitFailed``, ``NodeGone``,
    ``CommitterFailed``, ``SnapshotsDisabled``, ``QuotaExceeded``) and :attr:`condition_message` says why; ``body`` is the
    SandboxSnapshot object. Create a new snapshot to try again."""

    def __init__(
        self, message: str, *, reason: str | None = None, condition_message: str | None = None, body: Any = None
    ) -> None:
        super().__init__(message, code=type(self).__name__, body=body)
        #: Why, in CamelCase: the ``Ready`` condition's reason.
        self.reason = reason
        #: The human-readable explanation: the ``Ready`` condition's message.
        self.condition_message = condition_message


class CommandFailed(OrchardError):
    """``exec(..., check=True)`` or ``Session.run(..., check=True)`` and the command exited non-zero (or
    timed out)."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message, code="CommandFailed")
        self.result = result


_BY_STATUS: dict[int, type[OrchardError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: InvalidRequest,
    409: Conflict,
    413: InvalidRequest,
    415: InvalidRequest,
    422: InvalidRequest,
    429: TooManyRequests,
    500: OrchardError,
    502: AgentUnavailable,
    503: AgentUnavailable,
    504: Timeout,
}

_BY_CODE: dict[str, type[OrchardError]] = {
    "NotReady": NotReady,
    "PatchConflict": PatchConflict,
    "QuotaExceeded": QuotaExceeded,
}


def _text(value: Any) -> str | None:
    """A non-empty string field of an error body, else None."""
    return value if isinstance(value, str) and value else None


def parse_body(content: bytes) -> Any:
    """The JSON of an error body, or its text when it is not JSON."""
    try:
        return json.loads(content)
    except (ValueError, UnicodeDecodeError):
        return content.decode("utf-8", "replace")


def error_from_response(status: int, content: bytes) -> OrchardError:
    """The exception for an error answer (status >= 400) with body ``content``."""
    body = parse_body(content)
    if isinstance(body, dict):
        code = str(body.get("code") or "") or None
        message = str(body.get("message") or "") or f"HTTP {status}"
        retryable = bool(body.get("retryable", status in (429, 502, 503)))
    else:
        code = None
        message = (str(body).strip() or f"HTTP {status}")[:1000]
        retryable = status in (429, 502, 503)
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status)
    if cls is None:
        cls = InvalidRequest if 400 <= status < 500 else OrchardError
    return cls(message, status=status, code=code, retryable=retryable, body=body)
