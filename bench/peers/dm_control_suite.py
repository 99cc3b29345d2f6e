"""dm_control's own suite, as its users step it: envs one after another in
one Python thread, pixels from physics.render (MUJOCO_GL=egl). Prints
{"steps_per_second": N} (agent steps of all envs).
    python dm_control_suite.py DOMAIN TASK state|pixels ACTION_REPEAT NUM_ENVS SECONDS"""
import json
import os
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")
import numpy as np  # noqa: E402
from dm_control import suite  # noqa: E402

domain, task, observation = sys.argv[1], sys.argv[2], sys.argv[3]
repeat, num_envs, seconds = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
envs = [suite.load(domain, task, task_kwargs={"random": i}) for i in range(num_envs)]
spec = envs[0].action_spec()
actions = np.random.default_rng(0).uniform(spec.minimum, spec.maximum, (num_envs,) + spec.shape)
for env in envs:
    env.reset()


def step_all():
    for env, action in zip(envs, actions):
        for _ in range(repeat):
            ts = env.step(action)
        if observation == "pixels":
            env.physics.render(84, 84, camera_id=0)
        if ts.last():
            env.reset()


step_all()
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    step_all()
    steps += num_envs
print(json.dumps({"steps_per_second": steps / (time.perf_counter() - start)}))
