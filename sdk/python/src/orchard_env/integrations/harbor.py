"""A `Harbor <https://github.com/laude-institute/harbor>`_ environment (Terminal-Bench 2.0's framework,
Harbor 0.25.x, Python >= 3.12) whose tasks run in Orchard Env sandboxes (``make harbor-venv``, or
``pip install './sdk/python[harbor]'``).

Harbor picks it by import path::

    harbor run -p ./tasks -a oracle --env orchard_env.integrations.harbor:OrchardEnvironment \\
        --ek namespace=rl --ek ttl_seconds=7200

The gateway and the token come from ``ORCHARD_GATEWAY_URL`` and ``ORCHARD_TOKEN`` (or
``ORCHARD_TOKEN_FILE``), never from the environment's kwargs: Harbor writes those into every trial's
``config.json``. What maps to what (docs/HARNESSES.md, "Harbor", has the whole table):

- ``start``: one Sandbox per trial from the task's prebuilt ``docker_image`` (Orchard builds no images:
  a task with only ``environment/Dockerfile`` is refused when the environment is made, naming
  ``docker_image`` and how to prebuild it), or a claim from the SandboxPool named by ``pool``;
  ``cpus``/``memory_mb``/``storage_mb`` become ``resources`` (``cpu``, ``memory``, ``ephemeralStorage``;
  requests equal limits), and ``gpus > 0`` becomes ``resources.gpu``: ``count`` GPUs, with ``gpu_types``
  as ``types`` when the task lists any (any one of them will do; the operator's GPU type map, Helm value
  ``gpu.types``, says which node label each name selects, and an unknown name fails the sandbox with
  reason ``PlacementRefused``); the network policy becomes ``spec.network``. A sandbox that cannot start
  (placement refused, quota exceeded, image pull, startup timeout) raises :class:`SandboxStartError`
  with the sandbox's own phase, reason and message.
- ``exec``: ``bash -c <command>`` through the agent, with ``cwd`` (else the task's ``workdir``, else the
  image's), ``env`` (Harbor's persistent and scoped variables merged in), ``user`` (the agent switches
  users: it must run as root for any other user) and ``timeout_sec``, after which the agent SIGKILLs the
  command's whole process group; the answer is then ``return_code`` 124 and "Command timed out after N
  seconds" appended to ``stderr``, as Harbor's Kubernetes backends (GKE, ACK) answer. stdout and stderr
  stay apart (Docker's backend merges them into ``stdout``); an empty stream is ``None``; a command
  killed by a signal is ``128 + signal``. Gateway errors (the sandbox is gone, access revoked) raise
  :class:`~orchard_env.errors.OrchardError`: they are not the command's outcome.
- Files: ``upload_file`` (mode kept; into a directory when the target is one, as ``docker cp``),
  ``upload_dir``/``download_dir`` as one tar stream (modes and symlinks kept), ``download_file``.
  ``is_dir``/``is_file`` and ``run_healthcheck`` are Harbor's own (``test -d``/``test -f`` and its
  Docker-HEALTHCHECK loop) on this ``exec``.
- Network: ``public`` is egress ``AllowAll``, ``no-network`` ``Deny``, ``allowlist`` ``AllowList`` with
  host names (``*.x`` wildcards) as ``host`` entries, reached through the operator's egress proxy, and
  IP addresses and ranges as ``cidr`` entries. The policy switches live (``set_network``) between
  Harbor's agent and verifier phases.
- ``stop(delete)``: deletes the sandbox, or with ``--no-delete`` leaves it to its TTL and heartbeat
  timeout.
- ``preflight``: the gateway answers, and the caller's RBAC allows everything a trial does; it names
  each missing rule.
"""

from __future__ import annotations

import contextlib
import io
import re
import secrets
import shlex
import stat
from collections.abc import Mapping, Sequence
from ipaddress import ip_address
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.tar_transfer import extract_dir
from harbor.models.task.config import (
    NetworkAllowlistEntryType,
    NetworkMode,
    NetworkPolicy,
    classify_network_allowlist_entry,
)

