"""`SWE-ReX <https://github.com/SWE-agent/SWE-ReX>`_ on Orchard Env sandboxes (``pip install
'./sdk/python[swerex]'``; written against SWE-ReX 1.4.0): :class:`OrchardDeployment`, an
``AbstractDeployment`` whose ``start()`` creates a sandbox and waits until it is Ready and whose ``stop()``
deletes it, and :class:`OrchardRuntime`, the ``AbstractRuntime`` it hands out, which maps SWE-ReX's runtime
protocol onto the SDK's calls. Nothing is installed in the sandbox: no ``swerex-server``, no Python
needed in the image (bash is, as SWE-ReX's own sessions need it).

SWE-agent runs on it by giving ``SWEEnv`` the deployment::

    from orchard_env.integrations.swerex import OrchardDeployment
    env = SWEEnv(deployment=OrchardDeployment(image="python:3.11", namespace="rl"), repo=repo,
                 post_startup_commands=[])

What maps to what (the same semantics as SWE-ReX's ``LocalRuntime``, which its ``swerex-server`` runs in
a container, unless said otherwise):

- ``create_session`` / ``run_in_session`` / ``close_session``: one shell session of the sandbox
  (:meth:`~orchard_env.Sandbox.session`) per SWE-ReX session name, so ``cd``, variables and functions
  carry over. A :class:`~swerex.runtime.abstract.BashAction` runs with :meth:`~orchard_env.Session.run`
  (``timeout`` becomes the run's timeout: the agent interrupts the command with SIGINT, the session stays
  usable, and :class:`~swerex.exceptions.CommandTimeoutError` is raised). With ``expect`` strings, with
  ``is_interactive_command``/``is_interactive_quit``, or while an earlier command still runs, the command
  runs in the background, after a ``printf`` of a start token that is read away again (or its text is
  written to the running program with :meth:`~orchard_env.Session.input`), and the output is read with
  :meth:`~orchard_env.Session.read` until
  one of the ``expect`` patterns (regular expressions, as pexpect takes them) or the command's end (what
  SWE-ReX calls the PS1, answered as ``expect_string`` ``"SHELLPS1PREFIX"`` like theirs).
  :class:`~swerex.runtime.abstract.BashInterruptAction` stops a command still running with
  :meth:`~orchard_env.Session.interrupt` (SIGINT to the shell's process group, what the agent itself does
  at a run's timeout), ``n_retry`` times, then :meth:`~orchard_env.Session.signal` ``("KILL")`` (SIGKILL
  to the processes the run started below the shell).
- ``check``: ``"raise"`` raises :class:`~swerex.exceptions.NonZeroExitCodeError` with their message,
  ``"silent"`` answers the exit code, ``"ignore"`` answers ``exit_code`` None. A command whose syntax
  ``bash -n`` refuses raises :class:`~swerex.exceptions.BashIncorrectSyntaxError` before it runs (checked
  in the sandbox by default: ``syntax_check``). A command that ends the shell (``exit``) raises
  ``pexpect.EOF``, as theirs does.
- ``execute``: :meth:`~orchard_env.Sandbox.exec` with ``subprocess.run``'s semantics (a list is an argv, a
  string with ``shell=True`` runs with ``/bin/sh -c``, ``env`` replaces the whole environment,
  ``merge_output_streams``), a timeout raising ``CommandTimeoutError``, ``check`` raising
  ``NonZeroExitCodeError``, a missing program or ``cwd`` raising ``FileNotFoundError``.
- ``read_file`` / ``write_file``: :meth:`~orchard_env.Sandbox.download` decoded like ``Path.read_text``
  (``encoding``, ``errors``, universal newlines) / :meth:`~orchard_env.Sandbox.upload` (parents created);
  a missing file raises ``FileNotFoundError``, a directory ``IsADirectoryError``.
- ``upload``: a local directory goes as one tar stream (:meth:`~orchard_env.Sandbox.upload_dir`: modes and
  symlinks kept, merged into an existing target as SWE-ReX's remote runtime does), a file with
  :meth:`~orchard_env.Sandbox.upload_file` (its mode kept, into the directory when the target is one).

The runtime's methods are coroutines, as SWE-ReX's; each runs the SDK's synchronous client in a worker
thread (``asyncio.to_thread``), so the runtime works from any event loop, SWE-agent's one
``asyncio.run`` per call included. Gateway errors (the sandbox deleted, access revoked) are not command
outcomes: they raise :class:`~orchard_env.errors.OrchardError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import errno
import io
import logging
import os
import re
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import pexpect
from pydantic import BaseModel, ConfigDict, Field
from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    DeploymentStartupError,
    NoExitCodeError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    Action,
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionResponse,
    CloseResponse,
    CloseSessionRequest,
    CloseSessionResponse,
    Command,
    CommandResponse,
    CreateBashSessionRequest,
    CreateBashSessionResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    IsAliveResponse,
    Observation,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)
from swerex.runtime.local import _check_bash_command, _strip_control_chars
from swerex.utils.log import get_logger

from .. import _ops
from ..client import Sandbox, SandboxClient, Session
from ..errors import Conflict, Forbidden, InvalidRequest, NotFound, OrchardError
from ..models import ExecResult, SandboxProgress, SessionRunResult

#: What SWE-ReX's bash sessions answer as ``expect_string`` when the command ran to its end (their PS1).
PS1 = "SHELLPS1PREFIX"
#: Seconds a command may run when SWE-ReX gives no timeout (theirs waits forever): a day, the longest the
#: gateway waits for an answer, less the SDK's margin.
NO_TIMEOUT = 86_400.0 - _ops.ANSWER_MARGIN
#: Runs an argv with stderr sent to stdout (``merge_output_streams``).
MERGE_STDERR = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh"]
#: Characters that make an ``expect`` string a regular expression rather than literal text.
REGEX_SPECIALS = frozenset(".^$*+?{}[]\\|()")
#: Longest single wait for output, so that the end of a background command is seen that soon.
READ_SLICE = 0.5
#: Least seconds each interrupt attempt waits for the command to stop (``BashInterruptAction.timeout`` is
#: 0.2 by default, sized for a local terminal; here the signal and the answer cross the network).
INTERRUPT_MIN_WAIT = 1.0


class OrchardRuntimeConfig(BaseModel):
    """Settings of :class:`OrchardRuntime`: how its sessions and commands run in the sandbox."""

    shell: str | None = None
    """The sessions' shell (default: bash when the image has it, else sh; SWE-ReX assumes bash)."""
    cwd: str | None = None
    """Working directory of new sessions (default: the sandbox's)."""
    env: dict[str, str] = {}
    """Environment variables of new sessions (added to the sandbox's)."""
    user: str | int | None = None
    """Runs sessions and ``execute`` commands as this user of the image (a name, a uid, ``"uid:gid"``);
    files are read and written by the agent's user."""
    syntax_check: Literal["sandbox", "local", "off"] = "sandbox"
    """Where ``bash -n`` checks a command before it runs (``BashIncorrectSyntaxError``): in the sandbox
    (one exec more per command, as SWE-ReX's server does it inside the container), on this machine (its
    bash), or not at all."""
    max_output_bytes: int | None = None
    """Output one session run keeps (the agent's default is 4 MiB)."""

    model_config = ConfigDict(extra="forbid")


