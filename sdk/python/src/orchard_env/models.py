"""Typed views of the gateway's and agent's JSON answers. Every model keeps the full JSON in ``raw``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command."""

    exit_code: int | None
    """Exit code; None when a signal killed the command (see :attr:`signal`)."""
    stdout: str
    stderr: str
    timed_out: bool
    """True when ``timeout`` killed the command's process group."""
    stdout_truncated: bool
    stderr_truncated: bool
    duration: float
    """Run time in seconds, measured by the agent."""
    signal: int | None = None
    """Number of the signal that killed the command, if one did."""
    oom_killed: bool = False
    """True when the out-of-memory killer killed it: the sandbox's memory limit was reached (a resource
    problem, not the command's fault; run it again with more ``memory``)."""
    stdout_lossy: bool = False
    """True when stdout was not valid UTF-8 and invalid bytes became U+FFFD (``output_encoding`` text)."""
    stderr_lossy: bool = False
    """True when stderr was not valid UTF-8 and invalid bytes became U+FFFD (``output_encoding`` text)."""
    output_encoding: str = "text"
    """How ``stdout`` and ``stderr`` are encoded: ``text`` (UTF-8) or ``base64`` (exact bytes)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Exit code 0 and no timeout."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        """Whether either stream hit ``max_output_bytes``."""
        return self.stdout_truncated or self.stderr_truncated

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecResult:
        return cls(
            exit_code=data.get("exitCode"),
            stdout=data.get("stdout", ""),
            stderr=data.get("stderr", ""),
            timed_out=bool(data.get("timedOut")),
            stdout_truncated=bool(data.get("stdoutTruncated")),
            stderr_truncated=bool(data.get("stderrTruncated")),
            duration=float(data.get("durationMs") or 0) / 1000.0,
            signal=data.get("signal"),
            oom_killed=bool(data.get("oomKilled")),
            stdout_lossy=bool(data.get("stdoutLossy")),
            stderr_lossy=bool(data.get("stderrLossy")),
            output_encoding=str(data.get("outputEncoding") or "text"),
            raw=data,
        )


@dataclass(frozen=True)
class ExecEvent:
    """One event of a streamed command: ``started`` (pid), ``stdout``/``stderr`` (data) or ``exit``
    (``exit_code``, ``signal``, ``timed_out``, ``oom_killed``)."""

    type: str
    data: str = ""
    pid: int | None = None
    exit_code: int | None = None
    timed_out: bool = False
    signal: int | None = None
    """``exit``: number of the signal that killed the command, if one did."""
    oom_killed: bool = False
    """``exit``: True when the out-of-memory killer killed the command."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecEvent:
        return cls(
            type=str(data.get("type", "")),
            data=data.get("data", "") or "",
            pid=data.get("pid"),
            exit_code=data.get("exitCode"),
            timed_out=bool(data.get("timedOut")),
            signal=data.get("signal"),
            oom_killed=bool(data.get("oomKilled")),
            raw=data,
        )


