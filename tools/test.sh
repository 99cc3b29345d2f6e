#!/usr/bin/env bash
# Builds everything and runs every test. Installs missing Debian packages first.
#   tools/test.sh            Release build (-O3 -march=native), all tests
#   tools/test.sh asan       Debug + AddressSanitizer/UBSan build, all tests
#   tools/test.sh debug      Debug build, all tests
# Extra arguments after the preset go to ctest (e.g. `-R Replay`).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${1:-release}
shift || true
"$top/tools/install_deps.sh"
cd "$top"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset" "$@"
