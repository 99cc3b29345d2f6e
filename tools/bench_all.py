#!/usr/bin/env python3
"""Every figure the README and docs/benchmarks/ show, re-measured by one command.

    tools/bench_all.py [--out DIR] [--build DIR] [--only TAG...] [--force] [--list]

Runs each benchmark of PLAN below, one after another, as `troupe bench NAME
... --json` (and bench/d4pg_bench for the D4PG update), each comparison by
the protocol of bench/protocol.h (rounds alternated with the peer's, medians
and ranges), its rows printed as they come. Each writes OUT/TAG.json (default
OUT: docs/benchmarks/data, the figures the docs are generated from by
tools/bench_docs.py), the benchmark's figures plus a "run" object: the
command, the commit of the binary that measured them (`troupe --version`:
"+changes" when its sources had uncommitted changes; it refuses a binary
older than the tree's HEAD unless --stale-build), the machine (CPU model,
cores, memory), the dates it started and ended, its seconds and the load
average before and after.

A stopped run is resumed by running the same command again: a TAG whose
JSON the same build wrote is skipped (--force measures it again).
A benchmark that fails is reported at the end, its log's tail kept in
OUT/TAG.failed.txt, and the command exits 1. About an hour on a 2-core
machine, peers' virtual environments made on first use included
(docs/benchmarks.md).
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (tag, arguments of `troupe bench` or of d4pg_bench after its path, minutes on a 2-core machine)
PLAN = [
    ("envs", ["envs", "--only", "cartpole.swingup", "cheetah.run", "walker.walk"], 10),
    ("python", ["python", "--rounds", "9"], 13),
    ("replay", ["replay", "--rounds", "9"], 8),
    ("learner", ["learner", "--seconds", "2", "--rounds", "9"], 16),
    ("learner-pjrt", ["learner", "--device", "pjrt", "--seconds", "2"], 6),
    ("d4pg", ["@d4pg_bench", "--peers", "pixels", "256", "2", "5"], 8),
    ("d4pg-pjrt", ["@d4pg_bench", "--peers", "pixels", "256", "2", "5", "32", "256", "pjrt"], 12),
    ("gan", ["gan", "--only", "speed"], 4),
    ("gan-pjrt", ["gan", "--device", "pjrt"], 3),
    ("learner-input", ["learner-input"], 3),
    ("rl", ["rl"], 4),
    ("fleet", ["fleet"], 3),
    ("scaling", ["scaling"], 2),
    ("straggler", ["straggler"], 1),
    ("appo", ["appo"], 5),
]


def git(*args):
    out = subprocess.run(["git", "-C", TOP, *args], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def build_commit(build):
    """The commit the troupe binary was built at (troupe --version's first line)."""
    out = subprocess.run([os.path.join(build, "cli", "troupe"), "--version"], capture_output=True, text=True)
    words = (out.stdout.splitlines() or [""])[0].split()
    return words[1] if out.returncode == 0 and len(words) == 2 else "unknown"


def machine():
    # The model and its widest vector unit: two machines both called "AMD
    # EPYC", one with AVX-512 and one without, differ fivefold on XLA's CPU
    # programs.
    model, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    if isa:
        model = f"{model}, {isa}"
    memory_gib = 0.0
    try:
        with open("/proc/meminfo") as f:
            memory_gib = int(f.readline().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(memory_gib, 1),
            "kernel": platform.release()}


def load():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError):
        return None


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_for(build, args, json_path):
    if args[0].startswith("@"):
        return [os.path.join(build, "bench", args[0][1:]), *args[1:], "--json", json_path]
    return [os.path.join(build, "cli", "troupe"), "bench", *args, "--json", json_path]


def pjrt_plugin(build):
    plugin = os.environ.get("TROUPE_PJRT_PLUGIN") or os.path.join(build, "pjrt-venv", "pjrt_cpu_plugin.so")
    return plugin if os.path.exists(plugin) else None


