"""gymnasium's checks on troupe.gym's adapters (gymnasium from PyPI, in a venv
under the build tree: python/tests/gymnasium_checks.sh)."""
import warnings

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import troupe
from troupe.gym import TroupeEnv, TroupeVectorEnv


@pytest.mark.parametrize("observation,extra", [("state", {}), ("pixels", {"frame_stack": 2, "num_threads": 1})])
def test_check_env_passes(observation, extra):
    env = TroupeEnv("cartpole.swingup", observation=observation, **extra)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    # gymnasium's checker warns about what it finds dubious: nothing should be,
    # but that a state vector is unbounded (as dm_control's specs say too).
    dubious = [str(w.message) for w in caught
               if "spec" not in str(w.message) and "infinity" not in str(w.message)]
    assert not dubious
    env.close()


def test_vector_env_follows_the_vector_api_with_next_step_autoreset():
    envs = TroupeVectorEnv("cartpole.swingup", num_envs=3, observation="state", action_repeat=100)
    assert envs.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.NEXT_STEP
    obs, info = envs.reset(seed=7)
    assert envs.observation_space.contains(obs) and obs.shape == (3, 5)
    again, _ = envs.reset(seed=7)
    np.testing.assert_array_equal(obs, again)  # a seeded reset is reproducible
    envs.action_space.seed(0)
    for step in range(1, 11):  # 10 agent steps an episode
        obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
        assert envs.observation_space.contains(obs)
        assert reward.shape == (3,) and terminated.dtype == bool and truncated.dtype == bool
        assert not terminated.any() and truncated.all() == (step == 10)
    kept = obs.copy()
    obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample())
    assert (reward == 0).all() and not truncated.any()          # NEXT_STEP: the reset step
    assert (info["step_type"] == troupe.StepType.FIRST).all()
    assert not np.array_equal(obs, kept)
    envs.close()


def test_vector_env_equals_the_single_env_with_the_same_seed():
    single = TroupeEnv("walker.walk", observation="state")
    vector = TroupeVectorEnv("walker.walk", num_envs=1, observation="state")
    a, _ = single.reset(seed=11)
    b, _ = vector.reset(seed=11)
    np.testing.assert_array_equal(a, b[0])
    rng = np.random.default_rng(0)
    for _ in range(5):
        action = rng.uniform(-1, 1, 6).astype(np.float32)
        a, ra, *_ = single.step(action)
        b, rb, *_ = vector.step(action[None])
        np.testing.assert_array_equal(a, b[0])
        assert ra == rb[0]
