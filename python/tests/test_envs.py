"""troupe.make / EnvPool against the C++ pool: same bytes for the same seeds,
results that view the pool's buffers, async ordering, errors as exceptions."""
import gc

import numpy as np
import pytest

import troupe


def pool_test_actions(step, num_envs, action_size):
    """The helper's PoolTestAction (python/tests/test_helper.cc), exactly, in float32."""
    i = np.arange(num_envs)[:, None]
    j = np.arange(action_size)[None, :]
    return ((step * 7 + i * 13 + j * 5) % 21 - 10).astype(np.float32) / np.float32(10)


def batch_bytes(ts, pixels):
    parts = [ts.step_type, ts.reward, ts.discount, ts.env_id, ts.state]
    if pixels:
        parts.append(ts.observation)
    parts.append(ts.episode_step)
    return b"".join(np.ascontiguousarray(p).tobytes() for p in parts)


@pytest.mark.parametrize("task,observation,num_envs,threads,repeat,stack,steps", [
    # Short episodes (40 agent steps): batches across episode ends and resets.
    ("reacher.easy", "state", 7, 2, 25, 1, 45),
    ("cartpole.swingup", "pixels", 4, 2, 2, 3, 6),
])
def test_pool_results_equal_the_cpp_pools_byte_for_byte(helper, tmp_path, task, observation, num_envs, threads,
                                                        repeat, stack, steps):
    expected = tmp_path / "cpp.bin"
    helper("pool", task, observation, num_envs, threads, repeat, stack, 1234, steps, expected)
    pool = troupe.make(task, num_envs=num_envs, observation=observation, action_repeat=repeat, frame_stack=stack,
                       seed=1234, num_threads=threads)
    got = [batch_bytes(pool.reset(), observation == "pixels")]
    resets = 0
    for step in range(1, steps + 1):
        ts = pool.step(pool_test_actions(step, num_envs, pool.spec.action_shape[0]))
        resets += int(ts.first().sum())
        got.append(batch_bytes(ts, observation == "pixels"))
    data = expected.read_bytes()
    assert len(data) == sum(map(len, got))
    assert data == b"".join(got)
    assert resets == (num_envs if steps > pool.spec.episode_steps else 0)  # reacher crossed an episode end


def test_results_view_the_pools_buffers_and_a_step_changes_them():
    pool = troupe.make("cartpole.swingup", num_envs=3, observation="pixels", seed=5, num_threads=1)
    first = pool.reset()
    before = first.observation.copy()
    for array in (first.observation, first.reward, first.discount, first.step_type, first.env_id, first.state):
        assert array.base is pool.memory
        assert not array.flags.owndata and not array.flags.writeable
    address = first.observation.__array_interface__["data"][0]
    second = pool.step(np.full((3, 1), 0.7, np.float32))
    assert second.observation.__array_interface__["data"][0] == address
    # The arrays of the first timestep now show the second (the documented lifetime).
    assert not np.array_equal(first.observation, before)
    assert np.array_equal(first.observation, second.observation)
    assert (first.step_type == troupe.StepType.MID).all()
    with pytest.raises(ValueError):
        first.reward[0] = 1.0  # read-only


def test_an_array_outlives_its_pool():
    pool = troupe.make("cartpole.swingup", num_envs=2, observation="state", seed=1)
    state = pool.step(np.zeros((2, 1), np.float32)).state
    kept = state.copy()
    pool.close()
    del pool
    gc.collect()
    assert np.array_equal(state, kept)


def test_a_closed_pool_raises():
    pool = troupe.make("cartpole.swingup", num_envs=1, observation="state")
    pool.close()
    pool.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        pool.step(np.zeros((1, 1), np.float32))