@dataclass(frozen=True)
class ProcessInfo:
    """Status of a background process."""

    id: str
    state: str
    """``running`` or ``exited``."""
    pid: int | None
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    signal: int | None = None
    """Number of the signal that ended it, if one did."""
    oom_killed: bool = False
    """True when the out-of-memory killer killed it."""
    stdin_open: bool = False
    """True while its stdin can be written (started with ``keep_stdin`` or ``pty``, not closed yet)."""
    pty: bool = False
    """True when it runs on a pseudo-terminal (its output is all ``stdout``)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def running(self) -> bool:
        """Whether the process is still running."""
        return self.state == "running"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessInfo:
        return cls(
            id=str(data.get("id", "")),
            state=str(data.get("state", "")),
            pid=data.get("pid"),
            exit_code=data.get("exitCode"),
            stdout=data.get("stdout", "") or "",
            stderr=data.get("stderr", "") or "",
            timed_out=bool(data.get("timedOut")),
            signal=data.get("signal"),
            oom_killed=bool(data.get("oomKilled")),
            stdin_open=bool(data.get("stdinOpen")),
            pty=bool(data.get("pty")),
            raw=data,
        )


@dataclass(frozen=True)
class SessionInfo:
    """Status of a shell session (:meth:`Sandbox.session`)."""

    id: str
    """Session id (``s-<hex>``)."""
    shell: str
    """The shell the session runs (``/bin/bash``, else ``/bin/sh``, unless one was named)."""
    pid: int | None
    """OS process id of the shell (it leads its own process group)."""
    state: str
    """``running``, or ``exited`` once the shell has ended (a command ran ``exit``, or it was killed)."""
    exit_code: int | None
    """The shell's exit code once it has exited (None while running, or when killed by a signal)."""
    busy: bool
    """Whether a run is in progress."""
    started_at: str
    """Start time (RFC 3339)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def running(self) -> bool:
        """Whether the shell is still running."""
        return self.state == "running"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionInfo:
        return cls(
            id=str(data.get("id", "")),
            shell=str(data.get("shell", "")),
            pid=data.get("pid"),
            state=str(data.get("state", "")),
            exit_code=data.get("exitCode"),
            busy=bool(data.get("busy")),
            started_at=str(data.get("startedAt", "")),
            raw=data,
        )


@dataclass(frozen=True)
class SessionRunResult:
    """The outcome of one command run in a shell session (:meth:`Session.run`)."""

    output: str
    """Standard output and standard error of the command, interleaved as written."""
    exit_code: int | None
    """The command's exit status (``$?``; 130 when the timeout interrupted it); the shell's exit code when
    the command ended the shell; None when the shell was killed by a signal."""
    timed_out: bool
    """True when the timeout interrupted the command (the session stays usable)."""
    output_truncated: bool
    """True when the output exceeded the session's ``max_output_bytes`` (or the agent's output budget)."""
    output_lossy: bool
    """True when the output was not valid UTF-8 and invalid bytes became U+FFFD."""
    output_encoding: str
    """How ``output`` is encoded: ``text`` (UTF-8) or ``base64``."""
    duration: float
    """Run time in seconds, measured by the agent."""
    shell_exited: bool
    """True when the command ended the shell (``exit``, or a signal): the session has ended."""
    shell_restarted: bool
    """True when the interrupted command could not be stopped without ending the shell, so a fresh shell
    was started in the session (``cd``, variables and functions are lost)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Exit code 0 and no timeout."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionRunResult:
        return cls(
            output=data.get("output", "") or "",
            exit_code=data.get("exitCode"),
            timed_out=bool(data.get("timedOut")),
            output_truncated=bool(data.get("outputTruncated")),
            output_lossy=bool(data.get("outputLossy")),
            output_encoding=str(data.get("outputEncoding") or "text"),
            duration=float(data.get("durationMs") or 0) / 1000.0,
            shell_exited=bool(data.get("shellExited")),
            shell_restarted=bool(data.get("shellRestarted")),
            raw=data,
        )


