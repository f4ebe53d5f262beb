"""The Harbor task set (e2e/harbor-tasks) run without Kubernetes, Orchard or Harbor: the same image's
root filesystem, the same scripts, executed by mini-swe-agent's ``LocalEnvironment`` on this machine.
The paper's equivalence check in miniature: e2e/tests/harbor.rs runs the tasks through ``harbor run``
on Orchard and through this, and compares the rewards task by task.

Each task gets a file system of its own: an overlay of the image's root filesystem (its OCI layout,
unpacked once) and the task's changes. Every command
runs as a Harbor trial runs it (Harbor 0.25's oracle agent and verifier):

    healthcheck (Docker HEALTHCHECK: start period, interval, retries) when the task has one,
    /solution <- solution/, then  <solve.sh> > /logs/agent/oracle.txt 2>&1   (oracle agent only)
        as [agent].user, env [environment].env + [solution].env, cwd [environment].workdir,
        killed with its whole process group after [agent].timeout_sec,
    /tests <- tests/, then  /tests/test.sh > /logs/verifier/test-stdout.txt 2>&1
        as [verifier].user (root), env [environment].env + [verifier].env,
    reward = /logs/verifier/reward.txt.

A command is ``LocalEnvironment.execute`` of a shell line that enters, with util-linux tools, a mount and
PID namespace of its own (the task's overlay, its /proc, and /dev/null, zero, random, urandom bound
from the host), the task's file system (``chroot``), the user (``setpriv``) and a network: ``no-network`` a new empty network
namespace; ``public`` and ``allowlist`` the namespace given by ``--netns`` (the test's node, which
routes to its fake internet; an allowlist is not narrowed here, which changes nothing for tasks whose
solutions only use their allowed hosts). Needs root.

Usage: local_trials.py --tasks DIR --image-layout OCI_DIR --netns /proc/PID/ns/net
                       --nameserver IP --agent oracle|nop --out results.json [--task NAME ...]
Prints one JSON object: task name -> {"reward", "agent_exit", "agent_timed_out", "seconds"}.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import shutil
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from minisweagent.environments.local import LocalEnvironment

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEVICES = ("null", "zero", "random", "urandom")


def unpack(layout: Path, root: Path) -> None:
    """The image of OCI layout ``layout`` (one manifest) unpacked into ``root`` (whiteouts applied)."""
    index = json.loads((layout / "index.json").read_text())
    blob = lambda digest: layout / "blobs" / Path(*digest.split(":", 1))  # noqa: E731
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    for layer in manifest["layers"]:
        path = blob(layer["digest"])
        opener = gzip.open if layer["mediaType"].endswith("gzip") else open
        with opener(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                name = Path(member.name)
                if name.name.startswith(".wh."):
                    target = root / name.parent / name.name[len(".wh."):]
                    shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
                    continue
                tar.extract(member, root, set_attrs=True, numeric_owner=True, filter="fully_trusted")


def user_ids(root: Path, user: str | int | None) -> tuple[int, int]:
    """uid and gid of ``user`` (a name in the image's /etc/passwd, or a number); root when unset."""
    if user is None:
        return 0, 0
    if isinstance(user, int) or str(user).isdigit():
        return int(user), int(user)
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise SystemExit(f"user {user!r} is not in the image's /etc/passwd")


class Sandbox:
    """One task's file system, an overlay of the image's unpacked root filesystem (read only, shared by
    every task) and a directory of the task's own changes, and the way into it."""

    def __init__(self, base: Path, work: Path, netns: str, nameserver: str) -> None:
        self.base = base
        self.upper = work / "upper"
        self.overlay_work = work / "work"
        self.merged = work / "merged"
        for directory in (self.upper / "etc", self.overlay_work, self.merged):
            directory.mkdir(parents=True)
        self.netns = netns
        (self.upper / "etc/resolv.conf").write_text(f"nameserver {nameserver}\n")

    def path(self, target: str) -> Path:
        """Where the task's own copy of ``target`` is (what it wrote; copied in files)."""
        return self.upper / target.lstrip("/")

    def command(self, line: str, *, user: str | int | None, cwd: str, env: dict[str, str], network: str) -> str:
        """The host shell line that runs ``line`` (bash) inside the sandbox."""
        uid, gid = user_ids(self.base, user)
        merged = shlex.quote(str(self.merged))
        options = f"lowerdir={self.base},upperdir={self.upper},workdir={self.overlay_work}"
        mounts = [f"mount -t overlay overlay -o {shlex.quote(options)} {merged}",
                  f"mount -t proc proc {merged}/proc"] + [
            f"mount --bind /dev/{d} {merged}/dev/{d}" for d in DEVICES
        ]
        variables = {"PATH": PATH, "HOME": "/root" if uid == 0 else "/tmp", "LANG": "C.UTF-8", **env}
        exec_line = " ".join([
            "exec chroot", merged,
            "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "env", "-i", *(shlex.quote(f"{k}={v}") for k, v in variables.items()),
            "bash", "-c", shlex.quote(f"cd {shlex.quote(cwd)} && {line}"),
        ])
        setup = " && ".join(mounts + [exec_line])
        # Its own mount namespace (the mounts end with the command) and PID namespace (killing the
        # command kills everything it started).
        namespaces = "unshare --mount --propagation private --pid --fork --kill-child"
        if network == "no-network":
            namespaces += " --net"
            enter = ""
        else:
            enter = f"nsenter --net={shlex.quote(self.netns)} -- "
        return f"exec {enter}{namespaces} -- sh -c {shlex.quote(setup)}"

    def copy_in(self, source: Path, target: str) -> None:
        destination = self.path(target)
        shutil.rmtree(destination, ignore_errors=True)
        shutil.copytree(source, destination, symlinks=True)


def phase_network(phase: dict[str, Any], environment: dict[str, Any]) -> str:
    """A phase's network mode: its own, else the environment's baseline (Harbor's default is public)."""
    return phase.get("network_mode") or environment.get("network_mode") or "public"


def healthcheck(sandbox: Sandbox, shell: LocalEnvironment, check: dict[str, Any], workdir: str,
                env: dict[str, str], network: str) -> None:
    """Docker HEALTHCHECK semantics as Harbor runs them: failures during the start period do not count;
    after it, ``retries`` consecutive failures fail the trial."""
    start = time.monotonic()
    failures = 0
    while True:
        result = shell.execute({"command": sandbox.command(check["command"], user=None, cwd=workdir, env=env,
                                                           network=network)},
                               timeout=int(check.get("timeout_sec", 30)))
        if result["returncode"] == 0:
            return
        in_start_period = time.monotonic() - start < float(check.get("start_period_sec", 0))
        if not in_start_period:
            failures += 1
            if failures >= int(check.get("retries", 3)):
                raise SystemExit(f"healthcheck failed {failures} times: {result['output'][-500:]}")
        interval = check.get("start_interval_sec" if in_start_period else "interval_sec", 5)
        time.sleep(float(interval))


def run_task(task: Path, base: Path, netns: str, nameserver: str, agent: str, work: Path) -> dict[str, Any]:
    config = tomllib.loads((task / "task.toml").read_text())
    environment = config.get("environment", {})
    agent_config = config.get("agent", {})
    verifier = config.get("verifier", {})
    workdir = environment.get("workdir") or "/"
    env = {k: str(v) for k, v in environment.get("env", {}).items()}
    sandbox = Sandbox(base, work / task.name, netns, nameserver)
    shell = LocalEnvironment(cwd=str(work), timeout=600)
    started = time.monotonic()
    setup = f"mkdir -p {shlex.quote(workdir)} /logs/agent /logs/verifier /logs/artifacts && chmod 777 /logs/agent /logs/artifacts"
    result = shell.execute({"command": sandbox.command(setup, user=None, cwd="/", env={}, network="no-network")})
    if result["returncode"] != 0:
        raise SystemExit(f"{task.name}: setup failed: {result['output']}")
    if environment.get("healthcheck"):
        healthcheck(sandbox, shell, environment["healthcheck"], workdir, env, phase_network({}, environment))

    agent_exit, timed_out = None, False
    if agent == "oracle":
        sandbox.copy_in(task / "solution", "/solution")
        solution_env = {k: str(v) for k, v in config.get("solution", {}).get("env", {}).items()}
        line = "/solution/solve.sh > /logs/agent/oracle.txt 2>&1"
        timeout = agent_config.get("timeout_sec")
        result = shell.execute(
            {"command": sandbox.command(line, user=agent_config.get("user"), cwd=workdir,
                                        env={**env, "DEBIAN_FRONTEND": "noninteractive", **solution_env},
                                        network=phase_network(agent_config, environment))},
            timeout=int(timeout) if timeout else 600,
        )
        agent_exit = result["returncode"]
        timed_out = result.get("extra", {}).get("exception_type") == "TimeoutExpired"

    sandbox.copy_in(task / "tests", "/tests")
    verifier_env = {**env, **{k: str(v) for k, v in verifier.get("env", {}).items()}}
    line = "/tests/test.sh > /logs/verifier/test-stdout.txt 2>&1"
    shell.execute({"command": sandbox.command(line, user=verifier.get("user"), cwd=workdir, env=verifier_env,
                                              network=phase_network(verifier, environment))},
                  timeout=int(verifier.get("timeout_sec", 600)))
    reward_file = sandbox.path("/logs/verifier/reward.txt")
    reward = float(reward_file.read_text().strip()) if reward_file.exists() else None
    seconds = round(time.monotonic() - started, 3)
    shutil.rmtree(work / task.name, ignore_errors=True)
    return {"reward": reward, "agent_exit": agent_exit, "agent_timed_out": timed_out, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--image-layout", type=Path, required=True)
    parser.add_argument("--netns", required=True)
    parser.add_argument("--nameserver", required=True)
    parser.add_argument("--agent", choices=("oracle", "nop"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--task", action="append", default=[])
    arguments = parser.parse_args()
    tasks = sorted(p for p in arguments.tasks.iterdir() if (p / "task.toml").is_file())
    if arguments.task:
        tasks = [t for t in tasks if t.name in arguments.task]
    results = {}
    with tempfile.TemporaryDirectory(prefix="harbor-local-") as work:
        base = Path(work) / "image"
        base.mkdir()
        unpack(arguments.image_layout, base)
        for device in DEVICES:
            (base / "dev" / device).touch()
        for task in tasks:
            results[task.name] = run_task(task, base, arguments.netns, arguments.nameserver, arguments.agent,
                                          Path(work))
    arguments.out.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    os.umask(0o022)
    main()
