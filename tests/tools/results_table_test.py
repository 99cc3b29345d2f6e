"""tools/results_table.py on sweeps written here: per-seed finals, mean and
spread over the seeds done, frames and wall time to 90% of the final return,
the published number beside it, unfinished runs in brackets, runs listed in
not_kept.txt as "not kept"; and --check, which holds docs/results.md to the
runs kept in the repository (a value shown unmarked must come from a kept
run, one of a run not kept must carry the dagger)."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

TOP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(TOP, "tools", "results_table.py")
MARK = "\u2020"


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
        with open(os.path.join(directory, "done"), "w") as f:
            f.write("done\n")


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

    def test_runs_not_kept(self):
        with tempfile.TemporaryDirectory() as top:
            write_run(os.path.join(top, "cheetah_run", "seed-1"), [(20000, 100), (40000, 700)], 0.001, True)
            with open(os.path.join(top, "not_kept.txt"), "w") as f:
                f.write("# lost\ncheetah_run/seed-0\nball_in_cup_catch/seed-0  # and this one\n")
            out = subprocess.run([sys.executable, TOOL, top], capture_output=True, text=True, check=True).stdout
            cheetah = next(line for line in out.splitlines() if line.startswith("| cheetah.run"))
            self.assertIn("| cheetah.run | 700 (1; 1 not kept) | not kept, 700 | 40k |", cheetah)
            ball = next(line for line in out.splitlines() if line.startswith("| ball_in_cup.catch"))
            self.assertIn("| ball_in_cup.catch | - (0; 1 not kept) | not kept | - | - | 974 ± 33 |", ball)
            # A seed below a known one, neither kept nor listed.
            write_run(os.path.join(top, "cheetah_run", "seed-3"), [(20000, 100), (40000, 500)], 0.001, True)
            out = subprocess.run([sys.executable, TOOL, top], capture_output=True, text=True, check=True).stdout
            self.assertIn("| cheetah.run | 600 ± 141 (2; 1 not kept; 1 no run) | not kept, 700, no run, 500 |", out)
            # Kept and listed: the list is wrong.
            write_run(os.path.join(top, "cheetah_run", "seed-0"), [(20000, 100), (40000, 700)], 0.001, True)
            result = subprocess.run([sys.executable, TOOL, top], capture_output=True, text=True)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("is kept and listed in", result.stderr)

    def check(self, runs, page_rows, footnote=True):
        """--check of a page holding the state table with page_rows."""
        page = os.path.join(runs, "results.md")
        head = "| task | troupe D4PG (seeds done) | per seed | frames to 90% | wall time to 90% | SAC state | machine |"
        with open(page, "w", encoding="utf-8") as f:
            f.write("# Results\n\n" + head + "\n" + "|" + " --- |" * 7 + "\n" + "\n".join(page_rows) + "\n\n")
            if footnote:
                f.write(f"{MARK} Not reproducible from the repository: the run was not kept.\n")
        return subprocess.run([sys.executable, TOOL, runs, "--check", page], capture_output=True, text=True)

    def test_check(self):
        with tempfile.TemporaryDirectory() as top:
            runs = os.path.join(top, "state")
            # cheetah.run: seed 0 not kept (its value 694 only as logged), seeds 1 and 2 kept.
            write_run(os.path.join(runs, "cheetah_run", "seed-1"), [(20000, 100), (40000, 460), (60000, 500)],
                      0.002, True)
            write_run(os.path.join(runs, "cheetah_run", "seed-2"), [(20000, 100), (40000, 600), (60000, 700)],
                      0.001, True)
            with open(os.path.join(runs, "not_kept.txt"), "w") as f:
                f.write("cheetah_run/seed-0\n")
            good = f"| cheetah.run | 631 ± 114 (3){MARK} | 694{MARK}, 500, 700 | 40k{MARK} | 1.0 min{MARK} | 795 ± 30 | box |"
            result = self.check(runs, [good])
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("agree", result.stdout)
            # The mean over the kept seeds alone, as the tool prints it, needs no mark.
            result = self.check(runs, [good.replace(f"631 ± 114 (3){MARK}", "600 ± 141 (2; 1 not kept)")])
            self.assertEqual(result.returncode, 0, result.stderr)
            # A run not kept shown as if it were.
            result = self.check(runs, [good.replace(f"694{MARK}", "694")])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("seed 0: 694 unmarked, but its run is not kept", result.stderr)
            # A mean over it unmarked.
            result = self.check(runs, [good.replace(f"631 ± 114 (3){MARK}", "631 ± 114 (3)")])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("troupe D4PG (seeds done): 631 ± 114 (3), but the kept runs give 600 ± 141 (2; 1 not kept)",
                          result.stderr)
            # A kept run's value marked, or not the value it gives.
            result = self.check(runs, [good.replace("500, 700", f"500{MARK}, 700")])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("seed 1: 500\u2020 marked, but", result.stderr)
            result = self.check(runs, [good.replace("500, 700", "510, 700")])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("seed 1: 510, but", result.stderr)
            # A published number changed.
            result = self.check(runs, [good.replace("795 ± 30", "795 ± 31")])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("SAC state: 795 ± 31, not 795 ± 30", result.stderr)
            # A seed, or a task, shown with no run kept or listed.
            result = self.check(runs, [good.replace("500, 700", "500, 700, 720")])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("seed 3: 720, but", result.stderr)
            result = self.check(runs, [good, f"| walker.walk | 950 (1){MARK} | 950 | 200k | 3.0 min | 948 ± 54 | box |"])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("walker.walk: no run of it kept in", result.stderr)
            # A row the runs give but the page leaves out; the mark unexplained.
            result = self.check(runs, [])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("no row for cheetah.run", result.stderr)
            result = self.check(runs, [good], footnote=False)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("says what it means", result.stderr)
            # A kept run's files lost: its value, still shown unmarked, fails.
            os.remove(os.path.join(runs, "cheetah_run", "seed-2", "eval.csv"))
            result = self.check(runs, [good])
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("seed 2: 700, but", result.stderr)
            self.assertIn("is not kept nor listed", result.stderr)

    def test_the_results_page_agrees_with_the_runs_kept(self):
        docs = os.path.join(TOP, "docs")
        command = [sys.executable, TOOL, os.path.join(docs, "results", "state"), "--pixels",
                   os.path.join(docs, "results", "pixels"), "--check", os.path.join(docs, "results.md")]
        result = subprocess.run(command, capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        state = result.stdout.split("From pixels")[0]
        seeds = [line.split("|")[3].strip().split(", ") for line in state.splitlines() if line.startswith("| ")][2:]
        cells = [cell for row in seeds for cell in row]
        self.assertEqual(len(cells), 24)  # 8 tasks x 3 seeds
        self.assertEqual(cells.count("not kept"), 18)  # docs/results/state/not_kept.txt
        # A kept run's files lost: the page, which shows its value unmarked, no longer agrees.
        with tempfile.TemporaryDirectory() as top:
            copy = os.path.join(top, "state")
            shutil.copytree(os.path.join(docs, "results", "state"), copy)
            shutil.rmtree(os.path.join(copy, "walker_walk", "seed-2"))
            command[2] = copy
            result = subprocess.run(command, capture_output=True, text=True)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("walker.walk seed 2: 958, but", result.stderr)

    def test_not_a_directory(self):
        result = subprocess.run([sys.executable, TOOL, "/nonexistent/sweeps"], capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("/nonexistent/sweeps is not a directory", result.stderr)


if __name__ == "__main__":
    unittest.main()
