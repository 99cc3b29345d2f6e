"""Shared fixtures of the Python tests (run by ctest: python/CMakeLists.txt
sets PYTHONPATH to the build tree's package and names the C++ helper)."""
import os
import subprocess

import pytest


@pytest.fixture(scope="session")
def helper():
    """Runs troupe_python_test_helper (python/tests/test_helper.cc) with string arguments."""
    path = os.environ.get("TROUPE_PYTHON_TEST_HELPER")
    if not path or not os.path.exists(path):
        pytest.fail("TROUPE_PYTHON_TEST_HELPER is not set (run through ctest: ctest -L python)")

    def run(*args):
        done = subprocess.run([path, *map(str, args)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    return run
