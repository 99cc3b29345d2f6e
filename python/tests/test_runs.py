"""troupe.Run and troupe.Policy on a run directory the C++ helper makes: a
the agent's checkpoint, and the actions its policy gives with its parameters."""
import os

import numpy as np
import pytest

import troupe
from troupe import _native, layout


def make_run(helper, path, seed, batch=6):
    helper("checkpoint", path, seed, batch)
    observations = np.fromfile(os.path.join(path, "observations.f32"), np.float32).reshape(batch, -1)
    actions = np.fromfile(os.path.join(path, "actions.f32"), np.float32).reshape(batch, -1)
    return observations, actions


def test_a_loaded_policy_acts_as_the_cpp_policy_does(helper, tmp_path):
    runs = {}
    for seed in (3, 4):
        runs[seed] = (str(tmp_path / f"run{seed}"),) + make_run(helper, str(tmp_path / f"run{seed}"), seed)
    for seed, (path, observations, expected) in runs.items():
        policy = troupe.Policy.load(path)
        assert policy.task == "cartpole.swingup" and policy.action_size == 1
        assert policy.checkpoint.endswith("checkpoints/agent.ckpt") and policy.updates == 0
        actions = policy.act(observations)
        assert actions.dtype == np.float32 and actions.shape == expected.shape
        np.testing.assert_array_equal(actions, expected)
        # One observation (a batch of 1: the GEMM sums in another order, so to rounding).
        np.testing.assert_allclose(policy.act(observations[2]), expected[2], rtol=1e-5, atol=1e-6)
    # Different checkpoints act differently: the file is what decides.
    assert not np.array_equal(runs[3][2], runs[4][2])


def test_a_policy_acts_on_what_a_pool_gives(helper, tmp_path):
    path = str(tmp_path / "run")
    make_run(helper, path, seed=5)
    run = troupe.Run(path)
    policy = run.policy()
    env = run.config["env"]
    pool = troupe.make(env["task"], num_envs=4, observation="state", action_repeat=env["action_repeat"], seed=1)
    ts = pool.reset()
    for _ in range(3):
        actions = policy.act(ts.observation)
        assert actions.shape == (4, 1) and np.all(np.abs(actions) <= 1)
        ts = pool.step(actions)
    with pytest.raises(ValueError, match=r"policy: observations are float32 \[batch, 5\]; got float32 \[4, 3\]"):
        policy.act(np.zeros((4, 3), np.float32))


def test_a_run_reads_config_metrics_and_eval(helper, tmp_path):
    path = str(tmp_path / "run")
    make_run(helper, path, seed=6)
    with open(os.path.join(path, "metrics.csv"), "w") as f:
        f.write("seconds,frames,updates,eval_return\n0.5,3616,300,-1.00\n1.0,7000,650,12.5\n")
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.write('{"seconds": 0.5, "frames": 3616}\n{"seconds": 1.0, "frames": 7000}\n')
    with open(os.path.join(path, "eval.csv"), "w") as f:
        f.write("frames,updates,eval_return\n5000,400,101.5\n")
    run = troupe.Run(path)
    assert run.config["name"] == "python_policy_test"
    assert run.config["env"]["task"] == "cartpole.swingup" and run.config["d4pg"]["hidden"] == [32, 32]
    assert run.latest_checkpoint.endswith("agent.ckpt")
    assert run.metrics["frames"].dtype == np.int64
    np.testing.assert_array_equal(run.metrics["frames"], [3616, 7000])
    np.testing.assert_array_equal(run.metrics["eval_return"], [-1.0, 12.5])
    assert run.metrics_records()[1]["frames"] == 7000
    assert run.eval["eval_return"][0] == pytest.approx(101.5)
    assert run.episodes is None


def test_missing_runs_and_checkpoints_raise_naming_the_path(tmp_path):
    with pytest.raises(troupe.NotFoundError, match=str(tmp_path / "nowhere")):
        troupe.Run(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="config.textproto"):
        troupe.Run(str(tmp_path))
    (tmp_path / "config.textproto").write_text('env { task: "cartpole.swingup" observation: STATE }\n')
    assert troupe.Run(str(tmp_path)).checkpoints == []
    with pytest.raises(troupe.Error, match=str(tmp_path)) as error:
        troupe.Policy.load(str(tmp_path))
    assert error.value.code == "FAILED_PRECONDITION"


def test_the_layout_python_reads_is_the_one_cpp_writes():
    assert layout.FILES == dict(_native.run_files())
    keys = {name: key for key, name in layout.FILES.items()}
    written = {(mode, keys[name]): tuple(columns) for mode, name, columns in _native.run_columns()}
    assert layout.COLUMNS == written
    assert layout.path("/runs/a", "eval_csv") == os.path.join("/runs/a", "eval.csv")
