#!/usr/bin/env bash
# Compiles engine/pjrt/pjrt_c_api_layout_check.cc against a plugin's own
# pjrt_c_api.h: every struct and table entry troupe declares must sit where
# the plugin's header puts it. Exit 77 (ctest: skipped) without the header.
#   tools/pjrt_layout_check.sh CXX SOURCE_ROOT HEADER
set -euo pipefail
cxx=$1 root=$2 header=$3
if [[ ! -f $header ]]; then
  echo "skipped: no plugin header at $header (tools/pjrt_cpu_plugin.sh fetches one)"
  exit 77
fi
"$cxx" -std=c++20 -fsyntax-only -Werror -I"$root" -DTROUPE_PJRT_REFERENCE_HEADER="\"$header\"" \
  "$root/engine/pjrt/pjrt_c_api_layout_check.cc"
echo "troupe's PJRT C API declarations match $(readlink -f "$header")"