@dataclass(frozen=True)
class SessionSignalResult:
    """What :meth:`Session.signal` and :meth:`Session.interrupt` answer, at once (the run answers on its own
    once its command has ended)."""

    running: bool
    """Whether a run was in progress, so its command got the signal; False: nothing was signalled."""
    session: SessionInfo
    """The session's status just after the signal (``busy`` stays True until the run has answered)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionSignalResult:
        return cls(
            running=bool(data.get("running")),
            session=SessionInfo.from_json(data.get("session") or {}),
            raw=data,
        )


@dataclass(frozen=True)
class SessionReadResult:
    """What :meth:`Session.read` got: the session's output not read before, up to and including ``until``
    when it came."""

    output: str
    """Output not read before: up to and including ``until`` when it matched, else all of it."""
    matched: bool
    """Whether ``until`` was seen (always False without ``until``)."""
    output_truncated: bool
    """True when output was dropped at the session's cap (or the agent's output budget)."""
    output_lossy: bool
    """True when the output was not valid UTF-8 and invalid bytes became U+FFFD."""
    output_encoding: str
    """How ``output`` is encoded: ``text`` (UTF-8) or ``base64``."""
    shell_exited: bool
    """Whether the shell has exited (no more output will come)."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionReadResult:
        return cls(
            output=data.get("output", "") or "",
            matched=bool(data.get("matched")),
            output_truncated=bool(data.get("outputTruncated")),
            output_lossy=bool(data.get("outputLossy")),
            output_encoding=str(data.get("outputEncoding") or "text"),
            shell_exited=bool(data.get("shellExited")),
            raw=data,
        )


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory listing."""

    name: str
    type: str
    """``file``, ``directory``, ``symlink`` or ``other``."""
    size: int
    mode: int
    modified: str
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileEntry:
        return cls(
            name=str(data.get("name", "")),
            type=str(data.get("type", "")),
            size=int(data.get("size") or 0),
            mode=int(data.get("mode") or 0),
            modified=str(data.get("modified", "")),
            raw=data,
        )


@dataclass(frozen=True)
class PatchResult:
    """A patch that applied: the files it touched with their action (created, modified, deleted)."""

    files: list[dict[str, str]]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PatchResult:
        return cls(files=list(data.get("files") or []), raw=data)


@dataclass(frozen=True)
class SandboxProgress:
    """What a sandbox being waited for is doing, as ``create()`` and ``wait_ready()`` hand it to their
    ``on_progress`` callback each time it changes (also logged at INFO on the ``orchard_env`` logger)."""

    name: str
    namespace: str
    phase: str | None
    """Pending, Starting, Ready... (None before the operator's first status write)."""
    reason: str | None
    """The Ready condition's reason (``NotScheduled``, ``AgentStarting``, ``PolicyEnforcementMissing``...)."""
    message: str | None
    """The Ready condition's message: what the sandbox waits for, in the operator's words."""
    elapsed: float
    """Seconds since the wait began."""

    def __str__(self) -> str:
        text = f"sandbox {self.namespace}/{self.name}: phase {self.phase or 'unknown'}"
        if self.reason:
            text += f", reason {self.reason}"
        if self.message:
            text += f": {self.message}"
        return text + f" ({self.elapsed:.1f}s)"


@dataclass(frozen=True)
class GroupMember:
    """One member of a RolloutGroup's selected group."""

    name: str
    reward: float
    status: str
    length: int
    artifact: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupMember:
        return cls(
            name=str(data.get("name", "")),
            reward=float(data.get("reward") or 0.0),
            status=str(data.get("status", "")),
            length=int(data.get("length") or 0),
            artifact=data.get("artifact"),
            raw=data,
        )


@dataclass(frozen=True)
class Trajectory:
    """One launched trajectory of a RolloutGroup."""

    name: str
    stride: int
    status: str | None
    reward: float | None
    length: int | None
    artifact: str | None
    reason: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    attempts: int = 1
    """Attempts launched so far (``retry``), the first included."""
    waiting: str | None = None
    """Why a retried attempt has not started (``"Unschedulable: 0/2 nodes ... Insufficient memory."``)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        return cls(
            name=str(data.get("name", "")),
            stride=int(data.get("stride") or 0),
            status=data.get("status"),
            reward=data.get("reward"),
            length=data.get("length"),
            artifact=data.get("artifact"),
            reason=data.get("reason"),
            raw=data,
            attempts=int(data.get("attempts") or 1),
            waiting=data.get("waiting"),
        )


@dataclass(frozen=True)
class TrajectoryResult:
    """A trajectory's outcome as a driver records it (``POST .../sandboxes/{name}/result``, write-once).

    ``reward`` is required unless ``status`` is ``aborted``; ``> 0`` counts as positive."""

    reward: float | None = None
    status: str = "completed"
    """``completed``, ``truncated`` (cut at a length limit but usable) or ``aborted`` (unusable)."""
    length: int | None = None
    """Tokens or steps; shorter ranks first among equals."""
    artifact: str | None = None
    """An opaque pointer to the payload (tokens, logprobs), at most 4096 characters."""
    exit_code: int | None = None
    reason: str | None = None
    """A CamelCase reason (at most 128 characters), usually for ``aborted``."""
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The request body: the fields that are set, with the API's names."""
        body: dict[str, Any] = {"status": self.status}
        for key, value in (
            ("reward", self.reward), ("length", self.length), ("artifact", self.artifact),
            ("exitCode", self.exit_code), ("reason", self.reason), ("message", self.message),
        ):
            if value is not None:
                body[key] = value
        return body

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrajectoryResult:
        return cls(
            reward=data.get("reward"),
            status=str(data.get("status") or "completed"),
            length=data.get("length"),
            artifact=data.get("artifact"),
            exit_code=data.get("exitCode"),
            reason=data.get("reason"),
            message=data.get("message"),
        )


@dataclass(frozen=True)
class GroupResult:
    """A RolloutGroup as a trainer reads it: phase (Pending, Queued, Generating, Complete or Failed),
    selection and the reward-balanced group."""

    name: str
    namespace: str
    phase: str | None
    selection: str | None
    """Balanced, Relaxed, TopRanked or Dropped (then ``group`` is empty)."""
    positives: int | None
    group: list[GroupMember]
    trajectories: list[Trajectory]
    drop_reason: str | None
    message: str | None
    queue_position: int | None = None
    """While a stride waits for admission by the group's RolloutQueue: its 1-based place in the queue
    (as of the group's last reconcile); None otherwise."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def queued(self) -> bool:
        """Whether a stride waits for admission by the group's RolloutQueue (phase ``Queued``)."""
        return self.phase == "Queued"

    @property
    def complete(self) -> bool:
        """Whether the group is recorded (``Complete=True``)."""
        status = self.raw.get("status") or {}
        return any(
            c.get("type") == "Complete" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ) or self.phase == "Complete"

    @property
    def rewards(self) -> list[float]:
        """Rewards of the group's members, in group order."""
        return [m.reward for m in self.group]

    @property
    def artifacts(self) -> list[str | None]:
        """Artifact pointers of the group's members, in group order."""
        return [m.artifact for m in self.group]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupResult:
        meta = data.get("metadata") or {}
        status = data.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "")),
            phase=status.get("phase"),
            selection=status.get("selection"),
            positives=status.get("positives"),
            group=[GroupMember.from_json(m) for m in status.get("group") or []],
            trajectories=[Trajectory.from_json(t) for t in status.get("trajectories") or []],
            drop_reason=status.get("dropReason"),
            message=status.get("message"),
            queue_position=status.get("queuePosition"),
            raw=data,
        )


