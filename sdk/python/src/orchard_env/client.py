"""The synchronous client: :class:`SandboxClient`, :class:`Sandbox`, :class:`Process`, :class:`Session`,
:class:`RolloutGroup` and :class:`Snapshot`.

The one source of the public surface: ``aio.py`` (the asyncio client) is generated from this file by
``scripts/gen_aio.py``. Each method runs the core's plan of its operation with the driver
(``_sync_driver.py`` here, ``_async_driver.py`` there)."""

from __future__ import annotations

import builtins
import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

import httpx

from . import _cleanup, _core, _ops
from ._core import Content, LocalFile
from ._retry import RetryPolicy  # noqa: F401  (importable from here, as before)
from ._sync_driver import Driver, EpisodeRunner, Heartbeats, PortForward, read_path, read_stream, write_blocks
from .models import (
    DriveResult,
    ExecEvent,
    ExecResult,
    FileEntry,
    GroupResult,
    PatchResult,
    ProcessInfo,
    SandboxProgress,
    SessionInfo,
    SessionReadResult,
    SessionRunResult,
    SessionSignalResult,
    TrajectoryResult,
)

#: A trajectory's result as an episode gives it: a reward, a result dict (the API's keys) or a
#: :class:`TrajectoryResult`.
ResultValue = float | int | Mapping[str, Any] | TrajectoryResult
#: What an episode returns: a result, or a ``(result, payload)`` pair whose payload (tokens, logprobs...)
#: ``drive`` hands back to the trainer and never sends.
EpisodeResult = ResultValue | tuple[ResultValue, Any]

#: Open sandbox handles of both clients (``_cleanup``): at interpreter exit and on SIGTERM the sandboxes
#: of those with ``delete_on_exit`` are deleted (best effort; heartbeat expiry is the safety net when the
#: process dies without running exit handlers, e.g. SIGKILL or the OOM killer).
_OPEN = _cleanup.OPEN


# -- the public API: each method runs the core's plan of the operation --------------------------------


