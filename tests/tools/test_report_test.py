"""tools/test_report.py on ctest logs written here: a case of a must-run label
skipped for a failed fetch fails the report while PyPI answers (named) and
not while it is silent; an allowed reason passes and is listed; a script's
exit-77 skip is found through ctest's skip list, a passing script's partial
"skipped:" line is not a skip; GanReferenceTest must run where libtorch-dev
is installed; the fast tier fails on a slow case (slow alone too: one slow
only beside others is a busy machine) and a long total, and is checked only
on a run of all its cases in a Release build; a log written over during the
run is an error. PyPI and dpkg are never asked (--pypi, --installed); two
cases ask the real ctest (for the labels; for a case's time alone) and leave
the build folder's LastTest.log as it was."""
import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "test_report.py")
_spec = importlib.util.spec_from_file_location("test_report", TOOL)
REPORT = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(REPORT)
SEPARATOR = "-" * 58


def gtest_output(name, skip_message=None):
    lines = ["Running main() from gtest_main.cc", f"Note: Google Test filter = {name}", f"[ RUN      ] {name}"]
    if skip_message is None:
        return lines + [f"[       OK ] {name} (1 ms)", "[  PASSED  ] 1 test."]
    return lines + ["/src/engine/pjrt/pjrt_test.cc:51: Skipped", *skip_message.split("\n"), "",
                    f"[  SKIPPED ] {name} (0 ms)", "[  PASSED  ] 0 tests.", "[  SKIPPED ] 1 test, listed below:",
                    f"[  SKIPPED ] {name}"]


class Run:
    """A build folder with a LastTest.log (and LastTestsDisabled.log) as ctest writes them, and a listing."""

    def __init__(self, top, build_type="Release"):
        self.dir = os.path.join(top, "build")
        self.temporary = os.path.join(self.dir, "Testing", "Temporary")
        os.makedirs(self.temporary)
        with open(os.path.join(self.dir, "CMakeCache.txt"), "w") as f:
            f.write(f"CMAKE_BUILD_TYPE:STRING={build_type}\n")
        self.entries = []
        self.tests = []
        self.skipped = []

    def case(self, name, labels=(), seconds=0.1, result="passed", output=(), skip_return_code=None):
        """result: passed, failed, regex_skip (GTEST_SKIP) or code_skip (exit SKIP_RETURN_CODE)."""
        properties = [{"name": "LABELS", "value": list(labels)}] if labels else []
        if skip_return_code is not None:
            properties.append({"name": "SKIP_RETURN_CODE", "value": skip_return_code})
        self.tests.append({"name": name, "command": ["x"], "properties": properties})
        self.entries.append((name, seconds, result, list(output)))
        if result in ("regex_skip", "code_skip"):
            self.skipped.append((len(self.entries), name))

    def listed_only(self, name, labels=()):
        """A test the build registers that this run did not run."""
        self.tests.append({"name": name, "command": ["x"],
                           "properties": [{"name": "LABELS", "value": list(labels)}] if labels else []})

    def write(self, skip_list=True):
        total = len(self.entries)
        log = ["Start testing: Nov 28 22:24 UTC", SEPARATOR]
        for index, (name, seconds, result, output) in enumerate(self.entries, 1):
            log += [f"{index}/{total} Testing: {name}", f"{index}/{total} Test: {name}", 'Command: "x"',
                    "Directory: /src", f'"{name}" start time: Nov 28 22:24 UTC', "Output:", SEPARATOR, *output,
                    "<end of output>", f"Test time = {seconds:6.2f} sec", SEPARATOR]
            if result == "regex_skip":
                log += ["Test Pass Reason:", "Skip regular expression found in output. Regex=[\\[  SKIPPED \\]]"]
            elif result == "failed":
                log += ["Test Failed."]
            else:
                log += ["Test Passed."]
            log += [f'"{name}" end time: Nov 28 22:24 UTC', f'"{name}" time elapsed: 00:00:00', SEPARATOR, ""]
        log += ["End testing: Nov 28 22:44 UTC", ""]
        if skip_list and self.skipped:
            with open(os.path.join(self.temporary, "LastTestsDisabled.log"), "w") as f:
                f.write("".join(f"{index}:{name}\n" for index, name in self.skipped))
        with open(os.path.join(self.temporary, "LastTest.log"), "w") as f:
            f.write("\n".join(log))
        with open(os.path.join(self.dir, "tests.json"), "w") as f:
            json.dump({"kind": "ctestInfo", "version": {"major": 1, "minor": 0}, "tests": self.tests}, f)

    def report(self, *extra, pypi="answers", installed=""):
        """The report's exit status and output (in this process: the test stays quick)."""
        argv = [TOOL, self.dir, "--tests-json", os.path.join(self.dir, "tests.json"), "--pypi", pypi,
                "--installed", installed, *extra]
        out = io.StringIO()
        with mock.patch.object(sys, "argv", argv), contextlib.redirect_stdout(out):
            code = REPORT.main()
        return code, out.getvalue()


