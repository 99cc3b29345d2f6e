#!/usr/bin/env python3
"""How a run's policy did at each of its checkpoints: the return of its mean
action (what the evaluator scores) and of the mean action with Gaussian noise
added before the tanh, from the same start states, so that a dip in a run's
evaluations can be told apart: a fragile mean action (noise restores the
return) or a policy that has changed (it does not).

    PYTHONPATH=build/release/python build/release/python-venv/bin/python \\
        tools/checkpoint_returns.py RUN_DIR [--episodes 5] [--noise 0.05 0.2] [--seed 4242]

One line per checkpoint, oldest first: the learner's updates, the mean
return for each noise level (0 first), the mean |action|, the mean |state|
at the episodes' end per state dimension (state runs), and each episode's
return under the mean action. Keep checkpoints to study with
`--set learner.checkpoint_every_s=3 --set learner.keep_checkpoints=200`.
Needs troupe's Python module (build/release/python) and numpy.
"""
import argparse
import sys

import numpy as np

import troupe
from troupe import _native


def episode_returns(policy, task, repeat, observation, episodes, seed, sigma, rng):
    """(returns [episodes], mean |action|, final |state| per dimension or None) of `episodes` envs stepped together."""
    env = troupe.make(task, num_envs=episodes, observation=observation, action_repeat=repeat, seed=seed,
                      num_threads=1)
    ts = env.reset()
    total, magnitudes = np.zeros(episodes), []
    while True:
        actions = np.asarray(policy.act(ts.observation), dtype=np.float32).reshape(episodes, -1)
        if sigma > 0:
            pre = np.arctanh(np.clip(actions, -1 + 1e-6, 1 - 1e-6))
            actions = np.tanh(pre + sigma * rng.standard_normal(actions.shape)).astype(np.float32)
        magnitudes.append(np.abs(actions).mean())
        ts = env.step(actions)
        total += np.asarray(ts.reward)
        if np.all(ts.last()):
            break
    final = np.abs(np.asarray(ts.observation, dtype=np.float64)).mean(0) if observation == "state" else None
    env.close()
    return total, float(np.mean(magnitudes)), final


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--noise", type=float, nargs="*", default=[0.05, 0.2],
                        help="standard deviations of the noise added to the pre-tanh mean action")
    parser.add_argument("--seed", type=int, default=4242, help="the envs' seed (their start states)")
    args = parser.parse_args()
    if args.episodes < 1 or any(s <= 0 for s in args.noise):
        sys.exit("checkpoint_returns.py: --episodes >= 1 and every --noise > 0")
    run = troupe.Run(args.run_dir)
    if not run.checkpoints:
        sys.exit(f"checkpoint_returns.py: {args.run_dir} has no checkpoint")
    env = run.config["env"]
    task, repeat = env["task"], int(env.get("action_repeat", 1))
    observation = "state" if env.get("observation", "PIXELS") == "STATE" else "pixels"
    sigmas = [0.0] + list(args.noise)
    print("updates", *[f"return_noise_{s:g}" for s in sigmas], "mean_abs_action",
          "final_abs_state" if observation == "state" else "", "returns_of_the_mean_action")
    for checkpoint in run.checkpoints:
        policy = run.policy(checkpoint)
        played = [episode_returns(policy, task, repeat, observation, args.episodes, args.seed, sigma,
                                  np.random.default_rng(0)) for sigma in sigmas]
        means = [returns.mean() for returns, _, _ in played]
        returns, magnitude, final = played[0]  # the mean action's (noise 0)
        state = "[" + " ".join(f"{v:.2f}" for v in final) + "]" if final is not None else ""
        print(policy.updates, *[f"{m:.0f}" for m in means], f"{magnitude:.2f}", state,
              "[" + " ".join(f"{r:.0f}" for r in returns) + "]", flush=True)


if __name__ == "__main__":
    main()