class Sandbox(_core.SandboxCore):
    """A handle on one sandbox. A context manager: leaving the ``with`` block deletes the sandbox
    (unless created with ``delete_on_exit=False``), and so do interpreter exit and SIGTERM. While the
    handle is open it heartbeats the sandbox from a background thread (``auto_heartbeat``), so its
    heartbeat timeout does not run out while the trainer holds it; its TTL still ends it."""

    client: SandboxClient
    _heartbeats: Heartbeats | None

    def __init__(
        self, client: SandboxClient, name: str, namespace: str, raw: Mapping[str, Any] | None = None, *,
        delete_on_exit: bool = True, auto_heartbeat: bool = True, direct: bool = False,
    ) -> None:
        super().__init__(client, name, namespace, raw, delete_on_exit=delete_on_exit, auto_heartbeat=auto_heartbeat, direct=direct)

    # -- state -------------------------------------------------------------------------------

    def refresh(self) -> dict[str, Any]:
        """Reads the Sandbox object again, keeps it (``raw``, ``phase``) and returns it."""
        return self._run(self._refresh_plan())

    def wait_ready(
        self, timeout: float | None = _ops.DEFAULT_WAIT_TIMEOUT, *, on_progress: Callable[[SandboxProgress], None] | None = None
    ) -> Sandbox:
        """Waits until the sandbox is Ready (the gateway's watch-driven wait) and returns this handle.

        Raises as soon as the sandbox cannot become Ready by itself: :class:`~orchard_env.SandboxStalled`
        (``Stalled=True``: a missing pool, a full quota...) or :class:`~orchard_env.SandboxFailed`
        (Failed, Succeeded or Expired), each with ``phase``, ``reason`` and ``condition_message``. After
        ``timeout`` seconds (None: no limit) raises :class:`~orchard_env.Timeout` carrying the same three
        as last seen, also quoted in its message. The default, 630 s, outlasts the operator's default
        startup timeout (600 s after creation), so a sandbox that cannot start ends as ``SandboxFailed``
        with reason ``StartupTimeout`` and the operator's explanation rather than as a bare timeout.

        ``on_progress`` is called with a :class:`~orchard_env.SandboxProgress` (phase, the Ready reason and
        message, seconds waited) each time they change, seen within 2 s; every change is also logged at
        INFO on the ``orchard_env`` logger."""
        return self._run(self._wait_ready_plan(timeout, on_progress))

    # -- heartbeats ------------------------------------------------------------------------

    def heartbeat(self) -> dict[str, Any]:
        """Heartbeats the sandbox now, pushing back its heartbeat deadline (never its TTL), and answers
        ``{"heartbeatTimeoutSeconds", "written", "expiresAt"}`` (the gateway coalesces writes). Open handles
        do this in the background; calls through the gateway count as heartbeats too."""
        return self._run(self._heartbeat_plan())

    def set_timeout(self, seconds: float) -> dict[str, Any]:
        """Ends the sandbox ``seconds`` from now (rounded up), extending or shortening its life: its TTL
        becomes the time since Ready plus ``seconds``. Answers ``{"ttlSeconds", "ttlEndsAt",
        "maxTtlSeconds"}``. The heartbeat deadline still applies (an open handle keeps heartbeating).
        Raises :class:`~orchard_env.NotReady` before Ready, and :class:`~orchard_env.InvalidRequest`
        (code ``TtlBeyondMaximum``, naming the most still allowed) past the operator's maximum TTL."""
        return self._run(self._set_timeout_plan(seconds))

    def set_network(
        self, *, egress: str = "AllowList", allow: Sequence[str | Mapping[str, Any]] = (),
        deny: Sequence[str | Mapping[str, Any]] = (), wait: float = 5.0,
    ) -> dict[str, Any]:
        """Replaces the sandbox's whole ``spec.network`` (``PUT .../network``, RBAC ``update
        sandboxes/network``), e.g. between an agent phase and a verifier phase, and waits up to ``wait``
        seconds (at most 60; 0: not at all) until the egress proxy enforces the new host rules.

        ``egress`` is ``"AllowList"`` (only ``allow``), ``"Deny"`` (nothing) or ``"AllowAll"``. In
        ``allow`` a string is a host-name pattern (``"pypi.org"``; ``"*.github.com"``, its subdomains;
        ``"*"``, any host name), or an address range when it has a ``/`` and parses as one
        (``"10.0.0.0/8"``); a mapping is an entry as the API spells it (``{"host": "pypi.org", "ports":
        [{"port": 443}]}``). ``deny`` lists host-name patterns refused even when allowed (deny wins; it
        needs ``AllowList`` with a host entry, e.g. ``allow=["*"]``). Host entries are reached through the
        proxy the sandbox's ``HTTPS_PROXY``/``HTTP_PROXY`` variables name; connections to hosts no longer
        allowed are cut.

        Answers ``{"generation", "hostRulesInForce", "message"}``: ``hostRulesInForce`` is None when the
        rules name no hosts and never did (address ranges and the mode are NetworkPolicies, rewritten
        within a reconcile), False when the proxy does not enforce them yet at the end of the wait (a
        sandbox that is not Ready is not waited for; the previous rules stay in force until then) or
        refused them (``message`` says why). A host that is plainly not one (a scheme, a path, a port,
        an IP address) raises :class:`~orchard_env.InvalidRequest` before any request, a ``wait`` that is
        not a number from 0 ``ValueError``; the API server's rules refuse the rest (422, also
        :class:`~orchard_env.InvalidRequest`, with the rule's message)."""
        return self._run(self._set_network_plan(egress, allow, deny, wait))

    def _beat_in_background(self, loop: _core.Plan[None]) -> Heartbeats:
        return Heartbeats(self, loop)

    def _halt_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.halt()

    def stop_heartbeats(self) -> None:
        """Stops the handle's background heartbeats (it stops the background thread, waiting at most 5 s for
        it). Without heartbeats or calls through the gateway, the sandbox expires after its heartbeat timeout."""
        if self._heartbeats is not None:
            self._heartbeats.stop()
            self._heartbeats = None

    # -- agent calls -----------------------------------------------------------------------

    def exec(
        self, cmd: str | Sequence[str], *, timeout: float | None = None, cwd: str | None = None,
        env: Mapping[str, str] | None = None, stdin: str | bytes | None = None, shell: str | None = None,
        max_output_bytes: int | None = None, check: bool = False, user: str | int | None = None,
    ) -> ExecResult:
        """Runs a command and answers its :class:`~orchard_env.ExecResult` (``exit_code``, ``stdout``,
        ``stderr``, ``timed_out``, ``oom_killed``...). A list is an argv run directly (no shell needed in the
        image); a string runs with ``shell -c`` (default ``/bin/sh``). ``timeout`` (seconds; the agent's
        default is 600) kills the command's whole process group; ``cwd`` must exist; ``stdin`` is text or
        bytes; ``max_output_bytes`` caps each stream (``stdout_truncated``/``stderr_truncated`` say so). With
        ``check=True`` a non-zero exit, a timeout or a kill raises :class:`~orchard_env.CommandFailed`.

        ``user`` runs the command as another user of the image: a name from its ``/etc/passwd``, a uid (an
        ``int`` is sent as its decimal string), ``"user:group"`` or ``"uid:gid"``. The agent refuses before
        starting anything: an agent that does not run as root cannot switch users (403, raised as
        :class:`~orchard_env.Forbidden`), and a user or group the image's ``/etc/passwd``/``/etc/group`` lack,
        or a malformed value, is 400 ``BadRequest`` (:class:`~orchard_env.InvalidRequest`)."""
        return self._run(self._exec_plan(
            cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell, max_output_bytes=max_output_bytes, check=check,
            user=user))

    def exec_stream(
        self, cmd: str | Sequence[str], *, timeout: float | None = None, cwd: str | None = None,
        env: Mapping[str, str] | None = None, stdin: str | bytes | None = None, shell: str | None = None,
        user: str | int | None = None,
    ) -> Iterator[ExecEvent]:
        """Runs a command and yields its :class:`~orchard_env.ExecEvent` values as they happen: ``started``,
        ``stdout``/``stderr`` chunks, then ``exit`` (``exit_code``, ``signal``, ``timed_out``,
        ``oom_killed``). Closing the iterator early kills the command. Arguments as for :meth:`exec` (``user``
        too)."""
        response = self._run(self._exec_stream_plan(cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell, user=user))
        with contextlib.closing(response):
            for line in response.iter_lines():
                if (event := _core.exec_event(line)) is not None:
                    yield event

    def start_process(
        self, cmd: str | Sequence[str], *, id: str | None = None, timeout: float | None = None,
        cwd: str | None = None, env: Mapping[str, str] | None = None, stdin: str | bytes | None = None,
        shell: str | None = None, user: str | int | None = None, keep_stdin: bool = False,
        pty: tuple[int, int] | None = None,
    ) -> Process:
        """Starts a background process and returns its handle (:class:`Process`). It has no timeout unless
        ``timeout`` is given; ``id`` names it (else the agent picks one). Arguments as for :meth:`exec`
        (``user`` too). ``keep_stdin=True`` keeps its stdin open for :meth:`Process.write_stdin`;
        ``pty=(rows, cols)`` runs it on a pseudo-terminal of that size (for programs that need one: tmux,
        top, REPLs), whose output is all ``stdout``, written with :meth:`Process.write_stdin` and resized
        with :meth:`Process.resize`. Neither goes with ``stdin``."""
        return self._run(self._start_process_plan(
            Process, cmd, id, timeout=timeout, cwd=cwd, env=env, stdin=stdin, shell=shell, user=user,
            keep_stdin=keep_stdin, pty=pty,
        ))

    def list_processes(self, *, output: bool = False) -> list[ProcessInfo]:
        """The sandbox's background processes, oldest first (with their output so far when ``output``)."""
        return self._run(self._list_processes_plan(output))

    def get_process(self, id: str, *, wait: float | None = None) -> ProcessInfo:
        """The status of process ``id``; with ``wait`` (seconds, at most 300) the agent answers once the
        process exits or the wait runs out."""
        return self._run(self._get_process_plan(id, wait))

    def signal_process(self, id: str, signal: str | int = "TERM") -> ProcessInfo:
        """Sends ``signal`` (a name such as ``"TERM"``, or a number) to the whole process group of process
        ``id`` and answers its status."""
        return self._run(self._signal_process_plan(id, signal))

    def kill_process(self, id: str) -> ProcessInfo:
        """SIGKILLs the process group of process ``id`` (if it runs), forgets the process and answers its
        final status."""
        return self._run(self._kill_process_plan(id))

    def session(
        self, *, shell: str | None = None, cwd: str | None = None, env: Mapping[str, str] | None = None,
        user: str | int | None = None, max_output_bytes: int | None = None,
    ) -> Session:
        """Starts a persistent shell session (:class:`Session`): commands run one after another in the same
        shell, so ``cd``, variables and functions carry over. Returns its handle, a context manager:
        ``with sbx.session() as sh:`` closes the session at the end of the block.

        ``shell`` is a path or a name on ``PATH`` (default bash when the image has it, else ``sh``); ``cwd``
        and ``env`` as for :meth:`exec`; ``user`` runs the shell (so every command of the session) as
        another user, as for :meth:`exec` (:class:`~orchard_env.Forbidden` when the agent cannot switch,
        :class:`~orchard_env.InvalidRequest` for an unknown user); ``max_output_bytes`` caps the output one
        run keeps (the agent's default is 4 MiB). :class:`~orchard_env.TooManyRequests` when the sandbox
        has 64 sessions open."""
        return self.client._create_handle(lambda: self._start_session_plan(
            Session, shell=shell, cwd=cwd, env=env, user=user, max_output_bytes=max_output_bytes))

    def list_sessions(self) -> list[SessionInfo]:
        """The sandbox's shell sessions (:class:`~orchard_env.SessionInfo`), oldest first."""
        return self._run(self._list_sessions_plan())

    def forward_port(self, port: int, *, local_port: int = 0, host: str = "127.0.0.1") -> PortForward:
        """Forwards a local port to ``port`` inside the sandbox, like ``kubectl port-forward``:
        ``with sbx.forward_port(9222) as local_port:`` answers the local port (``local_port=0``, the
        default, lets the system pick one) and every connection to ``host:local_port`` meanwhile reaches
        ``port`` on the sandbox's loopback (servers bound to 127.0.0.1 included) through a tunnel of its own
        (an upgraded connection through the gateway; RBAC ``create sandboxes/portforward``). Leaving the
        block closes the listener and every open connection. A connection whose tunnel is refused (nothing
        listens on ``port``) is closed at once and the reason logged; a revoked token or RoleBinding ends
        open tunnels. ``ValueError`` for a port outside 1-65535."""
        return PortForward(self, port, local_port, host)

    def upload(self, path: str, data: Content, *, mode: int | str | None = None) -> dict[str, Any]:
        """Writes ``data`` to the file ``path`` in the sandbox (streamed and atomic; missing parent
        directories are created) and answers the agent's ``{"path", "size"}``.

        ``data`` is the file's content: bytes, or a ``str`` written as UTF-8 text (a ``str`` is never read
        as a local path). To copy a local file use :meth:`upload_file`: a ``pathlib.Path`` here raises
        ``TypeError``, and a binary file object still works but is deprecated. ``mode`` is octal
        (``0o755`` or ``"0755"``)."""
        return self._run(self._upload_plan(path, _core.upload_content(data, read_path, read_stream), mode))

    def upload_file(self, path: str, local_path: LocalFile, *, mode: int | str | None = None) -> dict[str, Any]:
        """Copies a local file to the file ``path`` in the sandbox (streamed and atomic; missing parent
        directories are created) and answers the agent's ``{"path", "size"}``.

        ``local_path`` is a local path (``str`` or ``os.PathLike``) or a binary file object, read from its
        current position (a retried upload reads a seekable one again from there; one that cannot seek is
        sent once). ``mode`` is octal (``0o755`` or ``"0755"``)."""
        return self._run(self._upload_plan(path, _core.upload_file_content(local_path, read_path, read_stream), mode))

    @overload
    def download(self, path: str) -> bytes: ...

    @overload
    def download(self, path: str, dest: LocalFile) -> int: ...

    def download(self, path: str, dest: LocalFile | None = None) -> bytes | int:
        """Reads the file ``path`` of the sandbox and answers its bytes.

        To stream a large file into a local file use :meth:`download_file`. ``download(path, dest)`` still
        does that (deprecated: a ``DeprecationWarning``)."""
        if dest is not None:
            warnings.warn(_core.DOWNLOAD_DEST, DeprecationWarning, stacklevel=2)
            return self.download_file(path, dest)
        response = self._run(self._download_plan(path))
        with contextlib.closing(response):
            return response.read()

    def download_file(self, path: str, local_path: LocalFile) -> int:
        """Streams the file ``path`` of the sandbox into ``local_path`` and answers the byte count.

        ``local_path`` is a local path (``str`` or ``os.PathLike``; created, or truncated) or a binary file
        object, written from its current position and left open."""
        target, handle = _core.download_target(local_path)
        response = self._run(self._download_plan(path))
        with contextlib.closing(response):
            return write_blocks(response, target, handle)

    def list_files(self, path: str = ".") -> list[FileEntry]:
        """The entries of directory ``path`` (:class:`~orchard_env.FileEntry`), sorted by name."""
        return self._run(self._list_files_plan(path))

    def delete_file(self, path: str, *, recursive: bool = False) -> None:
        """Deletes the file or empty directory ``path`` (any directory with ``recursive=True``)."""
        self._run(self._delete_file_plan(path, recursive))

    def stat(self, path: str) -> dict[str, Any]:
        """What ``path`` is: ``{"path", "exists", "type" (file, directory, symlink, other), "size", "mode",
        "modified", "uid", "gid", "target"}``; a missing path answers ``exists: False``, not an error."""
        return self._run(self._stat_plan(path))

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists in the sandbox (a symlink counts, wherever it points)."""
        return bool(self._run(self._stat_plan(path)).get("exists"))

    def make_dir(self, path: str, *, parents: bool = True) -> dict[str, Any]:
        """Creates directory ``path`` (with ``parents``, missing parents too and no error if it exists, as
        ``mkdir -p``); answers ``{"path", "created"}``."""
        return self._run(self._make_dir_plan(path, parents))

    def rename(self, source: str, target: str, *, overwrite: bool = False) -> dict[str, Any]:
        """Renames or moves ``source`` to ``target`` (an existing ``target`` only with ``overwrite``)."""
        return self._run(self._rename_plan(source, target, overwrite))

    def upload_dir(self, local: str | os.PathLike[str], path: str) -> dict[str, Any]:
        """Copies the local directory ``local``'s contents into the sandbox's directory ``path`` (created),
        as one tar stream: modes and symlinks kept (a symlink is never followed). The agent checks the whole
        archive first and writes nothing if an entry would leave ``path``. Answers ``{"path", "files", ...}``."""
        return self._run(self._upload_dir_plan(local, path))

    def download_dir(self, path: str, local: str | os.PathLike[str]) -> list[str]:
        """Copies the sandbox's directory ``path`` into the local directory ``local`` (created), as one tar
        stream extracted with tarfile's ``data`` filter (nothing lands outside ``local``); answers the names
        extracted."""
        response = self._run(self._download_dir_plan(path))
        with contextlib.closing(response):
            data = response.read()
        return _ops.extract_tar(data, local)

    def metrics(self) -> dict[str, Any]:
        """The task container's usage from its cgroup: ``{"cpuSeconds", "memoryBytes", "memoryPeakBytes",
        "memoryLimitBytes", "pids", "oomKills", "diskPath", "diskUsedBytes", ...}`` (a figure the node does
        not offer is None)."""
        return self._run(self._metrics_plan())

    def apply_patch(self, patch: str, *, cwd: str | None = None, strip: int | None = None) -> PatchResult:
        """Applies a unified diff (``git diff`` output) natively, every hunk or nothing, and answers the files
        it touched (:class:`~orchard_env.PatchResult`); when a hunk does not apply nothing is written and
        :class:`~orchard_env.PatchConflict` lists the failed hunks. Paths are relative to ``cwd`` after
        removing ``strip`` leading components (default 1, as ``patch -p1``)."""
        return self._run(self._apply_patch_plan(patch, cwd, strip))

    # -- results and lifecycle -----------------------------------------------------------------

    def snapshot(
        self, name: str | None = None, *, paths: Sequence[str] | None = None, ttl_seconds_after_unused: int | None = None,
        wait: bool = True, timeout: float | None = 600.0,
    ) -> Snapshot:
        """Snapshots the sandbox's filesystem (a SandboxSnapshot, ``POST .../sandboxsnapshots``, RBAC ``create
        sandboxsnapshots`` and ``get sandboxes``) and, with ``wait``, waits until the image is pushed. The
        sandbox must be Ready; its processes are paused while its changes are read (usually well under a
        second) and then go on. Only the filesystem is kept: processes, memory and open connections are not
        (docs/SNAPSHOTS.md). ``paths`` (absolute) keeps only the changes under them; ``name`` defaults to a
        generated ``<sandbox>-snap-...``; ``ttl_seconds_after_unused`` deletes the snapshot that long after
        the last sandbox started from it is gone. Returns its :class:`Snapshot`; a failed snapshot raises
        :class:`~orchard_env.SnapshotFailed` (e.g. reason ``PushRefused`` with the registry's answer), and
        one not Ready after ``timeout`` seconds :class:`~orchard_env.Timeout`."""
        return self._run(_core.snapshot_plan(self, name, paths, ttl_seconds_after_unused, wait, timeout))

    def fork(
        self, count: int, *, snapshot: Snapshot | None = None, paths: Sequence[str] | None = None,
        timeout: float | None = _ops.DEFAULT_WAIT_TIMEOUT, delete_on_exit: bool = True,
        labels: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None, cpu: str | int | float | None = None,
        memory: str | None = None, ttl_seconds: int | None = None, heartbeat_timeout_seconds: int | None = None,
        network: str | Mapping[str, Any] | None = None, **spec_fields: Any,
    ) -> builtins.list[Sandbox]:
        """Starts ``count`` sandboxes from this one's filesystem as it is now: snapshots it (see
        :meth:`snapshot`; kept one hour after its last fork is gone), or uses ``snapshot``, then creates the
        forks at once and waits until each is Ready. Each fork starts its own processes afresh (its image's
        command: the agent), with this sandbox's files; what a fork writes later is its own. The other
        arguments are :meth:`SandboxClient.create`'s, for every fork. Returns their handles (context managers,
        heartbeating while open); if any cannot become Ready, the forks are deleted and the error raised. For
        forks started before they are needed, create a SandboxPool whose template names the snapshot and claim
        its members with ``create(pool=...)`` (docs/SNAPSHOTS.md)."""
        fields = {
            "labels": labels, "env": env, "cpu": cpu, "memory": memory, "ttl_seconds": ttl_seconds,
            "heartbeat_timeout_seconds": heartbeat_timeout_seconds, "network": network, "extra": spec_fields,
        }
        return self._run(_core.fork_plan(self, count, snapshot, paths, timeout, delete_on_exit, fields))

    def record_result(
        self, reward: float | None = None, status: str = "completed", *, length: int | None = None,
        artifact: str | None = None, exit_code: int | None = None, reason: str | None = None, message: str | None = None,
    ) -> dict[str, Any]:
        """Records this trajectory's outcome in ``status.result`` and answers the gateway's ``{"recorded",
        "result"}``: ``reward`` (required unless ``status`` is ``aborted``), ``status`` (``completed``,
        ``truncated`` or ``aborted``), ``length``, ``artifact``, ``exit_code``, ``reason``, ``message``.
        Write-once: the same result again is fine, a different one raises :class:`~orchard_env.Conflict`."""
        return self._run(self._record_result_plan(reward, status, length, artifact, exit_code, reason, message))

    def delete(self) -> None:
        """Deletes the sandbox (already gone is fine) and stops its heartbeats."""
        self._run(self._delete_plan())

    def close(self) -> None:
        """Stops the heartbeats and, with ``delete_on_exit``, deletes the sandbox; closing again does nothing."""
        self._run(self._close_plan())

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Process(_core.ProcessCore):
    """A background process in a sandbox."""

    sandbox: Sandbox

    def __init__(self, sandbox: Sandbox, id: str, info: ProcessInfo | None = None) -> None:
        super().__init__(sandbox, id, info)

    def status(self) -> ProcessInfo:
        """Reads the process's status again, keeps it (:attr:`info`) and returns it."""
        return self._run(self._track(self.sandbox._get_process_plan(self.id)))

    def wait(self, timeout: float | None = None) -> ProcessInfo:
        """Waits until the process exits (long-polls of the agent) and returns its final status;
        :class:`~orchard_env.Timeout` after ``timeout`` seconds (None: no limit)."""
        return self._run(self._wait_plan(timeout))

    def signal(self, signal: str | int = "TERM") -> ProcessInfo:
        """Sends ``signal`` (a name such as ``"TERM"``, or a number) to the process's whole group and returns
        its status."""
        return self._run(self._track(self.sandbox._signal_process_plan(self.id, signal)))

    def kill(self) -> ProcessInfo:
        """SIGKILLs the process's group (if it runs), forgets the process and returns its final status."""
        return self._run(self._track(self.sandbox._kill_process_plan(self.id)))

    def write_stdin(self, data: str | bytes, *, close: bool = False) -> ProcessInfo:
        """Writes ``data`` (text, or bytes) to the process's stdin, in order with earlier writes, and returns
        its status; with ``close=True`` closes the stdin afterwards (the process reads end of input; on a
        terminal end-of-file is typed). Only for processes started with ``keep_stdin`` or ``pty``:
        :class:`~orchard_env.Conflict` otherwise, once it is closed, or when the process has not taken the
        bytes within 10 s. Never retried."""
        return self._run(self._track(self.sandbox._process_stdin_plan(self.id, data, close)))

    def close_stdin(self) -> ProcessInfo:
        """Closes the process's stdin (see :meth:`write_stdin`) and returns its status."""
        return self._run(self._track(self.sandbox._process_stdin_plan(self.id, b"", True)))

    def resize(self, rows: int, cols: int) -> ProcessInfo:
        """Sets the size of the process's terminal (it gets SIGWINCH) and returns its status; each 1 to
        1000 (``ValueError``). :class:`~orchard_env.Conflict` for a process without a terminal."""
        return self._run(self._track(self.sandbox._resize_process_plan(self.id, rows, cols)))