def _strip(text: str) -> str:
    """Output as SWE-ReX's sessions answer it: ANSI escapes removed, CRLF as LF."""
    return _strip_control_chars(text)


def _is_literal(pattern: str) -> bool:
    return not any(c in REGEX_SPECIALS for c in pattern)


def _earliest(patterns: list[re.Pattern[str]], text: str) -> tuple[int, re.Match[str]] | None:
    """The pattern that matches earliest in ``text`` (the first listed on a tie), as pexpect picks it."""
    best: tuple[int, re.Match[str]] | None = None
    for index, pattern in enumerate(patterns):
        match = pattern.search(text)
        if match is not None and (best is None or match.start() < best[1].start()):
            best = (index, match)
    return best


def _os_error(kind: type[OSError], code: int, path: str) -> OSError:
    """The ``OSError`` the local file system would raise: ``[Errno N] <strerror>: '<path>'``."""
    return kind(code, os.strerror(code), path)


def _file_error(error: OrchardError, path: str) -> OSError | None:
    """The ``OSError`` a local file operation on ``path`` would have raised for the agent's refusal."""
    message = str(error)
    if isinstance(error, NotFound):
        return _os_error(FileNotFoundError, errno.ENOENT, path)
    if isinstance(error, Forbidden):
        return _os_error(PermissionError, errno.EACCES, path)
    if isinstance(error, InvalidRequest):
        if "is a directory" in message:
            return _os_error(IsADirectoryError, errno.EISDIR, path)
        if "a component is a file" in message or "is not a directory" in message:
            return _os_error(NotADirectoryError, errno.ENOTDIR, path)
    return None