from .. import _ops
from .._retry import RetryPolicy
from ..aio import AsyncSandbox, AsyncSandboxClient
from ..client import SandboxClient
from ..errors import (
    Forbidden,
    GatewayUnreachable,
    InvalidRequest,
    NotFound,
    OrchardError,
    SandboxFailed,
    Timeout,
    Unauthorized,
)
from ..models import ExecResult as SandboxExecResult

#: What :meth:`OrchardEnvironment.type` answers (Harbor records it in trial results).
ENVIRONMENT_TYPE = "orchard"
#: The command timeout of an ``exec`` Harbor gives none (``timeout_sec=None``): Harbor then bounds the
#: call itself (``asyncio.wait_for``), so the agent's own default (600 s) must not apply. Just under the
#: gateway's longest answer wait (24 h).
NO_TIMEOUT_SECONDS = 86_000.0
#: The exit code of a command that ran out of its ``timeout_sec`` (``timeout(1)``'s, as Harbor's GKE,
#: ACK and EC2 backends answer).
TIMEOUT_EXIT_CODE = 124
#: Exit code of a command the agent refused to start (no such working directory or user), as a shell
#: answers for a command it cannot execute.
CANNOT_EXECUTE_EXIT_CODE = 126
#: Cap per output stream of one ``exec`` (the agent's own default is 4 MiB; Docker's backend has none).
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024 * 1024
#: Seconds ``set_network_policy`` waits for the egress proxy to enforce new host rules (at most 60).
DEFAULT_NETWORK_WAIT = 30.0
#: Label of every sandbox this environment creates.
MANAGED_BY = {"app.kubernetes.io/managed-by": "harbor"}

#: The permissions a trial uses (API group ``orchard.dev``), as ``(verb, resource)``, in the order
#: :func:`check_access` checks them.
REQUIRED_ACCESS: tuple[tuple[str, str], ...] = (
    ("create", "sandboxes"),
    ("get", "sandboxes"),
    ("delete", "sandboxes"),
    ("create", "sandboxes/exec"),
    ("create", "sandboxes/files"),
    ("get", "sandboxes/files"),
    ("update", "sandboxes/network"),
    ("create", "sandboxes/heartbeat"),
)


class OrchardEnvironmentError(RuntimeError):
    """Base class of this environment's own errors."""


class DockerImageRequired(OrchardEnvironmentError):
    """The task has no prebuilt image (``[environment].docker_image``), or is a multi-container
    (docker-compose) task: Orchard Env runs one prebuilt image per sandbox and builds nothing."""


class SandboxStartError(OrchardEnvironmentError):
    """The sandbox did not become Ready. :attr:`phase`, :attr:`reason` and :attr:`condition_message`
    are the sandbox's own (``PlacementRefused``, ``QuotaExceeded``, ``ImagePullBackOff``,
    ``StartupTimeout``, ``NotScheduled``...); ``__cause__`` is the SDK's error."""

    def __init__(self, message: str, *, phase: str | None = None, reason: str | None = None,
                 condition_message: str | None = None) -> None:
        super().__init__(message)
        self.phase = phase
        self.reason = reason
        self.condition_message = condition_message


# -- pure mappings -------------------------------------------------------------------------------------


def allow_entry(entry: str) -> dict[str, str]:
    """The ``spec.network.allow[]`` entry of one Harbor ``allowed_hosts`` entry (already validated and
    normalised by Harbor): a host name or a ``*.`` wildcard is a ``host`` (reached through the egress
    proxy), an IP address a one-address ``cidr``, a range a ``cidr``."""
    kind = classify_network_allowlist_entry(entry)
    if kind in (NetworkAllowlistEntryType.HOSTNAME, NetworkAllowlistEntryType.WILDCARD_HOSTNAME):
        return {"host": entry}
    if kind == NetworkAllowlistEntryType.IPV4_ADDRESS:
        return {"cidr": f"{entry}/32"}
    if kind == NetworkAllowlistEntryType.IPV6_ADDRESS:
        return {"cidr": f"{ip_address(entry).compressed}/128"}
    return {"cidr": entry}


