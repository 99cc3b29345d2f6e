#!/usr/bin/env python3
"""After ctest (tools/test.sh runs it): the skipped cases by label, each with
its reason, a count per label, and the checks that nothing skipped that must
run here and that the fast tier stayed fast, all from the last run's log.

  tools/test_report.py BUILD_DIR [--tests-json FILE] [--pypi probe|answers|silent]
                       [--installed PKG,...]

It reads BUILD_DIR/Testing/Temporary/LastTest.log (each case's output, time
and result; a GoogleTest case skipped by GTEST_SKIP, its message, is "Skip
regular expression found"; a script that exits with its SKIP_RETURN_CODE
reads "Test Passed." there, so ctest's LastTestsDisabled.log of the same run
says which did, and the script's "skipped: ..." line why), and the cases'
labels from `ctest --show-only=json-v1` (and a fast case over its bound
run again alone, `ctest -I`), asked in a scratch folder that
includes BUILD_DIR, so that the listing leaves BUILD_DIR's LastTest.log alone
(--tests-json: that listing from a file instead). The rules are the tables
below. --pypi answers|silent says whether PyPI answers instead of asking it
(probe, the default, asks only when a skip's verdict depends on it);
--installed names the Debian packages that are installed instead of asking
dpkg-query (an empty value: none). Exit 0 when every rule holds (or no test
ran), 1 naming each violation, 2 when there is no log of the last run to read
(none, or one written over during the run) or ctest cannot list the tests.
"""
import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request

# ---------------------------------------------------------------- the rules
# Labels whose cases fetch what they need from PyPI (plugins, venvs,
# reference packages): wherever PyPI answers they must run. While it answers,
# a case under one of them may skip only for a reason that one of its
# label's patterns matches (re.search): something this machine lacks that
# PyPI cannot give. Any other reason (a fetch that failed, or a reason
# nobody has judged yet) fails the run; a new reason of the first kind gets a
# pattern here. When PyPI does not answer, these skips are listed, not
# required.
NOT_FROM_PYPI = (
    r"needs root",                        # debootstrap, chroot, mounts
    r"apt-get install python3-venv",      # a Debian package, not PyPI's
)
MUST_RUN_WHILE_PYPI_ANSWERS = {
    "pjrt": NOT_FROM_PYPI + (
        r"the plugin has one device",     # a multi-device case on the CPU plugin
        r"needs a PJRT plugin with \d+ or more devices",
        r"this plugin cannot serialize programs",
        r"built without the PJRT backend",
        r"this build has no CUDA backend",  # the lease rehearsal's bundle needs one
    ),
    "tensorboard": NOT_FROM_PYPI,
    "parity": NOT_FROM_PYPI,
    "python": NOT_FROM_PYPI,
}
# Cases (by name prefix) that must run wherever a Debian package is
# installed (dpkg -s); where it is not, their skips are listed naming it.
MUST_RUN_WITH_PACKAGE = {
    "GanReferenceTest.": "libtorch-dev",  # bench/gan_reference_test.cc
}
# The fast tier (`ctest -L fast`): in this run every case labelled fast took
# at most case_seconds and all of them together at most total_seconds. Checked
# when the run ran every fast case (tools/test.sh, or with `-L fast`) of a
# Release build; cmake/SlowTests.cmake lists the cases kept out of it. A case
# over case_seconds is run again alone (ctest -I, at most alone_timeout): it
# is a violation only if it is over the bound alone too.
FAST_TIER = {"label": "fast", "case_seconds": 3.0, "total_seconds": 120.0, "alone_timeout": 60.0}
# Whether PyPI answers: pip (its own index settings) downloads one small
# wheel, within the timeout.
PYPI_PROBE = ("six==1.16.0", 60)
# ---------------------------------------------------------------------------

SEPARATOR = "-" * 58
REASON_WIDTH = 180


class Case:
    def __init__(self, name):
        self.name = name
        self.output = []
        self.seconds = 0.0
        self.result = None  # passed, failed, skipped (a skip regular expression matched)
        self.reason = ""    # ctest's pass/fail reason line


