"""Pure request builders shared by the sync and async clients (no I/O here)."""

from __future__ import annotations

import base64
import contextlib
import io
import ipaddress
import math
import os
import socket
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import InvalidRequest, OrchardError
from .models import TrajectoryResult

#: Seconds added to a command's own timeout for the gateway's answer timeout and the HTTP read timeout.
ANSWER_MARGIN = 30.0
#: The agent's default command timeout (docs/AGENT.md).
AGENT_DEFAULT_EXEC_TIMEOUT = 600.0
#: Longest server-side wait per request (the gateway clamps ``timeoutSeconds`` to it).
MAX_SERVER_WAIT = 300.0
#: Longest server-side wait per request while an ``on_progress`` callback follows a sandbox: a change of
#: phase or reason is reported at most this late.
PROGRESS_POLL = 2.0
#: Default seconds ``create()`` and ``wait_ready()`` wait for Ready: the operator's default startup timeout
#: (600 s after creation, Helm ``sandboxDefaults.startupTimeoutSeconds``) plus a margin, so a sandbox that
#: cannot start ends with the operator's ``StartupTimeout`` failure, which says why, before the SDK gives up.
DEFAULT_WAIT_TIMEOUT = 630.0
#: Heartbeat timeout of the sandboxes ``create()`` makes when the caller sets none: an open handle
#: heartbeats every third of it, and a sandbox whose trainer died is deleted this long after.
DEFAULT_HEARTBEAT_TIMEOUT = 600
#: Labels the operator puts on a RolloutGroup's trajectory Sandboxes (``<group>-<index>``).
ROLLOUT_GROUP_LABEL = "orchard.dev/rollout-group"
STRIDE_LABEL = "orchard.dev/stride"
#: Longest result ``message`` the CRD keeps.
MAX_RESULT_MESSAGE = 4096
#: Keys of a result body (``POST .../result``), as the API spells them.
RESULT_KEYS = frozenset({"reward", "status", "length", "artifact", "exitCode", "reason", "message"})
#: The agent's default and longest wait of a session ``read`` for its ``until`` (docs/AGENT.md).
SESSION_READ_DEFAULT_WAIT = 10.0
SESSION_READ_MAX_WAIT = 300.0
#: Phases a sandbox does not leave by itself without becoming Ready.
FINAL_PHASES = frozenset({"Failed", "Succeeded", "Expired"})
#: Longest wait of ``PUT .../network`` for the egress proxy (the gateway clamps ``timeoutSeconds`` to it).
NETWORK_MAX_WAIT = 60.0


def tar_of_directory(local: str | os.PathLike[str]) -> bytes:
    """A tar stream of the local directory ``local``'s contents (names relative to it; symlinks kept
    as symlinks, never followed). A ``ValueError`` when ``local`` is not a directory."""
    root = Path(local)
    if not root.is_dir():
        raise ValueError(f"upload_dir needs a local directory, not {str(root)!r}")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in sorted(root.iterdir()):
            archive.add(entry, arcname=entry.name, recursive=True)
    return buffer.getvalue()


def extract_tar(data: bytes, local: str | os.PathLike[str]) -> list[str]:
    """Extracts the tar stream ``data`` into the local directory ``local`` (created) with tarfile's
    ``data`` filter: no absolute paths, no ``..``, no links leaving ``local``, no devices. Answers the
    names extracted."""
    target = Path(local)
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        names = archive.getnames()
        archive.extractall(target, filter="data")
    return names


def timeout_seconds(seconds: float) -> int:
    """Whole seconds for ``set_timeout`` (pure): a positive number, rounded up so the sandbox never ends
    before the time asked for; anything else is a ``ValueError`` before any request."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"set_timeout needs a positive number of seconds, not {seconds!r}")
    return math.ceil(seconds)


def is_ip(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address (brackets allowed) (pure)."""
    try:
        ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return False
    return True


