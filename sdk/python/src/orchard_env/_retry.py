"""Retry policy: exponential backoff with full jitter on connection errors and retryable answers.

429/502/503/504 are retried when the server marked them ``retryable`` (without the flag: when the
request is idempotent). A 409 the server marked ``retryable`` (``NotReady`` while the sandbox starts, an
API write ``Conflict``) is retried for idempotent requests only (GET, HEAD, PUT, DELETE, OPTIONS). Other
4xx answers are never retried.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry.

    ``attempts`` counts every try (1 = no retry). The n-th retry sleeps a random time in
    ``[0, min(max_backoff, backoff * 2**n)]`` (full jitter).
    """

    attempts: int = 4
    backoff: float = 0.25
    max_backoff: float = 8.0

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to sleep before retry number ``retry`` (0-based)."""
        ceiling = min(self.max_backoff, self.backoff * (2**retry))
        return (rng or random).uniform(0.0, ceiling)


NO_RETRY = RetryPolicy(attempts=1)


def retry_exception(error: Exception, method: str) -> bool:
    """Whether a transport error is worth another try of ``method``."""
    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return True  # the request never left: always safe
    if isinstance(error, (httpx.ReadTimeout, httpx.WriteTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return method.upper() in IDEMPOTENT
    return False


def retry_status(status: int, retryable: bool | None, method: str) -> bool:
    """Whether an answer with ``status`` (and the body's ``retryable`` flag, if any) is worth another try."""
    if status == 409:
        return retryable is True and method.upper() in IDEMPOTENT
    if status not in RETRYABLE_STATUSES:
        return False
    if retryable is not None:
        return retryable
    return method.upper() in IDEMPOTENT
