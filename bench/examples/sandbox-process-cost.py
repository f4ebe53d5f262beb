#!/usr/bin/env python3
"""CPU that one hollow-node sandbox's own processes take, step by step, without a cluster.

Does what the local node does for each sandbox of `make bench-scale`, N times one after another:
`orchard-agent install DIR` (the init container: the agent copies itself into the pod's volume),
`DIR/orchard-agent serve` (the task container) until `/healthz` answers, E execs of
`/bin/sh -c "echo step K"` over one keep-alive connection (bench-scale's commands), then SIGTERM
and wait. Each step's CPU is that of the children this script waited for (`RUSAGE_CHILDREN`: the
install, the agent and, reaped by the agent, its commands), so it is the same figure bench-scale's
"sandboxes' processes" row sums over 1000 sandboxes. For comparison it also spawns the exec's
command directly (no agent) and the agent with `--version` (a process start with no work).

Usage: python3 bench/examples/sandbox-process-cost.py AGENT [N] [E]
  AGENT: the static agent (`make agent` builds target/x86_64-unknown-linux-gnu/agent/orchard-agent)
  N: sandboxes (default 300); E: execs per sandbox (default 4)
"""

import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def children_cpu_ms():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1e3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(port, proc, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"sandbox-process-cost: the agent exited with {proc.returncode} before /healthz answered")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            return conn
        except OSError:
            conn.close()
            time.sleep(0.002)
    sys.exit(f"sandbox-process-cost: /healthz did not answer within {timeout} s")


def spawn_and_wait(argv):
    """Starts argv with its output thrown away and waits for it."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, null, 1)])
    finally:
        os.close(null)
    os.waitpid(pid, 0)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    agent = os.path.abspath(sys.argv[1])
    sandboxes = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    execs = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    if not os.access(agent, os.X_OK):
        sys.exit(f"sandbox-process-cost: {agent} is not an executable")
    steps = {"install": 0.0, "agent start and stop": 0.0, "execs": 0.0}
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as base:
        for index in range(sandboxes):
            volume = os.path.join(base, str(index))
            before = children_cpu_ms()
            subprocess.run([agent, "install", volume], check=True, stdout=subprocess.DEVNULL)
            installed = children_cpu_ms()
            steps["install"] += installed - before
            port = free_port()
            proc = subprocess.Popen(
                [os.path.join(volume, "orchard-agent"), "serve", "--listen", f"127.0.0.1:{port}", "--insecure-no-auth"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            conn = wait_healthy(port, proc)
            # The agent's CPU is known only once it is reaped: its commands' share is measured by
            # the direct spawns below and subtracted per exec.
            exec_wall = time.perf_counter()
            for step in range(execs):
                body = json.dumps({"argv": ["/bin/sh", "-c", f"echo step {step}"]})
                conn.request("POST", "/v1/exec", body=body, headers={"Content-Type": "application/json"})
                answer = json.loads(conn.getresponse().read())
                if answer.get("exitCode") != 0:
                    sys.exit(f"sandbox-process-cost: exec failed: {answer}")
            steps["execs"] += (time.perf_counter() - exec_wall) * 1e3
            conn.close()
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            steps["agent start and stop"] += children_cpu_ms() - installed
            shutil.rmtree(volume)
    wall = (time.perf_counter() - wall) * 1e3
    total = steps["install"] + steps["agent start and stop"]

    before = children_cpu_ms()
    for _ in range(sandboxes):
        spawn_and_wait(["/bin/sh", "-c", "echo step 0"])
    sh_ms = (children_cpu_ms() - before) / sandboxes
    before = children_cpu_ms()
    for _ in range(sandboxes):
        spawn_and_wait([agent, "--version"])
    start_ms = (children_cpu_ms() - before) / sandboxes

    print(f"{sandboxes} sandboxes, {execs} execs each; CPU per sandbox of the processes waited for:")
    print(f"  all of a sandbox's processes (install, agent, its commands): {total / sandboxes:.2f} ms")
    print(f"  install (agent start + copy into the volume): {steps['install'] / sandboxes:.2f} ms")
    print(f"  the agent serving, with its {execs} commands: {steps['agent start and stop'] / sandboxes:.2f} ms")
    print(f"  one `/bin/sh -c echo` spawned directly, no agent: {sh_ms:.2f} ms")
    print(f"  `orchard-agent --version` (a process start, no work): {start_ms:.2f} ms")
    print(f"  wall time per sandbox: {wall / sandboxes:.2f} ms; of it the {execs} execs: {steps['execs'] / sandboxes:.2f} ms")


if __name__ == "__main__":
    main()