class Session(_core.SessionCore):
    """A persistent shell in a sandbox (:meth:`Sandbox.session`): its runs share ``cd``, variables and
    functions. A context manager: leaving the ``with`` block closes the session."""

    sandbox: Sandbox

    def __init__(self, sandbox: Sandbox, id: str, info: SessionInfo | None = None) -> None:
        super().__init__(sandbox, id, info)

    def run(self, command: str, *, timeout: float | None = None, check: bool = False) -> SessionRunResult:
        """Runs ``command`` (shell code) in the session's shell and answers its
        :class:`~orchard_env.SessionRunResult` (``output``: stdout and stderr interleaved, ``exit_code``,
        ``timed_out``, ``shell_exited``...). ``timeout`` (seconds; the agent's default is 600) interrupts the
        command (SIGINT, exit code 130) and the session stays usable. One run at a time: another run
        meanwhile raises :class:`~orchard_env.Conflict`, but :meth:`input` and :meth:`read` work during a run
        (that is what they are for). With ``check=True`` a non-zero exit or a timeout raises
        :class:`~orchard_env.CommandFailed`. Never retried."""
        return self._run(self._run_plan(command, timeout, check))

    def interrupt(self) -> SessionSignalResult:
        """Interrupts the command of the run in progress, as Ctrl-C does: SIGINT to the shell's process group
        (docs/AGENT.md, "Shell sessions"). Answers at once, without waiting for the run, which then answers
        on its own (``exit_code`` 130, ``timed_out`` False); the session stays as it was. Meant for another
        thread or task than the one waiting in :meth:`run`. ``running`` in the answer is False when no run
        was in progress (nothing was signalled). A command that ignores SIGINT keeps running: follow with
        ``signal("KILL")``. Never retried."""
        return self._run(self._signal_plan("INT"))

    def signal(self, signal: str | int = "INT") -> SessionSignalResult:
        """Sends ``signal`` (a name such as ``"KILL"`` or ``"SIGTERM"``, or a number) to the command of the run
        in progress and answers at once, like :meth:`interrupt` (which is ``signal("INT")``). SIGINT goes to
        the shell's process group; any other signal only to the processes the run started below the shell,
        never to the shell itself nor to ``&`` jobs of earlier runs, so ``signal("KILL")`` stops a command
        that ignores SIGINT and the session survives. An unknown signal raises
        :class:`~orchard_env.InvalidRequest`, a session whose shell has exited :class:`~orchard_env.Conflict`.
        Never retried."""
        return self._run(self._signal_plan(signal))

    def input(self, text: str) -> SessionInfo:
        """Writes ``text`` as given to the shell's stdin (end a line with a newline), to answer a prompt of
        the running command; keeps and returns the session's status. Send it once the command waits for it
        (:meth:`read` the prompt first): ``sh`` may read text that arrives earlier as shell code."""
        return self._run(self._track(self._input_plan(text)))

    def read(self, *, until: str | None = None, timeout: float | None = None) -> SessionReadResult:
        """Reads the session's output not read before, expect-style, and answers a
        :class:`~orchard_env.SessionReadResult`. With ``until`` (literal text, not a pattern) waits until it
        appears and answers the output up to and including it (``matched``); when it does not come within
        ``timeout`` seconds (the agent's default is 10, at most 300) or the shell exits, answers all there is
        with ``matched`` False. Without ``until`` answers at once. A run still answers its whole output."""
        return self._run(self._read_plan(until, timeout))

    def status(self) -> SessionInfo:
        """Reads the session's status again, keeps it (:attr:`info`) and returns it
        (:class:`~orchard_env.SessionInfo`: ``state``, ``busy``, ``exit_code``...)."""
        return self._run(self._track(self._status_plan()))

    def close(self) -> SessionInfo | None:
        """Ends the session (SIGKILLs its shell's whole process group) and returns its final status;
        closing again is fine (the status last seen is returned)."""
        return self._run(self._close_plan())

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Snapshot(_core.SnapshotCore):
    """A handle on a SandboxSnapshot (:meth:`Sandbox.snapshot`, :meth:`SandboxClient.snapshot`): a sandbox's
    filesystem committed as an image (:attr:`image`) that new sandboxes start from
    (``client.create(from_snapshot=snap)``)."""

    client: SandboxClient

    def __init__(self, client: SandboxClient, name: str, namespace: str, raw: Mapping[str, Any] | None = None) -> None:
        super().__init__(client, name, namespace, raw)

    def refresh(self) -> dict[str, Any]:
        """Reads the SandboxSnapshot object again, keeps it (``raw``, ``phase``, ``image``) and returns it."""
        return self._run(self._refresh_plan())

    def wait(self, timeout: float | None = 600.0) -> Snapshot:
        """Waits until the snapshot is Ready (its image pushed) and returns this handle;
        :class:`~orchard_env.SnapshotFailed` if it failed, :class:`~orchard_env.Timeout` after ``timeout``
        seconds (None: no limit)."""
        return self._run(self._wait_plan(timeout))

    def delete(self) -> None:
        """Deletes the snapshot (already gone is fine). Its deletion completes once no Sandbox, SandboxPool or
        RolloutGroup names it; the image stays in the registry."""
        self._run(self._delete_plan())


