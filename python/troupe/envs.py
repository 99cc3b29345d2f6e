"""Env pools: troupe.make(...) returns an EnvPool over the C++ envs::EnvPool.

Results view the pool's batch buffers without copying. Their lifetime:
  * sync mode (batch_size None or num_envs): reset() and step() write one
    buffer, so the arrays of a TimeStep change with the next reset()/step()
    (they are read-only views; np.copy what you keep);
  * async mode (batch_size < num_envs): recv() returns one slot of a ring
    of buffers; its arrays are valid until the next recv().
An array keeps the pool's memory alive (its .base is the pool's
PoolMemory), so an array outliving the pool never dangles.

The GIL is released while envs step, so other Python threads run meanwhile;
a pool itself is used from one thread at a time.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import NamedTuple, Optional, Sequence, Tuple

import numpy as np

from troupe import _native


class StepType(enum.IntEnum):
    """Where in an episode a timestep is (dm_env's FIRST / MID / LAST)."""
    FIRST = 0
    MID = 1
    LAST = 2


class TimeStep(NamedTuple):
    """A batch of timesteps, dm_env-style (its first four fields are dm_env's).

    observation: uint8 [B, H, W, 3*frame_stack] (pixels) or float32 [B, S] (state)
    reward, discount: float32 [B]; step_type: uint8 [B] (StepType values)
    env_id: int32 [B], the env of each row (row i is env i in sync mode)
    state: float32 [B, S], the task's state vector (also with pixels)
    episode_step: int32 [B], agent steps since the episode's reset
    """
    step_type: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    observation: np.ndarray
    env_id: np.ndarray
    state: np.ndarray
    episode_step: np.ndarray

    def first(self) -> np.ndarray:
        return self.step_type == StepType.FIRST

    def mid(self) -> np.ndarray:
        return self.step_type == StepType.MID

    def last(self) -> np.ndarray:
        return self.step_type == StepType.LAST


def _timestep(arrays: tuple) -> TimeStep:
    observation, reward, discount, step_type, env_id, state, episode_step = arrays
    return TimeStep(step_type, reward, discount, observation, env_id, state, episode_step)


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Shapes, dtypes and bounds of what a pool takes and gives (per env: no batch dimension)."""
    task: str
    observation: str                       # "pixels" or "state"
    observation_shape: Tuple[int, ...]
    observation_dtype: np.dtype
    observation_minimum: float
    observation_maximum: float
    state_shape: Tuple[int, ...]
    state_fields: Tuple[Tuple[str, int], ...]  # (name, size) of each part of the state vector
    action_shape: Tuple[int, ...]
    action_dtype: np.dtype
    action_minimum: np.ndarray
    action_maximum: np.ndarray
    reward_dtype: np.dtype
    reward_minimum: float                  # per agent step: [0, action_repeat]
    reward_maximum: float
    discount_dtype: np.dtype
    discount_minimum: float
    discount_maximum: float
    episode_steps: int                     # agent steps per episode (a time limit: no terminal states)
    action_repeat: int
    num_envs: int
    batch_size: int


class EnvPool:
    """A batch of envs of one task stepped by C++ worker threads (troupe.make makes one)."""

    def __init__(self, native: _native.EnvPool, observation: str):
        self._native = native
        self._observation = observation
        s = native.spec
        pixels = observation == "pixels"
        self.spec = EnvSpec(
            task=s["task"], observation=observation,
            observation_shape=(s["height"], s["width"], s["channels"]) if pixels else (s["state_size"],),
            observation_dtype=np.dtype(np.uint8) if pixels else np.dtype(np.float32),
            observation_minimum=0.0 if pixels else -np.inf,
            observation_maximum=255.0 if pixels else np.inf,
            state_shape=(s["state_size"],), state_fields=tuple(tuple(f) for f in s["state_fields"]),
            action_shape=(s["action_size"],), action_dtype=np.dtype(np.float32),
            action_minimum=s["action_minimum"], action_maximum=s["action_maximum"],
            reward_dtype=np.dtype(np.float32), reward_minimum=0.0, reward_maximum=float(s["action_repeat"]),
            discount_dtype=np.dtype(np.float32), discount_minimum=0.0, discount_maximum=1.0,
            episode_steps=s["episode_steps"], action_repeat=s["action_repeat"],
            num_envs=native.num_envs, batch_size=native.batch_size)

    # -- dm_env style -----------------------------------------------------
    def reset(self) -> TimeStep:
        """Sync mode: resets every env; a FIRST timestep of all of them."""
        return _timestep(self._native.reset())

    def step(self, actions) -> TimeStep:
        """Sync mode: steps env i with actions[i] (float32 [num_envs, A]); an env
        whose episode ended is reset instead (its action ignored, its row FIRST).
        ValueError (troupe.InvalidArgumentError) for a wrong shape or a NaN/inf."""
        return _timestep(self._native.step(actions))

    def send(self, actions, env_ids) -> None:
        """Async mode: queues actions[k] for env env_ids[k] and returns at once."""
        self._native.send(actions, np.asarray(env_ids, dtype=np.int32))

    def send_reset(self, env_ids) -> None:
        """Async mode: queues a reset of each env in env_ids."""
        self._native.send_reset(np.asarray(env_ids, dtype=np.int32))

    def recv(self) -> TimeStep:
        """Async mode: blocks until batch_size envs are done; their rows, in completion order."""
        return _timestep(self._native.recv())

    # -- gymnasium style (plain tuples; gymnasium is not needed) ------------
    @staticmethod
    def to_gym(ts: TimeStep):
        """(obs, reward, terminated, truncated, info) of a TimeStep. Control tasks
        end by their time limit: `truncated` marks LAST with discount > 0,
        `terminated` LAST with discount 0. An env that ended is reset by its
        next action (gymnasium's NEXT_STEP autoreset)."""
        last = ts.step_type == StepType.LAST
        terminated = last & (ts.discount == 0)
        truncated = last & (ts.discount != 0)
        info = {"env_id": ts.env_id, "step_type": ts.step_type, "discount": ts.discount,
                "episode_step": ts.episode_step, "state": ts.state}
        return ts.observation, ts.reward, terminated, truncated, info

    def gym_reset(self):
        """(obs, info) of reset()."""
        obs, _, _, _, info = self.to_gym(self.reset())
        return obs, info

    def gym_step(self, actions):
        """(obs, reward, terminated, truncated, info) of step(actions)."""
        return self.to_gym(self.step(actions))

    def gym_recv(self):
        """(obs, reward, terminated, truncated, info) of recv(); info["env_id"] says whose."""
        return self.to_gym(self.recv())

    # -- the rest ------------------------------------------------------------
    @property
    def num_envs(self) -> int:
        return self._native.num_envs

    @property
    def batch_size(self) -> int:
        return self._native.batch_size

    @property
    def num_threads(self) -> int:
        return self._native.num_threads

    @property
    def physics_errors(self) -> int:
        return self._native.physics_errors

    @property
    def memory(self):
        """The pool's batch buffers: the .base of every array it returns."""
        return self._native.memory

    def close(self) -> None:
        """Stops the pool once no array views its buffers. Idempotent."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"troupe.EnvPool({self.spec.task!r}, num_envs={self.num_envs}, batch_size={self.batch_size}, "
                f"observation={self._observation!r}, threads={self.num_threads})")


def make(task: str, num_envs: int = 1, observation: str = "pixels", action_repeat: int = 1,
         frame_stack: int = 1, seed: int = 0, batch_size: Optional[int] = None, num_threads: int = 0,
         height: int = 84, width: int = 84, camera: str = "", render_in_processes: bool = True) -> EnvPool:
    """A pool of `num_envs` envs of `task` ("walker.walk", as dm_control names them).

    observation: "pixels" (uint8 [H, W, 3*frame_stack], frames oldest first) or "state".
    seed: env i is seeded troupe._native.seed_for(seed, i), as in the C++ pool.
    batch_size: None (sync: reset/step over all envs) or 1..num_envs (async: send/recv).
    num_threads: 0 = one per core, at most num_envs.
    Errors: ValueError naming the field for a bad value; LookupError (NotFoundError)
    listing the known tasks for an unknown task.
    """
    native = _native.EnvPool(task=task, num_envs=num_envs, observation=observation, action_repeat=action_repeat,
                             frame_stack=frame_stack, seed=seed, batch_size=0 if batch_size is None else batch_size,
                             num_threads=num_threads, height=height, width=width, camera=camera,
                             render_in_processes=render_in_processes)
    return EnvPool(native, observation)
