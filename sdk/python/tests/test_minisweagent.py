"""``orchard_env.integrations.minisweagent`` against a fake gateway, compared with mini-swe-agent's own
``LocalEnvironment`` where the two can be run side by side. No cluster."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from typing import Any

import httpx
import pytest

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
if "MSWEA_GLOBAL_CONFIG_DIR" not in os.environ:
    # mini-swe-agent's config directory for this run only, removed when the run ends.
    _config_dir = tempfile.mkdtemp(prefix="mswea-")
    atexit.register(shutil.rmtree, _config_dir, ignore_errors=True)
    os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = _config_dir
if os.environ.get("CI") == "true":
    import minisweagent  # noqa: F401  (the SDK venv pins it: missing is a failure under CI)
else:
    pytest.importorskip("minisweagent")

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments import get_environment  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

from orchard_env import NotFound, RetryPolicy, SandboxClient  # noqa: E402
from orchard_env.integrations.minisweagent import MERGE_STDERR, OrchardEnvironment  # noqa: E402

FAST = RetryPolicy(attempts=2, backoff=0.001, max_backoff=0.002)
SANDBOX = {
    "metadata": {"name": "s1", "namespace": "ns", "uid": "u1"},
    "spec": {"image": "x", "lifecycle": {"heartbeatTimeoutSeconds": 0}},
    "status": {"phase": "Ready", "conditions": [{"type": "Ready", "status": "True"}]},
}


def exec_answer(stdout: str = "", exit_code: int | None = 0, timed_out: bool = False, signal: int | None = None,
                stderr: str = "") -> dict[str, Any]:
    return {"exitCode": exit_code, "signal": signal, "timedOut": timed_out, "stdout": stdout, "stderr": stderr,
            "durationMs": 1}


class Agent:
    """Plays the sandbox's agent behind the gateway: answers execs from ``script`` (command -> answer)."""

    def __init__(self, script: dict[str, dict[str, Any]]) -> None:
        self.script = script
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/namespaces/ns/sandboxes/s1" and request.method == "GET":
            return httpx.Response(200, json=SANDBOX)
        if request.url.path == "/v1/namespaces/ns/sandboxes/s1/exec":
            body = json.loads(request.content)
            self.bodies.append(body)
            return httpx.Response(200, json=self.script[body["argv"][-1]])
        if request.url.path.endswith("/heartbeat"):
            return httpx.Response(200, json={"heartbeatTimeoutSeconds": 0})
        return httpx.Response(404, json={"code": "NotFound", "message": request.url.path})


def environment(agent: Agent, **config: Any) -> tuple[SandboxClient, OrchardEnvironment]:
    client = SandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(agent), retry=FAST)
    return client, OrchardEnvironment(sandbox="s1", client=client, namespace="ns", **config)


def test_execute_runs_the_command_with_merged_output_and_the_configured_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = Agent({"ls; ls missing": exec_answer("a.py\nls: missing: No such file\n", exit_code=2)})
    monkeypatch.setenv("FORWARDED", "yes")
    client, env = environment(agent, cwd="/work/repo", timeout=7, env={"PAGER": "cat"}, forward_env=["FORWARDED", "UNSET"])
    with client:
        assert env.execute({"command": "ls; ls missing"}) == {
            "output": "a.py\nls: missing: No such file\n", "returncode": 2, "exception_info": ""}
        env.execute({"command": "ls; ls missing"}, cwd="/elsewhere", timeout=3)
    first, second = agent.bodies
    assert first["argv"] == [*MERGE_STDERR, "bash", "-lc", "ls; ls missing"]
    assert first["argv"][:4] == ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh"], "stderr joins stdout, in order"
    assert first["timeoutSeconds"] == 7 and first["cwd"] == "/work/repo"
    assert first["env"] == {"FORWARDED": "yes", "PAGER": "cat"}
    assert second["timeoutSeconds"] == 3 and second["cwd"] == "/elsewhere", "per-call cwd and timeout win"


