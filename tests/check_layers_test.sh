#!/usr/bin/env bash
# tools/check_layers.sh must fail, naming file, line and layers, on includes
# that run up (engine/ -> agents/) or sideways (gan/ -> replay/), and pass a
# tree whose includes run down (agents/ -> engine/, and non-troupe headers).
# It must also name a file outside agents/ that names an algorithm (learner/
# holding a D4pgAgent, an APPO message in gan/), and pass the same names in
# agents/ and in a test.
set -euo pipefail
check="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/check_layers.sh"
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree"/engine/nn "$tree"/gan "$tree"/agents "$tree"/learner
echo '#include "engine/nn/ops.h"' > "$tree"/agents/ok.h
echo 'D4pgAgent* agent;  // APPO too' > "$tree"/agents/d4pg_ok.h
echo 'TEST(Learner, Trains) {}  // D4PG' > "$tree"/learner/learner_test.cc
echo '// disappointing: not a name' > "$tree"/learner/ok.h
printf '#include "absl/status/status.h"\n#include "engine/nn/tensor.h"\n' > "$tree"/gan/ok.h
"$check" "$tree" > "$tree/clean.out" || { echo "FAIL: a clean tree was refused:"; cat "$tree/clean.out"; exit 1; }

printf '// x\n#include "agents/agent.h"\n' > "$tree"/engine/nn/up.cc
echo '#include "replay/item.h"' > "$tree"/gan/sideways.h
printf '#include "agents/agent.h"\n\nstd::unique_ptr<agents::D4pgAgent> agent;\n' > "$tree"/learner/named.h
echo 'return "APPO only";' > "$tree"/gan/named.cc
if "$check" "$tree" > "$tree/bad.out"; then echo "FAIL: includes that run up passed"; exit 1; fi
grep -q 'engine/nn/up.cc:2: engine/ includes agents/' "$tree/bad.out" || { echo "FAIL: no engine -> agents report:"; cat "$tree/bad.out"; exit 1; }
grep -q 'gan/sideways.h:1: gan/ includes replay/' "$tree/bad.out" || { echo "FAIL: no gan -> replay report:"; cat "$tree/bad.out"; exit 1; }
grep -q 'learner/named.h:3: names an algorithm outside agents/' "$tree/bad.out" || { echo "FAIL: no report of learner/ naming D4PG:"; cat "$tree/bad.out"; exit 1; }
grep -q 'gan/named.cc:1: names an algorithm outside agents/' "$tree/bad.out" || { echo "FAIL: no report of gan/ naming APPO:"; cat "$tree/bad.out"; exit 1; }
[[ $(wc -l < "$tree/bad.out") -eq 4 ]] || { echo "FAIL: expected exactly 4 reports:"; cat "$tree/bad.out"; exit 1; }
echo "PASS"
