"""dm_control's own suite, as its users step it: envs one after another in
one Python thread, pixels from physics.render (MUJOCO_GL=egl). One protocol
round (bench/protocol.h) of the peer: load the envs, warm up, then step for
SECONDS (wall clock) and print `steps_per_second N` (agent steps of all envs).
    python dm_control_suite.py DOMAIN TASK state|pixels ACTION_REPEAT NUM_ENVS SECONDS

Pixels are rendered as troupe renders them (envs/renderer.cc, envs/model.cc):
84x84 RGB from the task's fixed camera 0 (troupe's "fixed" camera of the same
view) once per agent step, with no multisampling (the model's
vis.quality.offsamples set to 0 before the first render makes the offscreen
buffer, as troupe's Model::Load does) and with shadows and reflections off
(render_flag_overrides); every other scene flag at MuJoCo's defaults in both.
Mesa's llvmpipe rasterizes on the calling thread (LP_NUM_THREADS=0), as
troupe's renderer sets it unless the user did (envs/renderer.cc): the two
sides' renderers use the same threads.
dm_control's physics.render makes a Camera (an mjvScene) per call, as its
pixels wrapper does: that cost is dm_control's, and stays in."""
import os
import sys
import time

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("LP_NUM_THREADS", "0")
import numpy as np  # noqa: E402
from dm_control import suite  # noqa: E402

domain, task, observation = sys.argv[1], sys.argv[2], sys.argv[3]
repeat, num_envs, seconds = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
envs = [suite.load(domain, task, task_kwargs={"random": i}) for i in range(num_envs)]
for env in envs:
    env.physics.model.vis.quality.offsamples = 0  # before the first render makes the context
spec = envs[0].action_spec()
actions = np.random.default_rng(0).uniform(spec.minimum, spec.maximum, (num_envs,) + spec.shape)
flags = {"shadow": False, "reflection": False}
for env in envs:
    env.reset()


def step_all():
    for env, action in zip(envs, actions):
        for _ in range(repeat):
            ts = env.step(action)
        if observation == "pixels":
            env.physics.render(84, 84, camera_id=0, render_flag_overrides=flags)
        if ts.last():
            env.reset()


for _ in range(2):
    step_all()
steps, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    step_all()
    steps += num_envs
print(f"steps_per_second {steps / (time.perf_counter() - start)}", flush=True)
