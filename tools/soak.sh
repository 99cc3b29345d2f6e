#!/usr/bin/env bash
# A soak that watches memory: a pixel run (actors, learner, evaluator, replay
# embedded) for MINUTES, every process's resident memory sampled every 10 s
# into OUT/memory.csv; at the end OUT/memory.svg charts them, and
# OUT/summary.txt says, per process, its resident memory when the window
# opens (after WARM minutes: replay full, the frame table warm), at the end,
# and its growth over the window; the script fails when any process grew by
# more than 5%.
#   tools/soak.sh [--minutes 30] [--warm 10] [--replay 3000] [--troupe BIN] [--config FILE] OUT [--set ...]
# Defaults: walker.walk from pixels, replay capped at 3,000 transitions (on
# 2 cores the learner paces the actors to ~8 transitions/s, so replay is
# full after ~6 minutes), no videos; further --set arguments go to troupe run.
# Long work: it prints each sample's line as it goes; out of CI (docs/
# development.md "Soak"). A stopped soak is started again (its OUT is new).
# With --troupe build/asan/cli/troupe (AddressSanitizer; ASAN_OPTIONS
# detect_leaks=1 is set) it is a LeakSanitizer run: at the run's end every
# process's leaks are in its log, and any fails the soak.
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

# Per role: the mean of the samples in the window's first and last minute;
# and memory.svg, the samples as a chart.
python3 - "$out" "$((60 * warm))" "$((60 * minutes))" "$leaks" <<'EOF'
import csv, sys
out, opens, ends, leaks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
rows = list(csv.DictReader(open(f"{out}/memory.csv")))
roles = sorted({r["role"] for r in rows}, key=lambda r: (r != "learner", r))
def mean(role, lo, hi):
    v = [float(r["rss_mib"]) for r in rows if r["role"] == role and lo <= int(r["t_s"]) < hi]
    return sum(v) / len(v) if v else float("nan")
lines = [f"soak: {ends // 60} min, window from minute {opens // 60} (resident memory, MiB: mean of the first and last minute)",
         f"{'process':<10} {'at start':>9} {'window opens':>13} {'end':>9} {'growth in window':>17}"]
bad = []
for role in roles:
    first, at_open, last = mean(role, 0, 60), mean(role, opens, opens + 60), mean(role, ends - 60, ends)
    growth = (last - at_open) / at_open * 100
    lines.append(f"{role:<10} {first:>9.0f} {at_open:>13.0f} {last:>9.0f} {growth:>16.1f}%")
    if not growth < 5:
        bad.append(f"{role} grew {growth:.1f}% in the window")
bad += [f"LeakSanitizer reported leaks in {path}" for path in leaks]
lines.append("growth under 5% for every process, no leak reported" if not bad else "FAILED: " + "; ".join(bad))
open(f"{out}/summary.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))

# memory.svg: each process's resident memory over the run, the window shaded
# (a chart without plotting libraries: Debian's python3 has none).
W, H, left, right, top, bottom = 720, 360, 60, 110, 20, 40
tmax = max(ends, max(int(r["t_s"]) for r in rows))
ymax = max(float(r["rss_mib"]) for r in rows) * 1.1
x = lambda t: left + (W - left - right) * t / tmax
y = lambda m: H - bottom - (H - top - bottom) * m / ymax
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<rect x="{x(opens):.1f}" y="{top}" width="{x(ends) - x(opens):.1f}" height="{H - top - bottom}" fill="#eef3fb"/>',
       f'<text x="{x(opens) + 4:.1f}" y="{top + 12}" fill="#456">window</text>',
       f'<line x1="{left}" y1="{H - bottom}" x2="{W - right}" y2="{H - bottom}" stroke="black"/>',
       f'<line x1="{left}" y1="{top}" x2="{left}" y2="{H - bottom}" stroke="black"/>']
for minute in range(0, tmax // 60 + 1, 5):
    svg.append(f'<text x="{x(60 * minute):.1f}" y="{H - bottom + 15}" text-anchor="middle">{minute}</text>')
step = 10 ** max(len(str(int(ymax))) - 1, 1) // 2 or 1
for mib in range(0, int(ymax) + 1, step):
    svg.append(f'<text x="{left - 5}" y="{y(mib) + 4:.1f}" text-anchor="end">{mib}</text>')
svg.append(f'<text x="{(left + W - right) / 2:.0f}" y="{H - 5}" text-anchor="middle">minutes</text>')
svg.append(f'<text x="12" y="{(top + H - bottom) / 2:.0f}" transform="rotate(-90 12 {(top + H - bottom) / 2:.0f})" '
           'text-anchor="middle">resident memory, MiB</text>')
colors = ["#c0392b", "#2471a3", "#229954", "#7d3c98", "#b9770e", "#566573"]
for i, role in enumerate(roles):
    points = " ".join(f"{x(int(r['t_s'])):.1f},{y(float(r['rss_mib'])):.1f}" for r in rows if r["role"] == role)
    svg.append(f'<polyline fill="none" stroke="{colors[i % len(colors)]}" stroke-width="1.5" points="{points}"/>')
    svg.append(f'<text x="{W - right + 8}" y="{top + 14 * (i + 1)}" fill="{colors[i % len(colors)]}">{role}</text>')
svg.append("</svg>")
open(f"{out}/memory.svg", "w").write("\n".join(svg) + "\n")
sys.exit(1 if bad else 0)
EOF