def read_log(path):
    """{name: Case} of each case in ctest's LastTest.log (the last attempt of a repeated one)."""
    cases = {}
    case = None
    state = None
    with open(path, errors="replace") as f:
        lines = f.read().split("\n")
    finished = any(line.startswith("End testing:") for line in lines)
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if state == "output":
            if line == "<end of output>":
                state = "after"
            else:
                case.output.append(line)
            continue
        m = re.match(r"^\d+/\d+ Test: (.+)$", line)
        if m:
            case = cases[m.group(1)] = Case(m.group(1))
            state = "header"
            continue
        if case is None:
            continue
        if state == "header" and line == "Output:" and i < len(lines) and lines[i] == SEPARATOR:
            i += 1
            state = "output"
        elif (m := re.match(r"^Test time = +([0-9.]+) sec", line)):
            case.seconds = float(m.group(1))
        elif line == "Test Passed.":
            case.result = "passed"
        elif line == "Test Failed.":
            case.result = "failed"
        elif line in ("Test Pass Reason:", "Test Fail Reason:") and i < len(lines):
            case.reason = lines[i]
            i += 1
            if line == "Test Fail Reason:":
                case.result = "failed"
            elif case.reason.startswith("Skip regular expression found"):
                case.result = "skipped"
            else:
                case.result = "passed"
    for case in cases.values():
        if case.result is None:  # never started (a failed fixture, a missing program): ctest failed it
            case.result = "failed"
    return cases, finished


def read_skip_list(temporary, log_path, cases):
    """The names ctest's LastTestsDisabled.log of this run lists (skipped or disabled), or None where
    there is none of this run: ctest writes it, a moment before LastTest.log, only when something skipped."""
    path = os.path.join(temporary, "LastTestsDisabled.log")
    if not os.path.exists(path) or abs(os.path.getmtime(path) - os.path.getmtime(log_path)) > 10:
        return None
    with open(path, errors="replace") as f:
        names = {line.split(":", 1)[1].strip() for line in f if ":" in line}
    if any(case.result == "skipped" and name not in names for name, case in cases.items()):
        return None  # another run's list
    return names


def gtest_reason(output):
    """GTEST_SKIP's message: the lines after "FILE:LINE: Skipped" up to "[  SKIPPED ]"."""
    for k, line in enumerate(output):
        m = re.match(r"^(.*):(\d+): Skipped$", line)
        if not m:
            continue
        message = []
        for following in output[k + 1:]:
            if following.startswith("[  SKIPPED ]"):
                break
            if following.strip():
                message.append(following.strip())
        where = f"{os.path.basename(m.group(1))}:{m.group(2)}"
        return " ".join(message) if message else f"GTEST_SKIP() with no message at {where}"
    return "skipped (no GTEST_SKIP message in its output)"


SCRIPT_SKIP = re.compile(r"^(?:[\w.-]+: )?(?:skipped|SKIPPED): (.+)$")
# Without ctest's list (a log copied away from its folder): a script's skip
# line as it begins, case-sensitive (a passing script may report a part
# skipped: "GAN: skipped: ...").
SCRIPT_SKIP_STRICT = re.compile(r"^(?:skipped: |[\w.-]+: SKIPPED: )")


def script_reason(output):
    """A script's last "skipped: WHY" line (or "NAME: SKIPPED: WHY"), else its last line."""
    for line in reversed(output):
        m = SCRIPT_SKIP.match(line.strip())
        if m:
            return m.group(1).strip()
    last = next((line.strip() for line in reversed(output) if line.strip()), "")
    return f"no 'skipped:' line in its output{': last line: ' + last if last else ''}"


def one_line(text):
    return text if len(text) <= REASON_WIDTH else text[:REASON_WIDTH - 3] + "..."


