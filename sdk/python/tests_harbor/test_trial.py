"""Harbor's own ``Trial`` (the orchestration ``harbor run`` runs per task) with its ``oracle`` and ``nop``
agents on :class:`OrchardEnvironment`, chosen by import path, against the fake gateway: start, the
agent and verifier phases with their network policies, the tests uploaded, the verifier's directory
downloaded and the reward read, the sandbox deleted. The fake agent plays the task: ``solve.sh`` marks
it solved, ``test.sh`` writes the reward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from orchard_env.integrations import harbor as integration

from conftest import FAST, NS, FakeGateway, exec_answer

IMPORT_PATH = "orchard_env.integrations.harbor:OrchardEnvironment"

TASK_TOML = """\
schema_version = "1.4"

[agent]
timeout_sec = 120.0
network_mode = "allowlist"
allowed_hosts = ["pypi.org", "*.pythonhosted.org"]

[verifier]
timeout_sec = 120.0
network_mode = "no-network"

[environment]
docker_image = "registry.local/tasks/hello:1"
build_timeout_sec = 600.0
cpus = 1
memory_mb = 2048
workdir = "/app"
network_mode = "no-network"
"""


def write_task(root: Path) -> Path:
    task = root / "hello"
    for folder in ("environment", "tests", "solution"):
        (task / folder).mkdir(parents=True)
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Write hello to /app/hello.txt.\n")
    (task / "environment" / "README").write_text("prebuilt image: registry.local/tasks/hello:1\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n[ -f /app/hello.txt ] && echo 1 > /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho hello > /app/hello.txt\n")
    return task


class Task:
    """The sandbox's commands for the task: solve.sh solves it, test.sh writes the reward."""

    def __init__(self, gateway: FakeGateway) -> None:
        self.gateway = gateway
        self.solved = False
        self.commands: list[str] = []

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        command = body["argv"][-1]
        self.commands.append(command)
        if "solve.sh" in command and "chmod" not in command:
            self.solved = True
            self.gateway.write("/app/hello.txt", "hello\n")
            self.gateway.write("/logs/agent/oracle.txt", "")
        elif "test.sh" in command and "chmod" not in command:
            self.gateway.write("/logs/verifier/test-stdout.txt", "ran\n")
            self.gateway.write("/logs/verifier/reward.txt", "1\n" if self.solved else "0\n")
        elif command.startswith("mkdir") or " mkdir -p " in f" {command}":
            return self.gateway.shell(body)
        return exec_answer()


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("nop", 0.0)])
async def test_a_harbor_trial_runs_on_orchard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: str,
                                              reward: float) -> None:
    gateway = FakeGateway()
    task = Task(gateway)
    gateway.exec = task
    original = integration.AsyncSandboxClient
    monkeypatch.setattr(integration, "AsyncSandboxClient", lambda *a, **k: original(
        *a, transport=httpx.MockTransport(gateway), retry=FAST, **k))
    config = TrialConfig(
        task=TaskConfig(path=write_task(tmp_path / "tasks")),
        trials_dir=tmp_path / "trials",
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(import_path=IMPORT_PATH, kwargs={"gateway_url": "http://gw", "namespace": NS}),
    )
    trial = await Trial.create(config)
    result = await trial.run()

    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None and result.verifier_result.rewards == {"reward": reward}
    [created] = gateway.created
    assert created["image"] == "registry.local/tasks/hello:1" and created["network"] == {"egress": "Deny"}
    assert created["resources"] == {"cpu": "1", "memory": "2048Mi"}
    assert gateway.networks == [
        {"egress": "AllowList", "allow": [{"host": "pypi.org"}, {"host": "*.pythonhosted.org"}]},  # agent phase
        {"egress": "Deny"},  # back to the baseline, which the verifier phase keeps
    ], gateway.networks
    assert "/tests/test.sh" in gateway.fs and gateway.fs["/app/README"].data.startswith(b"prebuilt")
    assert ("/solution/solve.sh" in gateway.fs) == (agent == "oracle")
    assert gateway.deleted == [created["generateName"] + "x0001"], "--delete is Harbor's default"
    trial_dir = tmp_path / "trials" / config.trial_name
    assert (trial_dir / "verifier" / "reward.txt").read_text() == ("1\n" if reward else "0\n")
