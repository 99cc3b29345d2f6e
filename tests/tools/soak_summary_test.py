#!/usr/bin/env python3
"""tools/soak_summary.py on memory samples the test writes: a process whose
least memory grew 4.9% in the window passes, one whose grew 5.0% fails the
soak naming it; an evaluation's peak where the window opens or ends passes
and is reported as the peak; a process with no samples in the window's
last third fails it naming the process; a named LeakSanitizer log does too, and
so does an actor the run had to kill at its stop (its leak check never
ran); the chart has one line a process and the window shaded."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(TOP, "tools", "soak_summary.py")


def soak(directory, learner_growth, run_log="stopped\n", peaks=()):
    """10 minutes sampled every 10 s, the window from minute 4: the learner
    at 1,000 MiB until minute 7, then at 1,000 x (1 + growth) (memory kept:
    the least in the window's last third is higher); 90 MiB more during
    each (start, end) second range of `peaks` (an evaluation); two actors
    flat. run.log holds `run_log`."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "run.log"), "w") as f:
        f.write(run_log)
    with open(os.path.join(directory, "memory.csv"), "w") as f:
        f.write("t_s,pid,role,rss_mib\n")
        for t in range(0, 600, 10):
            learner = 1000.0 if t < 420 else 1000.0 * (1 + learner_growth)
            learner += sum(90.0 for lo, hi in peaks if lo <= t < hi)
            f.write(f"{t},10,learner,{learner}\n{t},11,actor 0,400\n{t},12,actor 1,410.5\n")
    return directory


def run(directory, *leaks):
    return subprocess.run([sys.executable, TOOL, directory, "240", "600", *leaks], capture_output=True, text=True)


class SoakSummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="soak_summary_")

    def test_growth_under_five_percent_passes_and_is_charted(self):
        done = run(soak(self.dir, 0.049))
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        with open(os.path.join(self.dir, "summary.txt")) as f:
            summary = f.read()
        self.assertRegex(summary, r"learner\s+1000\s+1000\s+1049\s+4\.9%\s+1049\n")
        self.assertRegex(summary, r"actor 1\s+410\s+410\s+410\s+0\.0%\s+410\n")
        self.assertTrue(summary.endswith("growth under 5% for every process, no leak reported\n"), summary)
        with open(os.path.join(self.dir, "memory.svg")) as f:
            svg = f.read()
        self.assertEqual(len(re.findall(r"<polyline ", svg)), 3)
        self.assertEqual(len(re.findall(r"<polyline [^>]*points=\"(?:[\d.]+,[\d.]+ ){59}[\d.]+,[\d.]+\"", svg)), 3)
        self.assertIn(">window</text>", svg)
        for role in ("learner", "actor 0", "actor 1"):
            self.assertIn(f">{role}</text>", svg)

    def test_five_percent_fails_naming_the_process(self):
        done = run(soak(self.dir, 0.05))
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("FAILED: learner grew 5.0% in the window", done.stdout)

    def test_an_evaluations_peak_where_the_window_opens_or_ends_is_no_growth(self):
        # An evaluation under way when the soak ends (the means of the
        # window's first and last minute read it as 9% grown), then one over
        # the window's opening too (as -8%).
        for peaks in ([(540, 600)], [(200, 320), (540, 600)]):
            done = run(soak(self.dir, 0.0, peaks=peaks))
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            self.assertRegex(done.stdout, r"learner\s+1000\s+1000\s+1000\s+0\.0%\s+1090\n")

    def test_a_process_gone_before_the_window_ends_fails_naming_it(self):
        soak(self.dir, 0.0)
        path = os.path.join(self.dir, "memory.csv")
        with open(path) as f:
            kept = [line for line in f if not (line.startswith(tuple(f"{t}," for t in range(400, 600, 10)))
                                               and ",actor 1," in line)]
        with open(path, "w") as f:
            f.writelines(kept)
        done = run(self.dir)
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("FAILED: actor 1: no samples in the first minute or a third of the window", done.stdout)

    def test_a_leak_report_fails(self):
        done = run(soak(self.dir, 0.0), "/runs/x/logs/actor-0.log")
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("FAILED: LeakSanitizer reported leaks in /runs/x/logs/actor-0.log", done.stdout)

    def test_an_actor_killed_at_the_stop_fails(self):
        done = run(soak(self.dir, 0.0, "stopping\nactor 1 still running 60 s after its stop signal; killed\n"))
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertIn("FAILED: actor 1 still running 60 s after its stop signal; killed", done.stdout)


if __name__ == "__main__":
    unittest.main()
