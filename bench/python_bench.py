#!/usr/bin/env python3
"""troupe from Python against the C++ pool, EnvPool and dm_control, in one run.

    PYTHONPATH=build/release/python python3 bench/python_bench.py [--seconds 2] [--num-envs 64] [--json out.json]

For each task: env steps per second (agent steps of all envs; a pixel step
renders one 84x84 frame) of
  * Python: a loop of pool.step(actions) on troupe.make(...) (numpy in, views out);
  * C++: the same envs::EnvPool stepped from C++ with the same actions, in this
    process, alternating with the Python loop (best of --rounds each);
  * EnvPool (pip envpool, its Python API; state only: its dm_control tasks do
    not render) and dm_control's own suite (pip dm_control, envs stepped one
    after another as its users do, pixels from physics.render), both from
    PyPI in a venv under the build tree (BUILD/python-bench-venv), installed on
    first use; skipped, saying why, when they cannot be installed.
Bars (issue 24): Python >= 0.9x C++ for pixels, >= 0.7x for state, at 64 envs.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)

# (name, troupe task, observation, action_repeat, frame_stack, EnvPool id, dm_control domain, task)
CASES = [
    ("cartpole.swingup state", "cartpole.swingup", "state", 1, 1, "CartpoleSwingup-v1", "cartpole", "swingup"),
    ("cheetah.run state", "cheetah.run", "state", 1, 1, "CheetahRun-v1", "cheetah", "run"),
    ("walker.walk pixels (repeat 2, stack 3)", "walker.walk", "pixels", 2, 3, None, "walker", "walk"),
]
# Pinned so that figures compare; dm_control 1.0.50 fails on mujoco 4 (which
# pip would pick), hence the mujoco pin.
PEERS = "envpool==1.2.5 dm_control==1.0.50 mujoco==3.17.0"


def python_loop(troupe, np, task, observation, repeat, stack, num_envs, seconds):
    pool = troupe.make(task, num_envs=num_envs, observation=observation, action_repeat=repeat, frame_stack=stack)
    actions = np.random.default_rng(0).uniform(-1, 1, (num_envs,) + pool.spec.action_shape).astype(np.float32)
    pool.reset()
    for _ in range(10):
        pool.step(actions)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            pool.step(actions)
        steps += 10 * num_envs
    rate = steps / (time.perf_counter() - start)
    pool.close()
    return rate, actions


def peer_python(build):
    """The peers' venv python, installing them once; (python, None) or (None, why not)."""
    venv = os.path.join(build, "python-bench-venv")
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".installed")
    if os.path.exists(marker) and open(marker).read().strip() == PEERS:
        return python, None
    print(f"(installing {PEERS} from PyPI into {venv}: a minute or two, once)", flush=True)
    if not os.path.exists(python):
        made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if made.returncode != 0:
            return None, "cannot make a venv (apt-get install python3-venv): " + made.stderr[-300:]
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PEERS.split()],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"cannot install {PEERS} (offline?): " + done.stderr.strip()[-300:]
    open(marker, "w").write(PEERS + "\n")
    return python, None


def run_peer(python, script, *args):
    done = subprocess.run([python, os.path.join(HERE, "peers", script), *map(str, args)], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        return None, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return json.loads(done.stdout.strip().splitlines()[-1])["steps_per_second"], None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--build", default=os.path.join(TOP, "build", "release"))
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--only", help="run the cases whose name contains this (e.g. pixels)")
    parser.add_argument("--json")
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    import numpy as np
    import troupe
    from troupe import _native

    peer, why = (None, "--no-peers") if args.no_peers else peer_python(args.build)
    if why:
        print(f"peers skipped: {why}")
    load = os.getloadavg()[0]
    print(f"{args.num_envs} envs, {os.cpu_count()} cores, load average {load:.2f}; env steps/s, best of {args.rounds}")
    header = f"{'':40} {'Python':>10} {'C++':>10} {'ratio':>6} {'EnvPool':>10} {'dm_control':>10}"
    print(header)
    results = []
    for name, task, observation, repeat, stack, envpool_id, domain, dm_task in CASES:
        if args.only and args.only not in name:
            continue
        python_rate = cpp_rate = 0.0
        for _ in range(args.rounds):
            rate, actions = python_loop(troupe, np, task, observation, repeat, stack, args.num_envs, args.seconds)
            python_rate = max(python_rate, rate)
            cpp = _native.bench_cpp_pool(task=task, num_envs=args.num_envs, observation=observation,
                                         action_repeat=repeat, frame_stack=stack, num_threads=0, actions=actions,
                                         seconds=args.seconds, warmup=10)
            cpp_rate = max(cpp_rate, cpp["steps_per_second"])
        row = {"case": name, "python": python_rate, "cpp": cpp_rate, "ratio": python_rate / cpp_rate}
        notes = []
        if peer and envpool_id:
            row["envpool"], err = run_peer(peer, "envpool_dmc.py", envpool_id, args.num_envs, args.seconds)
            if err:
                notes.append(f"EnvPool: {err}")
        if peer:
            # dm_control steps envs one by one: fewer of them measure the same rate sooner.
            row["dm_control"], err = run_peer(peer, "dm_control_suite.py", domain, dm_task, observation, repeat,
                                              min(args.num_envs, 8), args.seconds)
            if err:
                notes.append(f"dm_control: {err}")
        fmt = lambda v: f"{v:10,.0f}" if isinstance(v, float) else f"{'-':>10}"  # noqa: E731
        print(f"{name:40} {fmt(python_rate)} {fmt(cpp_rate)} {row['ratio']:6.2f} {fmt(row.get('envpool'))} "
              f"{fmt(row.get('dm_control'))}", flush=True)
        for note in notes:
            print(f"  ({note})")
        bar = 0.9 if observation == "pixels" else 0.7
        row["bar"] = bar
        if row["ratio"] < bar:
            print(f"  below the bar: Python/C++ {row['ratio']:.2f} < {bar}")
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"num_envs": args.num_envs, "load_average": load, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
