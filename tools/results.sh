#!/usr/bin/env bash
# The results tables of docs/results.md: each task's config for state or pixels, 500k
# env frames, with `troupe sweep`, seed 0 of every task first, then seeds 1
# and 2 (a sweep rerun skips finished runs and resumes unfinished ones from
# their checkpoints, so rerun the same command after a stop). Each evaluation
# is 10 episodes (as the papers' final numbers), its return their mean.
# Evaluation videos off here (llvmpipe renders them on the cores the runs
# train on); at the end each task's seed 0 is recorded once
# (OUT_DIR/TASK/seed-0.mp4) with a frame strip (OUT_DIR/TASK/strip.png), and
# tools/results_table.py makes the table.
#   tools/results.sh state|pixels [TROUPE] [OUT_DIR] [SEEDS] [TASKS]
#   state:  configs/<task>_state.textproto, the 8 tasks, OUT_DIR runs/results_state
#   pixels: configs/<task>.textproto, the 6 pixel tasks (cartpole.swingup and
#           walker.walk first), OUT_DIR runs/results_pixels
#   defaults: TROUPE build/release/cli/troupe, SEEDS 3, TASKS all of the kind
#   (a space-separated list of config names, e.g. "cartpole_swingup walker_walk")
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kind=${1:-}
case "$kind" in
  state)
    suffix=_state
    tasks=(cartpole_swingup cartpole_balance reacher_easy cheetah_run ball_in_cup_catch pendulum_swingup finger_spin
           walker_walk) ;;
  pixels)
    suffix=
    tasks=(cartpole_swingup walker_walk cheetah_run finger_spin reacher_easy ball_in_cup_catch) ;;
  *)
    echo "usage: tools/results.sh state|pixels [TROUPE] [OUT_DIR] [SEEDS] [TASKS]" >&2
    exit 2 ;;
esac
troupe=${2:-$root/build/release/cli/troupe}
out=${3:-$root/runs/results_$kind}
seeds=${4:-3}
if [[ -n "${5:-}" ]]; then read -r -a tasks <<<"$5"; fi
for task in "${tasks[@]}"; do
  [[ -f "$root/configs/$task$suffix.textproto" ]] || { echo "no config configs/$task$suffix.textproto" >&2; exit 2; }
done
for ((n = 1; n <= seeds; ++n)); do
  for task in "${tasks[@]}"; do
    echo "== $task ($kind), seeds 0..$((n - 1)) ($(date -u +%H:%M:%S))"
    "$troupe" sweep "$root/configs/$task$suffix.textproto" --dir "$out/$task" --seeds "$n" \
      --set total_frames=500000 --set evaluator.episodes=10 --set evaluator.record_video=false
  done
done
for task in "${tasks[@]}"; do
  [[ -f $out/$task/seed-0/done ]] || continue
  "$troupe" view "$out/$task/seed-0" --record "$out/$task/seed-0.mp4" --strip "$out/$task/strip.png" \
    --width 160 --height 160
done