def host_pattern(value: Any, where: str) -> str:
    """A host-name pattern of ``network.allow[]`` or ``network.deny[]`` (``where``), checked only for what
    is plainly not a host name (pure): a scheme, a path, a port, an IP address, spaces. An
    :class:`~orchard_env.InvalidRequest` says what to write instead, before any request; the API server's
    CEL rule stays the authority on the rest (lowercase labels, length...)."""
    if not isinstance(value, str):
        raise TypeError(f"a network.{where}[] host is a str such as 'pypi.org', not {type(value).__name__}")
    host = value.strip()
    said = f"network.{where}[] host {value!r}"
    if not host or any(c.isspace() for c in host):
        raise InvalidRequest(f"{said} is not a host name: write one such as 'pypi.org', '*.github.com' or '*'")
    if "://" in host:
        bare = host.split("://", 1)[1].split("/", 1)[0].rsplit("@", 1)[-1].split(":", 1)[0]
        raise InvalidRequest(
            f"{said} has a scheme: write the host name alone ({bare!r}); the proxy carries http and https alike"
        )
    if "/" in host:
        head = host.split("/", 1)[0]
        if is_ip(head):
            if where == "allow":
                try:
                    ipaddress.ip_network(host, strict=False)
                except ValueError as error:
                    raise InvalidRequest(f"network.allow[] {value!r} is not an address range: {error}") from None
            raise InvalidRequest(f"{said} is an address range: deny takes host names only (leave the range out of allow)")
        raise InvalidRequest(f"{said} has a path: host rules name a host ({head!r}), never a URL path")
    if is_ip(host) or (":" in host and is_ip(host.rsplit(":", 1)[0])):
        address = host if is_ip(host) else host.rsplit(":", 1)[0]
        address = address.strip("[]")
        raise InvalidRequest(
            f"{said} is an IP address, which host rules never match: "
            + (f"allow it as an address range, '{address}/{128 if ':' in address else 32}'"
               if where == "allow" else "leave its address range out of allow instead")
        )
    if ":" in host:
        name, port = host.rsplit(":", 1)
        raise InvalidRequest(
            f"{said} has a port: write the host alone and the port apart, "
            + (f"{{'host': {name!r}, 'ports': [{{'port': {port}}}]}}" if where == "allow" and port.isdigit()
               else f"{name!r}")
        )
    return value


