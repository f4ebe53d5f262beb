"""The plans of a background process handle (:class:`ProcessCore`)."""

from __future__ import annotations

from ..models import ProcessInfo
from .handle import HandleCore
from .steps import Plan, until


class ProcessCore(HandleCore[ProcessInfo]):
    """State and plans of a background process handle; each plan keeps :attr:`info` up to date."""

    def _wait_plan(self, timeout: float | None) -> Plan[ProcessInfo]:
        def attempt(wait: float) -> Plan[ProcessInfo | None]:
            info = yield from self._track(self.sandbox._get_process_plan(self.id, wait=max(0.001, wait)))
            return None if info.running else info

        return until(timeout, attempt, lambda: f"process {self.id} still running after {timeout}s")
