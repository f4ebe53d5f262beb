"""The plans of a shell session handle (:class:`SessionCore`): runs, signals for the running command,
input, expect-style reads, status and close (docs/AGENT.md, "Shell sessions")."""

from __future__ import annotations

import contextlib

from .. import _ops
from ..errors import CommandFailed, NotFound
from ..models import SessionInfo, SessionReadResult, SessionRunResult, SessionSignalResult
from .handle import HandleCore
from .steps import Plan


class SessionCore(HandleCore[SessionInfo]):
    """State and plans of a shell session handle; the plans that answer the session's status keep
    :attr:`info` up to date."""

    def _path(self, rest: str = "") -> str:
        return f"/sessions/{self.id}{rest}"

    def _status_plan(self) -> Plan[SessionInfo]:
        return SessionInfo.from_json((yield from self.sandbox._agent("GET", self._path())).json())

    def _run_plan(self, command: str, timeout: float | None, check: bool) -> Plan[SessionRunResult]:
        """Runs ``command`` in the shell; never retried (the shell's state would change twice)."""
        body = _ops.session_run_body(command, timeout)
        answer = _ops.answer_timeout(timeout)
        response = yield from self.sandbox._agent(
            "POST", self._path("/run"), json_body=body, headers={"X-Orchard-Timeout": f"{answer:.0f}"},
            timeout=answer + 10.0, retry=False,
        )
        result = SessionRunResult.from_json(response.json())
        if check and not result.ok:
            why = " (timed out)" if result.timed_out else " (the shell exited)" if result.shell_exited else ""
            raise CommandFailed(f"{command!r} exited with {result.exit_code}{why}: {result.output[-500:]}", result)
        return result

    def _signal_plan(self, signal: str | int) -> Plan[SessionSignalResult]:
        """Signals the command of the run in progress and keeps the status answered; never retried (the
        signal would be sent twice)."""
        body = _ops.session_signal_body(signal)
        response = yield from self.sandbox._agent("POST", self._path("/signal"), json_body=body, retry=False)
        result = SessionSignalResult.from_json(response.json())
        self.info = result.session
        return result

    def _input_plan(self, text: str) -> Plan[SessionInfo]:
        """Writes ``text`` to the shell's stdin; never retried (the text would be written twice)."""
        if not isinstance(text, str):
            raise TypeError(f"input() takes a str, not {type(text).__name__}")
        response = yield from self.sandbox._agent("POST", self._path("/input"), json_body={"text": text}, retry=False)
        return SessionInfo.from_json(response.json())

    def _read_plan(self, until: str | None, timeout: float | None) -> Plan[SessionReadResult]:
        """Reads output; never retried (a read takes the output it answers)."""
        body = _ops.session_read_body(until, timeout)
        answer = _ops.read_answer_timeout(timeout)
        response = yield from self.sandbox._agent(
            "POST", self._path("/read"), json_body=body, headers={"X-Orchard-Timeout": f"{answer:.0f}"},
            timeout=answer + 10.0, retry=False,
        )
        return SessionReadResult.from_json(response.json())

    def _close_plan(self) -> Plan[SessionInfo | None]:
        """Ends the session; one already gone (closed before, or the sandbox's agent restarted) is fine:
        the status last seen is kept and answered."""
        with contextlib.suppress(NotFound):
            self.info = SessionInfo.from_json((yield from self.sandbox._agent("DELETE", self._path())).json())
        return self.info
