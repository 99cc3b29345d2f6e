#!/usr/bin/env bash
# The README's results table from state: the eight configs/<task>_state
# configs, 500k env frames each, with `troupe sweep`, seed 0 of every task
# first, then seeds 1 and 2 (a sweep rerun skips finished runs and resumes
# unfinished ones from their checkpoints, so rerun the same command after a
# stop). Each evaluation is 10 episodes (as the papers' final numbers), its
# return their mean. Evaluation videos off here (llvmpipe renders them on the
# cores the runs train on); at the end each task's seed 0 is recorded once
# (OUT_DIR/TASK/seed-0.mp4) with a frame strip (OUT_DIR/TASK/strip.png), and
# tools/results_table.py makes the table.
#   tools/results_state.sh [TROUPE] [OUT_DIR] [SEEDS]
#   defaults: build/release/cli/troupe, runs/results_state, 3
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
troupe=${1:-$root/build/release/cli/troupe}
out=${2:-$root/runs/results_state}
seeds=${3:-3}
tasks=(cartpole_swingup cartpole_balance reacher_easy cheetah_run ball_in_cup_catch pendulum_swingup finger_spin
       walker_walk)
for ((n = 1; n <= seeds; ++n)); do
  for task in "${tasks[@]}"; do
    echo "== $task, seeds 0..$((n - 1)) ($(date -u +%H:%M:%S))"
    "$troupe" sweep "$root/configs/${task}_state.textproto" --dir "$out/$task" --seeds "$n" \
      --set total_frames=500000 --set evaluator.episodes=10 --set evaluator.record_video=false
  done
done
for task in "${tasks[@]}"; do
  [[ -f $out/$task/seed-0/done ]] || continue
  "$troupe" view "$out/$task/seed-0" --record "$out/$task/seed-0.mp4" --strip "$out/$task/strip.png" \
    --width 160 --height 160
done