class _BashSession:
    """One SWE-ReX session: the sandbox's shell session, the command still running in it (started in the
    background for ``expect``), and the output read but not yet answered (pexpect's buffer)."""

    def __init__(self, name: str, handle: Session) -> None:
        self.name = name
        self.handle = handle
        self.pending: concurrent.futures.Future[SessionRunResult] | None = None
        self.pending_command = ""
        self.buffer = ""
        self.exited = False
        self.lock = threading.Lock()

    def take_buffer(self) -> str:
        text, self.buffer = self.buffer, ""
        return text

    def start(self, command: str) -> None:
        """Starts ``command`` as a run that outlives this call (for ``expect`` and interactive programs).

        What an earlier run left readable at the agent (its whole output stays readable until the next
        run starts) is read away first. The run then prints a token made fresh for it (in two halves, so a
        ``set -x`` trace of the command line does not hold it whole), and this returns once the token was
        read: later input reaches the command, not the shell, and later reads hold the command's output.
        Not with status polls: ``busy`` says the agent has started the run, not that the shell has read
        its command line yet."""
        self.handle.read(timeout=0)
        token = uuid.uuid4().hex
        line = f"printf '%s%s\\n' '__swerex_start_' '{token}__'; {command}"
        future: concurrent.futures.Future[SessionRunResult] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()

        def run() -> None:
            try:
                future.set_result(self.handle.run(line, timeout=NO_TIMEOUT))
            except BaseException as error:  # handed to whoever waits for the run
                future.set_exception(error)

        threading.Thread(target=run, name=f"swerex-session-{self.name}", daemon=True).start()
        self.pending, self.pending_command = future, command
        needle = f"__swerex_start_{token}__\n"
        early = ""
        while True:
            done = future.done()
            read = self.handle.read(until=needle, timeout=0 if done else READ_SLICE)
            if read.matched:
                return  # what came before the token is not the command's output (a trace)
            early += read.output
            if done:
                self.buffer += early  # it ended without printing the token (a syntax error): its output
                return


