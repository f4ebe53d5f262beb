#!/usr/bin/env python3
"""A trainer-driven RolloutGroup whose trajectories are mini-swe-agent runs in Orchard Env sandboxes.

The task: a tiny Python package whose ``add`` subtracts, with a failing unit test. Each trajectory
Sandbox gets the repository uploaded at the start of its episode; mini-swe-agent's ``DefaultAgent`` then
works on it through :class:`~orchard_env.integrations.minisweagent.OrchardEnvironment`, driven by a
``DeterministicModel`` whose scripted answers differ per trajectory (stand-ins for a policy's samples):
trajectories 0 and 5 fix the bug, trajectory 2 "cheats" by rewriting the test, the others make a wrong
edit or none. After the agent submits, the *trainer* computes the reward: it puts the held-out test file
back (whatever the agent did to it) and runs the tests through the gateway; nothing the agent wrote
decides the reward.

BAR (N=4, Nmax=8, stride 4, positiveFraction 0.5: a balanced group is 2 positives and 2 negatives):
the first stride has one positive, so the controller launches a second stride; with trajectory 5 the
group is recorded ``Balanced`` with members 0 and 5 (reward 1) and the two shortest negatives.

    pip install './sdk/python[minisweagent]'   # from a checkout
    python examples/minisweagent_rollout.py GATEWAY_URL TOKEN NAMESPACE IMAGE

``IMAGE`` needs ``bash`` and ``python3`` (``python:3.11``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", os.path.join(tempfile.gettempdir(), "mini-swe-agent-config"))

from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

from orchard_env import GroupResult, Sandbox, SandboxClient  # noqa: E402
from orchard_env.integrations.minisweagent import OrchardEnvironment  # noqa: E402

#: Where the repository goes, relative to the sandbox's working directory.
REPO = "repo"
BUGGY = "def add(a, b):\n    return a - b\n"
TEST = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class AddTest(unittest.TestCase):\n"
    "    def test_add(self):\n"
    "        self.assertEqual(add(2, 3), 5)\n"
    "        self.assertEqual(add(-1, 1), 0)\n\n\n"
    "if __name__ == '__main__':\n    unittest.main()\n"
)
FILES = {"calc/__init__.py": BUGGY, "tests/__init__.py": "", "tests/test_calc.py": TEST}
TASK = "The unit tests in tests/ fail: `python3 -m unittest` shows why. Fix the bug in calc/ and submit."
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
FIX = "sed -i 's/return a - b/return a + b/' calc/__init__.py"
WRONG = "sed -i 's/return a - b/return a * b/' calc/__init__.py"
CHEAT = "sed -i 's/assertEqual(add(2, 3), 5)/assertEqual(add(2, 3), -1)/; /add(-1, 1)/d' tests/test_calc.py"
LOOK = "cat calc/__init__.py"
TESTS = "python3 -m unittest -q 2>&1 | tail -n 3"
#: The scripted commands of each trajectory (index in the group): what a policy would have sampled.
#: Positives: 0 and 5. The negatives have different lengths (steps), so the group's members are fixed.
SCRIPTS: dict[int, list[str]] = {
    0: [TESTS, LOOK, FIX, TESTS, SUBMIT],
    1: [TESTS, LOOK, WRONG, SUBMIT],
    2: [TESTS, LOOK, CHEAT, TESTS, SUBMIT],
    3: [TESTS, LOOK, LOOK, WRONG, TESTS, LOOK, SUBMIT],
    4: [TESTS, LOOK, LOOK, LOOK, LOOK, LOOK, LOOK, SUBMIT],
    5: [LOOK, FIX, SUBMIT],
    6: [TESTS, LOOK, WRONG, TESTS, LOOK, LOOK, LOOK, LOOK, SUBMIT],
    7: [TESTS, SUBMIT],
}
#: The recorded group: BAR ranks by status, then length (steps), then name; Balanced takes the 2 best
#: positives and the 2 best negatives (trajectory 2's rewritten test does not count: the trainer scores).
EXPECTED_GROUP = {"0": 1.0, "5": 1.0, "7": 0.0, "1": 0.0}


def script(index: int) -> list[dict[str, Any]]:
    """The model's scripted answers for trajectory ``index``."""
    return [make_output(f"step {n}", [{"command": command}]) for n, command in enumerate(SCRIPTS[index % 8])]


def upload_repo(sandbox: Sandbox) -> None:
    """Puts the task's repository into the sandbox's working directory (a real image could bake it in)."""
    for path, content in FILES.items():
        sandbox.upload(f"{REPO}/{path}", content)


#: The trainer's test run: compiled files go first (stale or planted ``__pycache__`` would decide
#: otherwise: a same-size edit within the second of an earlier test run keeps the old bytecode valid).
SCORE = "find . -name __pycache__ -prune -exec rm -rf {} + && exec python3 -B -m unittest -q"


def reward(sandbox: Sandbox) -> float:
    """The trainer's verdict: the held-out test file goes back in place, then the tests run through the
    gateway; 1.0 if they pass."""
    sandbox.upload(f"{REPO}/tests/test_calc.py", TEST)
    result = sandbox.exec(["/bin/sh", "-c", SCORE], cwd=REPO, timeout=60)
    return 1.0 if result.ok else 0.0


def episode(sandbox: Sandbox) -> dict[str, Any]:
    """One trajectory: the repository, mini-swe-agent's loop to submission, then the trainer's reward."""
    index = int(sandbox.name.rsplit("-", 1)[1])
    upload_repo(sandbox)
    env = OrchardEnvironment(sandbox=sandbox, cwd=REPO, timeout=60)
    agent = DefaultAgent(
        DeterministicModel(outputs=script(index)), env,
        system_template="You are a software engineer. Run one shell command per step.",
        instance_template="{{task}}", step_limit=20, cost_limit=0,
    )
    outcome = agent.run(TASK)
    return {
        "reward": reward(sandbox),
        "length": agent.n_calls,
        "status": "completed" if outcome.get("exit_status") == "Submitted" else "truncated",
        "message": f"mini-swe-agent: {outcome.get('exit_status')}",
    }


def run(client: SandboxClient, image: str, *, concurrency: int = 4, timeout: float = 600) -> GroupResult:
    """Creates the group (template without ``run``: the trainer drives it) and drives it to completion."""
    template = {"image": image}  # no `run`: the trainer drives the trajectories and records results
    with client.create_rollout_group(
        template, generate_name="swe-", group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.5, 0.5),
        trajectory_timeout_seconds=300,
    ) as group:
        return group.drive(episode, concurrency=concurrency, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gateway", help="gateway URL, e.g. http://localhost:8443")
    parser.add_argument("token", help="bearer token of a user with the trainer Role")
    parser.add_argument("namespace")
    parser.add_argument("image", nargs="?", default="python:3.11", help="image with bash and python3")
    args = parser.parse_args(argv)
    with SandboxClient(args.gateway, args.token, namespace=args.namespace) as client:
        result = run(client, args.image)
    print(f"{result.name}: {result.phase} {result.selection}, positives {result.positives}")
    for member in result.group:
        print(f"  {member.name}: reward {member.reward} length {member.length} ({member.status})")
    members = {m.name.rsplit("-", 1)[1]: m.reward for m in result.group}
    return 0 if result.complete and result.selection == "Balanced" and members == EXPECTED_GROUP else 1


if __name__ == "__main__":
    sys.exit(main())