def test_async_results_come_per_env_in_order_and_equal_the_sync_pools():
    num_envs, batch, steps = 6, 2, 8
    action = lambda env, k: np.float32(((env * 3 + k * 5) % 11 - 5) / 5)  # noqa: E731
    sync = troupe.make("cartpole.swingup", num_envs=num_envs, observation="state", seed=9, num_threads=2)
    expected = {}  # (env, k) -> state after k steps
    ts = sync.reset()
    for env in range(num_envs):
        expected[env, 0] = ts.state[env].copy()
    for k in range(1, steps + 1):
        ts = sync.step(np.array([[action(env, k)] for env in range(num_envs)], np.float32))
        for env in range(num_envs):
            expected[env, k] = ts.state[env].copy()

    pool = troupe.make("cartpole.swingup", num_envs=num_envs, observation="state", seed=9, num_threads=2,
                       batch_size=batch)
    assert pool.batch_size == batch
    pool.send_reset(range(num_envs))
    seen = {env: 0 for env in range(num_envs)}
    received = 0
    while min(seen.values()) < steps:
        ts = pool.recv()
        assert ts.env_id.shape == (batch,) and len(set(ts.env_id.tolist())) == batch
        for row, env in enumerate(ts.env_id.tolist()):
            k = int(ts.episode_step[row])
            if received < num_envs and k == 0:
                assert ts.step_type[row] == troupe.StepType.FIRST
            assert np.array_equal(ts.state[row], expected[env, k]), (env, k)
        received += batch
        ids = ts.env_id.copy()
        ks = ts.episode_step.copy()
        for env, k in zip(ids.tolist(), ks.tolist()):
            seen[env] = k
        live = [(e, k) for e, k in zip(ids.tolist(), ks.tolist()) if k < steps]
        if live:
            pool.send(np.array([[action(e, k + 1)] for e, k in live], np.float32), [e for e, _ in live])
        if not live and all(v >= steps for v in seen.values()):
            break
    assert all(v == steps for v in seen.values())


def test_bad_input_raises_with_the_cpp_message_and_the_pool_goes_on():
    pool = troupe.make("walker.walk", num_envs=2, observation="state", seed=0)
    pool.reset()
    bad = np.zeros((2, 6), np.float32)
    bad[1, 4] = np.nan
    with pytest.raises(ValueError, match=r"walker.walk: env 1 action\[4\] is nan; actions must be finite") as error:
        pool.step(bad)
    assert isinstance(error.value, troupe.Error) and error.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ValueError, match=r"walker.walk: 6 action values for 2 envs; expected 12"):
        pool.step(np.zeros((1, 6), np.float32))
    with pytest.raises(ValueError, match=r"actions of shape \(6, 2\); expected \(2, 6\)"):
        pool.step(np.zeros((6, 2), np.float32))
    with pytest.raises(troupe.Error, match="FailedPrecondition|sync|async"):
        pool.recv()
    ts = pool.step(np.zeros((2, 6)))  # float64 is converted; the pool still works
    assert (ts.episode_step == 1).all()
    with pytest.raises(LookupError, match="unknown task 'walker.run'; known tasks: .*walker.walk"):
        troupe.make("walker.run")
    with pytest.raises(ValueError, match=r"pool.num_envs: 0 is outside"):
        troupe.make("walker.walk", num_envs=0)
    with pytest.raises(ValueError, match="observation: 'rgb' is neither"):
        troupe.make("walker.walk", observation="rgb")


def test_spec_gives_shapes_dtypes_and_bounds():
    pool = troupe.make("walker.walk", num_envs=2, observation="pixels", action_repeat=2, frame_stack=3, seed=0,
                       num_threads=1)
    spec = pool.spec
    assert spec.observation_shape == (84, 84, 9) and spec.observation_dtype == np.uint8
    assert spec.action_shape == (6,) and spec.action_dtype == np.float32
    assert (spec.action_minimum == -1).all() and (spec.action_maximum == 1).all()
    assert spec.episode_steps == 500 and spec.action_repeat == 2
    ts = pool.reset()
    assert ts.observation.shape == (2,) + spec.observation_shape and ts.observation.dtype == spec.observation_dtype
    assert ts.state.shape == (2,) + spec.state_shape and ts.state.dtype == np.float32
    assert sum(size for _, size in spec.state_fields) == spec.state_shape[0]
    assert ts.reward.dtype == spec.reward_dtype and ts.discount.dtype == spec.discount_dtype


def test_gym_form_truncates_at_the_time_limit_and_resets_on_the_next_step():
    # 1000 control steps / 100 per action: 10 agent steps an episode.
    pool = troupe.make("cartpole.swingup", num_envs=2, observation="state", action_repeat=100, seed=3)
    obs, info = pool.gym_reset()
    assert obs.shape == (2, 5) and (info["env_id"] == [0, 1]).all()
    for step in range(1, 11):
        obs, reward, terminated, truncated, info = pool.gym_step(np.zeros((2, 1), np.float32))
        assert not terminated.any()
        assert truncated.all() == (step == 10)
    obs, reward, terminated, truncated, info = pool.gym_step(np.zeros((2, 1), np.float32))
    assert (info["step_type"] == troupe.StepType.FIRST).all() and (reward == 0).all()
    assert not terminated.any() and not truncated.any()
    ts = pool.step(np.zeros((2, 1), np.float32))
    assert ts.mid().all() and not ts.first().any() and not ts.last().any()
