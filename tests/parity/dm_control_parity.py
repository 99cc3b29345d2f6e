#!/usr/bin/env python3
"""troupe's 8 control tasks against dm_control's, on the same physics states.

    python3 tests/parity/dm_control_parity.py --build build/release [--json out.json]

For each task (ctest label `parity`; tools/test.sh runs it with the rest):
  * same states: N states reached in dm_control (its reset, then seeded random
    actions) are set in both (qpos, qvel, last control); troupe's observation
    and reward must equal dm_control's (float32 rounding);
  * termination: from dm_control's reset state, both step the same actions to
    the episode's end: the same number of steps, both ending with discount 1;
  * the model: troupe's MJCF file loaded into dm_control's own engine (its
    MuJoCo 3.x and its stepping, "the twin") must follow dm_control's model
    within 1e-3 in qpos for whole episodes of three fixed policies (zero,
    seeded uniform random, a square wave) from dm_control's reset state;
  * the engines: troupe's env (MuJoCo 2.2.2) must stay as close for the first
    TOGETHER_STEPS steps of each (contacts amplify the engines' differences
    later), and its returns of the zero and random policies must be within
    RETURN_TOLERANCE of dm_control's (the square wave's are reported).
troupe's side is envs/task_probe_main.cc (troupe_task_probe): the real env
(Reset, Step, Observe) put in the given state. dm_control and mujoco come from
PyPI into a venv under the build tree (BUILD/dm-control-venv, made by
bench/python_bench.py's peer_python without the benchmarks' EnvPool),
installed on first use; without PyPI the test is
skipped (exit 77) saying why.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "bench"))
SKIP = 77

TASKS = ["cartpole.balance", "cartpole.swingup", "pendulum.swingup", "reacher.easy", "finger.spin", "cheetah.run",
         "walker.walk", "ball_in_cup.catch"]
STATES = 12          # same-state comparisons per task
EARLY_STEPS = 5      # steps over which the trajectories must still agree closely
OBS_TOLERANCE = 2e-4  # troupe observes in float32
REWARD_TOLERANCE = 1e-4
# Whole-episode returns: the trajectories part within tens of steps where the
# models or engines differ at all, so returns agree only statistically.
RETURN_TOLERANCE = (0.2, 15.0)  # |troupe - dm_control| <= max(relative x dm_control, absolute)

# troupe's models are dm_control's (the twin below checks it: troupe's MJCF
# file in dm_control's engine follows dm_control's model step for step), and
# so are observations and rewards; what is left is MuJoCo 2.2.2 here against
# 3.x there. Where the two engines step the same model, troupe's trajectories
# must stay within TOGETHER_QPOS of dm_control's for TOGETHER_STEPS control
# steps under every policy; they part later, from 1e-12-sized differences that
# contacts amplify (walker after ~100 steps, finger ~400). A model that
# differs at all parts within a few steps (finger's, cheetah's and walker's
# own models, before they were made dm_control's: 0, 0 and 1 steps).
TOGETHER_STEPS = 50
TOGETHER_QPOS = 1e-3
ENGINES_PART_SOONER = {
    "ball_in_cup.catch": "the ball's contacts with the cup's capsules differ between MuJoCo 2.2.2 and 3.x from the "
                         "first one (the same model: its twin follows dm_control's); trajectories part after ~10 "
                         "steps",
}


class Probe:
    """troupe_task_probe TASK over a pipe."""

    def __init__(self, binary, task):
        self.process = subprocess.Popen([binary, task], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, *words):
        self.process.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline())
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def target(task, probe, physics):
    """reacher: dm_control's target is a model geom it moves; troupe's a mocap body."""
    if task.startswith("reacher."):
        probe.ask("mocap", *physics.named.data.geom_xpos["target"])


def flat(np, observation, fields):
    """dm_control's observation dict in troupe's field order."""
    parts = []
    for name, size in fields:
        value = np.asarray(observation[name], dtype=np.float64).ravel()
        assert value.size == size, f"field {name}: dm_control has {value.size} values, troupe {size}"
        parts.append(value)
    return np.concatenate(parts)


def square_wave(np, time, low, high):
    """The scripted policy: each actuator a square wave between its bounds,
    1.7 Hz, actuator i a quarter period behind actuator i - 1 (contacts and
    fast motion, where models that differ part soonest)."""
    phase = 2 * np.pi * (1.7 * time - 0.25 * np.arange(low.size))
    return np.where(np.sin(phase) > 0, high, low)


def compare_task(np, suite, mujoco_physics, binary, task, failures, report):
    domain, name = task.split(".")
    env = suite.load(domain, name, task_kwargs={"random": 0})
    physics = env.physics
    probe = Probe(binary, task)
    spec = probe.ask("spec")
    row = {"task": task}
    fields = [tuple(f) for f in spec["fields"]]
    m = physics.model
    if (spec["nq"], spec["nv"], spec["nu"]) != (m.nq, m.nv, m.nu):
        failures.append(f"{task}: troupe's model has nq/nv/nu {spec['nq']}/{spec['nv']}/{spec['nu']}, "
                        f"dm_control's {m.nq}/{m.nv}/{m.nu}")
        probe.close()
        return
    dm_joints = [m.id2name(j, "joint") for j in range(m.njnt)]
    if spec["joints"] != dm_joints:  # names only (cartpole's hinge is dm_control's hinge_1): said, not failed
        print(f"note: {task}: joint names troupe {spec['joints']}, dm_control {dm_joints}")
    control_dt = spec["timestep"] * spec["substeps"]
    if abs(control_dt - env.control_timestep()) > 1e-9:
        failures.append(f"{task}: control timestep {control_dt} s, dm_control's {env.control_timestep()} s")
    low, high = env.action_spec().minimum, env.action_spec().maximum

    # 1. The same states: observation and reward are functions of the state.
    rng = np.random.default_rng(1)
    worst_obs = worst_reward = 0.0
    for k in range(STATES):
        env.reset()
        for _ in range(7 * k):
            env.step(rng.uniform(low, high))
        qpos, qvel, ctrl = physics.data.qpos.copy(), physics.data.qvel.copy(), physics.data.ctrl.copy()
        with physics.reset_context():
            physics.data.qpos[:], physics.data.qvel[:], physics.data.ctrl[:] = qpos, qvel, ctrl
        want_obs = flat(np, env.task.get_observation(physics), fields)
        want_reward = float(env.task.get_reward(physics))
        target(task, probe, physics)
        got = probe.ask("set", *qpos, *qvel, *ctrl)
        diff = np.abs(np.asarray(got["obs"]) - want_obs) / np.maximum(1, np.abs(want_obs))
        obs_error = float(np.max(diff))
        worst_obs = max(worst_obs, obs_error)
        worst_reward = max(worst_reward, abs(got["reward"] - want_reward))
        if obs_error > OBS_TOLERANCE:
            failures.append(f"{task}: state {k}: observation differs by up to {obs_error:.3g} "
                            f"(index {int(np.argmax(diff))}: troupe {got['obs'][int(np.argmax(diff))]:.6g}, "
                            f"dm_control {want_obs[int(np.argmax(diff))]:.6g})")
        if abs(got["reward"] - want_reward) > REWARD_TOLERANCE:
            failures.append(f"{task}: state {k}: reward troupe {got['reward']:.6g}, dm_control {want_reward:.6g}")
    row["obs_max_rel_error"] = worst_obs
    row["reward_max_error"] = worst_reward

    # 2 and 3. Whole episodes of fixed policies from dm_control's reset state.
    # The twin: troupe's MJCF file stepped by dm_control's own engine and
    # stepping, beside dm_control's model. Where the two models are the same,
    # the twin follows dm_control's trajectory whatever troupe's MuJoCo
    # version does.
    twin = mujoco_physics.Physics.from_xml_path(spec["model"])
    substeps = env._n_sub_steps  # noqa: SLF001 (what control.Environment.step steps)
    for policy in ("zero", "random", "square"):
        actions = np.random.default_rng(7)
        step = env.reset()
        probe.ask("reset", *physics.data.qpos, *physics.data.qvel)
        target(task, probe, physics)
        with twin.reset_context():
            twin.data.qpos[:], twin.data.qvel[:] = physics.data.qpos, physics.data.qvel
        twin_together = None
        troupe_return = dm_return = 0.0
        steps = 0
        early_error = 0.0
        together = None  # the step at which the trajectories part (None: they never do)
        troupe_last = dm_last = None
        while True:
            a = (np.zeros(m.nu) if policy == "zero" else actions.uniform(low, high) if policy == "random" else
                 square_wave(np, steps * control_dt, low, high))
            dm = env.step(a)
            got = probe.ask("step", *a)
            twin.data.ctrl[:] = a
            twin.step(substeps)
            if twin_together is None and float(np.max(np.abs(twin.data.qpos - physics.data.qpos))) > TOGETHER_QPOS:
                twin_together = steps
            steps += 1
            dm_return += dm.reward or 0.0
            troupe_return += got["reward"]
            qpos_error = float(np.max(np.abs(np.asarray(got["qpos"]) - physics.data.qpos)))
            if steps <= EARLY_STEPS:
                early_error = max(early_error, qpos_error)
            if together is None and qpos_error > TOGETHER_QPOS:
                together = steps - 1
            if got["last"] and troupe_last is None:
                troupe_last = (steps, got["discount"])
            if dm.last() and dm_last is None:
                dm_last = (steps, float(dm.discount))
            if troupe_last and dm_last:
                break
            if steps > 5000:
                failures.append(f"{task}: no episode end within 5000 steps")
                break
        if troupe_last != dm_last:
            failures.append(f"{task} {policy}: episode ends (step, discount) troupe {troupe_last}, "
                            f"dm_control {dm_last}")
        together = steps if together is None else together
        twin_together = steps if twin_together is None else twin_together
        if twin_together < steps:
            failures.append(f"{task} {policy} policy: troupe's model ({spec['model']}) in dm_control's engine parts "
                            f"from dm_control's model after {twin_together} steps: the models differ")
        if task not in ENGINES_PART_SOONER and together < min(TOGETHER_STEPS, steps):
            failures.append(f"{task} {policy} policy: the trajectories part (qpos more than {TOGETHER_QPOS} apart) "
                            f"after {together} steps; the same model should stay together {TOGETHER_STEPS}")
        # Returns: the square wave's contacts make every trajectory chaotic
        # over a whole episode (finger's parts after ~400 steps from 1e-12 at
        # its first contact), so only the zero and random policies' returns
        # are held to RETURN_TOLERANCE; the square wave's are reported.
        bound = max(RETURN_TOLERANCE[0] * abs(dm_return), RETURN_TOLERANCE[1])
        if policy != "square" and abs(troupe_return - dm_return) > bound:
            failures.append(f"{task} {policy} policy: return troupe {troupe_return:.1f}, dm_control {dm_return:.1f} "
                            f"(more than {bound:.1f} apart)")
        row[f"{policy}_steps"] = steps
        row[f"{policy}_return_troupe"] = troupe_return
        row[f"{policy}_return_dm_control"] = dm_return
        row[f"{policy}_early_qpos_error"] = early_error
        row[f"{policy}_steps_together"] = together
        row[f"{policy}_twin_steps_together"] = twin_together
    probe.close()
    report.append(row)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=os.path.join(TOP, "build", "release"))
    parser.add_argument("--json", default="")
    parser.add_argument("--tasks", default=",".join(TASKS))
    args = parser.parse_args()
    binary = os.path.join(args.build, "envs", "troupe_task_probe")
    if not os.path.exists(binary):
        print(f"dm_control_parity: {binary} is not built (cmake --build {args.build} --target troupe_task_probe)")
        return 1
    try:
        import dm_control  # noqa: F401  (already in dm_control's venv)
    except ImportError:
        from python_bench import DM_CONTROL, peer_python  # installs the pinned dm_control once
        python, why = peer_python(args.build, "dm-control-venv", DM_CONTROL)
        if python is None:
            print(f"dm_control_parity: SKIPPED: {why}")
            return SKIP
        os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:]])
    os.environ.setdefault("MUJOCO_GL", "disable")
    import numpy as np
    from dm_control import suite
    from dm_control import mujoco as mujoco_physics
    import mujoco

    failures, report = [], []
    for task in args.tasks.split(","):
        compare_task(np, suite, mujoco_physics, binary, task, failures, report)
    # The table (docs/tasks.md, "dm_control parity").
    print(f"troupe (MuJoCo 2.2.2) vs dm_control {dm_control.__version__ if hasattr(dm_control, '__version__') else ''}"
          f"(MuJoCo {mujoco.__version__}), same states and same actions:")
    print(f"{'task':20} {'obs rel err':>11} {'reward err':>10} {'steps':>6} {'zero: troupe':>12} {'dm_control':>10}"
          f" {'random: troupe':>14} {'dm_control':>10} {'square: troupe':>14} {'dm_control':>10} {'qpos err@5':>10} {'together':>8} {'twin':>5}")
    for r in report:
        print(f"{r['task']:20} {r['obs_max_rel_error']:11.2g} {r['reward_max_error']:10.2g} {r['zero_steps']:6d} "
              f"{r['zero_return_troupe']:12.1f} {r['zero_return_dm_control']:10.1f} {r['random_return_troupe']:14.1f}"
              f" {r['random_return_dm_control']:10.1f} {r['square_return_troupe']:14.1f}"
              f" {r['square_return_dm_control']:10.1f} {r['random_early_qpos_error']:10.2g}"
              f" {min(r[p + '_steps_together'] for p in ('zero', 'random', 'square')):8d}"
              f" {min(r[p + '_twin_steps_together'] for p in ('zero', 'random', 'square')):5d}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    for task, why in ENGINES_PART_SOONER.items():
        print(f"engines part sooner: {task}: {why}")
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
