"""Times sandbox create -> Ready through the SDK (used by `make bench-gateway`): N sandboxes one after
another, then N at once with the async client. Prints JSON (seconds). Connection settings come from
ORCHARD_GATEWAY_URL, ORCHARD_TOKEN and ORCHARD_NAMESPACE."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time

from orchard_env import AsyncSandboxClient, SandboxClient


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round((len(ordered) - 1) * q))]


async def concurrent(count: int) -> list[float]:
    async with AsyncSandboxClient() as client:

        async def one() -> float:
            started = time.perf_counter()
            sandbox = await client.create(image="busybox", auto_heartbeat=False)
            elapsed = time.perf_counter() - started
            await sandbox.delete()
            return elapsed

        return list(await asyncio.gather(*(one() for _ in range(count))))


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    sequential: list[float] = []
    with SandboxClient() as client:
        for _ in range(count):
            started = time.perf_counter()
            sandbox = client.create(image="busybox", auto_heartbeat=False)
            sequential.append(time.perf_counter() - started)
            sandbox.delete()
    parallel = asyncio.run(concurrent(count))
    print(json.dumps({
        "count": count,
        "p50": quantile(sequential, 0.5),
        "p90": quantile(sequential, 0.9),
        "max": max(sequential),
        "mean": statistics.fmean(sequential),
        "concurrent_p50": quantile(parallel, 0.5),
        "concurrent_max": max(parallel),
    }))


if __name__ == "__main__":
    main()
