#!/usr/bin/env bash
# Copies the finished runs of a directory of sweeps (tools/results.sh,
# tools/gan_batch_study.sh: DIR/SWEEP/RUN/) into the repository, without
# checkpoints or logs: each run's config, eval.csv, metrics.csv, done file
# and its pictures (learning or FID curve, GAN sample grid), enough for
# tools/results_table.py and tools/gan_study_table.py. Run directories live
# under runs/, which git ignores and a machine may lose. A run kept is taken
# off KEEP_DIR/not_kept.txt (the runs tools/results_table.py prints as "not
# kept": finished, their files lost), if that lists it.
#   tools/results_keep.sh runs/results_state docs/results/state
#   tools/results_keep.sh runs/batch_study docs/results/gan_batch_study
set -euo pipefail
from=${1:?usage: tools/results_keep.sh SWEEPS_DIR KEEP_DIR}
to=${2:?usage: tools/results_keep.sh SWEEPS_DIR KEEP_DIR}
kept=0
for done in "$from"/*/*/done; do
  [[ -f $done ]] || continue
  run=$(dirname "$done")
  dest="$to/$(basename "$(dirname "$run")")/$(basename "$run")"
  mkdir -p "$dest"
  cp "$run"/config.textproto "$run"/eval.csv "$run"/metrics.csv "$run"/done "$dest"/
  for picture in learning_curve.png fid_curve.png samples.png; do
    [[ -f $run/$picture ]] && cp "$run/$picture" "$dest"/
  done
  kept=$((kept + 1))
  listed="$to/not_kept.txt"
  name="$(basename "$(dirname "$run")")/$(basename "$run")"
  if [[ -f $listed ]] && awk -v run="$name" '$1 == run { found = 1 } END { exit !found }' "$listed"; then
    awk -v run="$name" '$1 != run' "$listed" > "$listed.new"
    mv "$listed.new" "$listed"
    echo "results_keep: $name kept, taken off $listed"
  fi
done
echo "results_keep: $kept finished runs of $from in $to"
