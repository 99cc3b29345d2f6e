#!/usr/bin/env bash
# Builds everything and runs every test. Installs the missing Debian packages
# of tests and benchmarks first (tools/install_deps.sh test, and asan for the
# asan preset); Slurm, the bundle's tools and Chromium are installed by the
# tests that use them (tests/slurm_cluster.sh, tools/bundle.sh,
# viz/report_test.cc).
#   tools/test.sh            Release build (-O3 -march=native), all tests
#   tools/test.sh asan       Debug + AddressSanitizer/UBSan build, all tests
#   tools/test.sh debug      Debug build, all tests
# Extra arguments after the preset go to ctest (e.g. `-R Replay`).
# After ctest, tools/test_report.py prints the skipped cases by label with
# their reasons and fails the run where a case that must run here skipped or
# the fast tier was slow in this run (docs/development.md "Build and test");
# it runs after a failed ctest too, and ctest's failure stays the exit status.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
preset=${1:-release}
shift || true
groups=(test)
[[ $preset == asan ]] && groups+=(asan)
# Each phase's time, printed at the end (where CI's 20 minutes went).
phase() { times+=("$1 $((SECONDS - mark)) s"); mark=$SECONDS; }
times=(); mark=$SECONDS
"$top/tools/install_deps.sh" "${groups[@]}"
phase packages
cd "$top"
cmake --preset "$preset" -DTROUPE_TESTS=ON >/dev/null
# How many of the build's compiles came from ccache (CMakeLists.txt): a
# build's time depends on it more than on anything else.
ccache_counts() { ccache --print-stats 2>/dev/null | awk '$1 ~ /^(direct|preprocessed)_cache_hit$/ {h += $2}
  $1 == "cache_miss" {m += $2} END {print h + 0, m + 0}'; }
read -r hits_before misses_before < <(ccache_counts)
cmake --build --preset "$preset"
read -r hits_after misses_after < <(ccache_counts)
phase build
compiles=$(((hits_after - hits_before) + (misses_after - misses_before)))
((compiles == 0)) || times[-1]+=" ($((hits_after - hits_before)) of $compiles compiles from ccache)"
# ctest writes LastTestsDisabled.log (the skipped tests) only when one
# skipped: none of an earlier run is left for the report to take as this one's.
build="$top/build/$preset"
rm -f "$build/Testing/Temporary/LastTestsDisabled.log"
status=0
ctest --preset "$preset" "$@" || status=$?
phase ctest
report=0
python3 "$top/tools/test_report.py" "$build" || report=$?
phase report
summary=$(printf '%s, ' "${times[@]}")
echo "tools/test.sh $preset: ${summary%, }; $SECONDS s in all"
exit $((status != 0 ? status : report))