@dataclass(frozen=True)
class EpisodeOutcome:
    """One episode that :meth:`~orchard_env.RolloutGroup.drive` ran, as the trainer keeps it: what it
    posted, the payload the episode returned beside its result (kept in this process only: never sent to
    the gateway), and where BAR put the trajectory."""

    name: str
    """The trajectory Sandbox's name, ``<group>-<index>`` (the name in ``group`` and ``trajectories``)."""
    index: int
    """The trajectory's index."""
    result: TrajectoryResult | None
    """What ``drive`` posted for it (``aborted``/``EpisodeFailed`` when the episode raised); None when it
    posted nothing (the episode was cancelled: the group completed first, async client)."""
    payload: Any = field(default=None, repr=False)
    """The second item of a ``(result, payload)`` pair the episode returned (tokens, logprobs, messages);
    None when it returned a result alone, raised or was cancelled."""
    error: BaseException | None = None
    """The exception the episode raised (or ``CancelledError``); None when it returned."""
    recorded: bool = False
    """Whether the gateway recorded ``result``. False when the Sandbox was gone or already had a result
    (the controller had aborted it): then ``trajectory`` holds what was recorded instead."""
    member: GroupMember | None = None
    """Its entry in the balanced group when BAR selected it; None otherwise."""
    trajectory: Trajectory | None = None
    """Its entry in the group's ``trajectories`` (the outcome the operator recorded)."""

    @property
    def in_group(self) -> bool:
        """Whether BAR put the trajectory in the recorded group."""
        return self.member is not None


@dataclass(frozen=True)
class DriveResult(GroupResult):
    """What :meth:`~orchard_env.RolloutGroup.drive` returns: the recorded group (a :class:`GroupResult`,
    so ``selection``, ``group``, ``rewards``... work as before) plus every episode it ran, by trajectory
    name, with its payload."""

    episodes: dict[str, EpisodeOutcome] = field(default_factory=dict, repr=False)
    """Every episode ``drive`` started, by trajectory name (``<group>-<index>``), whether BAR selected the
    trajectory or not (see :attr:`EpisodeOutcome.in_group`). Trajectories whose Sandbox failed or vanished
    before an episode could start have none (they are in ``trajectories``)."""

    @property
    def payloads(self) -> list[Any]:
        """The payloads of the group's members, in group order (as ``rewards`` and ``artifacts``); None
        for a member without one (an aborted backfill member, or an episode that returned no payload)."""
        return [
            outcome.payload if (outcome := self.episodes.get(member.name)) is not None else None
            for member in self.group
        ]

    @classmethod
    def of(cls, group: GroupResult, outcomes: list[EpisodeOutcome]) -> DriveResult:
        """``group`` with ``outcomes``, each told its group member and recorded trajectory (pure)."""
        members = {m.name: m for m in group.group}
        trajectories = {t.name: t for t in group.trajectories}
        episodes = {
            o.name: replace(o, member=members.get(o.name), trajectory=trajectories.get(o.name))
            for o in sorted(outcomes, key=lambda o: o.index)
        }
        fields = {f.name: getattr(group, f.name) for f in dataclasses.fields(GroupResult)}
        return cls(**fields, episodes=episodes)