def network_spec(policy: NetworkPolicy) -> dict[str, Any]:
    """The Sandbox's ``spec.network`` for a Harbor network policy (pure)."""
    if policy.network_mode == NetworkMode.PUBLIC:
        return {"egress": "AllowAll"}
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return {"egress": "Deny"}
    spec: dict[str, Any] = {"egress": "AllowList"}
    allow = [allow_entry(entry) for entry in policy.allowed_hosts]
    if allow:
        spec["allow"] = allow
    return spec


def cpu_quantity(cpus: int | float) -> str:
    """A Kubernetes CPU quantity for Harbor's ``cpus`` (``2`` -> ``"2"``, ``0.5`` -> ``"500m"``)."""
    if float(cpus).is_integer():
        return str(int(cpus))
    return f"{round(float(cpus) * 1000)}m"


def sandbox_resources(cpus: int | float | None, memory_mb: int | None, storage_mb: int | None,
                      gpus: int | None = None, gpu_types: Sequence[str] | None = None) -> dict[str, Any]:
    """The Sandbox's ``spec.resources`` (requests equal limits) for a task's ``cpus``, ``memory_mb`` and
    ``storage_mb`` (MiB, as Harbor's GKE backend reads them); what is unset takes the operator's default.
    ``gpus > 0`` adds ``gpu``: ``{"count": gpus}``, plus ``"types": gpu_types`` when it lists any (names
    as the task gives them: the operator matches them case-insensitively)."""
    resources: dict[str, Any] = {}
    if cpus is not None:
        resources["cpu"] = cpu_quantity(cpus)
    if memory_mb:
        resources["memory"] = f"{int(memory_mb)}Mi"
    if storage_mb:
        resources["ephemeralStorage"] = f"{int(storage_mb)}Mi"
    if gpus:
        gpu: dict[str, Any] = {"count": int(gpus)}
        if gpu_types:
            gpu["types"] = list(gpu_types)
        resources["gpu"] = gpu
    return resources


def asked_text(image: str | None, resources: Mapping[str, Any], pool: str | None) -> str:
    """What a trial asked for, for a start error (pure): ``image=..., cpu=2, gpu=1 (h100 or a100), pool=...``."""
    def shown(key: str, value: Any) -> str:
        if key == "gpu" and isinstance(value, Mapping):
            types = value.get("types") or []
            return f"gpu={value.get('count')}" + (f" ({' or '.join(types)})" if types else "")
        return f"{key}={value}"
    return ", ".join(shown(k, v) for k, v in {"image": image, **resources, "pool": pool}.items() if v)


def name_prefix(session_id: str) -> str:
    """``generateName`` of a trial's sandbox: its session id as a DNS label prefix (lowercase, ``-``, at
    most 40 characters; the API server appends 5)."""
    text = re.sub(r"[^a-z0-9]+", "-", session_id.lower()).strip("-")[:40].strip("-")
    return f"{text or 'harbor'}-"


def harbor_exec_result(result: SandboxExecResult, timeout_sec: float | None) -> ExecResult:
    """Harbor's :class:`~harbor.environments.base.ExecResult` of the agent's answer (pure): the exit
    code; ``128 + signal`` for a command a signal killed; 124 and "Command timed out after N seconds"
    in ``stderr`` for one that ran out of time. Empty streams are ``None`` (as Docker's backend answers);
    an out-of-memory kill and truncated output are said in ``stderr``."""
    stderr = result.stderr
    notes: list[str] = []
    if result.timed_out:
        seconds = timeout_sec if timeout_sec else NO_TIMEOUT_SECONDS
        notes.append(f"Command timed out after {seconds:g} seconds")
        code = TIMEOUT_EXIT_CODE
    elif result.exit_code is not None:
        code = int(result.exit_code)
    elif result.signal:
        code = 128 + int(result.signal)
    else:
        code = 1
    if result.oom_killed:
        notes.append("Killed by the out-of-memory killer: the sandbox reached its memory limit (memory_mb)")
    if result.stdout_truncated or result.stderr_truncated:
        which = " and ".join(name for name, cut in (("stdout", result.stdout_truncated),
                                                    ("stderr", result.stderr_truncated)) if cut)
        notes.append(f"Output truncated ({which} past max_output_bytes)")
    if notes:
        stderr = "\n".join([stderr.rstrip("\n"), *notes] if stderr.strip() else notes)
    return ExecResult(stdout=result.stdout or None, stderr=stderr or None, return_code=code)


