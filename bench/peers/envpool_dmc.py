"""EnvPool's Python API stepping one of its dm_control tasks (state only:
EnvPool's dm_control envs do not render): prints {"steps_per_second": N}.
    python envpool_dmc.py TASK_ID NUM_ENVS SECONDS [THREADS]   (e.g. CheetahRun-v1 64 2 1)
THREADS: EnvPool's worker threads (default 0: its own choice, one a core)."""
import json
import sys
import time

import envpool
import numpy as np

task, num_envs, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 0
env = envpool.make_dm(task, num_envs=num_envs, batch_size=num_envs, num_threads=threads)
shape = env.action_spec().shape
actions = np.random.default_rng(0).uniform(-1, 1, (num_envs,) + shape).astype(np.float64)
env.reset()
for _ in range(10):
    env.step(actions)
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    for _ in range(10):
        env.step(actions)
    steps += 10 * num_envs
print(json.dumps({"steps_per_second": steps / (time.perf_counter() - start)}))
