"""The plans of a RolloutGroup handle (:class:`GroupCore`); ``drive`` is in :mod:`.drive`."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from .. import _ops
from ..errors import (
    NotFound,
)
from ..models import GroupResult
from .drive import Driving
from .steps import Plan, T, until


class GroupCore(Driving):
    """State and plans of a RolloutGroup handle."""

    def __init__(self, client: Any, name: str, namespace: str, raw: Mapping[str, Any] | None, delete_on_exit: bool) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self.raw: dict[str, Any] = dict(raw or {})
        self.delete_on_exit = delete_on_exit

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.namespace}/{self.name})"

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
