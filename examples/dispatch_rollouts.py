#!/usr/bin/env python3
"""Many prompts at once: one run-based RolloutGroup per prompt through the SDK's ``AsyncDispatcher``, at
most ``--max-in-flight`` groups at a time, each handed back as it completes.

The "policy" is a shell runner: trajectory ``i`` of prompt ``p`` passes (reward 1) when ``i`` is a multiple
of ``2 + p % 3``, so prompts have pass rates 1/2, 1/3 and 1/4, and each trajectory takes a second or
two. BAR (N=4, Nmax=8, stride 4, positiveFraction 0.5: 2 positives and 2 negatives) records every group
``Balanced``; prompts with pass rate 1/4 need a second stride. The dispatcher keeps a progress line on
stderr when it is a terminal; each finished group is printed as it arrives and deleted once read.

    pip install ./sdk/python
    python examples/dispatch_rollouts.py GATEWAY_URL TOKEN NAMESPACE IMAGE [--prompts 12] [--max-in-flight 4]

``IMAGE`` needs a POSIX shell (``busybox``). ``--queue NAME`` names a RolloutQueue of the namespace (it
must exist): it bounds the trajectory sandboxes across all groups, while ``--max-in-flight`` bounds groups.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator

from orchard_env import AsyncDispatcher, AsyncSandboxClient, GroupRequest

# $PROMPT is the prompt's number; the trajectory's index is the suffix of its sandbox name.
RUNNER = (
    "i=${ORCHARD_SANDBOX##*-}\n"
    "sleep $(( 1 + i % 2 ))\n"
    "if [ $(( i % (2 + PROMPT % 3) )) -eq 0 ]; then r=1; else r=0; fi\n"
    "printf '{\"reward\": %d, \"status\": \"completed\", \"length\": %d}' $r $(( 10 + i )) > result.json\n"
)


def requests(image: str, prompts: int, queue: str | None) -> Iterator[GroupRequest]:
    """One request per prompt, made only when the dispatcher has room for it."""
    for prompt in range(prompts):
        yield GroupRequest(
            {
                "image": image,
                "env": {"PROMPT": str(prompt)},
                "run": {"command": ["/bin/sh", "-c", RUNNER], "timeoutSeconds": 60, "resultPath": "result.json"},
            },
            key=prompt,
            generate_name=f"prompt-{prompt}-",
            group_size=4, max_trajectories=8, stride=4, positive_fraction=(0.5, 0.5),
            queue=queue,
        )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gateway")
    parser.add_argument("token")
    parser.add_argument("namespace")
    parser.add_argument("image")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--queue", help="a RolloutQueue of the namespace that admits the groups' strides")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds each group may take")
    args = parser.parse_args()

    failed = 0
    async with (
        AsyncSandboxClient(args.gateway, args.token, namespace=args.namespace) as client,
        AsyncDispatcher(client, max_in_flight=args.max_in_flight, timeout=args.timeout) as dispatcher,
    ):
        async for done in dispatcher.run(requests(args.image, args.prompts, args.queue)):
            if done.ok and done.result is not None:
                result = done.result
                launched = len(result.trajectories)
                print(f"prompt {done.key}: {result.selection}, rewards {result.rewards}, {launched} trajectories ({done.name})")
            else:
                failed += 1
                print(f"prompt {done.key}: failed: {done.error or (done.result and done.result.phase)}", file=sys.stderr)
    stats = dispatcher.stats
    print(f"{stats.completed} groups recorded, {stats.failed} failed, at most {stats.peak_in_flight} in flight; "
          f"selections {dict(stats.selections)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
