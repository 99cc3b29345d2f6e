"""The Python blocks of the README and of every page under docs/ run as
written (each in a fresh interpreter, from an empty folder, with the build
tree's package)."""
import glob
import os
import re
import subprocess
import sys

import pytest

TOP = os.path.join(os.path.dirname(__file__), "..", "..")
PAGES = [os.path.join(TOP, "README.md")] + sorted(glob.glob(os.path.join(TOP, "docs", "**", "*.md"), recursive=True))


def python_blocks():
    """(page, index in the page, block) of every ```python block."""
    blocks = []
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            found = re.findall(r"^```python\n(.*?)^```", f.read(), flags=re.S | re.M)
        blocks += [(os.path.relpath(page, TOP), i, block) for i, block in enumerate(found)]
    return blocks


def test_the_readme_and_the_python_page_have_python_blocks():
    pages = {page for page, _, _ in python_blocks()}
    assert "README.md" in pages
    assert os.path.join("docs", "python.md") in pages


@pytest.mark.parametrize("page,index,block", [pytest.param(*b, id=f"{b[0]}:{b[1]}") for b in python_blocks()])
def test_a_python_block_runs(page, index, block, tmp_path):
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{page}, python block {index}:\n{done.stderr}"
    assert done.stdout.strip(), f"{page}, python block {index}: each block prints what it shows"
