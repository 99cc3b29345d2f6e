"""tools/results_table.py on sweeps written here: per-seed finals, mean and
spread over the seeds done, frames and wall time to 90% of the final return,
the published number beside it, unfinished runs in brackets."""
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "results_table.py")


def write_run(directory, evals, seconds_per_frame, done):
    os.makedirs(directory)
    with open(os.path.join(directory, "eval.csv"), "w") as f:
        f.write("frames,updates,eval_return,actions_at_bound\n")
        for frames, value in evals:
            f.write(f"{frames},0,{value},0.0\n")
    with open(os.path.join(directory, "metrics.csv"), "w") as f:
        f.write("seconds,frames,updates\n")
        for frames in range(0, evals[-1][0] + 1, 10000):
            f.write(f"{frames * seconds_per_frame},{frames},0\n")
    if done:
        open(os.path.join(directory, "done"), "w").write("done\n")


class ResultsTableTest(unittest.TestCase):
    def test_table(self):
        with tempfile.TemporaryDirectory() as top:
            sweep = os.path.join(top, "cheetah_run")
            # Seed 0 reaches 90% of its final 500 (450) at 40k frames, 80 s in.
            write_run(os.path.join(sweep, "seed-0"), [(20000, 100), (40000, 460), (60000, 500)], 0.002, True)
            # Seed 1 reaches 90% of 700 (630) at 60k frames, 60 s in.
            write_run(os.path.join(sweep, "seed-1"), [(20000, 100), (40000, 600), (60000, 700)], 0.001, True)
            # Seed 2 is still going: shown, not counted.
            write_run(os.path.join(sweep, "seed-2"), [(20000, 50)], 0.001, False)
            out = subprocess.run([sys.executable, TOOL, top, "--machine", "test box", "--csv",
                                  os.path.join(top, "seeds.csv")], capture_output=True, text=True, check=True).stdout
            row = next(line for line in out.splitlines() if line.startswith("| cheetah.run"))
            cells = [c.strip() for c in row.strip("|").split("|")]
            self.assertEqual(cells[1], "600 ± 141 (2)")  # mean of 500 and 700, sample std 141.4
            self.assertEqual(cells[2], "500, 700, (50 at 20k)")
            self.assertEqual(cells[3], "50k")  # median of 40k and 60k
            self.assertEqual(cells[4], "1.2 min")  # median of 80 s and 60 s
            self.assertEqual(cells[5], "795 ± 30")  # SAC state, DrQ paper
            self.assertEqual(cells[6], "test box")
            with open(os.path.join(top, "seeds.csv")) as f:
                self.assertEqual(len(f.read().splitlines()), 4)  # header and 3 seeds

    def test_a_clock_restarted_by_an_old_resume_counts_both_pieces(self):
        with tempfile.TemporaryDirectory() as top:
            run = os.path.join(top, "walker_walk", "seed-0")
            write_run(run, [(20000, 100), (40000, 900), (60000, 1000)], 0.001, True)
            # Killed at 30k frames (30 s) and resumed from its 20k checkpoint
            # by a troupe that started the clock again: 20 s more to 40k.
            with open(os.path.join(run, "metrics.csv"), "w") as f:
                f.write("seconds,frames,updates\n0,0,0\n10,10000,0\n30,30000,0\n"
                        "0.5,20000,0\n10.5,30000,0\n20.5,40000,0\n40.5,60000,0\n")
            out = subprocess.run([sys.executable, TOOL, top], capture_output=True, text=True, check=True).stdout
            row = next(line for line in out.splitlines() if line.startswith("| walker.walk"))
            cells = [c.strip() for c in row.strip("|").split("|")]
            self.assertEqual(cells[3], "40k")
            self.assertEqual(cells[4], "0.8 min")  # 30 + 20.5 s, not 20.5 s

    def test_not_a_directory(self):
        result = subprocess.run([sys.executable, TOOL, "/nonexistent/sweeps"], capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("/nonexistent/sweeps is not a directory", result.stderr)


if __name__ == "__main__":
    unittest.main()
