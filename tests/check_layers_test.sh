#!/usr/bin/env bash
# tools/check_layers.sh must fail, naming file, line and layers, on includes
# that run up (engine/ -> agents/) or sideways (gan/ -> replay/), and pass a
# tree whose includes run down (agents/ -> engine/, and non-troupe headers).
set -euo pipefail
check="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/check_layers.sh"
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree"/engine/nn "$tree"/gan "$tree"/agents
echo '#include "engine/nn/ops.h"' > "$tree"/agents/ok.h
printf '#include "absl/status/status.h"\n#include "engine/nn/tensor.h"\n' > "$tree"/gan/ok.h
"$check" "$tree" > "$tree/clean.out" || { echo "FAIL: a clean tree was refused:"; cat "$tree/clean.out"; exit 1; }

printf '// x\n#include "agents/d4pg_agent.h"\n' > "$tree"/engine/nn/up.cc
echo '#include "replay/item.h"' > "$tree"/gan/sideways.h
if "$check" "$tree" > "$tree/bad.out"; then echo "FAIL: includes that run up passed"; exit 1; fi
grep -q 'engine/nn/up.cc:2: engine/ includes agents/' "$tree/bad.out" || { echo "FAIL: no engine -> agents report:"; cat "$tree/bad.out"; exit 1; }
grep -q 'gan/sideways.h:1: gan/ includes replay/' "$tree/bad.out" || { echo "FAIL: no gan -> replay report:"; cat "$tree/bad.out"; exit 1; }
[[ $(wc -l < "$tree/bad.out") -eq 2 ]] || { echo "FAIL: expected exactly 2 reports:"; cat "$tree/bad.out"; exit 1; }
echo "PASS"
