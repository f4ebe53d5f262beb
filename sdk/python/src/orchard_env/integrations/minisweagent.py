"""A `mini-swe-agent <https://mini-swe-agent.com>`_ environment whose commands run in an Orchard Env
sandbox (``pip install './sdk/python[minisweagent]'``).

:class:`OrchardEnvironment` behaves like mini-swe-agent's own ``LocalEnvironment`` and
``DockerEnvironment``: ``execute(action, cwd="", *, timeout=None)`` runs ``action["command"]`` with the
configured ``interpreter`` (``bash -lc`` by default, as in ``DockerEnvironment``), stdout and stderr merged
into one ``output`` in the order they were written, and answers ``{"output", "returncode",
"exception_info"}``. A command that runs past its timeout has its whole process group killed (the
agent's exec timeout) and is reported as theirs report ``subprocess.TimeoutExpired``: the output so far,
``returncode`` -1 and ``exception_info`` "An error occurred while executing the command: Command '...'
timed out after N seconds". A command killed by a signal has ``returncode`` ``-signal``, as
``subprocess`` reports it. An output whose first line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
(exit code 0) raises ``Submitted`` with the rest of the output as the submission.

Gateway errors (the sandbox was deleted, access revoked, gateway unreachable) are not the command's
outcome: they raise :class:`~orchard_env.errors.OrchardError`, which ends the agent's run (its
``DefaultAgent`` re-raises uncaught exceptions), so a trainer records the trajectory aborted instead of
scoring a run whose commands did not run.

As mini-swe-agent's ``environment_class``::

    environment:
      environment_class: orchard_env.integrations.minisweagent.OrchardEnvironment
      sandbox: my-sandbox          # an existing, Ready sandbox
      namespace: rl                # else ORCHARD_NAMESPACE; gateway and token from ORCHARD_GATEWAY_URL, ORCHARD_TOKEN
      cwd: /work/repo
      timeout: 60

or in code, with a handle (what :meth:`~orchard_env.RolloutGroup.drive` gives each episode)::

    env = OrchardEnvironment(sandbox=sandbox, cwd="repo", timeout=60)
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

from ..client import Sandbox, SandboxClient
from ..models import ExecResult

#: What mini-swe-agent's environments read as the submission marker (first line of the output).
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: Runs the interpreter with stderr sent to stdout, so the output interleaves like theirs.
MERGE_STDERR = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh"]


class OrchardEnvironmentConfig(BaseModel):
    """Settings of :class:`OrchardEnvironment` (the names of mini-swe-agent's environment configs)."""

    sandbox: str = ""
    """Name of the sandbox (when the environment is not given a handle)."""
    namespace: str | None = None
    """Its namespace (default: ``ORCHARD_NAMESPACE``, then the pod's namespace)."""
    gateway_url: str | None = None
    """The gateway (default: ``ORCHARD_GATEWAY_URL``, then the in-cluster Service). The token is never
    part of the config (it would be serialized into trajectories): ``ORCHARD_TOKEN`` or
    ``ORCHARD_TOKEN_FILE``, then the pod's service-account token."""
    cwd: str = ""
    """Working directory of the commands; empty: the sandbox's working directory."""
    env: dict[str, str] = {}
    """Environment variables set for every command."""
    forward_env: list[str] = []
    """Variables of this process passed on to the commands when set (``env`` wins on conflict)."""
    timeout: int = 30
    """Seconds a command may run before its process group is killed."""
    interpreter: list[str] = ["bash", "-lc"]
    """The command is appended to this argv (as in mini-swe-agent's ``DockerEnvironment``)."""


def observation(command: str, result: ExecResult, timeout: float) -> dict[str, Any]:
    """mini-swe-agent's answer of ``execute`` for ``result`` (pure): the merged output, the return code,
    and on timeout what its environments report for ``subprocess.TimeoutExpired``."""
    text = result.stdout + result.stderr
    if result.timed_out:
        error = subprocess.TimeoutExpired(command, timeout, output=text)
        return {
            "output": text,
            "returncode": -1,
            "exception_info": f"An error occurred while executing the command: {error}",
            "extra": {"exception_type": type(error).__name__, "exception": str(error)},
        }
    returncode = result.exit_code if result.exit_code is not None else -(result.signal or 0) or -1
    return {"output": text, "returncode": returncode, "exception_info": ""}


def check_finished(output: dict[str, Any]) -> None:
    """Raises ``Submitted`` when the output's first line is the submission marker and the command
    succeeded (mini-swe-agent's own rule)."""
    lines = output.get("output", "").lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
        submission = "".join(lines[1:])
        raise Submitted(
            {
                "role": "exit",
                "content": submission,
                "extra": {"exit_status": "Submitted", "submission": submission},
            }
        )


class OrchardEnvironment:
    """A mini-swe-agent environment on an Orchard Env sandbox.

    ``sandbox`` is a :class:`~orchard_env.Sandbox` handle or a sandbox's name; with a name, ``client``
    (a :class:`~orchard_env.SandboxClient`) connects to it, or else a client is made from the config and
    the ``ORCHARD_*`` environment variables (and closed by :meth:`cleanup`). The sandbox is never
    deleted by the environment: its owner (a ``with`` block, ``RolloutGroup.drive``) does that."""

    def __init__(
        self, *, sandbox: Sandbox | str = "", client: SandboxClient | None = None,
        config_class: type = OrchardEnvironmentConfig, logger: logging.Logger | None = None, **kwargs: Any,
    ) -> None:
        self.logger = logger or logging.getLogger("minisweagent.environment")
        self._own_client: SandboxClient | None = None
        if isinstance(sandbox, Sandbox):
            kwargs.setdefault("namespace", sandbox.namespace)
            self.config = config_class(sandbox=sandbox.name, **kwargs)
            self.sandbox = sandbox
        else:
            self.config = config_class(sandbox=sandbox, **kwargs)
            if not self.config.sandbox:
                raise ValueError("OrchardEnvironment needs a sandbox (a handle or a name)")
            if client is None:
                client = self._own_client = SandboxClient(self.config.gateway_url, namespace=self.config.namespace)
            self.sandbox = client.connect(self.config.sandbox, namespace=self.config.namespace)

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Runs ``action["command"]`` in the sandbox; see the module's documentation for the answer."""
        command = action.get("command", "")
        seconds = timeout or self.config.timeout
        env = {key: value for key in self.config.forward_env if (value := os.getenv(key)) is not None}
        env.update(self.config.env)
        result = self.sandbox.exec(
            [*MERGE_STDERR, *self.config.interpreter, command],
            timeout=seconds, cwd=cwd or self.config.cwd or None, env=env or None,
        )
        output = observation(command, result, seconds)
        check_finished(output)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }

    def cleanup(self) -> None:
        """Closes the client the environment made itself (never deletes the sandbox)."""
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None


__all__ = ["OrchardEnvironment", "OrchardEnvironmentConfig", "check_finished", "observation"]
