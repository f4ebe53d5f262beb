"""Orchard Env: isolated sandboxes for RL trainers and reward-balanced rollout groups (BAR), through
the operator's gateway.

>>> from orchard_env import SandboxClient
>>> with SandboxClient() as client, client.create(image="python:3.11") as sbx:   # doctest: +SKIP
...     print(sbx.exec(["python3", "-c", "print(6 * 7)"]).stdout)
"""

from ._retry import RetryPolicy
from ._version import __version__
from .aio import AsyncProcess, AsyncRolloutGroup, AsyncSandbox, AsyncSandboxClient, AsyncSession
from .client import Process, RolloutGroup, Sandbox, SandboxClient, Session
from .dispatch import AsyncDispatcher, Dispatcher, DispatchResult, DispatchStats, GroupRequest
from .errors import (
    AgentUnavailable,
    CommandFailed,
    Conflict,
    Forbidden,
    GatewayUnreachable,
    InvalidRequest,
    NotFound,
    NotReady,
    OrchardError,
    PatchConflict,
    SandboxFailed,
    SandboxStalled,
    Timeout,
    TooManyRequests,
    Unauthorized,
)
from .models import (
    DriveResult,
    EpisodeOutcome,
    ExecEvent,
    ExecResult,
    FileEntry,
    GroupMember,
    GroupResult,
    PatchResult,
    ProcessInfo,
    SandboxProgress,
    SessionInfo,
    SessionReadResult,
    SessionRunResult,
    SessionSignalResult,
    Trajectory,
    TrajectoryResult,
)
from .pipeline import AsyncPipeline, Pipeline, PipelineResult, PipelineStats, Stage, StageFailed

__all__ = [
    "AgentUnavailable",
    "AsyncDispatcher",
    "AsyncPipeline",
    "AsyncProcess",
    "AsyncRolloutGroup",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AsyncSession",
    "CommandFailed",
    "Conflict",
    "DispatchResult",
    "DispatchStats",
    "Dispatcher",
    "DriveResult",
    "EpisodeOutcome",
    "ExecEvent",
    "ExecResult",
    "FileEntry",
    "Forbidden",
    "GatewayUnreachable",
    "GroupMember",
    "GroupRequest",
    "GroupResult",
    "InvalidRequest",
    "NotFound",
    "NotReady",
    "OrchardError",
    "PatchConflict",
    "PatchResult",
    "Pipeline",
    "PipelineResult",
    "PipelineStats",
    "Process",
    "ProcessInfo",
    "RetryPolicy",
    "RolloutGroup",
    "Sandbox",
    "SandboxClient",
    "SandboxFailed",
    "SandboxProgress",
    "SandboxStalled",
    "Session",
    "SessionInfo",
    "SessionReadResult",
    "SessionRunResult",
    "SessionSignalResult",
    "Stage",
    "StageFailed",
    "Timeout",
    "TooManyRequests",
    "Trajectory",
    "TrajectoryResult",
    "Unauthorized",
    "__version__",
]
