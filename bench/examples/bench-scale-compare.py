#!/usr/bin/env python3
"""Compares two operator flag sets on `bench-scale`, in alternating single-round runs.

usage: bench-scale-compare.py --rounds R --a="FLAGS" --b="FLAGS" [--a-operator BIN] [--b-operator BIN]
                              [--a-driver="ARGS"] [--b-driver="ARGS"] [-- BENCH_SCALE_ARGS...]
(the `=` form, since the flags start with dashes; `--x-operator` runs that configuration with another
operator binary, to compare two builds; `--x-driver` adds bench-scale arguments of that configuration
alone, after the shared ones, e.g. `--a-driver="--concurrency 1000"` to compare client concurrency)

Each round runs bench-scale once per flag set (`--rounds 1`, a fresh local cluster each time, so
neither configuration inherits the other's warm caches); the order flips every round, so drift on
the machine hits both alike. It prints a Markdown table of the median over the rounds with the
lowest and highest, and each run's line. Environment: BENCH_SCALE (the bench-scale binary, default
target/release/bench-scale) and ORCHARD_OPERATOR_BIN, as for bench-scale.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile


def run(binary, flags, operator, extra, json_path):
    command = [binary, "--rounds", "1", "--json", json_path, *extra]
    if flags:
        command += ["--", *shlex.split(flags)]
    print("+", shlex.join(command), file=sys.stderr, flush=True)
    # bench-scale's own report goes to stderr, so stdout holds only the comparison.
    environment = dict(os.environ)
    if operator:
        environment["ORCHARD_OPERATOR_BIN"] = operator
    finished = subprocess.run(command, stdout=sys.stderr, env=environment)
    try:
        with open(json_path) as file:
            return json.load(file)
    except (OSError, ValueError) as error:
        sys.exit(f"bench-scale-compare: bench-scale (exit {finished.returncode}) left no summary: {error}")


def spread(values, unit):
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}{unit}–{max(values):.2f}{unit})"


def step(summary, prefix):
    for entry in summary["steps"]:
        if entry["step"].startswith(prefix):
            return entry["p50"]
    return float("nan")


def cpu(summary, component):
    return sum(c["seconds"] for c in summary["cpuSeconds"] if c["component"] == component)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--a", required=True, help="operator flags of configuration A")
    parser.add_argument("--b", required=True, help="operator flags of configuration B")
    parser.add_argument("--a-operator", help="operator binary of configuration A (default ORCHARD_OPERATOR_BIN)")
    parser.add_argument("--b-operator", help="operator binary of configuration B (default ORCHARD_OPERATOR_BIN)")
    parser.add_argument("--a-driver", default="", help="bench-scale arguments of configuration A alone")
    parser.add_argument("--b-driver", default="", help="bench-scale arguments of configuration B alone")
    parser.add_argument("extra", nargs="*", help="bench-scale arguments of both (after --)")
    args = parser.parse_args()
    if args.rounds < 1:
        sys.exit("bench-scale-compare: --rounds must be at least 1")
    binary = os.environ.get("BENCH_SCALE", "target/release/bench-scale")
    names = {"A": args.a, "B": args.b}
    operators = {"A": args.a_operator, "B": args.b_operator}
    drivers = {"A": shlex.split(args.a_driver), "B": shlex.split(args.b_driver)}
    runs = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            order = ["A", "B"] if round_index % 2 == 0 else ["B", "A"]
            for name in order:
                path = os.path.join(scratch, f"{name}-{round_index}.json")
                runs[name].append(run(binary, names[name], operators[name], args.extra + drivers[name], path))
    rows = [
        ("end-to-end (last delete answered), s", lambda s: s["endToEndSeconds"], " s"),
        ("create -> Ready p50, s", lambda s: s["readySeconds"]["p50"], " s"),
        ("create -> Ready p99, s", lambda s: s["readySeconds"]["p99"], " s"),
        ("Sandbox created -> Pod created p50, s", lambda s: step(s, "Sandbox created"), " s"),
        ("Pod bound -> task container running p50, s", lambda s: step(s, "Pod bound"), " s"),
        ("Pod Ready -> Sandbox Ready p50, s", lambda s: step(s, "Pod Ready"), " s"),
        ("CPU seconds, all components", lambda s: sum(c["seconds"] for c in s["cpuSeconds"]), ""),
        ("CPU seconds, kube-apiserver", lambda s: cpu(s, "kube-apiserver"), ""),
        ("CPU seconds, orchard-operator", lambda s: cpu(s, "orchard-operator"), ""),
        ("CPU seconds, sandboxes' processes (hollow node: agent installs, agents, commands)",
         lambda s: sum(c["seconds"] for c in s["cpuSeconds"] if c["component"].startswith("sandboxes' processes")), ""),
        ("CPU seconds, the whole machine busy (/proc/stat)",
         lambda s: s.get("machineBusySeconds") if s.get("machineBusySeconds") is not None else float("nan"), ""),
    ]
    def title(name):
        operator = f" (operator {operators[name]})" if operators[name] else ""
        driver = f" (bench-scale `{shlex.join(drivers[name])}`)" if drivers[name] else ""
        return f"{name}: `{names[name]}`{operator}{driver}"
    print(f"| metric ({args.rounds} alternating rounds: median (lowest–highest)) | {title('A')} | {title('B')} |")
    print("|---|---|---|")
    success = {name: f"{sum(s['ok'] for s in runs[name])}/{sum(s['attempted'] for s in runs[name])}" for name in runs}
    print(f"| success | {success['A']} | {success['B']} |")
    for label, value, unit in rows:
        print(f"| {label} | {spread([value(s) for s in runs['A']], unit)} | {spread([value(s) for s in runs['B']], unit)} |")
    print()
    for name in ("A", "B"):
        for index, summary in enumerate(runs[name]):
            print(f"- {name}, round {index + 1}: {summary['endToEndSeconds']:.1f} s, {summary['ok']}/{summary['attempted']}; machine: {summary['machine']}")


if __name__ == "__main__":
    main()
