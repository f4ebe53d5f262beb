#!/usr/bin/env python3
"""One rollout step of a fixed-batch, GRPO-style trainer over BAR groups, with a fake policy.

Each prompt is an addition (``17 + 25``). Its RolloutGroup has no ``run``: the trainer drives it. Each
trajectory Sandbox goes through the three stages of an ``AsyncPipeline``: ``init`` writes the question into
the sandbox, ``run`` is the agent loop (the policy reads the question through the gateway, answers, and
writes its answer into the sandbox; what it returns, tokens and logprobs, is the trajectory's *payload*,
kept in the trainer and never sent to the cluster), and ``reward`` reads the answer back and scores it
trainer-side. The run stage is bounded by the inference server's concurrency (``FakePolicy.max_concurrency``)
across all groups at once; init and reward by CPU.

The trainer wants ``--batch`` groups with a learning signal per step. Groups cost different amounts (BAR
launches a second stride when the first has no balanced group, and drops prompts with no reward variance),
so the step over-samples: the dispatcher reads the prompts lazily, keeps at most ``--max-in-flight``
groups going (back-pressure), and hands back each group as BAR records it. The step takes the first
``--batch`` groups that are not ``Dropped`` and leaves the loop, which deletes the groups still running.
Advantages are normalised per group, and each member's tokens and logprobs come from its payload, matched
by trajectory (``result.payloads`` is in group order, as ``result.rewards``).

The fake policy is deterministic: trajectory ``i`` of prompt ``p`` answers right when a hash of ``(p, i)``
modulo 4 is below ``p.a % 5``, so prompts range from never right and always right (both ``Dropped``: no
variance) to mixed.

    pip install ./sdk/python
    python examples/grpo_rollouts.py GATEWAY_URL TOKEN NAMESPACE IMAGE [--prompts 12] [--batch 4] [--max-in-flight 4]

``IMAGE`` needs ``cat`` (``busybox``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from orchard_env import AsyncDispatcher, AsyncPipeline, AsyncSandbox, AsyncSandboxClient, GroupRequest, Stage


@dataclass(frozen=True)
class Prompt:
    id: int
    a: int
    b: int

    @property
    def question(self) -> str:
        return f"{self.a} + {self.b}"


def dataset(count: int) -> list[Prompt]:
    return [Prompt(i, 10 + 7 * i, 3 + 5 * i) for i in range(count)]


class FakePolicy:
    """Stands in for the model served next to the trainer: deterministic answers, tokens and logprobs,
    and an inference server that serves ``max_concurrency`` requests at once."""

    max_concurrency = 4

    def __init__(self, latency: float = 0.05) -> None:
        self.latency = latency

    async def generate(self, question: str, seed: str) -> dict[str, Any]:
        await asyncio.sleep(self.latency)  # the inference server's time
        a, b = (int(x) for x in question.split(" + "))
        draw = int(hashlib.sha256(seed.encode()).hexdigest(), 16)
        right = draw % 4 < a % 5
        answer = str(a + b if right else a + b + 1 + draw % 3)
        tokens = [ord(c) for c in answer]
        return {"answer": answer, "tokens": tokens, "logprobs": [-((draw >> k) % 7) / 10 for k in range(len(tokens))]}


def rollout_pipeline(policy: FakePolicy, prompts: dict[int, Prompt]) -> AsyncPipeline:
    """The stages of one trajectory; the item is its Sandbox, the prompt rides on its template's labels."""

    async def init(sandbox: AsyncSandbox) -> Prompt:       # CPU and the gateway: the task into the sandbox
        prompt = prompts[int(sandbox.raw["metadata"]["labels"]["prompt"])]
        await sandbox.upload("task/question.txt", prompt.question)
        return prompt

    async def run(sandbox: AsyncSandbox, prompt: Prompt) -> dict[str, Any]:   # the agent loop, on the GPU
        question = (await sandbox.exec(["cat", "task/question.txt"], check=True)).stdout
        index = sandbox.name.rsplit("-", 1)[1]
        out = await policy.generate(question, seed=f"{prompt.id}-{index}")
        await sandbox.upload("task/answer.txt", out["answer"])   # the policy's action in the environment
        return out                                               # the payload: it stays in the trainer

    async def reward(sandbox: AsyncSandbox, prompt: Prompt, out: dict[str, Any]) -> dict[str, Any]:
        answer = (await sandbox.exec(["cat", "task/answer.txt"])).stdout.strip()   # verified trainer-side
        return {"reward": 1.0 if answer == str(prompt.a + prompt.b) else 0.0, "length": len(out["tokens"])}

    return AsyncPipeline(init=Stage(init, 16), run=Stage(run, policy.max_concurrency), reward=Stage(reward, 16))


