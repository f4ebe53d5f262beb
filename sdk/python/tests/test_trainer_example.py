"""``examples/grpo_rollouts.py``, the example of docs/TRAINERS.md's GRPO section: the Python block there is
the example's code (each of its paragraphs appears in the example as written), and the example collects a
fixed batch of BAR groups with payloads, on the fake controller (no cluster) and, marked ``cluster``, on
the local cluster."""

from __future__ import annotations

import asyncio
import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from fake_controller import FakeController
from orchard_env import AsyncSandboxClient, RetryPolicy

from conftest import Cluster

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "grpo_rollouts.py"
MARKER = "<!-- run by: sdk/python/tests/test_trainer_example.py -->"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpo_rollouts", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_trainers_md_block_is_the_examples_code() -> None:
    doc = (ROOT / "docs" / "TRAINERS.md").read_text()
    assert doc.count(MARKER) == 1
    block = doc.split(MARKER + "\n```python\n", 1)[1].split("```", 1)[0]
    source = EXAMPLE.read_text()
    paragraphs = [p for p in block.split("\n\n") if p.strip()]
    assert len(paragraphs) >= 4
    for paragraph in paragraphs:
        assert paragraph.strip("\n") in source, f"not in examples/grpo_rollouts.py as written:\n{paragraph}"


class MeteredPolicy:
    """The example's policy, counting the requests it serves at once."""

    def __init__(self, example: ModuleType) -> None:
        self.inner = example.FakePolicy(latency=0.01)
        self.max_concurrency = self.inner.max_concurrency
        self.now = self.peak = self.calls = 0

    async def generate(self, question: str, seed: str) -> dict[str, Any]:
        self.now += 1
        self.calls += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.inner.generate(question, seed)
        finally:
            self.now -= 1


def check(example: ModuleType, groups: list[Any], batch: int) -> None:
    assert len(groups) == batch
    for prompt, members in groups:
        assert prompt.a % 5 in (1, 2, 3), "prompts always right or never right are Dropped, never trained on"
        assert len(members) == 4, "exactly groupSize members"
        advantages = [adv for _, _, adv in members]
        assert abs(sum(advantages)) < 1e-9 and statistics.pstdev(advantages) > 0
        for tokens, logprobs, advantage in members:
            right = "".join(map(chr, tokens)) == str(prompt.a + prompt.b)
            assert (advantage > 0) == right, "each member's payload is its own trajectory's (matched by name)"
            assert len(logprobs) == len(tokens)


def test_the_example_collects_a_fixed_batch_of_groups_with_payloads_on_the_fake_controller() -> None:
    example = load_example()
    fake = FakeController()
    policy = MeteredPolicy(example)

    async def main() -> Any:
        async with AsyncSandboxClient("http://gw", "t", namespace="ns", transport=httpx.MockTransport(fake.ahandle),
                                      retry=RetryPolicy(attempts=3, backoff=0.001, max_backoff=0.002)) as client:
            return await asyncio.wait_for(example.run(client, "busybox", prompts=12, batch=4, max_in_flight=4, policy=policy), 60)

    groups = asyncio.run(main())
    check(example, groups, 4)
    assert policy.peak == example.FakePolicy.max_concurrency, "the run stage's bound, across all groups in flight"
    assert len(fake.groups_created) > 4, "over-sampled: more groups started than the batch needs"
    assert sorted(fake.groups_deleted) == sorted(fake.groups_created), "handed over or left running: all deleted"
    assert not fake.sandboxes
    assert '"logprobs"' not in "".join(fake.sent) and "logprobs" not in "".join(fake.sent), "payloads stay in the trainer"


@pytest.mark.cluster
async def test_the_example_collects_a_fixed_batch_on_the_cluster(aclient: AsyncSandboxClient, cluster: Cluster) -> None:
    example = load_example()
    groups = await asyncio.wait_for(example.run(aclient, cluster.image, prompts=12, batch=3, max_in_flight=3), 600)
    check(example, groups, 3)