class ScratchCtest:
    """ctest run in a scratch folder that includes BUILD_DIR: ctest writes
    Testing/Temporary/LastTest.log in the folder it is given, so BUILD_DIR's
    log of the run being reported stays as it was."""

    def __init__(self, build_dir):
        self.dir = tempfile.mkdtemp(prefix="test_report_")
        with open(os.path.join(self.dir, "CTestTestfile.cmake"), "w") as f:
            f.write(f"subdirs([==[{os.path.abspath(build_dir)}]==])\n")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, *args, timeout):
        """ctest's output; on TimeoutExpired, ctest and the test it started are killed."""
        with subprocess.Popen(["ctest", "--test-dir", self.dir, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True) as ctest:
            try:
                return ctest.communicate(timeout=timeout)[0]
            except subprocess.TimeoutExpired:
                os.killpg(ctest.pid, signal.SIGKILL)
                ctest.communicate()
                raise


def registered_tests(build_dir, tests_json):
    """{name: {"labels": [...], "skip_return_code": int or None, "index": ctest's number}} of the tests
    BUILD_DIR registers."""
    if tests_json:
        with open(tests_json) as f:
            listing = json.load(f)
    else:
        with ScratchCtest(build_dir) as ctest:
            listing = json.loads(ctest.run("--show-only=json-v1", timeout=120))
    tests = {}
    for index, test in enumerate(listing.get("tests", []), 1):
        properties = {p["name"]: p["value"] for p in test.get("properties", [])}
        tests[test["name"]] = {"labels": list(properties.get("LABELS", [])),
                               "skip_return_code": properties.get("SKIP_RETURN_CODE"), "index": index}
    return tests


def seconds_alone(build_dir, index, timeout):
    """The time ctest gives test number INDEX run by itself (nothing else running in this process's
    ctest), or None with why it has none."""
    with ScratchCtest(build_dir) as ctest:
        try:
            out = ctest.run("-I", f"{index},{index}", timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"did not end within {timeout:g} s"
    # "1/1 Test #277: Suite.Case ....   Passed    0.05 sec"
    match = re.search(r"Test +#\d+: .*?(Passed|Failed|Not Run|Exception|Timeout)\s+([\d.]+) sec", out)
    if not match:
        return None, "ctest printed no time for it"
    if match.group(1) != "Passed":
        return None, f"it did not pass alone ({match.group(1)})"
    return float(match.group(2)), ""


def pypi_answers():
    """(answers, how): pip downloads PYPI_PROBE's wheel into a scratch folder within the timeout (where this
    Python has no pip, the index's page of the package is fetched: PIP_INDEX_URL, else PyPI's)."""
    requirement, timeout = PYPI_PROBE
    if importlib.util.find_spec("pip") is None:
        index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
        url = f"{index}/{requirement.split('==')[0]}/"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as page:
                page.read(1)
            return True, f"GET {url}"
        except (OSError, ValueError) as e:
            return False, f"GET {url}: {e}"
    scratch = tempfile.mkdtemp(prefix="test_report_pypi_")
    how = f"pip download {requirement}"
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "--quiet", "-d", scratch, requirement],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode == 0:
            return True, how
        return False, f"{how}: {one_line(' '.join((done.stderr or done.stdout).split()[-12:]))}"
    except subprocess.TimeoutExpired:
        return False, f"{how}: no answer in {timeout} s"
    except OSError as e:
        return False, f"{how}: {e}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def package_installed(package, installed):
    if installed is not None:
        return package in installed
    try:
        done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip().endswith(" installed")


def build_type(build_dir):
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.exists(cache):
        return None
    with open(cache, errors="replace") as f:
        m = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", f.read(), flags=re.M)
    return m.group(1).strip() if m else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--tests-json", help="ctest --show-only=json-v1's listing, instead of asking ctest")
    parser.add_argument("--pypi", choices=("probe", "answers", "silent"), default="probe")
    parser.add_argument("--installed", help="the installed Debian packages, comma-separated, instead of dpkg")
    args = parser.parse_args()
    installed = None if args.installed is None else {p for p in args.installed.split(",") if p}

    temporary = os.path.join(args.build_dir, "Testing", "Temporary")
    log_path = os.path.join(temporary, "LastTest.log")
    if not os.path.exists(log_path):
        print(f"test report: no {log_path} (no ctest run has finished in {args.build_dir})")
        return 2
    cost = os.path.join(temporary, "CTestCostData.txt")
    if os.path.exists(cost) and os.path.getmtime(cost) > os.path.getmtime(log_path) + 5:
        # ctest writes both as a run ends; a `ctest -N` in BUILD_DIR during the run writes its empty log over it.
        print(f"test report: {log_path} is older than the last run's {os.path.basename(cost)}: something wrote "
              "over the log during the run (a test that ran ctest in the build folder?); nothing to report from")
        return 2
    cases, finished = read_log(log_path)  # before anything runs ctest
    if not cases:
        print(f"test report: no test ran ({log_path})")
        return 0
    try:
        tests = registered_tests(args.build_dir, args.tests_json)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        print(f"test report: cannot list {args.build_dir}'s tests and their labels (ctest --show-only=json-v1): {e}")
        return 2
    skip_list = read_skip_list(temporary, log_path, cases)

    # Which cases skipped, and why.
    reasons = {}
    for name, case in cases.items():
        if case.result == "skipped":
            reasons[name] = gtest_reason(case.output)
        elif case.result == "passed" and (tests.get(name, {}).get("skip_return_code") is not None):
            if skip_list is not None:
                skipped = name in skip_list
            else:
                skipped = any(SCRIPT_SKIP_STRICT.match(line.strip()) for line in case.output)
            if skipped:
                case.result = "skipped"
                reasons[name] = script_reason(case.output)
        elif skip_list is not None and name in skip_list and case.result == "passed":
            case.result = "skipped"  # a disabled test
            reasons[name] = "not run (ctest lists it in LastTestsDisabled.log)"

    def labels(name):
        return tests[name]["labels"] if name in tests else []

    # The table: per label, the cases this run ran, skipped and failed, and their seconds.
    rows = {}
    for name, case in cases.items():
        for label in labels(name) or ["(no label)"]:
            row = rows.setdefault(label, [0, 0, 0, 0.0])
            row[0] += 1
            row[1] += case.result == "skipped"
            row[2] += case.result == "failed"
            row[3] += case.seconds
    print()
    print(f"Test report ({log_path}): {len(cases)} cases, {len(reasons)} skipped, "
          f"{sum(c.result == 'failed' for c in cases.values())} failed")
    print(f"  {'label':<14} {'cases':>6} {'skipped':>8} {'failed':>7} {'seconds':>9}")
    for label in sorted(rows, key=lambda l: (l == "(no label)", l)):
        ran, skipped, failed, seconds = rows[label]
        print(f"  {label:<14} {ran:>6} {skipped:>8} {failed:>7} {seconds:>9.1f}")

    # The skipped cases, by their labels, the cases of one reason together.
    if reasons:
        print("Skipped, by label:")
        groups = {}
        for name, reason in reasons.items():
            groups.setdefault("+".join(sorted(labels(name))) or "(no label)", {}).setdefault(reason, []).append(name)
        for group in sorted(groups):
            by_reason = groups[group]
            print(f"  {group} ({sum(len(v) for v in by_reason.values())}):")
            for reason in sorted(by_reason):
                print(f"    {one_line(reason)}")
                for name in sorted(by_reason[reason]):
                    print(f"      {name}")

    violations = []
    notes = []
    if not finished:
        notes.append(f"{log_path} does not end with ctest's 'End testing' line: the run was cut short, or "
                     "another ctest wrote over the log")

    # Must-run labels while PyPI answers.
    undecided = []
    for name in sorted(reasons):
        must = [l for l in labels(name) if l in MUST_RUN_WHILE_PYPI_ANSWERS]
        if not must:
            continue
        allowed = any(re.search(p, reasons[name]) for l in must for p in MUST_RUN_WHILE_PYPI_ANSWERS[l])
        if not allowed:
            undecided.append((name, must))
    if undecided:
        if args.pypi == "probe":
            answers, how = pypi_answers()
        else:
            answers, how = args.pypi == "answers", f"--pypi {args.pypi}"
        if answers:
            for name, must in undecided:
                violations.append(f"{name} ({', '.join(must)}) skipped while PyPI answers ({how}): "
                                  f"{one_line(reasons[name])} [if that names something PyPI cannot give, add a "
                                  "pattern to MUST_RUN_WHILE_PYPI_ANSWERS in tools/test_report.py]")
        else:
            notes.append(f"PyPI does not answer ({how}): the {len(undecided)} skipped "
                         f"{'/'.join(sorted(MUST_RUN_WHILE_PYPI_ANSWERS))} cases above are not required here")

    # Cases that must run wherever their package is installed.
    for prefix, package in MUST_RUN_WITH_PACKAGE.items():
        skipped = sorted(n for n in reasons if n.startswith(prefix))
        ran = [n for n in cases if n.startswith(prefix)]
        if not ran:
            continue
        if package_installed(package, installed):
            for name in skipped:
                violations.append(f"{name} skipped though {package} is installed: {one_line(reasons[name])}")
        elif skipped:
            notes.append(f"{prefix}*: {len(skipped)} of {len(ran)} skipped: {package} is not installed "
                         f"(apt-get install {package} to run them)")

    # The fast tier, from this run's times.
    tier = FAST_TIER["label"]
    fast = [n for n, t in tests.items() if tier in t["labels"]]
    ran_fast = [n for n in fast if n in cases]
    kind = build_type(args.build_dir)
    if not fast:
        notes.append(f"fast tier: no test is labelled {tier}")
    elif kind not in (None, "Release"):
        notes.append(f"fast tier: not checked (a {kind} build; the bounds are for Release)")
    elif len(ran_fast) < len(fast):
        notes.append(f"fast tier: not checked (this run ran {len(ran_fast)} of its {len(fast)} cases; "
                     f"a run of them all checks it: tools/test.sh, or with -L {tier})")
    else:
        times = sorted(((cases[n].seconds, n) for n in ran_fast), reverse=True)
        total = sum(t for t, _ in times)
        bound, total_bound = FAST_TIER["case_seconds"], FAST_TIER["total_seconds"]
        for seconds, name in times:
            if seconds <= bound:
                continue
            # Over the bound in a run of two at a time beside tests that build, train or start processes:
            # the case's own time, or a busy machine's? Run alone, the case answers.
            alone, why = seconds_alone(args.build_dir, tests[name]["index"], timeout=FAST_TIER["alone_timeout"])
            if alone is not None and alone <= bound:
                notes.append(f"fast tier: {name} took {seconds:.2f} s in this run and {alone:.2f} s alone: "
                             "the machine was busy, not the case")
                continue
            alone_text = f"{alone:.2f} s alone" if alone is not None else f"no time alone: {why}"
            violations.append(f"fast tier: {name} took {seconds:.2f} s, over {bound:g} s ({alone_text}): list it "
                              "in cmake/SlowTests.cmake or make it faster")
        if total > total_bound:
            violations.append(f"fast tier: its {len(times)} cases took {total:.1f} s in all, over {total_bound:g} s")
        notes.append(f"fast tier: {len(times)} cases, {total:.1f} s in all (bound {total_bound:g} s), the slowest "
                     f"{times[0][1]} {times[0][0]:.2f} s (bound {bound:g} s)")

    for note in notes:
        print(note)
    if violations:
        print(f"test report: {len(violations)} violation{'s' if len(violations) > 1 else ''}:")
        for violation in violations:
            print(f"  {violation}")
    # The run's counts as the last line, in the plain form CI reads.
    failed = sum(1 for c in cases.values() if c.result == "failed")
    print(f"tests: {len(cases) - len(reasons) - failed} passed, {failed} failed, {len(reasons)} skipped")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
