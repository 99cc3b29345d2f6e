#!/usr/bin/env python3
"""Checks the fast tier (`ctest -L fast`) stays fast: every case labelled
fast takes at most --case-seconds by ctest's recorded cost
(Testing/Temporary/CTestCostData.txt: a weighted average of the case's
times over the runs in this build folder), and all of them together at most
--total-seconds. A slow case belongs in cmake/SlowTests.cmake (or its binary
is SLOW in its troupe_test call).

  check_fast_tier.py BUILD_DIR [--cost FILE] [--fast-list FILE]

--fast-list takes the fast cases' names one per line instead of asking
`ctest -N -L fast` in BUILD_DIR (for the check's own test). Exit 0 when the
tier is fast; 1 naming each case over its bound and the total; 77 (a skip)
when no run has recorded times yet."""
import argparse
import json
import os
import subprocess
import sys


def fast_cases(build_dir):
    out = subprocess.run(["ctest", "--show-only=json-v1", "-L", "fast"], cwd=build_dir, check=True,
                         capture_output=True, text=True).stdout
    return [test["name"] for test in json.loads(out)["tests"]]


def recorded_times(cost_file):
    times = {}
    with open(cost_file) as f:
        for line in f:
            fields = line.split()
            if line.startswith("---"):
                break  # the failed tests' list follows
            if len(fields) == 3:
                times[fields[0]] = float(fields[2])
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--cost")
    parser.add_argument("--fast-list")
    parser.add_argument("--case-seconds", type=float, default=3.0)
    parser.add_argument("--total-seconds", type=float, default=120.0)
    args = parser.parse_args()
    cost = args.cost or os.path.join(args.build_dir, "Testing", "Temporary", "CTestCostData.txt")
    if not os.path.exists(cost):
        print(f"skipped: {cost} does not exist yet (no ctest run has recorded times)")
        return 77
    if args.fast_list:
        with open(args.fast_list) as f:
            cases = [line.strip() for line in f if line.strip()]
    else:
        cases = fast_cases(args.build_dir)
    if not cases:
        print(f"no test in {args.build_dir} is labelled fast")
        return 1
    times = recorded_times(cost)
    timed = [(times[name], name) for name in cases if name in times]
    slow = sorted((t, name) for t, name in timed if t > args.case_seconds)
    total = sum(t for t, _ in timed)
    for t, name in reversed(slow):
        print(f"{name}: {t:.2f} s (ctest's recorded average), over {args.case_seconds:g} s: list it in "
              "cmake/SlowTests.cmake or make it faster")
    print(f"{len(cases)} fast cases, {len(timed)} with recorded times, {total:.1f} s in all "
          f"(bound {args.total_seconds:g} s)")
    if total > args.total_seconds:
        print(f"the fast tier took {total:.1f} s, over {args.total_seconds:g} s")
        return 1
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
