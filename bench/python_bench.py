#!/usr/bin/env python3
"""One round of one troupe side of `troupe bench python` (bench/python_bench.cc).

    PYTHONPATH=BUILD/python python3 bench/python_bench.py --side python|cpp --task cheetah.run \\
        [--observation state] [--action-repeat 1] [--frame-stack 1] [--num-envs 64] [--threads 2] [--seconds 2]

Makes a troupe pool, steps it 10 batches to warm up, then for --seconds
(wall clock) and prints `steps_per_second N` (agent steps of all envs per
second; a pixel step renders one 84x84 frame):
  * --side python: a loop of pool.step(actions) on troupe.make(...) (numpy
    in, views out);
  * --side cpp: the same envs::EnvPool stepped from C++ with the same actions
    (troupe._native.bench_cpp_pool), in this process.
The comparison itself (warm-up rounds, rounds alternated with the C++ pool,
EnvPool or dm_control's suite, medians and ranges) is `troupe bench python`'s,
by bench/protocol.h, the protocol every comparison of troupe's is measured by.

peer_python() makes the venv the peers run in (BUILD/python-bench-venv, the
pins below; bench.cc's PythonBenchVenvPython makes the same one), and the
one with dm_control alone (BUILD/dm-control-venv) that
tests/parity/dm_control_parity.py compares with.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)

# Pinned so that figures compare; dm_control 1.0.50 fails on mujoco 4 (which
# pip would pick), hence the mujoco pin. bench/bench.cc pins the same.
DM_CONTROL = "dm_control==1.0.50 mujoco==3.17.0"
PEERS = "envpool==1.2.5 " + DM_CONTROL


def peer_python(build, venv_name="python-bench-venv", pins=PEERS):
    """The venv python holding `pins` (the peers' by default), installing them once;
    (python, None) or (None, why not)."""
    venv = os.path.join(build, venv_name)
    python = os.path.join(venv, "bin", "python")
    marker = os.path.join(venv, ".installed")
    if os.path.exists(marker) and open(marker).read().strip() == pins:
        return python, None
    print(f"(installing {pins} from PyPI into {venv}: a minute or two, once)", flush=True)
    if not os.path.exists(python):
        made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if made.returncode != 0:
            return None, "cannot make a venv (apt-get install python3-venv): " + made.stderr[-300:]
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *pins.split()],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"cannot install {pins} (offline?): " + done.stderr.strip()[-300:]
    open(marker, "w").write(pins + "\n")
    return python, None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", choices=("python", "cpp"), required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--observation", choices=("state", "pixels"), default="state")
    parser.add_argument("--action-repeat", type=int, default=1)
    parser.add_argument("--frame-stack", type=int, default=1)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="the pool's threads (0: one a core)")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    import numpy as np
    import troupe
    from troupe import _native

    if args.side == "cpp":
        # The actions' shape from a one-env state pool (cheap); the C++ pool is bench_cpp_pool's own.
        probe = troupe.make(args.task, num_envs=1, observation="state")
        shape = probe.spec.action_shape
        probe.close()
        actions = np.random.default_rng(0).uniform(-1, 1, (args.num_envs,) + shape).astype(np.float32)
        rate = _native.bench_cpp_pool(task=args.task, num_envs=args.num_envs, observation=args.observation,
                                      action_repeat=args.action_repeat, frame_stack=args.frame_stack,
                                      num_threads=args.threads, actions=actions, seconds=args.seconds,
                                      warmup=10)["steps_per_second"]
    else:
        pool = troupe.make(args.task, num_envs=args.num_envs, observation=args.observation,
                           action_repeat=args.action_repeat, frame_stack=args.frame_stack, num_threads=args.threads)
        actions = np.random.default_rng(0).uniform(-1, 1, (args.num_envs,) + pool.spec.action_shape).astype(np.float32)
        pool.reset()
        for _ in range(10):
            pool.step(actions)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            pool.step(actions)
            steps += args.num_envs
        rate = steps / (time.perf_counter() - start)
        pool.close()
    print(f"steps_per_second {rate}", flush=True)


if __name__ == "__main__":
    main()
