"""``orchard_env.integrations.harbor.OrchardEnvironment`` against a fake gateway (conftest.py), with
Harbor 0.25's own classes (its ``EnvironmentConfig``, ``NetworkPolicy``, ``TrialPaths``, factory and
healthcheck): creation and its refusals, exec, files, network switching, stop and preflight. No cluster."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from harbor.environments.base import HealthcheckError
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.config import EnvironmentConfig, HealthcheckConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from orchard_env import NotFound, SandboxClient
from orchard_env.integrations import harbor as integration
from orchard_env.integrations.harbor import (
    NO_TIMEOUT_SECONDS,
    DockerImageRequired,
    OrchardEnvironment,
    OrchardEnvironmentError,
    SandboxStartError,
    check_access,
    cpu_quantity,
    network_spec,
    sandbox_resources,
)

from conftest import FAST, NS, FakeGateway, Node, error, exec_answer

IMAGE = "registry.local/tasks/hello:1"
IMPORT_PATH = "orchard_env.integrations.harbor:OrchardEnvironment"


def task_dir(tmp_path: Path, *files: str) -> Path:
    environment = tmp_path / "task" / "environment"
    environment.mkdir(parents=True, exist_ok=True)
    for name in files:
        (environment / name).write_text("FROM debian\n" if name == "Dockerfile" else "services: {}\n")
    return environment


def make(tmp_path: Path, client: Any = None, *, files: tuple[str, ...] = ("Dockerfile",),
         config: dict[str, Any] | None = None, **kwargs: Any) -> OrchardEnvironment:
    settings = {"docker_image": IMAGE, "cpus": 2, "memory_mb": 4096, "storage_mb": 10240, "workdir": "/app",
                "env": {"TASK_VAR": "task"}, **(config or {})}
    return OrchardEnvironment(
        environment_dir=task_dir(tmp_path, *files), environment_name="hello", session_id="hello__AbC12__env",
        trial_paths=TrialPaths(tmp_path / "trial"), task_env_config=EnvironmentConfig(**settings),
        client=client, **kwargs,
    )


async def started(tmp_path: Path, client: Any, **kwargs: Any) -> OrchardEnvironment:
    environment = make(tmp_path, client, **kwargs)
    await environment.start(force_build=False)
    return environment


# -- pure mappings ------------------------------------------------------------------------------------


def test_network_policies_map_to_the_sandbox_network() -> None:
    assert network_spec(NetworkPolicy()) == {"egress": "AllowAll"}, "public is Harbor's default"
    assert network_spec(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)) == {"egress": "Deny"}
    assert network_spec(NetworkPolicy(network_mode=NetworkMode.ALLOWLIST)) == {"egress": "AllowList"}
    policy = EnvironmentConfig(
        docker_image=IMAGE, network_mode="allowlist",
        allowed_hosts=["PyPI.org", "*.github.com", "10.1.2.3", "2001:db8::1", "10.0.0.0/8", "2001:db8::/32"],
    ).resolve_baseline()
    assert network_spec(policy) == {"egress": "AllowList", "allow": [
        {"host": "pypi.org"}, {"host": "*.github.com"}, {"cidr": "10.1.2.3/32"}, {"cidr": "2001:db8::1/128"},
        {"cidr": "10.0.0.0/8"}, {"cidr": "2001:db8::/32"},
    ]}, "host names through the egress proxy, addresses and ranges as cidr"


def test_resources_are_kubernetes_quantities() -> None:
    assert sandbox_resources(2, 4096, 10240) == {"cpu": "2", "memory": "4096Mi", "ephemeralStorage": "10240Mi"}
    assert sandbox_resources(0.5, None, None) == {"cpu": "500m"}
    assert sandbox_resources(None, None, None) == {}, "unset: the operator's defaults"
    assert sandbox_resources(None, None, None, 2, ["H100", "A100"]) == {"gpu": {"count": 2, "types": ["H100", "A100"]}}
    assert sandbox_resources(1, None, None, 1, []) == {"cpu": "1", "gpu": {"count": 1}}, "no types: any GPU"
    assert sandbox_resources(1, None, None, 0, ["H100"]) == {"cpu": "1"}, "no GPUs: types mean nothing"
    assert cpu_quantity(1.0) == "1" and cpu_quantity(1.25) == "1250m"


def test_harbor_finds_the_environment_by_import_path(tmp_path: Path) -> None:
    environment = EnvironmentFactory.create_environment_from_import_path(
        IMPORT_PATH, environment_dir=task_dir(tmp_path), environment_name="hello", session_id="s__1",
        trial_paths=TrialPaths(tmp_path / "trial"), task_env_config=EnvironmentConfig(docker_image=IMAGE),
        namespace="rl", pool="tb2",
    )
    assert isinstance(environment, OrchardEnvironment) and environment.type() == "orchard"
    capabilities = environment.capabilities
    assert capabilities.dynamic_network_policy and capabilities.disable_internet and capabilities.network_allowlist
    assert capabilities.gpus, "Harbor's _validate_gpu_support lets GPU tasks through"
    assert not capabilities.tpus and not capabilities.docker_compose and not capabilities.mounted
    resources = EnvironmentFactory.resource_capabilities(None, IMPORT_PATH)
    assert resources is not None and resources.fractional_cpus and resources.cpu_limit and resources.memory_request


# -- refusals when the environment is made --------------------------------------------------------------


def test_a_task_with_only_a_dockerfile_is_refused_naming_docker_image_and_how_to_prebuild(tmp_path: Path) -> None:
    with pytest.raises(DockerImageRequired) as refused:
        make(tmp_path, config={"docker_image": None})
    message = str(refused.value)
    assert "has no docker_image" in message and "does not build environment/Dockerfile" in message
    assert "docker build -t REGISTRY/hello:TAG" in message and "docker push" in message
    assert 'docker_image = "REGISTRY/hello:TAG" under [environment] in task.toml' in message


def test_a_multi_container_task_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DockerImageRequired, match="docker-compose.yaml"):
        make(tmp_path, files=("docker-compose.yaml",))


async def test_a_gpu_task_asks_for_its_gpus_of_any_listed_type(tmp_path: Path, client: Any,
                                                               gateway: FakeGateway) -> None:
    await started(tmp_path, client, config={"gpus": 2, "gpu_types": ["H100", "A100-80GB"]})
    assert gateway.created[0]["resources"] == {
        "cpu": "2", "memory": "4096Mi", "ephemeralStorage": "10240Mi",
        "gpu": {"count": 2, "types": ["H100", "A100-80GB"]},
    }


async def test_a_gpu_task_without_types_takes_any_gpu_and_override_gpus_0_asks_for_none(
        tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    await started(tmp_path, client, config={"gpus": 1})
    assert gateway.created[0]["resources"]["gpu"] == {"count": 1}
    await started(tmp_path, client, config={"gpus": 1, "gpu_types": ["H100"]}, override_gpus=0)
    assert "gpu" not in gateway.created[1]["resources"], "--override-gpus 0 runs it without"
    # Harbor's own CPU/memory modes leave the GPUs alone: they are not optional.
    await started(tmp_path, client, config={"gpus": 1}, cpu_enforcement_policy="ignore",
                  memory_enforcement_policy="ignore")
    assert gateway.created[2]["resources"] == {"ephemeralStorage": "10240Mi", "gpu": {"count": 1}}


# -- start --------------------------------------------------------------------------------------------


async def test_start_creates_the_sandbox_from_the_task_and_waits_until_ready(tmp_path: Path, client: Any,
                                                                            gateway: FakeGateway) -> None:
    environment = await started(tmp_path, client, ttl_seconds=7200, labels={"job": "tb2"},
                                spec_fields={"runtimeClassName": "gvisor"},
                                network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    [body] = gateway.created
    assert body == {
        "generateName": "hello-abc12-env-",
        "labels": {"app.kubernetes.io/managed-by": "harbor", "job": "tb2"},
        "annotations": {"harbor/session-id": "hello__AbC12__env", "harbor/environment": "hello"},
        "image": IMAGE,
        "env": {"TASK_VAR": "task"},
        "ttlSeconds": 7200,
        "heartbeatTimeoutSeconds": 600,
        "network": {"egress": "Deny"},
        "resources": {"cpu": "2", "memory": "4096Mi", "ephemeralStorage": "10240Mi"},
        "runtimeClassName": "gvisor",
    }
    waits = [r for r in gateway.requests if r[1].endswith("/wait")]
    assert waits, "create() waits for Ready"
    assert environment.sandbox.name == "hello-abc12-env-x0001"


async def test_a_pool_claim_names_the_pool_and_sets_no_env(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    await started(tmp_path, client, pool="tb2", when_pool_empty="Wait")
    [body] = gateway.created
    assert body["pool"] == "tb2" and body["whenPoolEmpty"] == "Wait" and body["image"] == IMAGE
    assert "env" not in body, "env would differ from the pool template's: Harbor sets it on every exec"
    assert "heartbeatTimeoutSeconds" not in body, "a claim keeps the pool template's lifecycle"


async def test_resource_mode_ignore_leaves_cpu_and_memory_to_the_operator(tmp_path: Path, client: Any,
                                                                         gateway: FakeGateway) -> None:
    await started(tmp_path, client, cpu_enforcement_policy="ignore", memory_enforcement_policy="ignore")
    assert gateway.created[0]["resources"] == {"ephemeralStorage": "10240Mi"}


async def test_the_environment_dir_is_uploaded_into_the_workdir_for_a_prebuilt_task(tmp_path: Path, client: Any,
                                                                                   gateway: FakeGateway) -> None:
    environment = make(tmp_path, client, files=())
    (environment.environment_dir / "data.txt").write_text("payload")
    await environment.start(force_build=False)
    assert gateway.fs["/app/data.txt"].data == b"payload"


async def test_start_creates_the_workdir_first_from_the_root(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    # A prebuilt image need not have the task's workdir (a Dockerfile's WORKDIR would have made it), and
    # every command runs there: the first command makes it, from /.
    await started(tmp_path, client, config={"workdir": "/srv/my task"})
    first = gateway.setup_execs[0]
    assert first["argv"] == ["bash", "-c", "mkdir -p -- '/srv/my task'"] and first["cwd"] == "/"
    assert gateway.fs["/srv/my task"].type == "directory"


@pytest.mark.parametrize(("status", "reason"), [
    ({"phase": "Failed", "reason": "PlacementRefused",
      "message": "resources.cpu 64 is beyond the operator's maximum of 16 (--max-sandbox-cpu)",
      "conditions": [{"type": "Ready", "status": "False", "reason": "PlacementRefused"}]}, "PlacementRefused"),
    ({"phase": "Pending", "conditions": [
        {"type": "Ready", "status": "False", "reason": "NotScheduled", "message": "quota"},
        {"type": "Stalled", "status": "True", "reason": "QuotaExceeded",
         "message": 'exceeded quota: rl-quota, requested: limits.cpu=64, used: limits.cpu=0, limited: limits.cpu=32'}]},
     "QuotaExceeded"),
])
async def test_a_sandbox_that_cannot_start_fails_start_with_its_own_reason(
    tmp_path: Path, client: Any, gateway: FakeGateway, status: dict[str, Any], reason: str,
) -> None:
    gateway.outcome = status
    environment = make(tmp_path, client, config={"cpus": 64})
    with pytest.raises(SandboxStartError) as failed:
        await environment.start(force_build=False)
    assert failed.value.reason == reason
    assert reason in str(failed.value) and "cpu=64" in str(failed.value)
    assert failed.value.condition_message and failed.value.condition_message in str(failed.value)
    assert gateway.deleted == ["hello-abc12-env-x0001"], "the SDK deletes the sandbox that did not start"


async def test_an_unknown_gpu_type_fails_start_with_the_operators_refusal(tmp_path: Path, client: Any,
                                                                         gateway: FakeGateway) -> None:
    refusal = ("the operator refuses this sandbox's placement: spec.resources.gpu.types: unknown GPU type \"v100\" "
               "(known: a100, h100); the operator's GPU type map gets a type with --gpu-type NAME=LABEL=VALUE "
               "(env ORCHARD_GPU_TYPES, Helm value gpu.types)")
    gateway.outcome = {"phase": "Failed", "reason": "PlacementRefused", "message": refusal,
                       "conditions": [{"type": "Ready", "status": "False", "reason": "PlacementRefused"}]}
    environment = make(tmp_path, client, config={"gpus": 1, "gpu_types": ["V100"]})
    with pytest.raises(SandboxStartError) as failed:
        await environment.start(force_build=False)
    assert failed.value.reason == "PlacementRefused" and failed.value.condition_message == refusal
    assert "gpu=1 (V100)" in str(failed.value) and "known: a100, h100" in str(failed.value)


async def test_a_spec_the_api_server_refuses_fails_start_with_its_rule(tmp_path: Path, client: Any,
                                                                      gateway: FakeGateway) -> None:
    gateway.create_error = error(422, "TtlBeyondMaximum", "lifecycle.ttlSeconds 999999 is beyond the operator's maximum of 86400s")
    with pytest.raises(SandboxStartError, match="TtlBeyondMaximum") as failed:
        await started(tmp_path, client, ttl_seconds=999999)
    assert failed.value.reason == "TtlBeyondMaximum"


async def test_start_waits_less_than_harbors_own_start_timeout(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    gateway.outcome = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False", "reason": "NotScheduled",
                                                           "message": "0/3 nodes are available: 3 Insufficient cpu."}]}

    def never_ready(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/wait"):
            return error(504, "WaitTimeout", "not yet", phase="Pending", reason="NotScheduled",
                         conditionMessage="0/3 nodes are available: 3 Insufficient cpu.", retryable=True)
        return gateway(request)

    environment = make(tmp_path, config={"build_timeout_sec": 600})
    assert environment.create_arguments()["wait_timeout"] == 585.0
    from orchard_env import AsyncSandboxClient
    async with AsyncSandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(never_ready),
                                  retry=FAST) as impatient:
        environment = make(tmp_path, impatient, wait_timeout_sec=0.2)
        with pytest.raises(SandboxStartError, match="Insufficient cpu") as failed:
            await environment.start(force_build=False)
    assert failed.value.reason == "NotScheduled"


# -- exec ---------------------------------------------------------------------------------------------


async def test_exec_runs_bash_with_cwd_env_user_and_timeout(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    gateway.exec = lambda body: exec_answer("out\n", "err\n", 3)
    environment = await started(tmp_path, client, persistent_env={"JOB_VAR": "job"})
    environment.default_user = "agent"
    with environment.scoped_exec_env({"SCOPED": "1"}):
        result = await environment.exec("echo hi; exit 3", env={"CALL": "c"}, timeout_sec=30)
    assert (result.stdout, result.stderr, result.return_code) == ("out\n", "err\n", 3)
    await environment.exec("id", cwd="/tmp", user=0)
    first, second = gateway.execs
    assert first["argv"] == ["bash", "-c", "echo hi; exit 3"]
    assert first["cwd"] == "/app", "the task's workdir"
    assert first["env"] == {"TASK_VAR": "task", "JOB_VAR": "job", "CALL": "c", "SCOPED": "1"}
    assert first["user"] == "agent" and first["timeoutSeconds"] == 30
    assert second["cwd"] == "/tmp" and second["user"] == "0"
    assert second["timeoutSeconds"] == NO_TIMEOUT_SECONDS, "no timeout_sec: Harbor bounds the call itself"


async def test_exec_answers_like_harbors_kubernetes_backends(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    answers = iter([
        exec_answer("partial", "", None, timed_out=True, signal=9),
        exec_answer("", "", None, signal=9, oom_killed=True),
        exec_answer("", "", None, signal=15),
        exec_answer(),
    ])
    gateway.exec = lambda body: next(answers)
    environment = await started(tmp_path, client)
    timed_out = await environment.exec("sleep 100", timeout_sec=2)
    assert (timed_out.return_code, timed_out.stdout, timed_out.stderr) == (124, "partial", "Command timed out after 2 seconds")
    oom = await environment.exec("python3 big.py")
    assert oom.return_code == 137 and "out-of-memory killer" in (oom.stderr or "")
    assert (await environment.exec("kill -TERM $$")).return_code == 143
    quiet = await environment.exec("true")
    assert (quiet.stdout, quiet.stderr, quiet.return_code) == (None, None, 0), "empty streams are None, as Docker's"


async def test_a_missing_cwd_or_user_is_the_commands_failure_not_an_exception(tmp_path: Path, client: Any,
                                                                              gateway: FakeGateway) -> None:
    answers = iter([error(400, "InvalidCwd", "cwd /nope does not exist"),
                    error(400, "BadRequest", "no user `ghost` in the image's /etc/passwd")])
    gateway.exec = lambda body: next(answers)
    environment = await started(tmp_path, client)
    missing_cwd = await environment.exec("ls", cwd="/nope")
    assert missing_cwd.return_code == 126 and missing_cwd.stderr == "cwd /nope does not exist"
    missing_user = await environment.exec("ls", user="ghost")
    assert missing_user.return_code == 126 and "ghost" in (missing_user.stderr or "")


async def test_an_agent_that_cannot_switch_to_root_is_a_clear_error(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    gateway.exec = lambda body: error(403, "Forbidden", "the agent runs as uid 1000, not root, so it cannot run commands as uid 0:0; leave out `user`, or run the agent as root")
    environment = await started(tmp_path, client)
    with pytest.raises(OrchardEnvironmentError, match="image's USER, which must be root"):
        await environment.exec("rm -rf /logs/verifier", user="root")


async def test_a_sandbox_that_is_gone_raises_instead_of_answering_a_result(tmp_path: Path, client: Any,
                                                                         gateway: FakeGateway) -> None:
    environment = await started(tmp_path, client)
    gateway.sandboxes.clear()
    with pytest.raises(NotFound):
        await environment.exec("true")


async def test_exec_streams_output_to_harbors_callback(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    gateway.exec = lambda body: exec_answer("line one\nline two\n", "warning\n", 0)
    environment = await started(tmp_path, client)
    seen: list[tuple[str, str]] = []

    async def callback(text: str, stream: str) -> None:
        seen.append((stream, text))

    with environment.scoped_output_callback(callback):
        result = await environment.exec("make", timeout_sec=5)
    assert result.stdout == "line one\nline two\n" and result.stderr == "warning\n" and result.return_code == 0
    assert "".join(t for s, t in seen if s == "stdout") == "line one\nline two\n" and len(seen) > 3
    assert any(r[1].endswith("/exec/stream") for r in gateway.requests)


async def test_is_dir_and_is_file_test_the_path(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    environment = await started(tmp_path, client)
    gateway.write("/app/main.py", "print(1)")
    assert await environment.is_dir("/app") and not await environment.is_file("/app")
    assert await environment.is_file("/app/main.py") and not await environment.is_dir("/app/main.py")
    assert not await environment.is_file("/missing")
    assert gateway.execs[-1]["argv"] == ["bash", "-c", "test -f /missing"]


# -- healthcheck (Harbor's Docker-HEALTHCHECK loop on this exec) --------------------------------------


async def test_healthcheck_failures_in_the_start_period_do_not_count(tmp_path: Path, client: Any,
                                                                     gateway: FakeGateway) -> None:
    codes = iter([1, 1, 1, 1, 0])
    gateway.exec = lambda body: exec_answer(exit_code=next(codes))
    environment = await started(tmp_path, client, config={"healthcheck": HealthcheckConfig(
        command="curl -fs localhost:8000", start_period_sec=5, start_interval_sec=0.01, interval_sec=0.01,
        retries=2, timeout_sec=3)})
    await environment.run_healthcheck()
    assert len(gateway.execs) == 5 and gateway.execs[0]["timeoutSeconds"] == 3


async def test_healthcheck_fails_after_its_retries_and_a_timeout_counts_as_a_failure(tmp_path: Path, client: Any,
                                                                                    gateway: FakeGateway) -> None:
    gateway.exec = lambda body: exec_answer(exit_code=None, timed_out=True, signal=9)
    environment = await started(tmp_path, client)
    check = HealthcheckConfig(command="./ready.sh", interval_sec=0.01, retries=3, timeout_sec=1)
    with pytest.raises(HealthcheckError, match="3 consecutive"):
        await environment.run_healthcheck(check)
    assert len(gateway.execs) == 3


# -- files ---------------------------------------------------------------------------------------------


async def test_upload_file_keeps_the_mode_and_follows_docker_cp_into_a_directory(tmp_path: Path, client: Any,
                                                                                gateway: FakeGateway) -> None:
    environment = await started(tmp_path, client)
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ok\n")
    script.chmod(0o755)
    await environment.upload_file(script, "/opt/tools/run-it.sh")
    assert gateway.fs["/opt/tools/run-it.sh"].data == b"#!/bin/sh\necho ok\n"
    assert gateway.fs["/opt/tools/run-it.sh"].mode == 0o755
    await environment.upload_file(str(script), "/opt/tools")
    assert "/opt/tools/run.sh" in gateway.fs, "an existing directory receives the file"
    await environment.upload_file(script, "/new/dir/")
    assert "/new/dir/run.sh" in gateway.fs


async def test_directories_round_trip_with_modes_and_symlinks(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    environment = await started(tmp_path, client)
    source = tmp_path / "tests"
    (source / "lib").mkdir(parents=True)
    (source / "test.sh").write_text("#!/bin/bash\n")
    (source / "test.sh").chmod(0o755)
    (source / "lib" / "util.py").write_text("X = 1\n")
    os.symlink("test.sh", source / "run")
    await environment.upload_dir(source, "/tests")
    assert gateway.fs["/tests/test.sh"].mode & 0o111 and gateway.fs["/tests/run"].type == "symlink"
    back = tmp_path / "back"
    await environment.download_dir("/tests", back)
    assert (back / "lib" / "util.py").read_text() == "X = 1\n"
    assert stat.S_IMODE((back / "test.sh").stat().st_mode) & 0o111, "the mode is kept"
    assert os.readlink(back / "run") == "test.sh", "the symlink is kept, not followed"


async def test_download_dir_skips_a_link_that_leaves_the_directory_and_keeps_the_rest(tmp_path: Path, client: Any,
                                                                                      gateway: FakeGateway) -> None:
    environment = await started(tmp_path, client)
    gateway.write("/logs/agent/trajectory.json", "{}")
    gateway.put("/logs/agent/passwd", Node("symlink", target="/etc/passwd"))
    await environment.download_dir("/logs/agent", tmp_path / "agent")
    assert (tmp_path / "agent" / "trajectory.json").read_text() == "{}"
    assert not (tmp_path / "agent" / "passwd").exists()


async def test_download_file_creates_the_local_parents(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    environment = await started(tmp_path, client)
    gateway.write("/logs/verifier/reward.txt", "1\n")
    await environment.download_file("/logs/verifier/reward.txt", tmp_path / "out" / "deep" / "reward.txt")
    assert (tmp_path / "out" / "deep" / "reward.txt").read_text() == "1\n"
    with pytest.raises(NotFound):
        await environment.download_file("/logs/verifier/missing.txt", tmp_path / "missing.txt")


# -- network -------------------------------------------------------------------------------------------


async def test_the_network_policy_switches_live_between_phases(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    agent_phase = NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org", "*.github.com", "10.0.0.7"])
    environment = await started(tmp_path, client, network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
                                phase_network_policies=[agent_phase, NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)])
    assert gateway.created[0]["network"] == {"egress": "Deny"}
    await environment.set_network_policy(agent_phase)
    await environment.set_network_policy(agent_phase)  # unchanged: no request
    await environment.set_network_policy(NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
    await environment.set_network_policy(NetworkPolicy())
    assert gateway.networks == [
        {"egress": "AllowList", "allow": [{"host": "pypi.org"}, {"host": "*.github.com"}, {"cidr": "10.0.0.7/32"}]},
        {"egress": "Deny"},
        {"egress": "AllowAll"},
    ]
    [put] = [r for r in gateway.requests if r[0] == "PUT" and r[1].endswith("/network")][:1]
    assert put[2] == {"timeoutSeconds": "30"}, "waits for the egress proxy to enforce host rules"
    assert environment.network_policy.network_mode == NetworkMode.PUBLIC


async def test_host_rules_the_proxy_does_not_enforce_fail_the_switch(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    gateway.network_answer = {"generation": 4, "hostRulesInForce": False, "message": "allow[0].host: cannot resolve"}
    environment = await started(tmp_path, client, network_wait_sec=2)
    with pytest.raises(OrchardEnvironmentError, match="cannot resolve"):
        await environment.set_network_policy(NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["pypi.org"]))
    assert environment.network_policy.network_mode == NetworkMode.PUBLIC, "the previous policy is still the one in force"


# -- stop ----------------------------------------------------------------------------------------------


async def test_stop_deletes_the_sandbox_or_keeps_it_with_no_delete(tmp_path: Path, client: Any, gateway: FakeGateway) -> None:
    deleted = await started(tmp_path, client)
    await deleted.stop(delete=True)
    assert gateway.deleted == ["hello-abc12-env-x0001"]
    kept = await started(tmp_path, client)
    await kept.stop(delete=False)
    assert gateway.deleted == ["hello-abc12-env-x0001"] and "hello-abc12-env-x0002" in gateway.sandboxes
    with pytest.raises(OrchardEnvironmentError, match="not started"):
        await kept.exec("true")
    await kept.stop(delete=True)  # twice is fine


async def test_stop_closes_the_client_it_made(tmp_path: Path, gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    original = integration.AsyncSandboxClient

    def factory(*args: Any, **kwargs: Any) -> Any:
        made.append(original(*args, transport=httpx.MockTransport(gateway), retry=FAST, **kwargs))
        return made[-1]

    monkeypatch.setattr(integration, "AsyncSandboxClient", factory)
    environment = make(tmp_path, gateway_url="http://gw", namespace=NS)
    await environment.start(force_build=False)
    await environment.stop(delete=True)
    assert made and made[0]._http.is_closed and gateway.deleted


# -- preflight -----------------------------------------------------------------------------------------


class Rbac:
    """The gateway's authorisation: ``allowed`` (verb, resource) pairs pass, others get its 403."""

    ROUTES = {("POST", ""): ("create", "sandboxes"), ("GET", ""): ("get", "sandboxes"),
              ("DELETE", ""): ("delete", "sandboxes"), ("POST", "exec"): ("create", "sandboxes/exec"),
              ("PUT", "files"): ("create", "sandboxes/files"), ("GET", "files/stat"): ("get", "sandboxes/files"),
              ("PUT", "network"): ("update", "sandboxes/network"), ("POST", "heartbeat"): ("create", "sandboxes/heartbeat")}

    def __init__(self, allowed: set[tuple[str, str]], *, token_ok: bool = True) -> None:
        self.allowed, self.token_ok = allowed, token_ok
        self.seen: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/healthz":
            return httpx.Response(200, text="ok")
        if not self.token_ok:
            return error(401, "Unauthorized", "the API server did not accept the token")
        rest = path.removeprefix(f"/v1/namespaces/{NS}/sandboxes").lstrip("/")
        route = rest.partition("/")[2] if rest else ""
        verb, resource = self.ROUTES[(request.method, route)]
        self.seen.append((verb, resource))
        if (verb, resource) not in self.allowed:
            return error(403, "Forbidden", f"user alice cannot {verb} {resource} in namespace {NS}; grant it with a "
                         f'Role rule {{apiGroups: ["orchard.dev"], resources: ["{resource}"], verbs: ["{verb}"]}}')
        if request.method == "POST" and route == "":
            return error(400, "BadRequest", "the body must be a JSON object")
        return error(404, "NotFound", "sandbox not found")


