#!/usr/bin/env python3
"""tools/bench_all.py against a stand-in troupe: what it records, that a
resumed run skips what the same build measured and measures again after a
new build, that a failing benchmark is named (its log's tail kept, exit 1)
while the others go on, and that a binary built at another commit than
HEAD is refused. ctest runs it as Tools.BenchAll."""
import json
import os
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH_ALL = os.path.join(TOP, "tools", "bench_all.py")
HEAD = subprocess.run(["git", "-C", TOP, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                      text=True).stdout.strip()

# A troupe that answers --version with $FAKE_COMMIT, fails `bench fleet`, and
# otherwise writes one figure to --json's path; it counts its bench runs.
FAKE = """#!/bin/sh
if [ "$1" = --version ]; then echo "troupe $FAKE_COMMIT"; exit 0; fi
name=$2
echo "$name" >> "$FAKE_LOG"
if [ "$name" = fleet ]; then echo "fleet: something broke"; exit 3; fi
while [ $# -gt 1 ]; do
  if [ "$1" = --json ]; then
    printf '{"benchmark": "%s", "build": "%s", "figures": [{"name": "x", "value": 2, "unit": "u", "reference": "r", "reference_value": 1, "ratio": 2}]}\\n' "$name" "$FAKE_COMMIT" > "$2"
  fi
  shift
done
"""


def run(build, out, env, *args):
    done = subprocess.run([sys.executable, BENCH_ALL, "--build", build, "--out", out, *args], capture_output=True,
                          text=True, env=env, timeout=60)
    return done.returncode, done.stdout + done.stderr


def main():
    failures = []

    def check(ok, what, output=""):
        if not ok:
            failures.append(f"{what}\n{output}")

    with tempfile.TemporaryDirectory() as top:
        build, out, log = os.path.join(top, "build"), os.path.join(top, "out"), os.path.join(top, "calls")
        os.makedirs(os.path.join(build, "cli"))
        troupe = os.path.join(build, "cli", "troupe")
        with open(troupe, "w") as f:
            f.write(FAKE)
        os.chmod(troupe, 0o755)
        env = dict(os.environ, FAKE_COMMIT=HEAD, FAKE_LOG=log)

        code, output = run(build, out, env, "--only", "rl", "scaling")
        check(code == 0, "two benchmarks that write their JSON: exit 0", output)
        with open(os.path.join(out, "rl.json")) as f:
            rl = json.load(f)
        r = rl.get("run", {})
        check(r.get("commit") == HEAD, f"the record names the binary's commit {HEAD}", json.dumps(r))
        check(r.get("command", "").endswith("troupe bench rl"), "the record names the command", json.dumps(r))
        check(r.get("machine", {}).get("cores") == os.cpu_count(), "the record names the cores", json.dumps(r))
        check(all(k in r for k in ("started", "ended", "seconds", "load_before", "load_after")),
              "the record has the dates, seconds and loads", json.dumps(r))
        check(rl["figures"][0]["ratio"] == 2, "the figures are the benchmark's", json.dumps(rl))
        check(not os.path.exists(os.path.join(out, "rl.json.partial")), "no partial file is left")

        code, output = run(build, out, env, "--only", "rl", "scaling")
        with open(log) as f:
            calls = f.read().split()
        check(code == 0 and calls == ["rl", "scaling"], "a rerun of the same build skips both", output + str(calls))
        check("measured at" in output and "already" in output, "the rerun says what it skipped", output)

        env["FAKE_COMMIT"] = HEAD + "+changes"
        code, output = run(build, out, env, "--only", "rl")
        with open(log) as f:
            calls = f.read().split()
        check(code == 0 and calls == ["rl", "scaling", "rl"], "a new build measures again", output + str(calls))

        code, output = run(build, out, env, "--only", "fleet", "scaling", "--force")
        check(code == 1, "a failing benchmark: exit 1", output)
        check("fleet: FAILED: exit 3" in output, "the failure is named", output)
        with open(os.path.join(out, "fleet.failed.txt")) as f:
            check("fleet: something broke" in f.read(), "its log's tail is kept")
        with open(log) as f:
            check(f.read().split()[-1] == "scaling", "the benchmarks after it still run")

        env["FAKE_COMMIT"] = "0123456789ab"
        code, output = run(build, out, env, "--only", "rl")
        check(code == 2 and "was built at 0123456789ab" in output, "a stale build is refused", output)
        code, output = run(build, out, env, "--only", "rl", "--stale-build")
        check(code == 0, "unless --stale-build", output)

        code, output = run(build, out, env, "--only", "nosuch")
        check(code == 2 and "not in the plan" in output, "an unknown tag is refused naming the plan", output)

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("PASS: bench_all records, resumes, measures a new build, names a failure, refuses a stale build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