class RolloutGroup(_core.GroupCore):
    """A handle on a RolloutGroup (BAR): wait for its reward-balanced group. A context manager that
    deletes the group (and its trajectory sandboxes) on exit when ``delete_on_exit``."""

    client: SandboxClient

    def __init__(self, client: SandboxClient, name: str, namespace: str, raw: Mapping[str, Any] | None = None, *, delete_on_exit: bool = True) -> None:
        super().__init__(client, name, namespace, raw, delete_on_exit)

    def get(self) -> GroupResult:
        """Reads the group again and returns it as a :class:`~orchard_env.GroupResult`."""
        return self._run(self._get_plan())

    def wait(self, timeout: float | None = None) -> GroupResult:
        """Waits until the group is recorded (``Complete``) or ``Failed`` and returns it, with the gateway's
        watch-driven waits (long-polls of up to 300 s in a loop); :class:`~orchard_env.Timeout` after
        ``timeout`` seconds (None: no limit)."""
        return self._run(self._wait_plan(timeout))

    def drive(
        self, episode: Callable[[Sandbox], EpisodeResult], *, concurrency: int | None = None,
        timeout: float | None = None, poll_interval: float = 1.0,
    ) -> DriveResult:
        """Drives a trainer-driven group (its template has no ``run``): runs ``episode(sandbox)`` in a worker
        thread for every trajectory Sandbox the controller launches, later strides included, as each becomes
        Ready, at most ``concurrency`` at once (None: no limit but the stride), and records what it returns
        with :meth:`Sandbox.record_result`: a number is the reward of a ``completed`` trajectory, a dict has
        the result's keys (``reward``, ``status``, ``length``, ``artifact``, ``exitCode``, ``reason``,
        ``message``), or a :class:`~orchard_env.TrajectoryResult`; or a ``(result, payload)`` pair of one of
        those and anything else (tokens, logprobs, messages), whose payload is kept for the trainer and never
        sent. An episode that raises becomes ``{"status": "aborted", "reason": "EpisodeFailed", "message":
        <the exception>}``. Episodes run at most once per
        Sandbox UID and are never retried; a Sandbox that fails or disappears before its episode starts is
        skipped (the controller records it aborted). The handle given to ``episode`` heartbeats while the
        episode runs and is not deleted after it.

        Returns the recorded group once it is ``Complete`` (or ``Failed``), as a
        :class:`~orchard_env.DriveResult`: a :class:`~orchard_env.GroupResult` whose ``episodes`` hold every
        episode it ran by trajectory name (result, payload, error, whether BAR put it in the group) and whose
        ``payloads`` are the members' payloads in group order. The episodes still running then are waited for
        (with ``earlyStop: Eager`` the controller deletes their Sandboxes, so their calls fail fast). On any exception (``KeyboardInterrupt``, :class:`~orchard_env.Timeout` after ``timeout``
        seconds, a result that cannot be posted) deletes the group's trajectory Sandboxes that have no result
        yet, then raises it."""
        episodes = EpisodeRunner(self, episode, concurrency)
        return self._run(self._drive_plan(episodes, concurrency, timeout, poll_interval))

    def delete(self) -> None:
        """Deletes the group; the API server then deletes its trajectory Sandboxes (already gone is fine)."""
        self._run(self._delete_plan())

    def __enter__(self) -> RolloutGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.delete_on_exit:
            self.delete()