def run_one(tag, args, out, build, log, built_at):
    """Runs one benchmark; returns None, or what went wrong."""
    final = os.path.join(out, tag + ".json")
    partial = final + ".partial"
    command = command_for(build, args, partial)
    env = dict(os.environ)
    if "pjrt" in args:
        plugin = pjrt_plugin(build)
        if plugin is None:
            return (f"no PJRT CPU plugin: tools/pjrt_cpu_plugin.sh makes {build}/pjrt-venv/pjrt_cpu_plugin.so, "
                    "or set TROUPE_PJRT_PLUGIN")
        env["TROUPE_PJRT_PLUGIN"] = plugin
    shown = " ".join(shlex.quote(a) for a in command[:-2])
    print(f"== {tag}: {shown}", flush=True)
    record = {"command": shown.replace(TOP + "/", ""), "commit": built_at, "machine": machine(),
              "started": now(), "load_before": load()}
    start = time.monotonic()
    tail = []
    # Each runs in a folder of its own under the build (what it writes to its
    # working directory, e.g. scaling's plots, lands there, not in the tree).
    work = os.path.join(build, "bench_all", tag)
    os.makedirs(work, exist_ok=True)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          cwd=work) as p:
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
            tail = (tail + [line])[-60:]
    record.update({"ended": now(), "seconds": round(time.monotonic() - start, 1), "load_after": load()})
    if p.returncode != 0 or not os.path.exists(partial):
        with open(os.path.join(out, tag + ".failed.txt"), "w") as f:
            f.write(f"{shown}\nexit {p.returncode}\n" + "".join(tail))
        return f"exit {p.returncode} (log tail in {tag}.failed.txt)"
    with open(partial) as f:
        report = json.load(f)
    os.remove(partial)
    report["run"] = record
    with open(final + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(final + ".tmp", final)
    failed = os.path.join(out, tag + ".failed.txt")
    if os.path.exists(failed):
        os.remove(failed)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(TOP, "docs", "benchmarks", "data"))
    parser.add_argument("--build", default=os.path.join(TOP, "build", "release"))
    parser.add_argument("--only", nargs="+", default=[], metavar="TAG")
    parser.add_argument("--force", action="store_true", help="measure again what this commit measured already")
    parser.add_argument("--list", action="store_true", help="print the plan and exit")
    parser.add_argument("--stale-build", action="store_true",
                        help="measure with a binary built at another commit than HEAD")
    a = parser.parse_args()
    a.out, a.build = os.path.abspath(a.out), os.path.abspath(a.build)  # each benchmark runs in a folder of its own
    tags = [t for t, _, _ in PLAN]
    unknown = [t for t in a.only if t not in tags]
    if unknown:
        parser.error(f"--only {' '.join(unknown)}: not in the plan ({', '.join(tags)})")
    if a.list:
        for tag, args, minutes in PLAN:
            print(f"{tag:14} ~{minutes:2d} min  {' '.join(command_for(a.build, args, 'OUT/' + tag + '.json'))}")
        print(f"total ~{sum(m for _, _, m in PLAN)} min")
        return 0
    troupe = os.path.join(a.build, "cli", "troupe")
    if not os.access(troupe, os.X_OK):
        print(f"bench_all: no troupe at {troupe} (cmake --build --preset release, or --build DIR)", file=sys.stderr)
        return 2
    os.makedirs(a.out, exist_ok=True)
    here = build_commit(a.build)
    head = git("rev-parse", "--short=12", "HEAD")
    if here.split("+")[0] != head and not a.stale_build:
        print(f"bench_all: {troupe} was built at {here}, the tree is at {head}: build it first "
              "(cmake --build --preset release), or --stale-build", file=sys.stderr)
        return 2
    failures, skipped, measured = [], [], 0
    with open(os.path.join(a.build, "bench_all.log"), "a") as log:
        for tag, args, minutes in PLAN:
            if a.only and tag not in a.only:
                continue
            path = os.path.join(a.out, tag + ".json")
            if not a.force and os.path.exists(path):
                with open(path) as f:
                    if json.load(f).get("run", {}).get("commit") == here:
                        skipped.append(tag)
                        print(f"== {tag}: measured at {here} already ({os.path.relpath(path, TOP)}); --force again")
                        continue
            problem = run_one(tag, args, a.out, a.build, log, here)
            measured += problem is None
            if problem:
                failures.append((tag, problem))
                print(f"== {tag}: FAILED: {problem}", flush=True)
    print(f"bench_all at {here}: {measured} measured, {len(skipped)} already, "
          f"{len(failures)} failed" + "".join(f"\n  {t}: {p}" for t, p in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
