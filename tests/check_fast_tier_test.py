#!/usr/bin/env python3
"""tools/check_fast_tier.py passes a fast tier and fails one with a slow case
or too long a total, naming them; it skips (77) before any recorded run."""
import os
import subprocess
import sys
import tempfile

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "check_fast_tier.py")


def run(directory, cost_lines, cases, *extra):
    cost = os.path.join(directory, "cost.txt")
    with open(cost, "w") as f:
        f.write("".join(line + "\n" for line in cost_lines))
    listing = os.path.join(directory, "fast.txt")
    with open(listing, "w") as f:
        f.write("\n".join(cases) + "\n")
    result = subprocess.run([sys.executable, CHECK, directory, "--cost", cost, "--fast-list", listing, *extra],
                            capture_output=True, text=True)
    return result.returncode, result.stdout


def main():
    failures = []
    with tempfile.TemporaryDirectory() as d:
        code, out = run(d, ["A.b 3 0.2", "A.c 3 0.5", "Slow.e2e 1 40.0"], ["A.b", "A.c"])
        if code != 0 or "2 fast cases" not in out:
            failures.append(f"a fast tier failed: {code} {out}")
        code, out = run(d, ["A.b 3 0.2", "A.c 3 4.5"], ["A.b", "A.c"])
        if code != 1 or "A.c: 4.50 s" not in out:
            failures.append(f"a 4.5 s fast case passed or was not named: {code} {out}")
        code, out = run(d, ["A.b 3 2.0", "A.c 3 2.0"], ["A.b", "A.c"], "--total-seconds", "3")
        if code != 1 or "over 3 s" not in out:
            failures.append(f"a 4 s tier over a 3 s bound passed: {code} {out}")
        code, out = run(d, ["A.b 3 0.2", "---", "A.c"], ["A.b", "A.c"])
        if code != 0:
            failures.append(f"the failed-tests list after --- was read as times: {code} {out}")
        result = subprocess.run([sys.executable, CHECK, d, "--cost", os.path.join(d, "none.txt")],
                                capture_output=True, text=True)
        if result.returncode != 77 or "does not exist yet" not in result.stdout:
            failures.append(f"no recorded run did not skip: {result.returncode} {result.stdout}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
