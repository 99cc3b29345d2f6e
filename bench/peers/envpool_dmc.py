"""EnvPool's Python API stepping one of its dm_control tasks: prints {"steps_per_second": N}.
    python envpool_dmc.py TASK_ID NUM_ENVS SECONDS [THREADS] [state|pixels] [ACTION_REPEAT]
    (e.g. CheetahRun-v1 64 2 1)
One protocol round (bench/protocol.h) of the peer: make the envs, warm up,
then step for SECONDS (wall clock) and print agent steps per second of all
envs.
THREADS: EnvPool's worker threads (default 0: its own choice, one a core).
pixels: every agent step also renders every env at 84x84 (render_mode
rgb_array, EnvPool's renderer since 1.2), as troupe's pixel pools do.
ACTION_REPEAT: EnvPool steps per agent step, the same actions each (default 1).
EnvPool runs as its wheel ships it, with its own GL libraries: where its
renderer fails on this machine, the process fails (MuJoCo exits on its
error), and the caller reports EnvPool as not rendering here."""
import json
import sys
import time

import envpool
import numpy as np

task, num_envs, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 0
pixels = len(sys.argv) > 5 and sys.argv[5] == "pixels"
repeat = int(sys.argv[6]) if len(sys.argv) > 6 else 1

render = dict(render_mode="rgb_array", render_width=84, render_height=84) if pixels else {}
env = envpool.make_dm(task, num_envs=num_envs, batch_size=num_envs, num_threads=threads, **render)
shape = env.action_spec().shape
actions = np.random.default_rng(0).uniform(-1, 1, (num_envs,) + shape).astype(np.float64)
ids = np.arange(num_envs)


def step():
    for _ in range(repeat):
        env.step(actions)
    if pixels:
        env.render(env_ids=ids)


env.reset()
for _ in range(2 if pixels else 10):
    step()
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    for _ in range(1 if pixels else 10):
        step()
    steps += (1 if pixels else 10) * num_envs
print(json.dumps({"steps_per_second": steps / (time.perf_counter() - start)}))
