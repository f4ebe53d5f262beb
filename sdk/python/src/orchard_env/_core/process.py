"""The plans of a background process handle (:class:`ProcessCore`)."""

from __future__ import annotations

from typing import Any

from ..models import ProcessInfo
from .steps import Plan, T, until


class ProcessCore:
    """State and plans of a background process handle; each plan keeps :attr:`info` up to date."""

    def __init__(self, sandbox: Any, id: str, info: ProcessInfo | None) -> None:
        self.sandbox = sandbox
        self.id = id
        self.info = info

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id}, state={self.info.state if self.info else '?'})"

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