def _refused_start(error: OrchardError, cwd: str | None, user: str | int | None) -> bool:
    """Whether ``error`` is the agent refusing to start a command for its ``cwd`` or ``user`` (a
    result of the command, as ``docker exec -w``/``-u`` answer it), not a failure of the call."""
    if not isinstance(error, InvalidRequest):
        return False
    if error.code == "InvalidCwd":
        return cwd is not None
    return user is not None and error.code == "BadRequest" and "/etc/" in error.message


# -- the environment ----------------------------------------------------------------------------------


class OrchardEnvironment(BaseEnvironment):
    """A Harbor environment on an Orchard Env sandbox (one per trial). Keyword options, from code or as
    ``--ek key=value``:

    - ``namespace``, ``gateway_url``: where (default ``ORCHARD_NAMESPACE``, ``ORCHARD_GATEWAY_URL``); the
      token is always ``ORCHARD_TOKEN``/``ORCHARD_TOKEN_FILE`` (then the pod's service account);
    - ``pool``: claim a warm member of this SandboxPool (``when_pool_empty``: ``ColdStart``, the
      default, or ``Wait``); the task's image and resources must equal the pool template's for a warm
      claim;
    - ``ttl_seconds``, ``heartbeat_timeout_seconds``: the sandbox's lifetime (operator default TTL 2 h;
      the SDK heartbeats while the trial runs);
    - ``wait_timeout_sec``: how long ``start`` waits for Ready (default: the task's
      ``build_timeout_sec`` less 15 s, so the sandbox's own reason is raised before Harbor's start timeout);
    - ``network_wait_sec``: how long a network switch waits for the egress proxy (default 30, at most 60);
    - ``max_output_bytes``: cap per output stream of one ``exec`` (default 64 MiB);
    - ``direct``: exec and file calls straight to the sandbox's pod (SDK ``direct=True``);
    - ``labels``: extra labels of the sandboxes; ``spec_fields``: extra Sandbox spec fields
      (``{"runtimeClassName": "gvisor", "nodeSelector": {...}}``);
    - ``client``: an :class:`~orchard_env.AsyncSandboxClient` to use (from code; not closed by ``stop``).
    """

    def __init__(
        self, environment_dir: Path, environment_name: str, session_id: str, trial_paths: Any,
        task_env_config: Any, *, gateway_url: str | None = None, namespace: str | None = None,
        pool: str | None = None, when_pool_empty: str | None = None, ttl_seconds: int | None = None,
        heartbeat_timeout_seconds: int | None = None, wait_timeout_sec: float | None = None,
        network_wait_sec: float = DEFAULT_NETWORK_WAIT, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        direct: bool = False, labels: Mapping[str, str] | None = None,
        spec_fields: Mapping[str, Any] | None = None, client: AsyncSandboxClient | None = None,
        **kwargs: Any,
    ) -> None:
        self._gateway_url = gateway_url
        self._namespace = namespace
        self._pool = pool
        self._when_pool_empty = when_pool_empty
        self._ttl_seconds = ttl_seconds
        self._heartbeat_timeout_seconds = heartbeat_timeout_seconds
        self._wait_timeout_sec = wait_timeout_sec
        self._network_wait = min(max(float(network_wait_sec), 0.0), _ops.NETWORK_MAX_WAIT)
        self._max_output_bytes = int(max_output_bytes)
        self._direct = bool(direct)
        self._labels = dict(labels or {})
        self._spec_fields = dict(spec_fields or {})
        self._client = client
        self._own_client = client is None
        self._sandbox: AsyncSandbox | None = None
        super().__init__(
            environment_dir=environment_dir, environment_name=environment_name, session_id=session_id,
            trial_paths=trial_paths, task_env_config=task_env_config, **kwargs,
        )

    # -- what Harbor asks of a provider ---------------------------------------------------------------

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        # A Sandbox's resources are requests and limits at once (Guaranteed QoS): every mode but
        # `ignore` gets both.
        return EnvironmentResourceCapabilities(
            cpu_limit=True, cpu_request=True, memory_limit=True, memory_request=True, fractional_cpus=True,
        )

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            gpus=True,
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_cidrs=True,
            dynamic_network_policy=True,
        )

    def _validate_definition(self) -> None:
        if (self.environment_dir / "docker-compose.yaml").exists():
            raise DockerImageRequired(
                f"task {self.environment_name}: multi-container tasks (environment/docker-compose.yaml) are "
                "not supported by Orchard Env, which runs one prebuilt image per sandbox"
            )
        if not self.task_env_config.docker_image:
            dockerfile = self.environment_dir / "Dockerfile"
            how = (
                f"build {dockerfile} and push it to a registry the cluster pulls from, e.g. "
                f"`docker build -t REGISTRY/{self.environment_name}:TAG {self.environment_dir} && "
                f"docker push REGISTRY/{self.environment_name}:TAG`, then set "
                f'docker_image = "REGISTRY/{self.environment_name}:TAG" under [environment] in task.toml'
                if dockerfile.exists() else
                'set docker_image = "REGISTRY/IMAGE:TAG" under [environment] in task.toml'
            )
            raise DockerImageRequired(
                f"task {self.environment_name} has no docker_image: Orchard Env runs sandboxes from prebuilt "
                f"images and does not build environment/Dockerfile; {how}"
            )

    @classmethod
    def preflight(cls) -> None:
        """Before any trial: the gateway (``ORCHARD_GATEWAY_URL``) answers and the caller
        (``ORCHARD_TOKEN``/``ORCHARD_TOKEN_FILE``) may do what a trial does in ``ORCHARD_NAMESPACE``;
        ``SystemExit`` naming each problem (the missing RBAC rules) otherwise. Harbor gives preflight no
        kwargs: ``--ek gateway_url=``/``namespace=`` are not seen here, set the variables."""
        with SandboxClient(retry=RetryPolicy(attempts=2, backoff=0.2, max_backoff=1.0)) as client:
            problems = check_access(client)
            where = f"gateway {client.settings.base_url}, namespace {client.namespace}"
        if problems:
            raise SystemExit(
                f"Orchard Env preflight failed ({where}):\n" + "\n".join(f"- {p}" for p in problems)
            )

    # -- lifecycle -------------------------------------------------------------------------------------

    def _client_or_new(self) -> AsyncSandboxClient:
        if self._client is None:
            self._client = AsyncSandboxClient(self._gateway_url, namespace=self._namespace, direct=self._direct)
        return self._client

    def _wait_timeout(self) -> float:
        if self._wait_timeout_sec is not None:
            return float(self._wait_timeout_sec)
        return max(30.0, float(self.task_env_config.build_timeout_sec) - 15.0)

    def create_arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``AsyncSandboxClient.create`` for this trial's sandbox."""
        arguments: dict[str, Any] = {
            "generate_name": name_prefix(self.session_id),
            "labels": {**MANAGED_BY, **self._labels},
            "annotations": {"harbor/session-id": self.session_id, "harbor/environment": self.environment_name},
            "network": network_spec(self.network_policy),
            "wait_timeout": self._wait_timeout(),
            "delete_on_exit": True,
        }
        if self.context_id is not None:
            arguments["annotations"]["harbor/context-id"] = str(self.context_id)
        resources = sandbox_resources(self._effective_cpus, self._effective_memory_mb, self._effective_storage_mb,
                                      self._effective_gpus, self.task_env_config.gpu_types)
        if resources:
            arguments["resources"] = resources
        if self._pool:
            arguments["pool"] = self._pool
            if self._when_pool_empty:
                arguments["when_pool_empty"] = self._when_pool_empty
        else:
            # A claim must not set env (it would differ from the pool template's): Harbor sets the task's
            # variables on every exec anyway.
            env = self._startup_env()
            if env:
                arguments["env"] = env
        if self._ttl_seconds is not None:
            arguments["ttl_seconds"] = int(self._ttl_seconds)
        if self._heartbeat_timeout_seconds is not None:
            arguments["heartbeat_timeout_seconds"] = int(self._heartbeat_timeout_seconds)
        arguments.update(self._spec_fields)
        return arguments

    async def start(self, force_build: bool) -> None:
        if force_build and (self.environment_dir / "Dockerfile").exists():
            self.logger.warning(
                "Orchard Env does not build images: --force-build ignored, the sandbox runs docker_image %s",
                self.task_env_config.docker_image,
            )
        arguments = self.create_arguments()
        image = self.task_env_config.docker_image
        asked = asked_text(image, arguments.get("resources", {}), self._pool)
        try:
            self._sandbox = await self._client_or_new().create(image, **arguments)
        except (SandboxFailed, Timeout) as error:
            # The sandbox's own reason (SandboxStalled is a SandboxFailed; the SDK deleted the sandbox).
            raise SandboxStartError(
                f"the Orchard sandbox of {self.session_id} did not start: {error} (asked for {asked})",
                phase=error.phase, reason=error.reason, condition_message=error.condition_message,
            ) from error
        except InvalidRequest as error:
            # The gateway or the API server refused the spec (a CEL rule, a TTL past the maximum).
            raise SandboxStartError(
                f"the Orchard sandbox of {self.session_id} was refused: {error} (asked for {asked})",
                reason=error.code, condition_message=error.message,
            ) from error
        self.logger.debug("sandbox %s/%s is Ready", self._sandbox.namespace, self._sandbox.name)
        await self._make_workdir()
        result = await self.ensure_dirs(self._mount_targets(writable_only=True))
        if result is not None and result.return_code != 0:
            raise OrchardEnvironmentError(f"could not create the mount targets: {result.stderr or result.stdout}")
        await self._upload_environment_dir_after_start()

    async def _make_workdir(self) -> None:
        """The task's ``workdir``, created when the image lacks it (as a Dockerfile's ``WORKDIR`` would be):
        every command runs there, so a missing one would fail them all."""
        workdir = self.task_env_config.workdir
        if not workdir:
            return
        result = await self.exec(f"mkdir -p -- {shlex.quote(workdir)}", cwd="/")
        if result.return_code != 0:
            raise OrchardEnvironmentError(
                f"could not create the task's workdir {workdir}: {result.stderr or result.stdout}"
            )

    async def stop(self, delete: bool) -> None:
        """Deletes the sandbox, or with ``delete=False`` (``--no-delete``) leaves it to its TTL and heartbeat
        timeout (its heartbeats stop here). Gateway errors are logged, not raised (the sandbox's deadlines
        end it anyway)."""
        sandbox, self._sandbox = self._sandbox, None
        try:
            if sandbox is not None:
                sandbox.delete_on_exit = delete
                await sandbox.close()
                if not delete:
                    self.logger.info(
                        "kept sandbox %s/%s (--no-delete): its TTL or heartbeat timeout ends it",
                        sandbox.namespace, sandbox.name,
                    )
        except OrchardError as error:
            self.logger.warning("could not stop sandbox %s/%s: %s", sandbox.namespace, sandbox.name, error)
        finally:
            if self._own_client and self._client is not None:
                client, self._client = self._client, None
                await client.close()

    @property
    def sandbox(self) -> AsyncSandbox:
        """The trial's sandbox (after :meth:`start`)."""
        if self._sandbox is None:
            raise OrchardEnvironmentError("the sandbox is not started: call start() first")
        return self._sandbox

    # -- commands -------------------------------------------------------------------------------------

    async def exec(
        self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
        timeout_sec: int | None = None, user: str | int | None = None,
    ) -> ExecResult:
        sandbox = self.sandbox
        user = self._resolve_user(user)
        merged = self._merge_env(env)
        workdir = cwd or self.task_env_config.workdir or None
        seconds = float(timeout_sec) if timeout_sec else None
        argv = ["bash", "-c", command]
        try:
            if (callback := self._output_callback()) is None:
                result = await sandbox.exec(
                    argv, timeout=seconds or NO_TIMEOUT_SECONDS, cwd=workdir, env=merged, user=user,
                    max_output_bytes=self._max_output_bytes,
                )
            else:
                result = await self._exec_streamed(sandbox, argv, seconds, workdir, merged, user, callback)
        except InvalidRequest as error:
            if _refused_start(error, workdir, user):
                return ExecResult(stdout=None, stderr=error.message, return_code=CANNOT_EXECUTE_EXIT_CODE)
            raise
        except Forbidden as error:
            if user is not None and "not root" in error.message:
                raise OrchardEnvironmentError(
                    f"cannot run a command as user {user!r}: {error.message}. Harbor runs setup and verifier "
                    "commands as root; the sandbox runs as the image's USER, which must be root for that "
                    "(Orchard cannot run a non-root image as root)"
                ) from error
            raise
        return harbor_exec_result(result, seconds)

    async def _exec_streamed(
        self, sandbox: AsyncSandbox, argv: list[str], seconds: float | None, cwd: str | None,
        env: dict[str, str] | None, user: str | int | None, callback: Any,
    ) -> SandboxExecResult:
        """``exec`` through ``exec/stream``, handing each chunk to Harbor's output callback."""
        chunks: dict[str, list[str]] = {"stdout": [], "stderr": []}
        async for event in sandbox.exec_stream(argv, timeout=seconds or NO_TIMEOUT_SECONDS, cwd=cwd, env=env, user=user):
            if event.type in chunks:
                chunks[event.type].append(event.data)
                await callback(event.data, event.type)
            elif event.type == "exit":
                return SandboxExecResult(
                    exit_code=event.exit_code, stdout="".join(chunks["stdout"]), stderr="".join(chunks["stderr"]),
                    timed_out=event.timed_out, stdout_truncated=bool(event.raw.get("stdoutTruncated")),
                    stderr_truncated=bool(event.raw.get("stderrTruncated")),
                    duration=float(event.raw.get("durationMs") or 0) / 1000.0, signal=event.signal,
                    oom_killed=event.oom_killed, raw=event.raw,
                )
        raise OrchardError(f"the exec stream of sandbox {sandbox.namespace}/{sandbox.name} ended without an exit event")

    # -- files ---------------------------------------------------------------------------------------

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copies a local file to ``target_path``, keeping its mode; into ``target_path`` when that is a
        directory (or ends with ``/``), as ``docker cp`` does. Missing parents are created."""
        sandbox = self.sandbox
        source = Path(source_path)
        target = target_path
        if target.endswith("/"):
            target = str(PurePosixPath(target) / source.name)
        else:
            found = await sandbox.stat(target)
            if found.get("exists") and found.get("type") == "directory":
                target = str(PurePosixPath(target) / source.name)
        await sandbox.upload_file(target, source, mode=stat.S_IMODE(source.stat().st_mode))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copies the local directory's contents into ``target_dir`` (created), as one tar stream."""
        await self.sandbox.upload_dir(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await self.sandbox.download_file(source_path, target)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copies the directory's contents into ``target_dir`` (created, files overwritten), as one tar
        stream. Extracted with Harbor's ``extract_dir``: a member the ``data`` filter refuses (a link out
        of the directory an agent left behind) is skipped alone, as Harbor's cloud backends do, instead of
        failing the whole download."""
        sandbox = self.sandbox
        response = await sandbox._run(sandbox._download_dir_plan(source_dir))
        async with contextlib.aclosing(response):
            data = await response.aread()
        refused = extract_dir(io.BytesIO(data), target_dir)
        for why in refused:
            self.logger.warning("download_dir %s: skipped %s", source_dir, why)

    # -- network -------------------------------------------------------------------------------------

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        """Replaces the sandbox's ``spec.network`` (``PUT .../network``) and waits for the egress proxy to
        enforce new host rules; raises when it has not within ``network_wait_sec`` or refused them (the
        previous rules then stay in force)."""
        sandbox = self.sandbox
        spec = network_spec(network_policy)
        answer = await sandbox.set_network(
            egress=spec["egress"], allow=spec.get("allow", ()), wait=self._network_wait,
        )
        if answer.get("hostRulesInForce") is False:
            why = answer.get("message") or f"not in force after {self._network_wait:g} s"
            raise OrchardEnvironmentError(
                f"network policy {network_policy.network_mode.value} of sandbox {sandbox.namespace}/{sandbox.name} "
                f"is not enforced: {why}"
            )


# -- preflight -----------------------------------------------------------------------------------------


def check_access(client: SandboxClient, namespace: str | None = None) -> list[str]:
    """What keeps a trial from running (empty when nothing): the gateway must answer ``/healthz`` and the
    caller's RBAC must allow each of :data:`REQUIRED_ACCESS`. Checked with calls that change nothing: the
    gateway authorises each request before it reads the body or looks the sandbox up, so a call on a
    sandbox that does not exist answers 404 when allowed and 403 (naming the missing Role rule) when not,
    and a create with a body that is not an object answers 400 when allowed."""
    ns = namespace or client.namespace
    url = client.settings.base_url
    try:
        client._gateway("GET", "/healthz", retry=False)
    except GatewayUnreachable as error:
        return [f"the gateway {url} does not answer ({error}); set ORCHARD_GATEWAY_URL"]
    except OrchardError as error:
        return [f"the gateway {url} answers /healthz with {error}; is ORCHARD_GATEWAY_URL the gateway?"]
    probe = f"harbor-preflight-{secrets.token_hex(4)}"
    base = f"/v1/namespaces/{ns}/sandboxes"
    one = f"{base}/{probe}"
    calls: dict[tuple[str, str], tuple[str, str, dict[str, Any]]] = {
        ("create", "sandboxes"): ("POST", base, {"json_body": []}),
        ("get", "sandboxes"): ("GET", one, {}),
        ("delete", "sandboxes"): ("DELETE", one, {}),
        ("create", "sandboxes/exec"): ("POST", f"{one}/exec", {"json_body": {"argv": ["true"]}}),
        ("create", "sandboxes/files"): ("PUT", f"{one}/files", {"params": {"path": "/tmp/harbor-preflight"},
                                                                "content": b""}),
        ("get", "sandboxes/files"): ("GET", f"{one}/files/stat", {"params": {"path": "/"}}),
        ("update", "sandboxes/network"): ("PUT", f"{one}/network", {"json_body": {"egress": "Deny"},
                                                                     "params": {"timeoutSeconds": "0"}}),
        ("create", "sandboxes/heartbeat"): ("POST", f"{one}/heartbeat", {}),
    }
    problems: list[str] = []
    for verb, resource in REQUIRED_ACCESS:
        method, path, fields = calls[(verb, resource)]
        what = f"{verb} {resource}"
        try:
            response = client._gateway(method, path, retry=False, **fields)
        except Unauthorized as error:
            return [f"the gateway refuses the token ({error}); set ORCHARD_TOKEN or ORCHARD_TOKEN_FILE"]
        except Forbidden as error:
            problems.append(f"missing RBAC {what} (API group orchard.dev) in namespace {ns}: {error.message}")
        except (NotFound, InvalidRequest):
            pass  # allowed: the probe sandbox does not exist, or the create body is refused after authorisation
        except OrchardError as error:
            problems.append(f"could not check {what}: {error}")
        else:
            if method == "POST" and path == base:
                # A gateway that took the probe create after all: remove what it made.
                with contextlib.suppress(Exception):
                    name = response.json()["metadata"]["name"]
                    client.delete(name, namespace=ns)
    return problems


__all__ = [
    "DockerImageRequired",
    "OrchardEnvironment",
    "OrchardEnvironmentError",
    "SandboxStartError",
    "allow_entry",
    "check_access",
    "cpu_quantity",
    "harbor_exec_result",
    "name_prefix",
    "network_spec",
    "sandbox_resources",
]
