"""Steps, plans and their runner; requests with retries (:func:`exchange`) and long-polls (:func:`until`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

import httpx

from .. import _ops
from .._config import TokenSource
from .._retry import NO_RETRY, RetryPolicy, retry_exception, retry_status
from ..errors import (
    GatewayUnreachable,
    Timeout,
    error_from_response,
    parse_body,
)

log = logging.getLogger("orchard_env")

T = TypeVar("T")

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
    timeout: float | None, attempt: Callable[[float], Plan[T | None]], expired: Callable[[], str | Timeout],
    slice_seconds: float = _ops.MAX_SERVER_WAIT,
) -> Plan[T]:
    """Long-polls: repeats ``attempt(wait)`` (one server-side wait of at most ``wait`` seconds, and at
    most ``slice_seconds``) until it answers something other than None; once ``timeout`` seconds have
    passed (None: never) raises ``expired()``: a :class:`Timeout`, or the message of one."""
    deadline = None if timeout is None else (yield NOW) + timeout
    longest = min(_ops.MAX_SERVER_WAIT, slice_seconds)
    while True:
        remaining = longest if deadline is None else deadline - (yield NOW)
        if remaining <= 0:
            why = expired()
            raise why if isinstance(why, Timeout) else Timeout(why)
        value = yield from attempt(min(longest, remaining))
        if value is not None:
            return value
