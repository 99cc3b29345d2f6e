#!/usr/bin/env bash
# Copies the finished runs of a results directory (tools/results.sh) into
# the repository, without checkpoints or logs: each run's config, eval.csv,
# metrics.csv and done file, enough for tools/results_table.py. Run
# directories live under runs/, which git ignores and a machine may lose.
#   tools/results_keep.sh runs/results_state docs/results/state
set -euo pipefail
from=${1:?usage: tools/results_keep.sh RESULTS_DIR KEEP_DIR}
to=${2:?usage: tools/results_keep.sh RESULTS_DIR KEEP_DIR}
kept=0
for done in "$from"/*/seed-*/done; do
  [[ -f $done ]] || continue
  run=$(dirname "$done")
  dest="$to/$(basename "$(dirname "$run")")/$(basename "$run")"
  mkdir -p "$dest"
  cp "$run"/config.textproto "$run"/eval.csv "$run"/metrics.csv "$run"/done "$dest"/
  kept=$((kept + 1))
done
echo "results_keep: $kept finished runs of $from in $to"