class OrchardRuntime(AbstractRuntime):
    """SWE-ReX's runtime protocol on one Orchard Env sandbox (see the module's documentation)."""

    def __init__(self, sandbox: Sandbox, *, logger: logging.Logger | None = None, **kwargs: Any) -> None:
        """``sandbox`` is a handle of the synchronous client (its owner, e.g. :class:`OrchardDeployment`,
        deletes it); ``kwargs`` are :class:`OrchardRuntimeConfig`'s fields."""
        self._config = OrchardRuntimeConfig(**kwargs)
        self.sandbox = sandbox
        self.logger = logger or get_logger("rex-runtime")
        self._sessions: dict[str, _BashSession] = {}
        self._lock = threading.Lock()
        self._syntax_check = self._config.syntax_check

    @classmethod
    def from_config(cls, sandbox: Sandbox, config: OrchardRuntimeConfig, **kwargs: Any) -> OrchardRuntime:
        return cls(sandbox, **config.model_dump(), **kwargs)

    @property
    def sessions(self) -> dict[str, _BashSession]:
        return self._sessions

    # -- the protocol: coroutines around the synchronous implementations --------------------------

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        """Whether the sandbox is Ready and its agent answers (within ``timeout`` seconds)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._is_alive), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            return IsAliveResponse(is_alive=False, message=f"no answer from {self._where()} within {timeout} s")

    async def create_session(self, request: CreateSessionRequest) -> CreateSessionResponse:
        return await asyncio.to_thread(self._create_session, request)

    async def run_in_session(self, action: Action) -> Observation:
        return await asyncio.to_thread(self._run_in_session, action)

    async def close_session(self, request: CloseSessionRequest) -> CloseSessionResponse:
        return await asyncio.to_thread(self._close_session, request)

    async def execute(self, command: Command) -> CommandResponse:
        return await asyncio.to_thread(self._execute, command)

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        return await asyncio.to_thread(self._read_file, request)

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        return await asyncio.to_thread(self._write_file, request)

    async def upload(self, request: UploadRequest) -> UploadResponse:
        return await asyncio.to_thread(self._upload, request)

    async def close(self) -> CloseResponse:
        """Closes every session (the sandbox stays: its owner deletes it)."""
        return await asyncio.to_thread(self.close_sync)

    # -- liveness -----------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"sandbox {self.sandbox.namespace}/{self.sandbox.name}"

    def _is_alive(self) -> IsAliveResponse:
        try:
            raw = self.sandbox.refresh()
            if not _ops.is_ready(raw):
                phase, reason, message = _ops.why_not_ready(raw)
                return IsAliveResponse(
                    is_alive=False, message=f"{self._where()} is not Ready: phase {phase}, reason {reason}: {message}"
                )
            self.sandbox.stat("/")  # the agent answers
        except OrchardError as error:
            return IsAliveResponse(is_alive=False, message=f"{self._where()}: {error}")
        return IsAliveResponse(is_alive=True)

    # -- sessions -------------------------------------------------------------------------------------

    def _session(self, name: str) -> _BashSession:
        with self._lock:
            session = self._sessions.get(name)
        if session is None:
            raise SessionDoesNotExistError(f"session {name!r} does not exist")
        return session

    def _create_session(self, request: CreateSessionRequest) -> CreateBashSessionResponse:
        if not isinstance(request, CreateBashSessionRequest):
            raise ValueError(f"unknown session type: {request!r}")
        with self._lock:
            if request.session in self._sessions:
                raise SessionExistsError(f"session {request.session} already exists")
            # Reserved before the (slow) start, so a second create of the name fails as theirs does.
            self._sessions[request.session] = None  # type: ignore[assignment]
        try:
            config = self._config
            handle = self.sandbox.session(
                shell=config.shell, cwd=config.cwd, env=config.env or None, user=config.user,
                max_output_bytes=config.max_output_bytes,
            )
        except BaseException:
            with self._lock:
                self._sessions.pop(request.session, None)
            raise
        session = _BashSession(request.session, handle)
        with self._lock:
            self._sessions[request.session] = session
        output = ""
        if request.startup_source:
            source = "source" if os.path.basename(handle.info.shell if handle.info else "") == "bash" else "."
            command = " ; ".join(f"{source} {path}" for path in request.startup_source)
            with session.lock:
                result = self._run_to_end(session, command, request.startup_timeout, timeout_error=False)
            output = result.output
        return CreateBashSessionResponse(output=output)

    def _close_session(self, request: CloseSessionRequest) -> CloseBashSessionResponse:
        with self._lock:
            session = self._sessions.get(request.session)
            if session is None:
                raise SessionDoesNotExistError(f"session {request.session!r} does not exist")
            del self._sessions[request.session]
        session.handle.close()  # kills the shell; a run still pending answers and its thread ends
        return CloseBashSessionResponse()

    def close_sync(self) -> CloseResponse:
        """:meth:`close`, synchronously."""
        with self._lock:
            sessions = [s for s in self._sessions.values() if s is not None]
            self._sessions.clear()
        for session in sessions:
            try:
                session.handle.close()
            except OrchardError as error:  # the sandbox may be gone already
                self.logger.debug("closing session %s: %s", session.name, error)
        return CloseResponse()

    def _run_in_session(self, action: Action) -> BashObservation:
        session = self._session(action.session)
        with session.lock:
            if session.exited:
                raise pexpect.EOF(f"the shell of session {session.name!r} has exited")
            if isinstance(action, BashInterruptAction):
                return self._interrupt(session, action)
            if action.is_interactive_command or action.is_interactive_quit:
                return self._run_interactive(session, action)
            observation = self._run_normal(session, action)
        if action.check == "raise" and observation.exit_code != 0:
            message = (f"Command {action.command!r} failed with exit code {observation.exit_code}. "
                       f"Here is the output:\n{observation.output!r}")
            if action.error_msg:
                message = f"{action.error_msg}: {message}"
            raise NonZeroExitCodeError(message)
        return observation

    def _run_normal(self, session: _BashSession, action: BashAction) -> BashObservation:
        self._check_syntax(action.command)
        if session.pending is None and not action.expect:
            result = self._run_to_end(session, action.command, action.timeout)
            exit_code = None if action.check == "ignore" else result.exit_code
            return BashObservation(output=result.output, exit_code=exit_code, expect_string=PS1)
        self._send(session, action.command)
        before, matched, finished = self._expect(session, action.expect, action.timeout, action.command)
        if action.check == "ignore":
            exit_code = None
        elif finished is not None:
            exit_code = finished.exit_code
        elif action.check == "raise":
            raise NoExitCodeError(
                f"no exit code for {action.command!r}: it printed {matched!r} and is still running"
            )
        else:
            exit_code = None
        return BashObservation(output=_strip(before), exit_code=exit_code, expect_string=matched)

    def _run_interactive(self, session: _BashSession, action: BashAction) -> BashObservation:
        """A command to an interactive program (``is_interactive_command``), or the one that quits it
        (``is_interactive_quit``): no exit code (0, as theirs), no syntax check."""
        self._send(session, action.command)
        before, matched, _ = self._expect(session, action.expect, action.timeout, action.command)
        output = _strip(before)
        if not action.is_interactive_quit:
            output = output.lstrip().removeprefix(action.command).strip()
        return BashObservation(output=output, exit_code=0, expect_string=matched)

    def _send(self, session: _BashSession, command: str) -> None:
        """Starts ``command`` in the background, or writes it as a line to the command still running."""
        if session.pending is None:
            session.start(command)
            return
        try:
            session.handle.input(command + "\n")
        except Conflict:
            self._lost_shell(session)
            raise

    def _run_to_end(
        self, session: _BashSession, command: str, timeout: float | None, *, timeout_error: bool = True
    ) -> SessionRunResult:
        """Runs ``command`` to its end; its ``output`` as SWE-ReX answers it (earlier unanswered output
        first). A timeout raises ``CommandTimeoutError`` (``pexpect.TIMEOUT`` while a session starts, as
        theirs): the agent has interrupted the command, and its output so far is kept for the interrupt
        action that SWE-agent sends next."""
        earlier = session.take_buffer()
        try:
            result = session.handle.run(command, timeout=NO_TIMEOUT if timeout is None else timeout)
        except Conflict:
            self._lost_shell(session)
            raise
        if result.shell_restarted:
            self.logger.warning(
                "%s: %r ignored SIGINT at its timeout; the agent started a fresh shell in session %s (its cd and "
                "variables are lost)", self._where(), command, session.name,
            )
        if result.timed_out:
            session.buffer = earlier + result.output
            if not timeout_error:
                raise pexpect.TIMEOUT(f"timeout after {timeout} seconds while starting session {session.name!r}")
            raise CommandTimeoutError(f"timeout after {timeout} seconds while running command {command!r}")
        if result.shell_exited:
            session.exited = True
            raise pexpect.EOF(
                f"the shell of session {session.name!r} exited with {result.exit_code} running {command!r}"
            )
        return dataclasses.replace(result, output=_strip(earlier + result.output))

    def _lost_shell(self, session: _BashSession) -> None:
        """After the agent refused a run or input (409): when the shell has exited, later calls raise
        ``pexpect.EOF`` (theirs raise it once bash is gone)."""
        try:
            if not session.handle.status().running:
                session.exited = True
        except OrchardError:
            pass

    def _expect(
        self, session: _BashSession, expect: list[str], timeout: float | None, command: str
    ) -> tuple[str, str, SessionRunResult | None]:
        """Waits until one of the ``expect`` patterns appears in the output of the running command, or the
        command ends (SWE-ReX's PS1), like ``pexpect.expect(expect + [PS1])``: answers the output before the
        match, the string matched and, when the command ended, its result. ``CommandTimeoutError`` after
        ``timeout`` seconds (the command keeps running, its output kept for the next action)."""
        assert session.pending is not None
        patterns = [re.compile(p, re.DOTALL) for p in expect]
        literal = expect[0] if len(expect) == 1 and _is_literal(expect[0]) else None
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.01
        while True:
            hit = _earliest(patterns, session.buffer)
            if hit is not None:
                index, match = hit
                before = session.buffer[: match.start()]
                session.buffer = session.buffer[match.end():]
                return before, expect[index], None
            pending = session.pending
            if pending.done():
                session.pending = None
                try:
                    result = pending.result()
                except Conflict:
                    self._lost_shell(session)
                    raise
                session.buffer += session.handle.read().output  # what no read took before the end
                if result.shell_exited:
                    session.exited = True
                    raise pexpect.EOF(
                        f"the shell of session {session.name!r} exited with {result.exit_code} running "
                        f"{session.pending_command!r}"
                    )
                hit = _earliest(patterns, session.buffer)
                if hit is not None:
                    index, match = hit
                    before = session.buffer[: match.start()]
                    session.buffer = session.buffer[match.end():]
                    return before, expect[index], result
                return session.take_buffer(), PS1, result
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise CommandTimeoutError(f"timeout after {timeout} seconds while running command {command!r}")
            if not patterns:
                # Only the end counts: wait for the run itself.
                concurrent.futures.wait([pending], timeout=remaining)
                continue
            if literal is not None:
                # The agent's expect: answers as soon as the text is there.
                wait = READ_SLICE if remaining is None else min(READ_SLICE, remaining)
                session.buffer += session.handle.read(until=literal, timeout=wait).output
                continue
            concurrent.futures.wait([pending], timeout=pause if remaining is None else min(pause, remaining))
            pause = min(pause * 2, READ_SLICE)
            session.buffer += session.handle.read().output

    def _interrupt(self, session: _BashSession, action: BashInterruptAction) -> BashObservation:
        """Stops the command still running, like their Ctrl-C (``n_retry`` times, ``timeout`` each) and
        then their ``kill -9`` of the job: the session's interrupt (SIGINT to the shell's process group),
        then SIGKILL to the processes the run started below the shell. Without a running command (a
        timed-out run was interrupted by the agent already) it answers the output not answered yet."""
        if session.pending is None:
            # Not read from the agent: after a run its whole output stays readable until the next one.
            return BashObservation(output=_strip(session.take_buffer()).strip(), exit_code=0, expect_string=PS1)
        wait = max(action.timeout, INTERRUPT_MIN_WAIT)
        for _ in range(action.n_retry):
            self._signal(session, "INT")
            try:
                before, matched, _ = self._expect(session, action.expect, wait, "<interrupt>")
            except CommandTimeoutError:
                time.sleep(0.2)
                continue
            return self._interrupted(session, before, matched)
        self._signal(session, "KILL")
        try:
            before, matched, _ = self._expect(session, action.expect, wait, "<interrupt>")
        except CommandTimeoutError:
            raise pexpect.TIMEOUT("Failed to interrupt session") from None
        return self._interrupted(session, before, matched)

    def _interrupted(self, session: _BashSession, before: str, matched: str) -> BashObservation:
        """Their answer to an interrupt: the output up to the match and what followed it."""
        following = session.take_buffer()
        return BashObservation(output=_strip(before + following).strip(), exit_code=0, expect_string=matched)

    def _signal(self, session: _BashSession, signal: str) -> None:
        """Sends ``signal`` to the command of the session's run in progress (the agent's session signal:
        SIGINT to the shell's process group, any other signal below the shell). A shell that has exited
        meanwhile (409) is no matter: the run's own answer says so, and :meth:`_expect` raises
        ``pexpect.EOF``."""
        with contextlib.suppress(Conflict):
            session.handle.signal(signal)

    def _check_syntax(self, command: str) -> None:
        """``BashIncorrectSyntaxError`` when ``bash -n`` refuses ``command`` (their message and
        ``extra_info``)."""
        if self._syntax_check == "off":
            return
        if self._syntax_check == "local":
            _check_bash_command(command)
            return
        result = self.sandbox.exec(["bash", "-n"], stdin=command + "\n", timeout=60, user=self._config.user)
        if result.exit_code == 0:
            return
        if result.exit_code == 127 and result.raw.get("error"):
            self.logger.warning("%s has no bash: commands are not checked with `bash -n`", self._where())
            self._syntax_check = "off"
            return
        stdout, stderr = result.stdout, result.stderr
        message = (
            f"Error (exit code {result.exit_code}) while checking bash command \n{command!r}\n"
            f"---- Stderr ----\n{stderr}\n---- Stdout ----\n{stdout}"
        )
        raise BashIncorrectSyntaxError(message, extra_info={"bash_stdout": stdout, "bash_stderr": stderr})

    # -- commands and files -----------------------------------------------------------------------

    def _execute(self, command: Command) -> CommandResponse:
        """``subprocess.run`` in the sandbox (see the module's documentation)."""
        cmd: str | list[str]
        direct = False  # an argv run as given, whose missing program the agent reports
        if isinstance(command.command, str):
            if command.shell:
                cmd = command.command if command.env is None and not command.merge_output_streams else [
                    "/bin/sh", "-c", command.command]
            else:
                cmd, direct = [command.command], True
        else:
            cmd = ["/bin/sh", "-c", *command.command] if command.shell else list(command.command)
            direct = not command.shell
        if command.env is not None:
            # subprocess's env is the whole environment.
            assert isinstance(cmd, list)
            cmd = ["env", "-i", *(f"{k}={v}" for k, v in command.env.items()), *cmd]
            direct = False
        if command.merge_output_streams:
            assert isinstance(cmd, list)
            cmd = [*MERGE_STDERR, *cmd]
            direct = False
        try:
            result = self.sandbox.exec(
                cmd, timeout=NO_TIMEOUT if command.timeout is None else command.timeout, cwd=command.cwd,
                user=self._config.user,
            )
        except InvalidRequest as error:
            if error.code == "InvalidCwd" and command.cwd is not None:
                kind, code = (NotADirectoryError, errno.ENOTDIR) if "not a directory" in str(error) else (
                    FileNotFoundError, errno.ENOENT)
                raise _os_error(kind, code, command.cwd) from None
            raise
        if result.timed_out:
            raise CommandTimeoutError(f"Timeout ({command.timeout}s) exceeded while running command")
        if direct and result.raw.get("error") and result.exit_code in (126, 127):
            program = cmd[0] if isinstance(cmd, list) else cmd
            if result.exit_code == 127:
                raise _os_error(FileNotFoundError, errno.ENOENT, program)
            raise _os_error(PermissionError, errno.EACCES, program)
        response = CommandResponse(stdout=result.stdout, stderr=result.stderr, exit_code=_returncode(result))
        if command.check and response.exit_code != 0:
            message = (
                f"Command {command.command!r} failed with exit code {response.exit_code}. "
                f"Stdout:\n{response.stdout!r}\nStderr:\n{response.stderr!r}"
            )
            if command.error_msg:
                message = f"{command.error_msg}: {message}"
            raise NonZeroExitCodeError(message)
        return response

    def _read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        try:
            data = self.sandbox.download(request.path)
        except OrchardError as error:
            raise (_file_error(error, request.path) or error) from None
        text = io.TextIOWrapper(io.BytesIO(data), encoding=request.encoding or "utf-8", errors=request.errors)
        return ReadFileResponse(content=text.read())

    def _write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        try:
            self.sandbox.upload(request.path, request.content)
        except OrchardError as error:
            raise (_file_error(error, request.path) or error) from None
        return WriteFileResponse()

    def _upload(self, request: UploadRequest) -> UploadResponse:
        source = Path(request.source_path)
        target = request.target_path
        try:
            if source.is_dir():
                self.sandbox.upload_dir(source, target)
            elif source.is_file():
                if self.sandbox.stat(target).get("type") == "directory":
                    target = f"{target.rstrip('/')}/{source.name}"  # shutil.copy into a directory
                self.sandbox.upload_file(target, source, mode=stat.S_IMODE(source.stat().st_mode))
            else:
                raise _os_error(FileNotFoundError, errno.ENOENT, request.source_path)
        except OrchardError as error:
            raise (_file_error(error, target) or error) from None
        return UploadResponse()


def _returncode(result: ExecResult) -> int:
    """``subprocess``'s returncode: the exit code, or minus the signal that killed the command."""
    if result.exit_code is not None:
        return result.exit_code
    return -(result.signal or 0) or -1


class OrchardDeploymentConfig(BaseModel):
    """Settings of :class:`OrchardDeployment`, in the style of SWE-ReX's deployment configs
    (``get_deployment()``). The token is never part of it (SWE-agent writes its configs into its
    trajectories): ``ORCHARD_TOKEN`` or ``ORCHARD_TOKEN_FILE`` (or ``token_file`` here), else the pod's
    service-account token; or give :class:`OrchardDeployment` a ``client`` or ``token``."""

    image: str | None = None
    """The sandbox's image (any Linux image with bash; nothing is installed in it)."""
    pool: str | None = None
    """Claim a warm member of this SandboxPool instead (no image needed)."""
    sandbox: str | None = None
    """Use this existing sandbox (waited for until Ready; never deleted by the deployment) instead of
    creating one."""
    namespace: str | None = None
    """Default: ``ORCHARD_NAMESPACE``, then the pod's namespace."""
    gateway_url: str | None = None
    """Default: ``ORCHARD_GATEWAY_URL``, then the in-cluster gateway Service."""
    token_file: str | None = None
    """A file holding the bearer token (default: ``ORCHARD_TOKEN``/``ORCHARD_TOKEN_FILE``)."""
    generate_name: str = "swerex-"
    """Prefix of the created sandbox's name."""
    cpu: str | None = None
    memory: str | None = None
    env: dict[str, str] = {}
    """Environment variables of the sandbox."""
    labels: dict[str, str] = {}
    network: str | dict[str, Any] | None = None
    """Egress: ``"Deny"`` (the operator's default), ``"AllowAll"``, or the spec's object
    (``{"egress": "AllowList", "allow": ["pypi.org"]}``)."""
    ttl_seconds: int | None = None
    """The sandbox's lifetime (default: the operator's, 2 h)."""
    heartbeat_timeout_seconds: int | None = None
    """How long the sandbox outlives this process without heartbeats (default 600; the deployment
    heartbeats while started)."""
    working_dir: str | None = None
    spec_fields: dict[str, Any] = {}
    """Other Sandbox spec fields (``node_selector``, ``when_pool_empty``, ``startup``...)."""
    startup_timeout: float = _ops.DEFAULT_WAIT_TIMEOUT
    """Seconds ``start()`` waits for the sandbox to be Ready."""
    direct: bool | None = None
    """Send agent calls straight to the sandbox's pod (the client's direct mode)."""
    runtime: OrchardRuntimeConfig = Field(default_factory=OrchardRuntimeConfig)
    """How the runtime's sessions and commands run."""

    type: Literal["orchard"] = "orchard"
    """Discriminator, as in SWE-ReX's configs."""

    model_config = ConfigDict(extra="forbid")

    def get_deployment(self) -> OrchardDeployment:
        return OrchardDeployment.from_config(self)


class OrchardDeployment(AbstractDeployment):
    """A SWE-ReX deployment on an Orchard Env sandbox: ``start()`` creates it (or connects to
    ``sandbox``) and waits until it is Ready, ``runtime`` is its :class:`OrchardRuntime`, ``stop()`` closes
    the runtime's sessions and deletes the sandbox it created. Hooks get ``on_custom_step`` with each
    step and each change of the sandbox's phase while it starts."""

    def __init__(
        self, *, client: SandboxClient | None = None, sandbox: Sandbox | str | None = None,
        token: str | None = None, logger: logging.Logger | None = None, **kwargs: Any,
    ) -> None:
        """``kwargs`` are :class:`OrchardDeploymentConfig`'s fields. ``client`` is used as given (and not
        closed); without it one is made from the config and ``token`` (and closed by :meth:`stop`).
        ``sandbox`` may be a handle of an existing sandbox (e.g. the one ``RolloutGroup.drive`` gives an
        episode): it is used as is and never deleted or closed by the deployment."""
        self.logger = logger or get_logger("rex-deploy")
        if client is not None and not isinstance(client, SandboxClient):
            raise TypeError(f"OrchardDeployment takes a SandboxClient (the synchronous client), not {type(client).__name__}")
        if sandbox is not None and not isinstance(sandbox, (Sandbox, str)):
            raise TypeError(
                f"OrchardDeployment(sandbox=) takes a Sandbox of the synchronous client or a sandbox's name, "
                f"not {type(sandbox).__name__}"
            )
        self._handle: Sandbox | None = None
        if isinstance(sandbox, Sandbox):
            self._handle = sandbox
            kwargs.setdefault("namespace", sandbox.namespace)
            sandbox = sandbox.name
        self._config = OrchardDeploymentConfig(sandbox=sandbox, **kwargs)
        self._client = client
        self._token = token
        self._own_client: SandboxClient | None = None
        self._sandbox: Sandbox | None = None
        self._runtime: OrchardRuntime | None = None
        self._hooks = CombinedDeploymentHook()

    @classmethod
    def from_config(cls, config: OrchardDeploymentConfig, **kwargs: Any) -> OrchardDeployment:
        return cls(**config.model_dump(), **kwargs)

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def config(self) -> OrchardDeploymentConfig:
        return self._config

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox's handle (e.g. to record a trajectory's result).

        Raises:
            DeploymentNotStartedError: If the deployment was not started.
        """
        if self._sandbox is None:
            raise DeploymentNotStartedError()
        return self._sandbox

    @property
    def runtime(self) -> OrchardRuntime:
        """Returns the runtime if running.

        Raises:
            DeploymentNotStartedError: If the deployment was not started.
        """
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        """Whether the sandbox is Ready and its agent answers.

        Raises:
            DeploymentNotStartedError: If the deployment was not started.
        """
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return await self._runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        """Creates the sandbox (or connects to the configured one) and waits until it is Ready; raises
        ``DeploymentStartupError`` when it cannot become Ready (its cause is the SDK's error)."""
        if self._runtime is not None:
            self.logger.warning("Deployment is already started. Ignoring duplicate start() call.")
            return
        await asyncio.to_thread(self._start)

    async def stop(self) -> None:
        """Closes the runtime's sessions and deletes the sandbox the deployment created (a sandbox it was
        given or connected to stays); stopping again does nothing."""
        await asyncio.to_thread(self.stop_sync)

    def _progress(self, progress: SandboxProgress) -> None:
        step = f"Sandbox {progress.phase or 'Pending'}"
        if progress.reason:
            step += f" ({progress.reason})"
        self._hooks.on_custom_step(step)

    def _start(self) -> None:
        config = self._config
        t0 = time.monotonic()
        try:
            if self._handle is not None:
                sandbox = self._handle
                if not _ops.is_ready(sandbox.raw):
                    sandbox.wait_ready(config.startup_timeout, on_progress=self._progress)
            else:
                client = self._client
                if client is None:
                    client = self._own_client = SandboxClient(
                        config.gateway_url, self._token, namespace=config.namespace, token_file=config.token_file
                    )
                if config.sandbox:
                    self._hooks.on_custom_step("Connecting to sandbox")
                    sandbox = client.connect(config.sandbox, namespace=config.namespace, direct=config.direct)
                    if not _ops.is_ready(sandbox.raw):
                        sandbox.wait_ready(config.startup_timeout, on_progress=self._progress)
                else:
                    self._hooks.on_custom_step("Creating sandbox")
                    self.logger.info("Creating a sandbox (image %s, pool %s)", config.image, config.pool)
                    sandbox = client.create(
                        config.image, generate_name=config.generate_name, namespace=config.namespace,
                        labels=config.labels or None, env=config.env or None, cpu=config.cpu, memory=config.memory,
                        ttl_seconds=config.ttl_seconds, heartbeat_timeout_seconds=config.heartbeat_timeout_seconds,
                        network=config.network, wait=True, wait_timeout=config.startup_timeout, delete_on_exit=True,
                        direct=config.direct, on_progress=self._progress, pool=config.pool,
                        working_dir=config.working_dir, **config.spec_fields,
                    )
        except OrchardError as error:
            self._close_own_client()
            raise DeploymentStartupError(f"the sandbox did not start: {error}") from error
        except BaseException:
            self._close_own_client()
            raise
        self._sandbox = sandbox
        self.logger.info("Sandbox %s/%s Ready in %.2fs", sandbox.namespace, sandbox.name, time.monotonic() - t0)
        self._hooks.on_custom_step("Starting runtime")
        self._runtime = OrchardRuntime(sandbox, logger=self.logger, **config.runtime.model_dump())

    def stop_sync(self) -> None:
        """:meth:`stop`, synchronously."""
        runtime, self._runtime = self._runtime, None
        sandbox, self._sandbox = self._sandbox, None
        try:
            if runtime is not None:
                runtime.close_sync()
            if sandbox is not None and sandbox is not self._handle:
                sandbox.close()  # deletes a sandbox it created (delete_on_exit), stops the heartbeats
        finally:
            self._close_own_client()

    def _close_own_client(self) -> None:
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None


__all__ = [
    "NO_TIMEOUT",
    "PS1",
    "OrchardDeployment",
    "OrchardDeploymentConfig",
    "OrchardRuntime",
    "OrchardRuntimeConfig",
]
