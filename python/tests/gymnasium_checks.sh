#!/usr/bin/env bash
# gymnasium's own checks on troupe's adapters (python/tests/test_gymnasium.py),
# in a virtual environment under the build tree that also sees Debian's numpy
# and pytest (--system-site-packages). gymnasium is a test dependency only.
# Exits 77 (ctest: skipped), saying why, when it cannot be installed (offline).
#   gymnasium_checks.sh PYTHON VENV_DIR TEST_FILE
set -euo pipefail
python=$1 venv=$2 tests=$3
requirement="gymnasium==1.4.0"
if [[ ! -f "$venv/.installed" || "$(cat "$venv/.installed")" != "$requirement" ]]; then
  if ! "$python" -m venv --system-site-packages "$venv" >/dev/null 2>&1; then
    echo "skipped: cannot make a virtual environment in $venv (apt-get install python3-venv)"
    exit 77
  fi
  if ! timeout 300 "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$requirement" 2>&1 | tail -3; then
    echo "skipped: cannot install $requirement from PyPI (offline?)"
    exit 77
  fi
  "$venv/bin/python" -c "import gymnasium" 2>/dev/null || { echo "skipped: $requirement did not install (offline?)"; exit 77; }
  echo "$requirement" >"$venv/.installed"
fi
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$tests"
