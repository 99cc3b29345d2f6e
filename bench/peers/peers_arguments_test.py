"""The Python peers' command lines (jax_drq.py, torch_d4pg.py, jax_d4pg.py, torch_ppo.py):
bad arguments are refused with the usage line and what was wrong, and
torch_d4pg.py's reduce-overhead on the CPU is skipped saying why, and the JAX
peers' device pjrt names a plugin that is no file, all before torch or jax is
imported, so this runs with neither installed."""
import os
import subprocess
import sys
import unittest

PEERS = os.path.dirname(os.path.abspath(__file__))


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(PEERS, script), *args], capture_output=True, text=True,
                          timeout=60)


class PeerArgumentsTest(unittest.TestCase):
    def assertRefused(self, script, args, *says):
        result = run(script, *args)
        self.assertNotEqual(result.returncode, 0, f"{script} {args} accepted: {result.stdout}")
        self.assertIn(f"usage: {script} THREADS BATCH SIZE", result.stderr)
        for text in says:
            self.assertIn(text, result.stderr)
        self.assertNotIn("_per_second", result.stdout)

    def test_jax_drq_refuses_bad_arguments(self):
        self.assertRefused("jax_drq.py", ["1", "8", "84"])
        self.assertRefused("jax_drq.py", ["1", "eight", "84", "2", "jit"], "invalid literal for int()")
        self.assertRefused("jax_drq.py", ["1", "8", "84", "2", "eager"])
        self.assertRefused("jax_drq.py", ["1", "8", "84", "2", "jit", "tpu"])
        self.assertRefused("jax_drq.py", ["1", "8", "84", "2", "jit", "cpu", "float16"])
        self.assertRefused("jax_drq.py", ["0", "8", "84", "2", "jit"], "THREADS, BATCH >= 1")
        self.assertRefused("jax_drq.py", ["1", "8", "14", "2", "jit"], "SIZE >= 15")

    def test_torch_d4pg_refuses_bad_arguments(self):
        self.assertRefused("torch_d4pg.py", ["1", "8", "84", "3", "2"])
        self.assertRefused("torch_d4pg.py", ["1", "8", "84", "3", "2", "jit"])
        self.assertRefused("torch_d4pg.py", ["1", "8", "84", "3", "2", "eager", "cpu", "layers=3"],
                           "unknown option 'layers=3'")
        self.assertRefused("torch_d4pg.py", ["1", "8", "84", "3", "2", "eager", "hidden=wide"],
                           "hidden=wide: not an integer")
        self.assertRefused("torch_d4pg.py", ["1", "8", "84", "3", "2", "eager", "precision=float16"],
                           "precision=float16: float32 or bfloat16")
        self.assertRefused("torch_d4pg.py", ["1", "8", "84", "0", "2", "eager"], "FRAMES")
        self.assertRefused("torch_d4pg.py", ["1", "8", "84", "3", "2", "eager", "atoms=1"], "atoms >= 2")
        self.assertRefused("torch_d4pg.py", ["1", "8", "84", "3", "2", "eager", "prioritized=2"], "prioritized 0 or 1")

    def test_jax_d4pg_refuses_bad_arguments(self):
        self.assertRefused("jax_d4pg.py", ["1", "8", "84", "3", "2", "eager"])
        self.assertRefused("jax_d4pg.py", ["1", "8", "84", "3", "2", "jit", "cpu", "channels=0"], "channels")

    def test_the_jax_peers_on_the_pjrt_plugin_refuse_a_plugin_that_is_no_file(self):
        env = dict(os.environ, TROUPE_PJRT_PLUGIN="/nonexistent/plugin.so")
        for script, args in [("jax_drq.py", ["1", "8", "84", "2", "jit", "pjrt"]),
                             ("jax_d4pg.py", ["1", "8", "84", "3", "2", "jit", "pjrt"])]:
            result = subprocess.run([sys.executable, os.path.join(PEERS, script), *args], capture_output=True,
                                    text=True, timeout=60, env=env)
            self.assertNotEqual(result.returncode, 0, f"{script} accepted: {result.stdout}")
            self.assertIn("device pjrt: TROUPE_PJRT_PLUGIN='/nonexistent/plugin.so' is no file", result.stderr)
            self.assertNotIn("_per_second", result.stdout)

    def test_torch_ppo_refuses_bad_arguments(self):
        for args, says in [(["2", "cartpole", "balance", "8", "speed"], ""),
                           (["2", "cartpole", "balance", "8", "fast", "10"], ""),
                           (["two", "cartpole", "balance", "8", "speed", "10"], "invalid literal for int()"),
                           (["2", "cartpole", "balance", "0", "speed", "10"], "ACTION_REPEAT >= 1"),
                           (["2", "cartpole", "balance", "8", "speed", "10", "layers=3"], "unknown option 'layers=3'"),
                           (["2", "cartpole", "balance", "8", "speed", "10", "batch=many"], "batch=many: not a number"),
                           (["2", "cartpole", "balance", "8", "learn", "1000", "epochs=0"], "epochs, minibatches"),
                           (["2", "cartpole", "balance", "8", "learn", "1000", "eval_episodes=0"], "eval_episodes >= 1"),
                           (["2", "cartpole", "balance", "8", "learn", "1000", "anneal=2"], "anneal is 0 or 1"),
                           (["2", "cartpole", "balance", "8", "learn", "1000", "eval_every=-5"], "eval_every"),
                           (["2", "cartpole", "balance", "8", "learn", "1000", "pixels=8"], "pixels 0 or >= 15"),
                           (["2", "cartpole", "balance", "8", "learn", "1000", "pixels=64", "detach=2"],
                            "detach is 0 or 1"),
                           (["2", "cartpole", "balance", "8", "learn", "1000", "channels=0"], "channels")]:
            result = run("torch_ppo.py", *args)
            self.assertNotEqual(result.returncode, 0, f"torch_ppo.py {args} accepted: {result.stdout}")
            self.assertIn("usage: torch_ppo.py THREADS DOMAIN TASK ACTION_REPEAT", result.stderr)
            self.assertIn(says, result.stderr)
            self.assertNotIn("_per_second", result.stdout)

    def test_torch_d4pg_skips_reduce_overhead_on_the_cpu(self):
        result = run("torch_d4pg.py", "1", "8", "84", "3", "2", "reduce-overhead", "cpu")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("reduce-overhead is CUDA graphs, unsupported on the CPU; skipped", result.stdout)
        self.assertNotIn("updates_per_second", result.stdout)


if __name__ == "__main__":
    unittest.main()
