#!/usr/bin/env bash
# tools/results_keep.sh: a finished run's config and CSVs are copied (and are
# what tools/results_table.py reads), an unfinished run and checkpoints are not.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for seed in 0 1; do
  run="$work/results/cheetah_run/seed-$seed"
  mkdir -p "$run/checkpoints"
  echo 'name: "cheetah"' > "$run/config.textproto"
  printf 'frames,updates,eval_return,actions_at_bound\n20000,0,700.5,0.0\n' > "$run/eval.csv"
  printf 'seconds,frames,updates\n0,0,0\n10,20000,0\n' > "$run/metrics.csv"
  echo weights > "$run/checkpoints/learner.ckpt"
done
touch "$work/results/cheetah_run/seed-0/done"  # seed 1 is still going
printf 'png' > "$work/results/cheetah_run/seed-0/learning_curve.png"
# A GAN sweep's run, named for its grid point.
gan="$work/results/equal_images/lr_scaling-SQRT__batch_size-1024__seed-0"
mkdir -p "$gan/samples"
echo 'mode: GAN' > "$gan/config.textproto"
printf 'images,steps,classifier_fid,classifier_score,seconds\n500000,488,30.5,7.1,900\n' > "$gan/eval.csv"
printf 'seconds,images,steps,images_per_s\n900,500000,488,550\n' > "$gan/metrics.csv"
printf 'png' > "$gan/samples.png"
touch "$gan/done"
# The keep directory lists seeds 0 and 2 as not kept (files lost once); keeping
# seed 0 takes it off the list, the other lines stay (seed 1, unfinished, is
# not copied: "no run" in the table).
mkdir -p "$work/kept"
printf '# lost runs\ncheetah_run/seed-0\ncheetah_run/seed-2\n' > "$work/kept/not_kept.txt"
out=$("$top/tools/results_keep.sh" "$work/results" "$work/kept")
[[ $out == *"2 finished runs"* ]] || { echo "unexpected output: $out"; exit 1; }
[[ $out == *"cheetah_run/seed-0 kept, taken off"* ]] || { echo "unexpected output: $out"; exit 1; }
[[ $(cat "$work/kept/not_kept.txt") == $'# lost runs\ncheetah_run/seed-2' ]] ||
  { echo "not_kept.txt: $(cat "$work/kept/not_kept.txt")"; exit 1; }
kept_gan="$work/kept/equal_images/lr_scaling-SQRT__batch_size-1024__seed-0"
for f in config.textproto eval.csv metrics.csv done samples.png; do
  [[ -f $kept_gan/$f ]] || { echo "missing $kept_gan/$f"; exit 1; }
done
[[ ! -e $kept_gan/samples ]] || { echo "the samples folder copied"; exit 1; }
kept="$work/kept/cheetah_run/seed-0"
for f in config.textproto eval.csv metrics.csv done learning_curve.png; do
  [[ -f $kept/$f ]] || { echo "missing $kept/$f"; exit 1; }
done
[[ ! -e $kept/checkpoints ]] || { echo "checkpoints copied"; exit 1; }
[[ ! -e $work/kept/cheetah_run/seed-1 ]] || { echo "unfinished run copied"; exit 1; }
table=$(python3 "$top/tools/results_table.py" "$work/kept")
[[ $table == *"| cheetah.run | 700 (1; 1 not kept; 1 no run) | 700, no run, not kept |"* ]] || { echo "table: $table"; exit 1; }
# A missing argument is a usage error, not a copy into the wrong place.
if "$top/tools/results_keep.sh" "$work/results" 2>/dev/null; then echo "ran without KEEP_DIR"; exit 1; fi
echo "ok"
