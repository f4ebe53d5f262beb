"""Deletes the sandboxes of open handles created with ``delete_on_exit`` when the interpreter exits
(``atexit``) or the process gets SIGTERM, for both clients.

Every sandbox handle registers here while it is open. :func:`drain` deletes the sandboxes of the ones
with ``delete_on_exit`` synchronously, with a fresh ``httpx.Client`` and short timeouts: it runs from an
exit handler or a signal handler, where the async client's event loop may be gone and the sync client's
connection pool may be in use by the interrupted code. Best effort: what it cannot delete in time is left
to the sandbox's heartbeat timeout (600 s unless the caller chose otherwise) or its TTL.

The SIGTERM handler is installed when the first handle with ``delete_on_exit`` opens in the main thread
(Python lets only the main thread install signal handlers), and only when SIGTERM has a Python handler or
the default action: a process that ignores SIGTERM keeps running, and so do its sandboxes; a handler
installed by native code cannot be chained. On SIGTERM it drains, then calls the previous Python handler,
or, when the previous action was the default one, restores it and raises SIGTERM again, so the process
ends as it would have without the SDK.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import httpx

log = logging.getLogger("orchard_env")

#: Seconds the whole exit cleanup may take (Kubernetes gives a SIGTERMed pod 30 s by default).
DRAIN_SECONDS = 10.0
#: Seconds one DELETE may take.
REQUEST_SECONDS = 5.0


class Handle(Protocol):
    """What :func:`drain` needs of a sandbox handle (``SandboxCore``)."""

    name: str
    namespace: str
    delete_on_exit: bool
    _closed: bool

    def _exit_delete(self) -> tuple[str, dict[str, str], Any]:
        """The DELETE to send: its URL, its headers and the sync transport to send it with (None: the
        default)."""

    def _halt_heartbeats(self) -> None:
        """Ends the background heartbeats without waiting (no I/O, no locks)."""


#: Open sandbox handles (weak: a handle nobody holds and no heartbeat runs for is not kept alive).
OPEN: weakref.WeakSet[Any] = weakref.WeakSet()

_previous: Callable[[int, FrameType | None], Any] | int | None = None
_installed = False


def register(handle: Handle) -> None:
    """Records an open handle; installs the SIGTERM handler if it has ``delete_on_exit``."""
    OPEN.add(handle)
    if handle.delete_on_exit:
        install_sigterm_handler()


def forget(handle: Handle) -> None:
    """The handle is closed or its sandbox deleted: nothing to do for it at exit."""
    OPEN.discard(handle)


def _snapshot() -> list[Any]:
    # Other threads may open handles meanwhile; a WeakSet then says it changed size during iteration.
    for _ in range(5):
        try:
            return list(OPEN)
        except RuntimeError:
            continue
    return []


def drain(budget: float = DRAIN_SECONDS) -> int:
    """Deletes the sandboxes of the open handles with ``delete_on_exit`` (marking them closed), within
    ``budget`` seconds; answers how many DELETEs were answered below 400 or 404. Never raises."""
    pending = [h for h in _snapshot() if h.delete_on_exit and not h._closed]
    if not pending:
        return 0
    deadline = time.monotonic() + budget
    clients: dict[int, httpx.Client] = {}
    deleted = 0
    try:
        for handle in pending:
            handle._closed = True
            forget(handle)
            try:
                handle._halt_heartbeats()
                url, headers, transport = handle._exit_delete()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning("exit cleanup out of time: sandbox %s/%s not deleted", handle.namespace, handle.name)
                    continue
                http = clients.get(id(transport))
                if http is None:
                    http = clients[id(transport)] = httpx.Client(transport=transport)
                timeout = httpx.Timeout(min(REQUEST_SECONDS, remaining))
                response = http.request("DELETE", url, headers=headers, timeout=timeout)
                if response.status_code < 400 or response.status_code == 404:
                    deleted += 1
                else:
                    log.warning("exit cleanup: deleting sandbox %s/%s answered %s", handle.namespace, handle.name, response.status_code)
            except Exception as error:  # best effort: the heartbeat timeout is the safety net
                log.warning("exit cleanup: cannot delete sandbox %s/%s: %r", handle.namespace, handle.name, error)
    finally:
        for http in clients.values():
            http.close()
    return deleted


def install_sigterm_handler() -> None:
    """Installs :func:`on_sigterm` once, from the main thread, over a Python handler or the default
    action (never over ``SIG_IGN`` or a native handler)."""
    global _previous, _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is signal.SIG_IGN or previous is None:
            return
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError) as error:  # e.g. an embedded interpreter without signal support
        log.debug("no SIGTERM cleanup: %r", error)
        return
    _previous = previous
    _installed = True


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: deletes the sandboxes of open ``delete_on_exit`` handles, then chains to the previous
    handler, or ends the process by the default action."""
    drain()
    previous = _previous
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


atexit.register(drain)