class TestReportTest(unittest.TestCase):
    def setUp(self):
        self.top = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.top)

    def test_a_fetch_skip_under_pjrt_fails_while_pypi_answers_and_is_listed_while_it_is_silent(self):
        run = Run(self.top)
        name = "Pjrt.PjrtTest.AddsOnThePlugin"
        run.case(name, ["pjrt"], result="regex_skip",
                 output=gtest_output(name, "no PJRT plugin at TROUPE_PJRT_PLUGIN (tools/pjrt_cpu_plugin.sh)"))
        run.case("A.b", ["fast"])
        run.write()
        code, out = run.report(pypi="answers")
        self.assertEqual(code, 1, out)
        self.assertIn(f"{name} (pjrt) skipped while PyPI answers", out)
        self.assertIn("no PJRT plugin at TROUPE_PJRT_PLUGIN", out)
        code, out = run.report(pypi="silent")
        self.assertEqual(code, 0, out)
        self.assertIn("PyPI does not answer", out)
        self.assertIn(f"  pjrt (1):\n    no PJRT plugin at TROUPE_PJRT_PLUGIN (tools/pjrt_cpu_plugin.sh)\n      {name}",
                      out)

    def test_an_allowed_reason_passes_and_is_listed(self):
        run = Run(self.top)
        name = "Pjrt.PjrtTest.AGroupOfTwoDevices"
        run.case(name, ["pjrt"], result="regex_skip",
                 output=gtest_output(name, "the plugin has one device: a group needs two"))
        run.case("Bundle.TheLease", ["bundle", "pjrt"], result="code_skip", skip_return_code=77,
                 output=["skipped: needs root (debootstrap, chroot, bind mounts)"])
        run.write()
        code, out = run.report(pypi="answers")
        self.assertEqual(code, 0, out)
        self.assertIn("the plugin has one device: a group needs two\n      " + name, out)
        self.assertIn("  bundle+pjrt (1):\n    needs root (debootstrap, chroot, bind mounts)\n      Bundle.TheLease",
                      out)
        self.assertNotIn("violation", out)

    def test_a_scripts_skip_is_read_from_ctests_list_and_its_skipped_line(self):
        run = Run(self.top)
        run.case("TensorBoard.ReadsRlAndGanRuns", ["tensorboard"], seconds=4.0, result="code_skip",
                 skip_return_code=77, output=["installing tensorboard", "skipped: cannot install tensorboard==2.18.0: "
                                              "pip: Read timed out", "pip's last lines"])
        run.case("Parity.DmControlSameStates", ["parity"], result="code_skip", skip_return_code=77,
                 output=["dm_control_parity: SKIPPED: dm_control==1.0.28 did not install"])
        run.write()
        code, out = run.report(pypi="answers")
        self.assertEqual(code, 1, out)
        self.assertIn("TensorBoard.ReadsRlAndGanRuns (tensorboard) skipped while PyPI answers (--pypi answers): "
                      "cannot install tensorboard==2.18.0: pip: Read timed out", out)
        self.assertIn("Parity.DmControlSameStates (parity) skipped while PyPI answers (--pypi answers): "
                      "dm_control==1.0.28 did not install", out)

    def test_a_passing_script_that_reports_a_part_skipped_is_not_a_skip(self):
        run = Run(self.top)
        run.case("TensorBoard.ReadsRlAndGanRuns", ["tensorboard"], skip_return_code=77,
                 output=["RL: 12 scalars agree", "GAN: skipped: no Fashion-MNIST at /usr/share"])
        run.case("Py.skip", ["python"], result="code_skip", skip_return_code=77, output=["skipped: needs root"])
        run.write()
        code, out = run.report(pypi="answers")
        self.assertEqual(code, 0, out)
        self.assertNotIn("TensorBoard.ReadsRlAndGanRuns", out)
        self.assertIn("Py.skip", out)
        # Without ctest's skip list (a log copied alone), a script's skip is its first "skipped: " line.
        os.remove(os.path.join(run.temporary, "LastTestsDisabled.log"))
        code, out = run.report(pypi="answers")
        self.assertEqual(code, 0, out)
        self.assertNotIn("TensorBoard.ReadsRlAndGanRuns", out)
        self.assertIn("needs root\n      Py.skip", out)

    def test_another_runs_skip_list_is_not_read(self):
        run = Run(self.top)
        run.case("Python.gymnasium", ["python"], skip_return_code=77, output=["12 passed"])
        run.write()
        stale = os.path.join(run.temporary, "LastTestsDisabled.log")
        with open(stale, "w") as f:
            f.write("1:Python.gymnasium\n")
        an_hour_ago = time.time() - 3600
        os.utime(stale, (an_hour_ago, an_hour_ago))
        code, out = run.report(pypi="answers")
        self.assertEqual(code, 0, out)
        self.assertIn(" 0 skipped", out)

    def test_gan_reference_must_run_where_libtorch_dev_is_installed(self):
        run = Run(self.top)
        reason = "libtorch-dev is not installed (/usr/include/torch/torch.h missing)"
        for case in ("GanReferenceTest.LossesMatch", "GanReferenceTest.EmaSamplesMatch"):
            run.case(case, ["fast"], result="regex_skip", output=gtest_output(case, reason))
        run.write()
        code, out = run.report(installed="libtorch-dev,cmake")
        self.assertEqual(code, 1, out)
        self.assertIn("GanReferenceTest.EmaSamplesMatch skipped though libtorch-dev is installed", out)
        self.assertIn("GanReferenceTest.LossesMatch skipped though libtorch-dev is installed", out)
        code, out = run.report(installed="")
        self.assertEqual(code, 0, out)
        self.assertIn("GanReferenceTest.*: 2 of 2 skipped: libtorch-dev is not installed", out)

    def test_the_fast_tier_fails_naming_a_slow_case_and_a_long_total(self):
        run = Run(self.top)
        run.case("A.quick", ["fast"], seconds=0.5)
        run.case("A.slow", ["fast", "strict_device"], seconds=3.5)
        run.case("E2e.long", [], seconds=400.0)
        run.write()
        asked = []
        def alone(build_dir, index, timeout):
            asked.append(index)
            return 3.2, ""
        with mock.patch.object(REPORT, "seconds_alone", alone):
            code, out = run.report()
        self.assertEqual(code, 1, out)
        self.assertIn("fast tier: A.slow took 3.50 s, over 3 s (3.20 s alone)", out)
        self.assertNotIn("A.quick took", out)
        self.assertEqual(asked, [2])  # ctest's number of A.slow, and only it

        with mock.patch.object(REPORT, "seconds_alone", lambda *a, **k: (None, "did not end within 60 s")):
            code, out = run.report()
        self.assertEqual(code, 1, out)
        self.assertIn("A.slow took 3.50 s, over 3 s (no time alone: did not end within 60 s)", out)

        run = Run(os.path.join(self.top, "total"))
        for i in range(50):
            run.case(f"A.case{i}", ["fast"], seconds=2.5)  # 125 s
        run.write()
        code, out = run.report()
        self.assertEqual(code, 1, out)
        self.assertIn("fast tier: its 50 cases took 125.0 s in all, over 120 s", out)

    def test_a_case_slow_only_beside_others_is_a_busy_machine_not_a_violation(self):
        run = Run(self.top)
        run.case("A.quick", ["fast"], seconds=0.5)
        run.case("A.stalled", ["fast"], seconds=3.31)
        run.write()
        with mock.patch.object(REPORT, "seconds_alone", lambda *a, **k: (0.05, "")):
            code, out = run.report()
        self.assertEqual(code, 0, out)
        self.assertIn("fast tier: A.stalled took 3.31 s in this run and 0.05 s alone: the machine was busy", out)

    def test_the_fast_tier_is_checked_on_a_run_of_all_its_cases_in_a_release_build(self):
        run = Run(self.top)
        run.case("A.quick", ["fast"], seconds=0.5)
        run.write()
        code, out = run.report()
        self.assertEqual(code, 0, out)
        self.assertIn("fast tier: 1 cases, 0.5 s in all", out)

        run = Run(os.path.join(self.top, "partial"))  # `-R A.slow`: one of two fast cases
        run.case("A.slow", ["fast"], seconds=9.0)
        run.listed_only("A.quick", ["fast"])
        run.write()
        code, out = run.report()
        self.assertEqual(code, 0, out)
        self.assertIn("fast tier: not checked (this run ran 1 of its 2 cases", out)

        run = Run(os.path.join(self.top, "debug"), build_type="Debug")
        run.case("A.slow", ["fast"], seconds=9.0)
        run.write()
        code, out = run.report()
        self.assertEqual(code, 0, out)
        self.assertIn("fast tier: not checked (a Debug build", out)

    def test_a_failed_case_is_counted_and_no_log_is_an_error(self):
        run = Run(self.top)
        run.case("A.broken", ["fast"], result="failed", output=["[  FAILED  ] A.broken"])
        run.write()
        code, out = run.report()
        self.assertEqual(code, 0, out)  # ctest's exit status carries failures
        self.assertIn("1 cases, 0 skipped, 1 failed", out)
        os.remove(os.path.join(run.temporary, "LastTest.log"))
        code, out = run.report()
        self.assertEqual(code, 2, out)

    def test_a_log_written_over_during_the_run_is_an_error(self):
        run = Run(self.top)
        run.case("A.quick", ["fast"])
        run.write()
        with open(os.path.join(run.temporary, "CTestCostData.txt"), "w") as f:
            f.write("A.quick 1 0.1\n---\n")
        a_minute_ago = time.time() - 60  # the log: an empty one a `ctest -N` wrote before the run ended
        os.utime(os.path.join(run.temporary, "LastTest.log"), (a_minute_ago, a_minute_ago))
        code, out = run.report()
        self.assertEqual(code, 2, out)
        self.assertIn("something wrote over the log during the run", out)

    def test_ctests_listing_leaves_the_build_folders_log_alone(self):
        if shutil.which("ctest") is None:
            self.skipTest("no ctest")
        run = Run(self.top)
        name = "Pjrt.Fetchless"
        run.case(name, ["pjrt"], result="regex_skip", output=gtest_output(name, "no PJRT plugin at TROUPE_PJRT_PLUGIN"))
        run.write()
        with open(os.path.join(run.dir, "CTestTestfile.cmake"), "w") as f:
            f.write(f'add_test({name} "/bin/true")\nset_tests_properties({name} PROPERTIES LABELS "pjrt")\n')
        log = os.path.join(run.temporary, "LastTest.log")
        with open(log) as f:
            before = f.read()
        result = subprocess.run([sys.executable, TOOL, run.dir, "--pypi", "answers", "--installed", ""],
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn(f"{name} (pjrt) skipped while PyPI answers", result.stdout)
        with open(log) as f:
            self.assertEqual(f.read(), before)

    def test_a_case_alone_is_timed_by_ctest_leaving_the_build_folders_log_alone(self):
        if shutil.which("ctest") is None:
            self.skipTest("no ctest")
        run = Run(self.top)
        run.case("A.sleeps", ["fast"])
        run.write()
        with open(os.path.join(run.dir, "CTestTestfile.cmake"), "w") as f:
            f.write('add_test(A.sleeps "/bin/sleep" "0.3")\nadd_test(A.fails "/bin/false")\n'
                    'add_test(A.hangs "/bin/sleep" "30")\n')
        log = os.path.join(run.temporary, "LastTest.log")
        with open(log) as f:
            before = f.read()
        seconds, why = REPORT.seconds_alone(run.dir, 1, timeout=20)
        self.assertEqual(why, "")
        self.assertGreaterEqual(seconds, 0.25)
        self.assertLess(seconds, 5)
        self.assertEqual(REPORT.seconds_alone(run.dir, 2, timeout=20), (None, "it did not pass alone (Failed)"))
        self.assertEqual(REPORT.seconds_alone(run.dir, 3, timeout=1), (None, "did not end within 1 s"))
        with open(log) as f:
            self.assertEqual(f.read(), before)


if __name__ == "__main__":
    unittest.main()