class SandboxClient(Driver, _core.ClientCore):
    """Synchronous client of the Orchard Env gateway.

    ``base_url`` and ``token`` default to ``ORCHARD_GATEWAY_URL`` and ``ORCHARD_TOKEN`` (or
    ``ORCHARD_TOKEN_FILE``), then to the in-cluster gateway Service and the pod's service-account
    token; ``namespace`` to ``ORCHARD_NAMESPACE``, then the pod's namespace. With ``direct=True``,
    sandboxes send exec, process, file and patch calls straight to the agent at the IP of the
    sandbox's own Ready pod with that pod's token; a handle asks the gateway for both once
    (``GET .../sandboxes/{name}/token``, which needs RBAC ``get`` on ``sandboxes/token``). Lifecycle
    calls still go through the gateway. ``kube_server``, ``kube_token`` and ``kube_ca_file`` are
    deprecated and ignored (a ``DeprecationWarning`` when given): direct mode no longer reads the
    Kubernetes API.
    """

    _sandbox_type = Sandbox
    _group_type = RolloutGroup
    _snapshot_type = Snapshot

    def _gateway(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._run(self._gateway_plan(method, path, **kwargs))

    # -- sandboxes ------------------------------------------------------------------------------

    def create(
        self, image: str | None = None, *, name: str | None = None, generate_name: str | None = None, namespace: str | None = None,
        labels: Mapping[str, str] | None = None, annotations: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
        cpu: str | int | float | None = None, memory: str | None = None, ttl_seconds: int | None = None, heartbeat_timeout_seconds: int | None = None,
        network: str | Mapping[str, Any] | None = None, from_snapshot: str | Snapshot | None = None,
        spec: Mapping[str, Any] | None = None, wait: bool = True,
        wait_timeout: float | None = _ops.DEFAULT_WAIT_TIMEOUT, delete_on_exit: bool = True, auto_heartbeat: bool = True,
        direct: bool | None = None, on_progress: Callable[[SandboxProgress], None] | None = None, **spec_fields: Any) -> Sandbox:
        """Creates a sandbox from ``image`` (or a full ``spec``) and, with ``wait`` (default), waits until
        it is Ready. Returns its handle, a context manager: ``with client.create(...) as sbx:``.

        Other spec fields go as keywords (``working_dir=``, ``run=``, ``startup=``, ``node_selector=``...);
        ``pool="name"`` claims a warm member of that SandboxPool (no ``image`` needed: the pool's template
        gives it; ``when_pool_empty="Wait"`` waits for a member instead of starting cold).
        ``from_snapshot`` (a :class:`Snapshot` or its name) starts the sandbox from a snapshot's filesystem
        instead of ``image``; it waits (phase Pending, reason ``SnapshotNotReady``) until the snapshot is
        Ready.

        The wait returns early with :class:`~orchard_env.SandboxStalled` or
        :class:`~orchard_env.SandboxFailed`, and gives up after ``wait_timeout`` seconds with
        :class:`~orchard_env.Timeout` (see :meth:`wait_ready`); with ``delete_on_exit`` the sandbox is
        deleted before the error is raised. ``on_progress`` follows the wait as in :meth:`wait_ready`.

        ``heartbeat_timeout_seconds`` (None: 600) is how long the sandbox lives without a heartbeat. The
        open handle heartbeats every third of it (``auto_heartbeat``), so a sandbox outlives its trainer by
        at most that; ``0`` turns the deadline off. A pool claim (``pool=``) gets no default: the pool
        template's lifecycle applies. The TTL (``ttl_seconds``, else the operator's default, 2 h) ends
        the sandbox whatever the heartbeats. With ``delete_on_exit`` the handle deletes the sandbox when
        it is closed, when the interpreter exits and when the process gets SIGTERM."""
        plan = self._create_plan(
            namespace, wait=wait, wait_timeout=wait_timeout, delete_on_exit=delete_on_exit, auto_heartbeat=auto_heartbeat,
            direct=direct, on_progress=on_progress, image=image, name=name, generate_name=generate_name, labels=labels, annotations=annotations,
            env=env, cpu=cpu, memory=memory, ttl_seconds=ttl_seconds, heartbeat_timeout_seconds=heartbeat_timeout_seconds,
            network=network, spec=spec, extra=_ops.with_snapshot(spec_fields, from_snapshot))
        return self._create_handle(plan)

    def connect(
        self, name: str, *, namespace: str | None = None, delete_on_exit: bool = False,
        auto_heartbeat: bool = True, direct: bool | None = None,
    ) -> Sandbox:
        """A handle on the existing sandbox ``name``. While open it heartbeats the sandbox
        (``auto_heartbeat``, once the sandbox is Ready and has a heartbeat timeout); closing it deletes the
        sandbox only with ``delete_on_exit``."""
        return self._run(self._connect_plan(name, namespace, delete_on_exit, auto_heartbeat, direct))

    def get(self, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        """The Sandbox object ``name``, as ``kubectl get sandbox <name> -o json`` shows it
        (:class:`~orchard_env.NotFound` if there is none)."""
        return self._run(self._get_plan(name, namespace))

    def list(self, *, label_selector: str | None = None, namespace: str | None = None) -> builtins.list[dict[str, Any]]:
        """The Sandbox objects of the namespace, optionally only those matching ``label_selector``
        (``"suite=sdk"``)."""
        return self._run(self._list_plan("sandboxes", label_selector, namespace))

    def delete(self, name: str, *, namespace: str | None = None) -> None:
        """Deletes the sandbox ``name`` (:class:`~orchard_env.NotFound` if there is none)."""
        self._run(self._delete_plan(name, namespace))

    # -- rollout groups -------------------------------------------------------------------------

    def create_rollout_group(
        self, template: Mapping[str, Any], *, group_size: int | None = None, max_trajectories: int | None = None,
        stride: int | None = None, positive_fraction: tuple[float, float] | Mapping[str, float] | None = None,
        early_stop: str | None = None, filter: Mapping[str, Any] | bool | None = None, trajectory_timeout_seconds: int | None = None,
        cleanup: str | None = None, queue: str | None = None, active_deadline_seconds: int | None = None,
        retry: Mapping[str, Any] | None = None, launch_jitter_seconds: float | None = None,
        name: str | None = None, generate_name: str | None = None, labels: Mapping[str, str] | None = None,
        namespace: str | None = None, delete_on_exit: bool = True) -> RolloutGroup:
        """Creates a RolloutGroup whose trajectories run in sandboxes made from ``template`` (a sandbox
        shorthand such as ``{"image": ..., "run": {"command": [...]}}``, or ``{"metadata": ..., "spec":
        ...}``). ``queue`` names a RolloutQueue of the namespace: each stride waits for its admission (phase
        ``Queued``) before launching. ``active_deadline_seconds`` is the group's own deadline from its first
        admitted stride: trajectories still without an outcome then are aborted (``DeadlineExceeded``) and the
        group is recorded from what finished. ``retry`` retries trajectories that ran out of memory or lost
        their pod (``{"max_attempts": 3, "on_oom": {"memory_factor": 2, "max_memory": "8Gi"}, "on_eviction":
        True}``; docs/API.md). ``launch_jitter_seconds`` spreads the starts of each stride (default 1 s, 0 for
        none). Returns the group's handle at once; call :meth:`RolloutGroup.wait` or
        :meth:`RolloutGroup.drive`."""
        return self._run(self._create_group_plan(
            template, namespace, delete_on_exit, name=name, generate_name=generate_name, labels=labels,
            group_size=group_size, max_trajectories=max_trajectories, stride=stride, positive_fraction=positive_fraction,
            early_stop=early_stop, filter=filter, trajectory_timeout_seconds=trajectory_timeout_seconds, cleanup=cleanup,
            queue=queue, active_deadline_seconds=active_deadline_seconds, retry=retry,
            launch_jitter_seconds=launch_jitter_seconds))

    def rollout_group(self, name: str, *, namespace: str | None = None, delete_on_exit: bool = False) -> RolloutGroup:
        """A handle on the existing RolloutGroup ``name`` (no request is made); leaving its ``with`` block
        deletes the group only with ``delete_on_exit``."""
        return RolloutGroup(self, name, namespace or self.namespace, delete_on_exit=delete_on_exit)

    def list_rollout_groups(self, *, label_selector: str | None = None, namespace: str | None = None) -> builtins.list[GroupResult]:
        """The RolloutGroups of the namespace, optionally only those matching ``label_selector``."""
        return self._run(self._list_groups_plan(label_selector, namespace))

    # -- snapshots ------------------------------------------------------------------------------

    def snapshot(self, name: str, *, namespace: str | None = None) -> Snapshot:
        """A handle on the existing SandboxSnapshot ``name``, read now (:class:`~orchard_env.NotFound` if there
        is none)."""
        return self._run(self._get_snapshot_plan(name, namespace))

    def list_snapshots(self, *, label_selector: str | None = None, namespace: str | None = None) -> builtins.list[Snapshot]:
        """The SandboxSnapshots of the namespace, optionally only those matching ``label_selector``."""
        return self._run(self._list_snapshots_plan(label_selector, namespace))

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the client's HTTP connections. Close the sandbox handles first: they use them (the exit
        cleanup of handles still open does not)."""
        self._close_http()

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Process", "RolloutGroup", "Sandbox", "SandboxClient", "Session", "Snapshot"]