def rbac_client(rbac: Any) -> SandboxClient:
    return SandboxClient("http://gw", "t", namespace=NS, transport=httpx.MockTransport(rbac), retry=FAST)


def test_preflight_passes_when_every_permission_is_granted_and_changes_nothing() -> None:
    rbac = Rbac(set(integration.REQUIRED_ACCESS))
    with rbac_client(rbac) as client:
        assert check_access(client) == []
    assert rbac.seen == list(integration.REQUIRED_ACCESS), "one cheap call per permission"


def test_preflight_names_each_missing_rule() -> None:
    granted = set(integration.REQUIRED_ACCESS) - {("create", "sandboxes/exec"), ("update", "sandboxes/network")}
    with rbac_client(Rbac(granted)) as client:
        problems = check_access(client)
    assert len(problems) == 2
    assert problems[0].startswith("missing RBAC create sandboxes/exec (API group orchard.dev) in namespace ns")
    assert 'resources: ["sandboxes/exec"], verbs: ["create"]' in problems[0]
    assert 'resources: ["sandboxes/network"], verbs: ["update"]' in problems[1]


def test_preflight_says_when_the_token_or_the_gateway_is_wrong() -> None:
    with rbac_client(Rbac(set(), token_ok=False)) as client:
        assert check_access(client) == [
            "the gateway refuses the token (401 Unauthorized: the API server did not accept the token); "
            "set ORCHARD_TOKEN or ORCHARD_TOKEN_FILE"]

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with rbac_client(down) as client:
        [problem] = check_access(client)
    assert problem.startswith("the gateway http://gw does not answer") and "ORCHARD_GATEWAY_URL" in problem