def requests(image: str, prompts: list[Prompt]) -> Iterator[GroupRequest]:
    for prompt in prompts:                                 # read lazily, as the dispatcher has room
        yield GroupRequest(
            {"metadata": {"labels": {"prompt": str(prompt.id)}}, "spec": {"image": image}},   # no "run"
            key=prompt, generate_name=f"prompt-{prompt.id}-",
            group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.25, 0.75))


async def rollout_step(client: AsyncSandboxClient, image: str, prompts: list[Prompt], policy: FakePolicy,
                       *, batch: int, max_in_flight: int = 4) -> list[tuple[Prompt, list[tuple[list, list, float]]]]:
    """``batch`` groups with a learning signal: each group's prompt and, per member, its tokens, logprobs
    and advantage."""
    pipeline = rollout_pipeline(policy, {p.id: p for p in prompts})
    groups = []
    async with AsyncDispatcher(client, max_in_flight=max_in_flight, episode=pipeline.episode, timeout=600) as dispatcher:
        async for done in dispatcher.run(requests(image, prompts)):       # in completion order
            if not done.ok or done.result.selection == "Dropped" or None in done.result.payloads:
                continue            # an error, no reward variance, or an aborted member: over-sampling covers it
            rewards = done.result.rewards
            mean, std = statistics.fmean(rewards), statistics.pstdev(rewards) or 1.0
            groups.append((done.key, [
                (payload["tokens"], payload["logprobs"], (reward - mean) / std)
                for reward, payload in zip(rewards, done.result.payloads)   # matched by trajectory
            ]))
            if len(groups) == batch:
                break               # leaving the loop deletes the groups still running
    return groups


async def run(client: AsyncSandboxClient, image: str, *, prompts: int = 12, batch: int = 4, max_in_flight: int = 4,
              policy: FakePolicy | None = None) -> list[tuple[Prompt, list[tuple[list, list, float]]]]:
    """One rollout step on ``client`` (what ``main`` runs; the tests run it against a fake gateway)."""
    return await rollout_step(client, image, dataset(prompts), policy or FakePolicy(), batch=batch, max_in_flight=max_in_flight)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gateway")
    parser.add_argument("token")
    parser.add_argument("namespace")
    parser.add_argument("image")
    parser.add_argument("--prompts", type=int, default=12, help="prompts available to the step (over-sampling)")
    parser.add_argument("--batch", type=int, default=4, help="groups with a signal the step needs")
    parser.add_argument("--max-in-flight", type=int, default=4)
    args = parser.parse_args()
    async with AsyncSandboxClient(args.gateway, args.token, namespace=args.namespace) as client:
        groups = await run(client, args.image, prompts=args.prompts, batch=args.batch, max_in_flight=args.max_in_flight)
    for prompt, members in groups:
        print(f"prompt {prompt.id} ({prompt.question}): advantages {[round(adv, 2) for _, _, adv in members]}, "
              f"tokens {[''.join(map(chr, tokens)) for tokens, _, _ in members]}")
    # A trainer's update would go here: the policy-gradient loss over every member's tokens, weighted by
    # its advantage, with the logprobs for the importance ratio.
    return 0 if len(groups) == args.batch else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
