#!/usr/bin/env bash
# A soak that watches memory: a pixel run (actors, learner, evaluator, replay
# embedded) for MINUTES, every process's resident memory sampled every 10 s
# into OUT/memory.csv; at the end OUT/memory.svg charts them, and
# OUT/summary.txt says, per process, the least resident memory it held in
# the window's first third (the window opens after WARM minutes: replay
# full, the frame table warm) and in its last third, their growth, and its
# peak; the script fails when any process's least memory grew by 5% or more
# (tools/soak_summary.py: an evaluation's memory comes and goes).
#   tools/soak.sh [--minutes 30] [--warm 10] [--replay 3000] [--troupe BIN] [--config FILE] OUT [--set ...]
# Defaults: walker.walk from pixels, replay capped at 3,000 transitions (on
# 2 cores the learner paces the actors to ~8 transitions/s, so replay is
# full after ~6 minutes), no videos; further --set arguments go to troupe run.
# Long work: it prints each sample's line as it goes; out of CI (docs/
# development.md "Soak"). A stopped soak is started again (its OUT is new).
# With --troupe build/asan/cli/troupe (AddressSanitizer; ASAN_OPTIONS
# detect_leaks=1 is set) it is a LeakSanitizer run: at the run's end every
# process's leaks are in its log, and any fails the soak (as does an actor
# the run had to kill at its stop: its leak check never ran).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
minutes=30; warm=10; replay=3000; troupe=$top/build/release/cli/troupe; config=$top/configs/walker_walk.textproto
while [[ $# -gt 0 ]]; do
  case $1 in
    --minutes) minutes=$2; shift 2 ;;
    --warm) warm=$2; shift 2 ;;
    --replay) replay=$2; shift 2 ;;
    --troupe) troupe=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    *) break ;;
  esac
done
out=${1:?usage: tools/soak.sh [--minutes M] [--warm W] [--replay N] [--troupe BIN] [--config FILE] OUT [--set ...]}
shift
if ((warm >= minutes)); then echo "soak: --warm $warm must be below --minutes $minutes" >&2; exit 2; fi
[[ -x $troupe ]] || { echo "soak: no troupe binary at $troupe (build it, or --troupe BIN)" >&2; exit 2; }
if [[ -e $out ]]; then echo "soak: $out exists; give a new folder" >&2; exit 2; fi
mkdir -p "$out"

ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$troupe" run "$config" --set runs_dir="$out/runs" --set learner.replay_size="$replay" \
  --set evaluator.record_video=false --set total_frames=1000000000 "$@" > "$out/run.log" 2>&1 &
run_pid=$!
trap 'kill -INT $run_pid 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM  # (the EXIT trap stops the run)

# The run's process tree: the launcher (learner, replay, evaluator) and its actors.
tree() {
  local pids=($1) i=0
  while ((i < ${#pids[@]})); do
    pids+=($(cat /proc/${pids[i]}/task/*/children 2>/dev/null))
    i=$((i + 1))
  done
  echo "${pids[@]}"
}
role() {  # PID: learner, or "actor N" from its command line
  [[ $1 == "$run_pid" ]] && { echo learner; return; }
  local cmd
  cmd=$(tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null || true)
  if [[ $cmd =~ ^[^\ ]*\ actor\  ]]; then  # troupe actor (argv[0] may be /proc/self/exe)
    echo "actor $(sed -n 's/.*--index[ =]\([0-9]*\).*/\1/p' <<< "$cmd")"
  else
    echo "other $(basename "${cmd%% *}")"
  fi
}

echo "t_s,pid,role,rss_mib" > "$out/memory.csv"
start=$(date +%s)
end=$((start + 60 * minutes))
while (( $(date +%s) < end )); do
  kill -0 "$run_pid" 2>/dev/null || { echo "soak: the run ended early: $(tail -n 3 "$out/run.log")" >&2; exit 1; }
  t=$(( $(date +%s) - start ))
  line="t=${t}s"
  for pid in $(tree "$run_pid"); do
    rss=$(awk '/^VmRSS:/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status" 2>/dev/null || true)
    [[ -n $rss ]] || continue
    r=$(role "$pid")
    [[ $r == other* ]] && continue
    echo "$t,$pid,$r,$rss" >> "$out/memory.csv"
    line+="  $r ${rss} MiB"
  done
  echo "$line"
  sleep 10
done
kill -INT "$run_pid" 2>/dev/null || true
wait "$run_pid" 2>/dev/null || true
trap - EXIT INT TERM
leaks=$(grep -rl "ERROR: LeakSanitizer" "$out/run.log" "$out"/runs/*/logs 2>/dev/null || true)

# The verdict and chart: tools/soak_summary.py (summary.txt, memory.svg).
python3 "$top/tools/soak_summary.py" "$out" "$((60 * warm))" "$((60 * minutes))" $leaks