def allow_rule(entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """One ``network.allow[]`` entry (pure): a mapping as given (``{"host": ..., "ports": [...]}``,
    ``{"cidr": ...}``); a string with a ``/`` that is an address range, ``{"cidr": s}``; any other string
    a host-name pattern, ``{"host": s}`` (``pypi.org``, ``*.github.com``, ``*``), checked by
    :func:`host_pattern`."""
    if isinstance(entry, Mapping):
        return dict(entry)
    if isinstance(entry, str) and "/" in entry and "://" not in entry:
        try:
            ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            pass
        else:
            return {"cidr": entry.strip()}
    return {"host": host_pattern(entry, "allow")}


def deny_rule(entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """One ``network.deny[]`` entry (pure): a mapping as given, a string ``{"host": s}`` (checked by
    :func:`host_pattern`)."""
    if isinstance(entry, Mapping):
        return dict(entry)
    return {"host": host_pattern(entry, "deny")}


def rule_list(entries: Any, name: str) -> list[Any]:
    """The entries of ``allow``/``deny`` as a list; a lone string or mapping is a ``TypeError`` (a str
    would be read letter by letter)."""
    if isinstance(entries, (str, bytes, Mapping)) or not isinstance(entries, (Sequence, set, frozenset)):
        raise TypeError(f"{name} takes a list of entries such as ['pypi.org'], not {type(entries).__name__}")
    return list(entries)


def network_body(
    egress: str, allow: Sequence[str | Mapping[str, Any]] = (), deny: Sequence[str | Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """A whole ``spec.network`` (pure): the body of ``PUT .../network``, and what ``create(network=...)``
    sends. ``allow`` strings become host or cidr entries (:func:`allow_rule`), ``deny`` strings host
    entries (:func:`deny_rule`); empty lists are left out (the network is replaced whole either way)."""
    if not isinstance(egress, str):
        raise TypeError(f"egress is 'Deny', 'AllowAll' or 'AllowList', not {egress!r}")
    body: dict[str, Any] = {"egress": egress}
    if rules := [allow_rule(e) for e in rule_list(allow, "allow=")]:
        body["allow"] = rules
    if denied := [deny_rule(e) for e in rule_list(deny, "deny=")]:
        body["deny"] = denied
    return body


def network_field(network: str | Mapping[str, Any]) -> dict[str, Any]:
    """``spec.network`` of ``create(network=...)`` (pure): an egress mode (``"AllowAll"``), or the spec's
    object whose ``allow``/``deny`` lists may hold plain strings as in :func:`network_body`; its other
    members pass as given (the gateway refuses unknown ones)."""
    if isinstance(network, str):
        return {"egress": network}
    spec = dict(network)
    for key, convert in (("allow", allow_rule), ("deny", deny_rule)):
        if spec.get(key) is not None:
            spec[key] = [convert(e) for e in rule_list(spec[key], f"network[{key!r}]")]
    return spec


def network_wait(seconds: float) -> str:
    """``timeoutSeconds`` of ``PUT .../network`` (pure): a number of seconds from 0 (do not wait), as
    plain decimal text; the gateway caps it at :data:`NETWORK_MAX_WAIT`. Anything else is a
    ``ValueError`` before any request."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise ValueError(f"set_network(wait=) needs a number of seconds from 0, not {seconds!r}")
    return f"{min(float(seconds), NETWORK_MAX_WAIT):.3f}".rstrip("0").rstrip(".")


def camel(name: str) -> str:
    """``working_dir`` -> ``workingDir`` (names already in camelCase stay)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def sandbox_body(
    image: str | None,
    *,
    name: str | None = None,
    generate_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    env: Mapping[str, str] | Sequence[Mapping[str, str]] | None = None,
    cpu: str | int | float | None = None,
    memory: str | None = None,
    ttl_seconds: int | None = None,
    heartbeat_timeout_seconds: int | None = None,
    network: str | Mapping[str, Any] | None = None,
    spec: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of ``POST .../sandboxes``: shorthand fields, or a full ``spec``.

    ``network`` may be an egress mode (``"Deny"``, ``"AllowAll"``) or the spec's object, whose ``allow``
    and ``deny`` may list plain strings (:func:`network_field`); ``extra``
    holds any other spec field in snake_case or camelCase (``working_dir``, ``run``, ``startup``...).
    """
    body: dict[str, Any] = {}
    if name:
        body["name"] = name
    if generate_name:
        body["generateName"] = generate_name
    if labels:
        body["labels"] = dict(labels)
    if annotations:
        body["annotations"] = dict(annotations)
    fields: dict[str, Any] = {}
    if image is not None:
        fields["image"] = image
    if env:
        fields["env"] = dict(env) if isinstance(env, Mapping) else [dict(e) for e in env]
    if cpu is not None:
        fields["cpu"] = str(cpu)
    if memory is not None:
        fields["memory"] = memory
    if ttl_seconds is not None:
        fields["ttlSeconds"] = int(ttl_seconds)
    if heartbeat_timeout_seconds is not None:
        fields["heartbeatTimeoutSeconds"] = int(heartbeat_timeout_seconds)
    if network is not None:
        fields["network"] = network_field(network)
    for key, value in (extra or {}).items():
        if value is not None:
            fields[camel(key)] = retry_body(value) if camel(key) == "retry" else value
    if spec is not None:
        if fields:
            raise ValueError(
                f"give either spec= or spec fields ({', '.join(sorted(fields))}), not both"
            )
        body["spec"] = dict(spec)
    else:
        if "image" not in fields and "pool" not in fields and "fromSnapshot" not in fields:
            raise ValueError(
                "image is required (any Linux image, e.g. 'python:3.11'), unless pool= names a SandboxPool "
                "or from_snapshot= a SandboxSnapshot"
            )
        if "image" in fields and "fromSnapshot" in fields:
            raise ValueError("give either image or from_snapshot, not both: a snapshot brings its own image")
        body.update(fields)
    return body


def with_default_heartbeat(body: dict[str, Any], seconds: int = DEFAULT_HEARTBEAT_TIMEOUT) -> dict[str, Any]:
    """``body`` (of :func:`sandbox_body`) with ``heartbeatTimeoutSeconds`` set to ``seconds`` where it
    sets none: in the shorthand, in its ``lifecycle`` object, or in a full ``spec``'s ``lifecycle``. A
    pool claim (``pool``) is left alone: a lifecycle of its own would replace the pool template's whole
    ``lifecycle`` (its TTL included)."""
    spec = body.get("spec")
    target: dict[str, Any] = dict(spec) if isinstance(spec, Mapping) else body
    if target.get("pool") or "heartbeatTimeoutSeconds" in target:
        return body
    lifecycle = target.get("lifecycle")
    if isinstance(lifecycle, Mapping):
        if "heartbeatTimeoutSeconds" in lifecycle:
            return body
        target["lifecycle"] = {**lifecycle, "heartbeatTimeoutSeconds": seconds}
    elif isinstance(spec, Mapping):
        target["lifecycle"] = {"heartbeatTimeoutSeconds": seconds}
    else:
        target["heartbeatTimeoutSeconds"] = seconds
    if isinstance(spec, Mapping):
        body = {**body, "spec": target}
    return body


def command_fields(
    cmd: str | Sequence[str], shell: str | None = None
) -> dict[str, Any]:
    """``argv`` for a list, ``command`` (run by ``shell``, default ``/bin/sh``) for a string."""
    if isinstance(cmd, str):
        fields: dict[str, Any] = {"command": cmd}
        if shell:
            fields["shell"] = shell
        return fields
    argv = [str(a) for a in cmd]
    if not argv:
        raise ValueError("argv must name a program")
    if shell:
        raise ValueError("shell= only applies to a command string")
    return {"argv": argv}


def exec_body(
    cmd: str | Sequence[str],
    *,
    timeout: float | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | bytes | None = None,
    shell: str | None = None,
    max_output_bytes: int | None = None,
    output_encoding: str | None = None,
    user: str | int | None = None,
) -> dict[str, Any]:
    """The agent's exec request (docs/AGENT.md)."""
    body = command_fields(cmd, shell)
    if timeout is not None:
        body["timeoutSeconds"] = timeout
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if isinstance(stdin, bytes):
        body["stdinBase64"] = base64.b64encode(stdin).decode()
    elif stdin is not None:
        body["stdin"] = stdin
    if max_output_bytes is not None:
        body["maxOutputBytes"] = int(max_output_bytes)
    if output_encoding is not None:
        body["outputEncoding"] = output_encoding
    if user is not None:
        body["user"] = user_field(user)
    return body


def terminal_size(pty: tuple[int, int] | Sequence[int]) -> dict[str, int]:
    """The ``pty`` field of a process request, or a ``resize`` body (pure): ``(rows, cols)``, each 1 to
    1000; ``ValueError`` otherwise."""
    size = tuple(pty)
    if len(size) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1000 for n in size):
        raise ValueError(f"a terminal size is (rows, cols), each an int from 1 to 1000, not {pty!r}")
    return {"rows": size[0], "cols": size[1]}


def stdin_body(data: str | bytes, close: bool) -> dict[str, Any]:
    """The body of a write to a process's stdin (pure): text as ``data``, bytes as ``dataBase64``."""
    body: dict[str, Any] = {}
    if isinstance(data, bytes):
        if data:
            body["dataBase64"] = base64.b64encode(data).decode()
    elif isinstance(data, str):
        if data:
            body["data"] = data
    else:
        raise TypeError(f"stdin data is str or bytes, not {type(data).__name__}")
    if close:
        body["close"] = True
    return body


def user_field(user: str | int) -> str:
    """The ``user`` field of an exec, process or session request (pure): a name, ``"user:group"`` or
    ``"uid:gid"`` as given, a uid (``int``) as its decimal string. A ``bool`` is a ``TypeError``."""
    if isinstance(user, bool) or not isinstance(user, (str, int)):
        raise TypeError(f"user= takes a name, a uid (int), 'user:group' or 'uid:gid', not {user!r}")
    return str(user)


def millis(seconds: float, what: str, *, zero: bool = False) -> int:
    """Seconds as the agent's whole milliseconds (pure), rounded up: a positive number (or 0 when
    ``zero``); anything else is a ``ValueError`` before any request."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{what} needs a number of seconds, not {seconds!r}")
    if seconds < 0 or (seconds == 0 and not zero):
        raise ValueError(f"{what} needs a {'non-negative' if zero else 'positive'} number of seconds, not {seconds!r}")
    return math.ceil(seconds * 1000)


def session_body(
    *,
    shell: str | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    user: str | int | None = None,
    max_output_bytes: int | None = None,
) -> dict[str, Any]:
    """The body of ``POST .../sessions`` (the agent's ``SessionRequest``, docs/AGENT.md "Shell sessions")."""
    body: dict[str, Any] = {}
    if shell is not None:
        body["shell"] = shell
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if max_output_bytes is not None:
        body["maxOutputBytes"] = int(max_output_bytes)
    if user is not None:
        body["user"] = user_field(user)
    return body


def session_run_body(command: str, timeout: float | None = None) -> dict[str, Any]:
    """The body of ``POST .../sessions/{id}/run``: ``timeout`` seconds become ``timeoutMs``."""
    if not isinstance(command, str):
        raise TypeError(f"a session runs shell code (a str), not {type(command).__name__}")
    body: dict[str, Any] = {"command": command}
    if timeout is not None:
        body["timeoutMs"] = millis(timeout, "run(timeout=)")
    return body


def session_read_body(until: str | None = None, timeout: float | None = None) -> dict[str, Any]:
    """The body of ``POST .../sessions/{id}/read``: ``until`` (literal text), ``timeout`` seconds as
    ``timeoutMs`` (0: answer at once)."""
    body: dict[str, Any] = {}
    if until is not None:
        if not isinstance(until, str) or not until:
            raise ValueError(f"read(until=) takes a non-empty str (literal text), not {until!r}")
        body["until"] = until
    if timeout is not None:
        body["timeoutMs"] = millis(timeout, "read(timeout=)", zero=True)
    return body


def session_signal_body(signal: str | int) -> dict[str, Any]:
    """The body of ``POST .../sessions/{id}/signal``: a signal name (``"INT"``, ``"SIGKILL"``) or number,
    checked by the agent (an unknown one is 400)."""
    if isinstance(signal, bool) or not isinstance(signal, (str, int)):
        raise TypeError(f"signal() takes a signal name (str) or number (int), not {signal!r}")
    return {"signal": signal}


def read_answer_timeout(wait: float | None) -> float:
    """Seconds the gateway should wait for a session ``read``'s answer: its wait (the agent's default
    10 s, at most 300 s) plus the margin."""
    return min(SESSION_READ_MAX_WAIT, wait if wait is not None else SESSION_READ_DEFAULT_WAIT) + ANSWER_MARGIN


def answer_timeout(command_timeout: float | None) -> float:
    """Seconds the gateway should wait for a command's answer (its ``X-Orchard-Timeout``)."""
    return (command_timeout if command_timeout is not None else AGENT_DEFAULT_EXEC_TIMEOUT) + ANSWER_MARGIN


def heartbeat_interval(timeout_seconds: float | None) -> float | None:
    """Seconds between automatic heartbeats: a third of the sandbox's heartbeat timeout; None when off."""
    if timeout_seconds is None or timeout_seconds <= 0:
        return None
    return max(0.5, timeout_seconds / 3.0)


def spec_heartbeat_timeout(sandbox: Mapping[str, Any]) -> int | None:
    """``spec.lifecycle.heartbeatTimeoutSeconds`` of a Sandbox object, if set."""
    lifecycle = (sandbox.get("spec") or {}).get("lifecycle") or {}
    value = lifecycle.get("heartbeatTimeoutSeconds")
    return int(value) if value is not None else None


def group_body(
    template: Mapping[str, Any],
    *,
    name: str | None = None,
    generate_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    group_size: int | None = None,
    max_trajectories: int | None = None,
    stride: int | None = None,
    positive_fraction: tuple[float, float] | Mapping[str, float] | None = None,
    early_stop: str | None = None,
    filter: Mapping[str, Any] | bool | None = None,
    trajectory_timeout_seconds: int | None = None,
    cleanup: str | None = None,
    queue: str | None = None,
    active_deadline_seconds: int | None = None,
    retry: Mapping[str, Any] | None = None,
    launch_jitter_seconds: float | None = None,
) -> dict[str, Any]:
    """The body of ``POST .../rolloutgroups``. ``template`` is a sandbox shorthand
    (``{"image": ..., "run": {...}}``) or ``{"metadata": ..., "spec": ...}``. ``queue`` names a
    RolloutQueue of the namespace that admits the group's strides; ``active_deadline_seconds`` is the
    group's own deadline, counted from its first admitted stride."""
    body: dict[str, Any] = {"template": {camel(k): v for k, v in template.items()}}
    if name:
        body["name"] = name
    if generate_name:
        body["generateName"] = generate_name
    if labels:
        body["labels"] = dict(labels)
    if group_size is not None:
        body["groupSize"] = int(group_size)
    if max_trajectories is not None:
        body["maxTrajectories"] = int(max_trajectories)
    if stride is not None:
        body["stride"] = int(stride)
    if positive_fraction is not None:
        if isinstance(positive_fraction, Mapping):
            body["positiveFraction"] = dict(positive_fraction)
        else:
            low, high = positive_fraction
            body["positiveFraction"] = {"min": float(low), "max": float(high)}
    if early_stop is not None:
        body["earlyStop"] = early_stop
    if filter is not None:
        body["filter"] = {"enabled": filter} if isinstance(filter, bool) else dict(filter)
    if trajectory_timeout_seconds is not None:
        body["trajectoryTimeoutSeconds"] = int(trajectory_timeout_seconds)
    if cleanup is not None:
        body["cleanup"] = cleanup
    if queue is not None:
        body["queue"] = queue
    if active_deadline_seconds is not None:
        body["activeDeadlineSeconds"] = int(active_deadline_seconds)
    if retry is not None:
        body["retry"] = retry_body(retry)
    if launch_jitter_seconds is not None:
        body["launchJitterSeconds"] = float(launch_jitter_seconds)
    return body


#: The keys of a group's ``retry`` (snake_case or as the API spells them) and of its ``on_oom``.
RETRY_KEYS = {"max_attempts": "maxAttempts", "on_oom": "onOOM", "on_eviction": "onEviction"}
ON_OOM_KEYS = {"memory_factor": "memoryFactor", "cpu_factor": "cpuFactor", "max_memory": "maxMemory", "max_cpu": "maxCpu"}


def retry_body(retry: Mapping[str, Any]) -> dict[str, Any]:
    """A ``retry`` (a group's, or a sandbox's ``create(retry=...)``) as the API spells it: ``{"max_attempts": 3, "on_oom": {"max_memory": "8Gi"},
    "on_eviction": True}`` becomes ``{"maxAttempts": 3, "onOOM": {"maxMemory": "8Gi"}, "onEviction": true}``
    (the API's own spelling passes unchanged). An unknown key is a ``ValueError`` naming the known ones,
    before anything is sent."""

    def spelled(given: Mapping[str, Any], keys: Mapping[str, str], what: str) -> dict[str, Any]:
        known = {**keys, **{v: v for v in keys.values()}}
        unknown = sorted(k for k in given if k not in known)
        if unknown:
            raise ValueError(f"unknown {what} key(s) {unknown}: use {sorted(keys)}")
        return {known[k]: v for k, v in given.items()}

    if not isinstance(retry, Mapping):
        raise ValueError(f"retry must be a mapping such as {{'max_attempts': 3, 'on_eviction': True}}, not {retry!r}")
    body = spelled(retry, RETRY_KEYS, "retry")
    on_oom = body.get("onOOM")
    if on_oom is not None:
        if not isinstance(on_oom, Mapping):
            raise ValueError(f"retry on_oom must be a mapping such as {{'max_memory': '8Gi'}}, not {on_oom!r}")
        body["onOOM"] = spelled(on_oom, ON_OOM_KEYS, "retry on_oom")
    return body


#: Headers of a tunnel request: an HTTP/1.1 upgrade to a raw TCP stream.
TUNNEL_HEADERS = {"Connection": "Upgrade", "Upgrade": "tcp"}


def tunnel_path(port: int) -> str:
    """The agent route of a tunnel to ``port`` (1-65535) inside the sandbox; ``ValueError`` otherwise."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an int from 1 to 65535, not {port!r}")
    return f"/ports/{port}/tunnel"


def half_close(stream: Any) -> None:
    """Tells the far end of a tunnel that nothing more comes (shutdown of the socket's sending side),
    where the stream is a plain socket; over TLS the tunnel stays open until the far end closes."""
    sock = stream.get_extra_info("socket")
    if sock is not None and stream.get_extra_info("ssl_object") is None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)


def upgraded_stream(response: Any, port: int) -> Any:
    """The network stream of a tunnel's ``101`` answer; ``OrchardError`` when the answer is not an upgrade
    (the caller closes it)."""
    stream = response.extensions.get("network_stream") if response.status_code == 101 else None
    if stream is None:
        raise OrchardError(
            f"a tunnel to port {port} was answered {response.status_code} without an upgrade "
            "(a proxy between here and the gateway must pass HTTP/1.1 upgrades)"
        )
    return stream


def sandbox_path(namespace: str, name: str, rest: str = "") -> str:
    """Gateway path of a sandbox route."""
    return f"/v1/namespaces/{namespace}/sandboxes/{name}{rest}"


def with_snapshot(fields: Mapping[str, Any], snapshot: Any) -> dict[str, Any]:
    """``fields`` (spec fields) with ``from_snapshot`` set to ``snapshot``'s name (a handle or a name)."""
    if snapshot is None:
        return dict(fields)
    name = getattr(snapshot, "name", snapshot)
    if not isinstance(name, str) or not name:
        raise ValueError(f"from_snapshot must be a Snapshot or a snapshot's name, not {snapshot!r}")
    return {**fields, "from_snapshot": name}


def snapshot_path(namespace: str, name: str, rest: str = "") -> str:
    """Gateway path of a SandboxSnapshot route."""
    return f"/v1/namespaces/{namespace}/sandboxsnapshots/{name}{rest}"


def snapshot_body(
    sandbox: str,
    *,
    name: str | None = None,
    generate_name: str | None = None,
    paths: Sequence[str] | None = None,
    ttl_seconds_after_unused: int | None = None,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The body of ``POST .../sandboxsnapshots``. Paths must be absolute (``ValueError`` otherwise)."""
    body: dict[str, Any] = {"sandbox": sandbox}
    if name:
        body["name"] = name
    if generate_name:
        body["generateName"] = generate_name
    if paths:
        bad = [p for p in paths if not isinstance(p, str) or not p.startswith("/")]
        if bad:
            raise ValueError(f"snapshot paths must be absolute paths inside the sandbox, e.g. '/work': {bad!r}")
        body["paths"] = list(paths)
    if ttl_seconds_after_unused is not None:
        if int(ttl_seconds_after_unused) <= 0:
            raise ValueError("ttl_seconds_after_unused must be positive (None keeps the snapshot until deleted)")
        body["ttlSecondsAfterUnused"] = int(ttl_seconds_after_unused)
    if labels:
        body["labels"] = dict(labels)
    return body


def snapshot_state(snapshot: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """``(phase, Ready reason, Ready message)`` of a SandboxSnapshot object."""
    status = snapshot.get("status") or {}
    phase = status.get("phase") if isinstance(status, Mapping) else None
    ready = next(
        (c for c in (status.get("conditions") or []) if isinstance(c, Mapping) and c.get("type") == "Ready"),
        {},
    ) if isinstance(status, Mapping) else {}
    return (
        phase if isinstance(phase, str) else None,
        ready.get("reason") or None,
        ready.get("message") or None,
    )


def group_path(namespace: str, name: str, rest: str = "") -> str:
    """Gateway path of a rollout group route."""
    return f"/v1/namespaces/{namespace}/rolloutgroups/{name}{rest}"


def json_object(value: Any) -> dict[str, Any]:
    """A parsed JSON answer as an object (an empty one if the answer was not an object)."""
    return value if isinstance(value, dict) else {}


def phase_of(sandbox: Mapping[str, Any]) -> str | None:
    """``status.phase`` of a Sandbox object."""
    return (sandbox.get("status") or {}).get("phase")


def is_ready(sandbox: Mapping[str, Any]) -> bool:
    """Whether the Sandbox object has ``Ready=True``."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (sandbox.get("status") or {}).get("conditions") or []
    )


def condition(sandbox: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_`` in ``status.conditions`` of an object, if present."""
    for c in (sandbox.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return None


def is_stalled(sandbox: Mapping[str, Any]) -> bool:
    """Whether the Sandbox object has ``Stalled=True``: it cannot progress without outside help."""
    stalled = condition(sandbox, "Stalled")
    return stalled is not None and stalled.get("status") == "True"


def why_not_ready(sandbox: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """``(phase, reason, message)`` explaining where a Sandbox object stands (pure): a phase it will not
    leave (Failed, Succeeded, Expired) is explained by ``status.reason``/``status.message``; otherwise
    the ``Stalled`` condition's reason and message when it is True, else the ``Ready`` condition's
    (the gateway's ``WaitTimeout`` answers the same pair as ``reason``/``conditionMessage``)."""
    status = sandbox.get("status") or {}
    phase = status.get("phase")
    if phase in FINAL_PHASES and (status.get("reason") or status.get("message")):
        return phase, status.get("reason") or None, status.get("message") or None
    chosen = condition(sandbox, "Stalled") if is_stalled(sandbox) else condition(sandbox, "Ready")
    if chosen is None:
        return phase, status.get("reason") or None, status.get("message") or None
    return phase, chosen.get("reason") or None, chosen.get("message") or None


def explain(phase: str | None, reason: str | None, message: str | None) -> str:
    """``phase Pending, reason NotScheduled: 0/3 nodes are available...`` (the parts that are known)."""
    text = f"phase {phase or 'unknown'}"
    if reason:
        text += f", reason {reason}"
    if message:
        text += f": {message}"
    return text


def agent_endpoint_of(sandbox: Mapping[str, Any]) -> str | None:
    """``status.agentEndpoint`` of a Sandbox object (the agent's URL at the pod IP)."""
    return (sandbox.get("status") or {}).get("agentEndpoint")


def agent_target(answer: Any) -> tuple[str, str] | None:
    """The agent's URL and bearer token of the gateway's ``GET .../sandboxes/{name}/token`` answer
    (``{"endpoint": "http://10.0.0.7:9090", "token": "..."}``) (pure); ``None`` when it holds no
    http(s) URL and token."""
    if not isinstance(answer, Mapping):
        return None
    endpoint, token = answer.get("endpoint"), answer.get("token")
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        return None
    if not isinstance(token, str) or not token.strip():
        return None
    return endpoint.rstrip("/"), token.strip()


# -- trainer-driven rollout groups -----------------------------------------------------------------


def template_runs(group: Mapping[str, Any]) -> bool:
    """Whether a RolloutGroup object's template has ``spec.run`` (the operator then runs the trajectory
    and records its result itself; without ``run`` a driver outside the sandbox records it)."""
    template = (group.get("spec") or {}).get("template") or {}
    spec = template.get("spec") if isinstance(template.get("spec"), Mapping) else template
    return bool((spec or {}).get("run"))


def trajectory_index(group: str, name: str) -> int | None:
    """Index of trajectory ``name`` (``<group>-<index>``) of ``group``, None if it is not one."""
    rest = name[len(group) + 1:] if name.startswith(group + "-") else ""
    return int(rest) if rest.isdigit() else None


def split_episode_value(value: Any) -> tuple[Any, Any]:
    """What an episode returned, as ``(result, payload)``: a ``(result, payload)`` pair (a 2-tuple) is
    split, anything else is a result alone (payload None). The payload stays with the trainer: only the
    result is ever sent (:func:`result_body`)."""
    if isinstance(value, tuple) and len(value) == 2:
        return value[0], value[1]
    return value, None


def result_body(value: Any) -> dict[str, Any]:
    """The result body of what an episode returned: a number is the reward of a ``completed``
    trajectory (``True``/``False`` count as 1.0/0.0); a :class:`~orchard_env.models.TrajectoryResult`
    or a mapping with the API's keys (``reward``, ``status``, ``length``, ``artifact``, ``exitCode``,
    ``reason``, ``message``; ``exit_code`` also accepted) is sent as it is (``status`` defaults to
    ``completed``). Anything else raises ``TypeError``, an unknown key ``ValueError``."""
    if isinstance(value, TrajectoryResult):
        return value.to_json()
    if isinstance(value, (int, float)):
        return {"reward": float(value), "status": "completed"}
    if isinstance(value, Mapping):
        body = {camel(str(k)): v for k, v in value.items() if v is not None}
        unknown = sorted(set(body) - RESULT_KEYS)
        if unknown:
            raise ValueError(f"unknown result keys {unknown}; allowed: {sorted(RESULT_KEYS)}")
        body.setdefault("status", "completed")
        return body
    raise TypeError(f"an episode must return a reward (number), a dict or a TrajectoryResult, not {type(value).__name__}")


def aborted_body(error: BaseException) -> dict[str, Any]:
    """The result of an episode that raised ``error``: aborted, reason ``EpisodeFailed``, the exception
    as the message (cut to the CRD's limit)."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return {"status": "aborted", "reason": "EpisodeFailed", "message": text[:MAX_RESULT_MESSAGE]}
