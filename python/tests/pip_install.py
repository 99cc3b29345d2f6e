#!/usr/bin/env python3
"""`pip install` of troupe's Python module into a fresh venv, and a pixel pool stepped from it.

    python3 python/tests/pip_install.py --source SOURCE_DIR --build BUILD_DIR --helper TEST_HELPER

ctest runs it as Python.PipInstallIntoAFreshVenv (label python). It
  * makes a new venv, BUILD/pip-venv (any earlier one is removed first), from
    the Python it runs on (Debian's; no system site-packages);
  * runs `BUILD/pip-venv/bin/pip install -v SOURCE_DIR` (pyproject.toml:
    scikit-build-core from PyPI, CMake and Debian's build dependencies) with
    its CMake build in a new BUILD/pip-build, told to link the module from
    BUILD's objects and libraries (TROUPE_PYTHON_REUSE_BUILD=BUILD) rather
    than compile them again, and checks from pip's log that it compiled
    nothing and linked the module;
  * from outside the source and build trees, with nothing pointing at them
    (no PYTHONPATH, no TROUPE_* variables), imports troupe from the venv,
    steps a cartpole pixel pool of 4 envs on 2 threads (so one env worker
    process, which must be the one installed in the venv) and checks its
    bytes against the C++ pool's for the same seed and actions
    (troupe_python_test_helper of the build tree).
Exit 77 (skipped), saying why, only when PyPI cannot be reached; a failed
install while PyPI answers is a failure (the pip log's tail is printed).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77

# Runs inside the venv: argv[1] the venv, argv[2] the C++ pool's bytes.
STEP_A_PIXEL_POOL = r'''
import os, sys
import numpy as np
import troupe

venv, expected = os.path.realpath(sys.argv[1]), sys.argv[2]
here = os.path.dirname(os.path.realpath(troupe.__file__))
assert here.startswith(venv + "/lib/"), f"troupe imported from {here}, not from the venv {venv}"
assert os.path.realpath(troupe._native.__file__).startswith(here + "/"), troupe._native.__file__
print("imported", here)

def actions(step, num_envs, action_size):  # python/tests/test_envs.py's, the helper's PoolTestAction
    i = np.arange(num_envs)[:, None]
    j = np.arange(action_size)[None, :]
    return ((step * 7 + i * 13 + j * 5) % 21 - 10).astype(np.float32) / np.float32(10)

def batch_bytes(ts):
    parts = [ts.step_type, ts.reward, ts.discount, ts.env_id, ts.state, ts.observation, ts.episode_step]
    return b"".join(np.ascontiguousarray(p).tobytes() for p in parts)

pool = troupe.make("cartpole.swingup", num_envs=4, observation="pixels", action_repeat=2, frame_stack=3,
                   seed=1234, num_threads=2)
ts = pool.reset()
got = [batch_bytes(ts)]
# The env worker process the pool started is the venv's.
workers = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        status = open(f"/proc/{pid}/status").read()
        if f"\nPPid:\t{os.getpid()}\n" in status:
            workers.append(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        pass
assert workers and all(w.startswith(here + "/bin/troupe_env_worker") for w in workers), workers
for step in range(1, 7):
    ts = pool.step(actions(step, 4, pool.spec.action_shape[0]))
    got.append(batch_bytes(ts))
assert ts.observation.shape == (4, 84, 84, 9) and ts.observation.dtype == np.uint8, (ts.observation.shape,
                                                                                     ts.observation.dtype)
assert ts.observation.std() > 1, "blank frames"
data = open(expected, "rb").read()
assert data == b"".join(got), "the venv's pool stepped other bytes than the C++ pool"
print(f"stepped a pixel pool: {ts.observation.shape} {ts.observation.dtype}, env worker {workers[0]}, "
      f"{len(data)} bytes equal to the C++ pool's")
pool.close()
'''


def pypi_answers():
    """(True, why) when the index pip uses answers for scikit-build-core; else (False, why)."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/scikit-build-core/", timeout=20) as reply:
            return reply.status == 200, f"{index} answered {reply.status}"
    except Exception as error:  # noqa: BLE001  (any failure to connect means offline)
        return False, f"{index} cannot be reached: {error}"


def clean_environment():
    """This environment without what would point Python or troupe at the source or build tree."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("TROUPE_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", required=True)
    parser.add_argument("--build", required=True)
    parser.add_argument("--helper", required=True, help="troupe_python_test_helper")
    args = parser.parse_args()
    source, build = os.path.abspath(args.source), os.path.abspath(args.build)

    answers, why = pypi_answers()
    if not answers:
        print(f"skipped: pip install needs scikit-build-core from PyPI: {why}")
        return SKIP
    print(f"({why})")

    # A fresh venv, without the system's site-packages.
    venv = os.path.join(build, "pip-venv")
    shutil.rmtree(venv, ignore_errors=True)
    made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
    if made.returncode != 0:
        print(f"FAILED: `{sys.executable} -m venv {venv}`: {made.stdout}{made.stderr}")
        return 1

    # pip install SOURCE (the repository root: pyproject.toml) in a new CMake build
    # that links the module from BUILD's objects.
    log, pip_build = os.path.join(build, "pip-install.log"), os.path.join(build, "pip-build")
    shutil.rmtree(pip_build, ignore_errors=True)
    command = [os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-v", "--disable-pip-version-check",
               f"--config-settings=build-dir={pip_build}",
               f"--config-settings=cmake.define.TROUPE_PYTHON_REUSE_BUILD={build}", source]
    print("$", " ".join(command), f"(log: {log})", flush=True)
    started = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=clean_environment(),
                              cwd=tempfile.gettempdir())
    seconds = time.monotonic() - started
    text = open(log).read()
    if done.returncode != 0:
        answers, why = pypi_answers()
        if not answers:
            print(f"skipped: PyPI stopped answering during the install: {why}\n{text[-4000:]}")
            return SKIP
        print(f"FAILED: PyPI answers ({why}) but `pip install {source}` failed (exit {done.returncode}):\n"
              f"{text[-4000:]}")
        return 1
    print(text.strip().splitlines()[-1], f"({seconds:.0f} s)")
    # The build reused BUILD's objects: pip's build step (after scikit-build-core's
    # "*** Building project", so not the configure that brings BUILD up to date)
    # compiled nothing and linked the module.
    pip_build_step = text.split("*** Building project", 1)[-1]
    compiled = [line.strip() for line in pip_build_step.splitlines()
                if "Building CXX object" in line or "Building C object" in line]
    if compiled or "Linking CXX shared module" not in pip_build_step:
        print(f"FAILED: pip's build was to link the module from {build}'s objects and compile nothing; "
              f"it compiled {len(compiled)} files ({compiled[:3]}), and linked the module: "
              f"{'Linking CXX shared module' in pip_build_step} (log: {log})")
        return 1

    # The C++ pool's bytes for the same seed and actions, then the venv's pool.
    with tempfile.TemporaryDirectory() as scratch:
        expected = os.path.join(scratch, "cpp.bin")
        subprocess.run([args.helper, "pool", "cartpole.swingup", "pixels", "4", "2", "2", "3", "1234", "6", expected],
                       check=True)
        ran = subprocess.run([os.path.join(venv, "bin", "python"), "-c", STEP_A_PIXEL_POOL, venv, expected],
                             capture_output=True, text=True, env=clean_environment(), cwd=scratch, timeout=300)
    print(ran.stdout, end="")
    if ran.returncode != 0:
        print(f"FAILED: the installed module, from {venv}:\n{ran.stderr[-4000:]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
