#!/usr/bin/env python3
"""Staged pipeline against bounded batches, on simulated stage costs (``make bench-pipeline``).

No cluster and no gateway: each stage is an ``asyncio.sleep`` on a simulated machine with ``--gpu``
inference slots (8) and ``--cpu`` CPU slots (16, shared by init and reward). Per item: init 2 s on a CPU
slot (sandbox creation or pool claim), run 10 s on a GPU slot (the agent loop, bounded by the inference
server's concurrency), reward 3 s on a CPU slot (evaluation); every cost is multiplied by ``--scale``
(1/100 by default) so a run takes seconds. Two workloads: ``fixed`` (exactly those costs) and
``variable`` (run costs drawn uniformly from 5-15 s with a fixed seed, the same draws for every mode).

Modes, in the same run, on the same workload and machine:

- ``pipeline``: ``orchard_env.AsyncPipeline(init=Stage(.., cpu), run=Stage(.., gpu), reward=Stage(.., cpu))``;
  items move to the next stage as soon as each stage ends.
- ``batch B``: B items at a time go through init (all B), then run (all B), then reward (all B); the next
  batch starts when the whole batch is done (``asyncio.gather`` per stage).

Reported per mode: the makespan (scaled, and the equivalent at scale 1: scaled / scale), the simulated
GPU idle fraction (1 - GPU slot-seconds busy / (GPU slots x makespan)) and the makespan's ratio to the
pipeline's. ``--rounds`` rounds (3), the order of the modes rotating every round; each cell is the median
over the rounds with the lowest and highest in brackets. ``--write-doc PATH`` replaces the
``## Pipeline`` section of PATH (docs/BENCHMARKS.md) with the results.

    PYTHONPATH=sdk/python/src python sdk/python/bench/bench_pipeline.py [--items 64] [--scale 0.01] [--write-doc docs/BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchard_env import AsyncPipeline, Stage

HEADING = "## Pipeline"
INIT, RUN, REWARD = 2.0, 10.0, 3.0


@dataclass
class Machine:
    """The simulated machine: GPU and CPU slots, and the GPU slot-seconds spent busy."""

    gpu: int
    cpu: int
    scale: float
    run_costs: Sequence[float]
    gpu_busy: float = 0.0
    _gpu: asyncio.Semaphore = field(init=False)
    _cpu: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self._gpu = asyncio.Semaphore(self.gpu)
        self._cpu = asyncio.Semaphore(self.cpu)

    async def init(self, item: int) -> int:
        async with self._cpu:
            await asyncio.sleep(INIT * self.scale)
        return item

    async def run(self, item: int, state: object = None) -> float:
        async with self._gpu:
            started = time.perf_counter()
            await asyncio.sleep(self.run_costs[item] * self.scale)
            self.gpu_busy += time.perf_counter() - started
        return self.run_costs[item]

    async def reward(self, item: int, state: object = None, payload: object = None) -> float:
        async with self._cpu:
            await asyncio.sleep(REWARD * self.scale)
        return 1.0


@dataclass(frozen=True)
class Outcome:
    makespan: float
    """Seconds, scaled."""
    gpu_idle: float
    """Fraction of the GPU slot-seconds of the makespan that no run used."""


async def pipelined(machine: Machine, items: int) -> Outcome:
    pipeline = AsyncPipeline(
        init=Stage(machine.init, machine.cpu), run=Stage(machine.run, machine.gpu), reward=Stage(machine.reward, machine.cpu),
    )
    started = time.perf_counter()
    async with pipeline:
        done = [result async for result in pipeline.run(range(items))]
    makespan = time.perf_counter() - started
    assert len(done) == items and all(result.ok for result in done), [r.error for r in done if not r.ok]
    return Outcome(makespan, 1 - machine.gpu_busy / (machine.gpu * makespan))


async def batched(machine: Machine, items: int, batch: int) -> Outcome:
    started = time.perf_counter()
    for first in range(0, items, batch):
        members = range(first, min(first + batch, items))
        await asyncio.gather(*(machine.init(i) for i in members))
        await asyncio.gather(*(machine.run(i) for i in members))
        await asyncio.gather(*(machine.reward(i) for i in members))
    makespan = time.perf_counter() - started
    return Outcome(makespan, 1 - machine.gpu_busy / (machine.gpu * makespan))


def run_costs(workload: str, items: int, seed: int) -> list[float]:
    if workload == "fixed":
        return [RUN] * items
    draw = random.Random(seed)
    return [draw.uniform(5.0, 15.0) for _ in range(items)]


def median_spread(values: Sequence[float], show: Callable[[float], str]) -> str:
    ordered = sorted(values)
    if len(ordered) == 1:
        return show(ordered[0])
    return f"{show(ordered[len(ordered) // 2])} ({show(ordered[0])}–{show(ordered[-1])})"


def load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def settle(max_wait: float) -> tuple[float, bool, float]:
    """Waits at most ``max_wait`` seconds for a 1-minute load average below half the CPUs: (load, quiet,
    seconds waited)."""
    threshold = (os.cpu_count() or 1) / 2
    started = time.monotonic()
    while True:
        now = load()
        if now < threshold:
            return now, True, time.monotonic() - started
        if time.monotonic() - started >= max_wait:
            print(f"benchmark: the machine is NOT quiet (load {now:.2f} >= {threshold:.1f} after {max_wait:.0f} s): figures are noisy",
                  file=sys.stderr)
            return now, False, time.monotonic() - started
        time.sleep(5)


def replace_section(text: str, heading: str, section: str) -> str:
    """``text`` with the section at ``heading`` (to the next ``## ``) replaced by ``section``, appended
    when absent (as bench/src/docs.rs does for the Rust benchmarks)."""
    section = section.rstrip("\n") + "\n\n"
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\n") == heading]
    if not starts:
        return text.rstrip() + "\n\n" + section
    start = starts[0]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "".join(lines[:start]) + section + "".join(lines[end:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--scale", type=float, default=0.01, help="multiplies every stage cost (0.01: 1/100)")
    parser.add_argument("--gpu", type=int, default=8, help="inference slots (the run stage's bound)")
    parser.add_argument("--cpu", type=int, default=16, help="CPU slots, shared by init and reward (their stages' bound)")
    parser.add_argument("--batch", type=int, action="append", help="baseline batch sizes (default: 8, 16 and 64)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=20261128)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds to wait at most for a quiet machine")
    parser.add_argument("--write-doc", type=Path, help="replace the '## Pipeline' section of this Markdown file")
    args = parser.parse_args()
    batches = args.batch or [8, 16, 64]
    modes = ["pipeline", *(f"batch {b}" for b in batches)]
    workloads = ["fixed", "variable"]

    load_before, quiet, waited = settle(args.settle)
    started_at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results: dict[tuple[str, str], list[Outcome]] = {}
    for round_ in range(args.rounds):
        order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]
        for workload in workloads:
            costs = run_costs(workload, args.items, args.seed)
            for mode in order:
                machine_ = None

                async def one() -> Outcome:
                    nonlocal machine_
                    machine_ = Machine(args.gpu, args.cpu, args.scale, costs)
                    if mode == "pipeline":
                        return await pipelined(machine_, args.items)
                    return await batched(machine_, args.items, int(mode.split()[1]))

                outcome = asyncio.run(one())
                results.setdefault((workload, mode), []).append(outcome)
                print(f"round {round_ + 1} {workload:8} {mode:9} makespan {outcome.makespan:.3f} s scaled "
                      f"({outcome.makespan / args.scale:.1f} s equivalent), GPU idle {100 * outcome.gpu_idle:.1f} %", flush=True)
    load_after = load()

    rows = []
    for workload in workloads:
        costs = run_costs(workload, args.items, args.seed)
        bound = sum(costs) / args.gpu + INIT + REWARD
        base = [o.makespan for o in results[(workload, "pipeline")]]
        for mode in modes:
            outcomes = results[(workload, mode)]
            spans = [o.makespan for o in outcomes]
            ratios = [span / pipe for span, pipe in zip(spans, base)]  # round by round
            rows.append(
                f"| {workload} | {mode} | {median_spread(spans, lambda v: f'{v:.3f} s')} | "
                f"{median_spread([s / args.scale for s in spans], lambda v: f'{v:.1f} s')} | "
                f"{median_spread([100 * o.gpu_idle for o in outcomes], lambda v: f'{v:.1f} %')} | "
                f"{'1.00x' if mode == 'pipeline' else median_spread(ratios, lambda v: f'{v:.2f}x')} | {bound:.1f} s |"
            )
    state = (f"quiet machine (load average below {(os.cpu_count() or 1) / 2:.1f} after waiting {waited:.0f} s)" if quiet
             else f"**not a quiet machine** (the load average did not fall below {(os.cpu_count() or 1) / 2:.1f} within {waited:.0f} s)")
    section = f"""{HEADING}

Command: `make bench-pipeline` (`sdk/python/bench/bench_pipeline.py --items {args.items} --scale {args.scale:g} --gpu {args.gpu} --cpu {args.cpu} --rounds {args.rounds} --write-doc docs/BENCHMARKS.md` in the SDK venv). No cluster, no gateway: the SDK's `AsyncPipeline` against bounded batches on simulated stage costs, in one process. A simulated machine has {args.gpu} GPU (inference) slots and {args.cpu} CPU slots shared by init and reward; per item, init holds a CPU slot for 2 s (sandbox creation or pool claim), run a GPU slot for 10 s (the agent loop), reward a CPU slot for 3 s (evaluation), each an `asyncio.sleep` of the cost times {args.scale:g}. The `variable` workload draws each run's cost uniformly from 5–15 s (seed {args.seed}, the same draws for every mode). `pipeline` is `AsyncPipeline(init=Stage(init, {args.cpu}), run=Stage(run, {args.gpu}), reward=Stage(reward, {args.cpu}))` over {args.items} items (default `max_in_flight`, the sum of the bounds); `batch B` takes B items through init (all B), then run (all B), then reward (all B), and starts the next batch when the whole batch is done. GPU idle is 1 − (GPU slot-seconds the runs held) / ({args.gpu} × makespan). The lower bound is the GPU work / {args.gpu} plus one init and one reward. {args.rounds} rounds, the order of the modes rotating every round; each cell is the median over the rounds with the lowest and highest in brackets; ratios are the baseline's makespan over the pipeline's in the same round. Equivalent seconds are the scaled ones divided by {args.scale:g}: they include the event loop's own overhead and the timer's granularity (about a millisecond per sleep, magnified {1 / args.scale:.0f} times), so they are a little above what the costs alone give. Run {started_at}, Python {platform.python_version()}; machine: {os.cpu_count()} CPUs; {state}; load average {load_before:.2f} at the start, {load_after:.2f} at the end.

| workload | mode | makespan (scaled) | makespan (equivalent) | GPU idle | makespan / pipeline's | lower bound (equivalent) |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

What this measures is the scheduling alone. A batch leaves the GPU idle while its items are initialised
and rewarded, and, with variable run costs, while its slowest runs finish; larger batches pay for that less
often, but one batch of all the items still keeps the GPU idle during every init before it and every reward
after it. The pipeline's GPU idles only at the start (the first inits) and the end (the last rewards and
the tail of the runs), which keeps it close to the lower bound. It does not measure real costs: no
sandboxes, no inference server, and the simulated CPU work uses no real CPU; the simulated machine has
exactly as many slots as the stages' bounds.
"""
    print()
    print(section)
    if args.write_doc is not None:
        text = args.write_doc.read_text() if args.write_doc.exists() else "# Benchmarks\n"
        args.write_doc.write_text(replace_section(text, HEADING, section))
        print(f"wrote the {HEADING!r} section of {args.write_doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
