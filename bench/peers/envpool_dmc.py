"""EnvPool's Python API stepping one of its dm_control tasks: prints {"steps_per_second": N}.
    python envpool_dmc.py TASK_ID NUM_ENVS SECONDS [THREADS] [pixels]   (e.g. CheetahRun-v1 64 2 1)
THREADS: EnvPool's worker threads (default 0: its own choice, one a core).
pixels: every step also renders every env at 84x84 (render_mode rgb_array,
EnvPool's renderer since 1.2), as troupe's pixel pools do."""
import json
import os
import sys
import sysconfig
import time


# EnvPool's vendored GL library (a name prefix in envpool.libs) -> the system's.
SYSTEM_GL = {"libEGL-": "/lib/x86_64-linux-gnu/libEGL.so.1", "libOpenGL-": "/lib/x86_64-linux-gnu/libOpenGL.so.0",
             "libGLdispatch-": "/lib/x86_64-linux-gnu/libGLdispatch.so.0"}


def use_system_gl():
    """EnvPool's wheel vendors libEGL, libOpenGL and libGLdispatch under
    hashed names; next to Mesa's EGL (which loads the system's libGLdispatch)
    two dispatch tables exist and MuJoCo's gladLoadGL fails. Point the
    vendored names at the system's glvnd libraries (in this bench-only venv;
    the originals are kept as NAME.vendored)."""
    libs = os.path.join(sysconfig.get_paths()["purelib"], "envpool.libs")
    if not os.path.isdir(libs):
        return
    for name in os.listdir(libs):
        path = os.path.join(libs, name)
        target = next((t for prefix, t in SYSTEM_GL.items() if name.startswith(prefix)), None)
        if target and not name.endswith(".vendored") and not os.path.islink(path) and os.path.exists(target):
            os.replace(path, path + ".vendored")
            os.symlink(target, path)


task, num_envs, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 0
pixels = len(sys.argv) > 5 and sys.argv[5] == "pixels"
if pixels:
    use_system_gl()
    os.environ.setdefault("EGL_PLATFORM", "surfaceless")

import envpool  # noqa: E402  (after the GL fix)
import numpy as np  # noqa: E402

render = dict(render_mode="rgb_array", render_width=84, render_height=84) if pixels else {}
env = envpool.make_dm(task, num_envs=num_envs, batch_size=num_envs, num_threads=threads, **render)
shape = env.action_spec().shape
actions = np.random.default_rng(0).uniform(-1, 1, (num_envs,) + shape).astype(np.float64)
ids = np.arange(num_envs)


def step():
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
