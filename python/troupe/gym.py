"""gymnasium adapters of troupe's pools (needs gymnasium, which troupe itself does not).

    from troupe.gym import TroupeEnv, TroupeVectorEnv
    env = TroupeEnv("cartpole.swingup", observation="state")          # a gymnasium.Env
    envs = TroupeVectorEnv("walker.walk", num_envs=16, observation="pixels", frame_stack=3)

Control tasks end by their time limit, so episodes end `truncated`, never
`terminated`. The vector env resets an env that ended on its next step
(AutoresetMode.NEXT_STEP: that step's action is ignored, its reward is 0).
What these return is copied out of the pool's buffers, as gymnasium asks.
A seeded reset() rebuilds the pool with that seed (env i gets
troupe._native.seed_for(seed, i)), so seeded resets are reproducible.
"""
from __future__ import annotations

from typing import Any, Optional

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from troupe.envs import EnvPool, make


def _spaces(pool: EnvPool):
    spec = pool.spec
    if spec.observation == "pixels":
        observation = spaces.Box(0, 255, spec.observation_shape, np.uint8)
    else:
        observation = spaces.Box(-np.inf, np.inf, spec.observation_shape, np.float32)
    action = spaces.Box(spec.action_minimum, spec.action_maximum, spec.action_shape, np.float32)
    return observation, action


def _copy_info(info: dict, row=slice(None)) -> dict:
    return {k: np.array(v[row]) for k, v in info.items()}


class TroupeEnv(gymnasium.Env):
    """One env of `task` as a gymnasium.Env (a troupe pool of one env underneath)."""
    metadata = {"render_modes": []}

    def __init__(self, task: str, observation: str = "state", seed: int = 0, **make_args: Any):
        self._make_args = dict(task=task, num_envs=1, observation=observation, **make_args)
        self._pool = make(seed=seed, **self._make_args)
        self.observation_space, self.action_space = _spaces(self._pool)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        if seed is not None:
            self._pool.close()
            self._pool = make(seed=int(seed), **self._make_args)
        obs, info = self._pool.gym_reset()
        return np.array(obs[0]), _copy_info(info, 0)

    def step(self, action):
        actions = np.asarray(action, dtype=np.float32).reshape(1, -1)
        obs, reward, terminated, truncated, info = self._pool.gym_step(actions)
        return np.array(obs[0]), float(reward[0]), bool(terminated[0]), bool(truncated[0]), _copy_info(info, 0)

    def close(self):
        self._pool.close()


class TroupeVectorEnv(gymnasium.vector.VectorEnv):
    """`num_envs` envs of `task` as a gymnasium VectorEnv over one troupe pool (sync mode)."""
    metadata = {"render_modes": [], "autoreset_mode": gymnasium.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, task: str, num_envs: int, observation: str = "state", seed: int = 0, **make_args: Any):
        self._make_args = dict(task=task, num_envs=num_envs, observation=observation, **make_args)
        self._pool = make(seed=seed, **self._make_args)
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = _spaces(self._pool)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed=None, options: Optional[dict] = None):
        if seed is not None:
            base = int(seed[0] if isinstance(seed, (list, tuple)) else seed)
            self._np_random, self._np_random_seed = gymnasium.utils.seeding.np_random(base)
            self._pool.close()
            self._pool = make(seed=base, **self._make_args)
        obs, info = self._pool.gym_reset()
        return np.array(obs), _copy_info(info)

    def step(self, actions):
        obs, reward, terminated, truncated, info = self._pool.gym_step(np.asarray(actions, dtype=np.float32))
        return np.array(obs), np.array(reward), np.array(terminated), np.array(truncated), _copy_info(info)

    def close_extras(self, **kwargs):
        self._pool.close()