def test_harbor_runs_the_preflight_by_import_path(monkeypatch: pytest.MonkeyPatch) -> None:
    rbac = Rbac({("create", "sandboxes"), ("get", "sandboxes"), ("delete", "sandboxes")})
    monkeypatch.setattr(integration, "SandboxClient", lambda **kwargs: rbac_client(rbac))
    with pytest.raises(SystemExit) as stopped:
        EnvironmentFactory.run_preflight(None, IMPORT_PATH)
    text = str(stopped.value)
    assert text.startswith("Orchard Env preflight failed (gateway http://gw, namespace ns):")
    for missing in ("create sandboxes/exec", "create sandboxes/files", "get sandboxes/files",
                    "update sandboxes/network", "create sandboxes/heartbeat"):
        assert f"- missing RBAC {missing} " in text
    rbac.allowed = set(integration.REQUIRED_ACCESS)
    EnvironmentFactory.run_preflight(None, IMPORT_PATH)  # passes


def test_the_tar_helpers_of_harbor_refuse_members_individually(tmp_path: Path) -> None:
    """What download_dir relies on: Harbor's extract_dir skips a refused member and goes on."""
    from harbor.environments.tar_transfer import extract_dir

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        link = tarfile.TarInfo("out")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
        info = tarfile.TarInfo("ok.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"ok"))
    buffer.seek(0)
    refused = extract_dir(buffer, tmp_path)
    assert len(refused) == 1 and (tmp_path / "ok.txt").read_bytes() == b"ok"
