"""What the handles on objects inside a sandbox share (:class:`HandleCore`): the sandbox they belong to,
their id, the status last seen, and running plans through the sandbox's client."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

from .steps import Plan, T


class _Status(Protocol):
    @property
    def state(self) -> str: ...


Info = TypeVar("Info", bound=_Status)


class HandleCore(Generic[Info]):
    """A background process's or a shell session's handle: :attr:`info` is the status last seen, kept up to
    date by the plans wrapped in :meth:`_track`."""

    def __init__(self, sandbox: Any, id: str, info: Info | None) -> None:
        self.sandbox = sandbox
        self.id = id
        self.info = info

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id}, state={self.info.state if self.info else '?'})"

    def _run(self, plan: Plan[T]) -> Any:
        return self.sandbox._run(plan)

    def _track(self, plan: Plan[Info]) -> Plan[Info]:
        self.info = yield from plan
        return self.info