def test_a_timeout_is_reported_like_mini_swe_agents_own_environments(tmp_path: Any) -> None:
    command = "echo started; sleep 5"
    theirs = LocalEnvironment(cwd=str(tmp_path), timeout=1).execute({"command": command})
    agent = Agent({command: exec_answer("started\n", exit_code=None, timed_out=True, signal=9)})
    client, env = environment(agent, timeout=1)
    with client:
        ours = env.execute({"command": command})
    assert ours == theirs, (ours, theirs)
    assert ours["returncode"] == -1 and "timed out after 1 seconds" in ours["exception_info"]


def test_return_codes_match_local_environment(tmp_path: Any) -> None:
    local = LocalEnvironment(cwd=str(tmp_path))
    for command, answer in [
        ("exit 3", exec_answer(exit_code=3)),
        ("echo out; echo err >&2", exec_answer("out\nerr\n")),
        ("kill -9 $$", exec_answer(exit_code=None, signal=9)),
    ]:
        client, env = environment(Agent({command: answer}))
        with client:
            assert env.execute({"command": command}) == local.execute({"command": command}), command


def test_the_submission_marker_raises_submitted_only_on_success() -> None:
    done = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; git diff"
    failed = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; false"
    agent = Agent({
        done: exec_answer("\nCOMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\ndiff --git a/x b/x\n"),
        failed: exec_answer("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", exit_code=1),
    })
    client, env = environment(agent)
    with client:
        with pytest.raises(Submitted) as raised:
            env.execute({"command": done})
        assert raised.value.messages[0]["extra"] == {"exit_status": "Submitted", "submission": "diff --git a/x b/x\n"}
        assert env.execute({"command": failed})["returncode"] == 1


def test_gateway_errors_are_not_command_outcomes() -> None:
    client, env = environment(Agent({}))
    with client:
        env.sandbox.name = "gone"
        with pytest.raises(NotFound):
            env.execute({"command": "true"})


def test_config_serialization_and_template_vars_hold_no_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    client, env = environment(Agent({}), cwd="repo")
    with client:
        info = env.serialize()["info"]["config"]
        assert info["environment_type"] == "orchard_env.integrations.minisweagent.OrchardEnvironment"
        assert info["environment"]["sandbox"] == "s1" and info["environment"]["cwd"] == "repo"
        assert "t" not in json.dumps(info["environment"]).split('"'), "the token is not in the config"
        variables = env.get_template_vars(task="fix it")
        assert variables["cwd"] == "repo" and variables["task"] == "fix it" and "system" in variables
        handle = OrchardEnvironment(sandbox=env.sandbox, timeout=5)
        assert handle.sandbox is env.sandbox and handle.config.namespace == "ns"


def test_it_loads_as_a_dotted_environment_class(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = Agent({"true": exec_answer()})
    monkeypatch.setenv("ORCHARD_GATEWAY_URL", "http://gw")
    monkeypatch.setenv("ORCHARD_TOKEN", "t")
    real = SandboxClient.__init__

    def with_fake_transport(self: SandboxClient, *args: Any, **kwargs: Any) -> None:
        real(self, *args, transport=httpx.MockTransport(agent), **kwargs)

    monkeypatch.setattr(SandboxClient, "__init__", with_fake_transport)
    env = get_environment({
        "environment_class": "orchard_env.integrations.minisweagent.OrchardEnvironment",
        "sandbox": "s1", "namespace": "ns", "timeout": 9,
    })
    assert isinstance(env, OrchardEnvironment)
    assert env.execute({"command": "true"})["returncode"] == 0
    env.cleanup()


def test_mini_swe_agents_default_agent_runs_to_submission_through_the_environment() -> None:
    agent = Agent({
        "cat calc.py": exec_answer("def add(a, b):\n    return a - b\n"),
        "sed -i s/-/+/ calc.py": exec_answer(),
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT": exec_answer("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n"),
    })
    model = DeterministicModel(outputs=[
        make_output("look", [{"command": "cat calc.py"}]),
        make_output("fix", [{"command": "sed -i s/-/+/ calc.py"}]),
        make_output("done", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}]),
    ])
    client, env = environment(agent)
    with client:
        run = DefaultAgent(model, env, system_template="You fix bugs.", instance_template="{{task}}",
                           step_limit=10, cost_limit=0).run("fix add")
    assert run["exit_status"] == "Submitted"
    assert [b["argv"][-1] for b in agent.bodies] == [
        "cat calc.py", "sed -i s/-/+/ calc.py", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
