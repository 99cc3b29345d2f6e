#!/usr/bin/env bash
# run.sh of a troupe bundle (tools/bundle.sh): runs its tests and benchmarks
# on this machine and writes every result into one folder.
#
#   ./run.sh [--cpu-only] [--budget SECONDS] [--parts LIST] [--fast-peers]
#            [--return DIR] [--dry-run PLUGIN] [RESULTS_DIR]   (default: ./results)
#
# The parts, in the order they run (most decisive first: a GPU lease is 15
# minutes, and what is not reached is lost):
#   pjrt     the compiled step through the XLA CUDA PJRT plugin: the DrQ step
#            against PyTorch and JAX jit (float32, bfloat16; batch 256, 1024),
#            the D4PG pixel update at batch 256 against the PyTorch and JAX
#            updates, the GAN step against PyTorch
#   correct  the compiled steps' correctness on that plugin (the D4PG and GAN
#            PJRT-vs-CPU tests)
#   tests    the test binaries that use a GPU (CUDA backend, op conformance,
#            the PJRT suites on the GPU plugin), each bounded by the budget
#   job      the main job, learner on the GPU (engine.device GPU), on a pixel
#            task for what the budget leaves (at most five minutes): the path
#            it chose, updates/s, frames/s, input wait, device idle
#   cuda     the CUDA backend's rows (DrQ step, GAN step, D4PG updates,
#            scaling projection)
#   cpu      the CPU benchmarks
# --parts LIST: a comma-separated subset (default all, in the order above).
# --budget SECONDS: no part starts work once SECONDS have passed, and each
#   step is cut to what is left; the last step ends 15 s before it.
# --fast-peers: PyTorch peers eager only (TROUPE_PYTORCH_MODES=eager); the
#   torch.compile modes cost about a minute of compile each on a cold machine;
#   and 2 alternated rounds per side in each comparison (--rounds 2; each
#   peer round is a process that imports its framework and warms up).
# --return DIR: after each part, and when the script is stopped (SIGTERM,
#   SIGINT, SIGHUP: an outer timeout), DIR gets summary.txt, env.txt and
#   results.tar.gz (every result but run checkpoints): the few files a device
#   call returns. Give the outer timeout a margin over --budget.
# --dry-run PLUGIN: a rehearsal on a machine without a GPU: PLUGIN (an XLA
#   CPU plugin) stands in for the CUDA one and is taken for a GPU by the
#   benchmarks (TROUPE_BENCH_STAND_IN=1), which run their quick sizes, one
#   round per side, XLA's CPU compiles unoptimised; the `tests` part runs a
#   few cases of each suite; the job runs the state task on it for 10 s;
#   every part runs in its order.
# --cpu-only: the tests that need neither a GPU, rendering nor data sets (a
#   bare Linux root), and no benchmarks.
# Results: NAME.xml and NAME.log per test binary, bench_*.json/.txt,
# run_gpu.txt and runs/ (the job), devices.txt, env.txt, summary.txt (each
# row as it comes; its last line "N passed, M failed"). RESULTS_DIR.tar.gz
# holds them all.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cpu_only=0
budget=100000
parts=pjrt,correct,tests,job,cuda,cpu
return_dir=""
stand_in=""
rounds=()  # each comparison's rounds per side (bench/protocol.h): the benchmarks' default, 2 with --fast-peers
all_parts=" pjrt correct tests job cuda cpu "
while (($# > 0)); do
  case "$1" in
    --cpu-only) cpu_only=1; shift ;;
    --budget) budget=${2:?--budget SECONDS}; shift 2 ;;
    --parts) parts=${2:?--parts LIST}; shift 2 ;;
    --fast-peers) export TROUPE_PYTORCH_MODES=eager; rounds=(--rounds 2); shift ;;
    --return) return_dir=${2:?--return DIR}; shift 2 ;;
    --dry-run) stand_in=${2:?--dry-run PLUGIN}; shift 2 ;;
    --help|-h) sed -n '2,43p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ $budget =~ ^[0-9]+$ ]] || { echo "run.sh: --budget $budget: a whole number of seconds" >&2; exit 2; }
for part in ${parts//,/ }; do
  [[ $all_parts == *" $part "* ]] || { echo "run.sh: --parts: unknown part $part (${all_parts// /,})" >&2; exit 2; }
done
if [[ -n $stand_in && ! -f $stand_in ]]; then echo "run.sh: --dry-run $stand_in: no such file" >&2; exit 2; fi
has() { ((!cpu_only)) && [[ ",$parts," == *",$1,"* ]]; }
t0=$(date +%s)
left() { echo $((budget - 15 - ($(date +%s) - t0))); }
capped() { local l=$(left); echo $((l < $1 ? l : $1)); }  # CAP: the seconds left, at most CAP
out=$(mkdir -p "${1:-results}" && cd "${1:-results}" && pwd)
if [[ -n $return_dir ]]; then return_dir=$(mkdir -p "$return_dir" && cd "$return_dir" && pwd); fi
[[ -n $stand_in ]] && stand_in=$(cd "$(dirname "$stand_in")" && pwd)/$(basename "$stand_in")
export TROUPE_HOME="$here/share/troupe"
cd "$TROUPE_HOME"  # the tests' data, as in the source tree (every path above is absolute)
: > "$out/env.txt"
: > "$out/summary.txt"
note() { echo "$*" | tee -a "$out/env.txt"; }
say() { echo "$*" | tee -a "$out/summary.txt"; }  # a summary row, printed as it comes

# What goes back: the summary, env.txt and everything as one tar (no run
# checkpoints: networks and replay are large and say nothing here).
pack() {
  tar -C "$(dirname "$out")" --exclude='*/checkpoints' -czf "$out.tar.gz" "$(basename "$out")" 2>/dev/null
  if [[ -n $return_dir ]]; then
    cp "$out/summary.txt" "$out/env.txt" "$return_dir/" 2>/dev/null
    cp "$out.tar.gz" "$return_dir/results.tar.gz" 2>/dev/null
  fi
}
stopped() {
  # Further signals ignored, not defaulted: an outer `timeout` signals this
  # script and then its whole process group, and a second TERM landing while
  # this runs would kill it before its files go back (seen under load: an
  # empty summary returned). The caller's -k KILL still ends a hang.
  trap '' TERM INT HUP
  say "stopped by SIG$1 at $(( $(date +%s) - t0 )) s: what ran is kept"
  kill -TERM -- $(jobs -p) 2>/dev/null
  pack
  exit 143
}
trap 'stopped TERM' TERM
trap 'stopped INT' INT
trap 'stopped HUP' HUP

note "troupe bundle $(cat "$here/VERSION" 2>/dev/null) on $(uname -srm), $(nproc) cores, budget ${budget} s, parts $parts"

# CUDA's own libraries (cuBLAS, NCCL) are not in the bundle: find the versions
# the binaries need where such a machine keeps them, the toolkit's lib64 or
# the lib folders of the nvidia-* Python wheels.
candidates=()
for d in "${CUDA_HOME:-}/lib64" "${CUDA_HOME:-}/lib" /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  [[ -d "$d" ]] && candidates+=("$d")
done
# The machine's python3 (TROUPE_PYTHON), and the one a GPU image keeps PyTorch and JAX in.
pythons=()
for py in "${TROUPE_PYTHON:-python3}" /opt/torch/.venv/bin/python3; do
  command -v "$py" >/dev/null 2>&1 && pythons+=("$py")
done
for py in "${pythons[@]}"; do
  site=$("$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) || continue
  for s in $site; do
    for d in "$s"/nvidia/*/lib "$s"/nvidia/*/*/lib; do [[ -d "$d" ]] && candidates+=("$d"); done
  done
done
needed=$(ldd "$here"/bin/* 2>/dev/null | grep -oE 'lib(cublas|cublasLt|cudart|nccl)\.so\.[0-9]+' | sort -u)
# Opened at run time, not linked: cuDNN (the CUDA backend's convolutions;
# im2col without it) and NVRTC (cuDNN's runtime-compiled kernels).
optional="libcudnn.so.9 libnvrtc.so.13"
libpath=""
for soname in $needed $optional; do
  found=""
  for d in "${candidates[@]}"; do
    if [[ -e "$d/$soname" ]]; then found=$d; break; fi
  done
  if [[ -n "$found" ]]; then
    note "CUDA library $soname: $found"
    case ":$libpath:" in *":$found:"*) ;; *) libpath="$libpath:$found" ;; esac
  elif [[ " $optional " == *" $soname "* ]]; then
    note "CUDA library $soname: not found (looked in: ${candidates[*]:-nothing}); the CUDA backend goes without it"
  else
    note "CUDA library $soname: not found (looked in: ${candidates[*]:-nothing}); the CUDA programs will not start"
  fi
done
export LD_LIBRARY_PATH="${libpath#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Every program's and library's dependencies, now that CUDA's are on the path
# (the NVIDIA driver's libcuda.so.1 is opened only when CUDA is first called).
unresolved=$(for f in "$here"/bin/* "$here"/lib/*; do [[ -f $f ]] && ldd "$f" 2>/dev/null | grep 'not found'; done |
             sort -u | awk '{print $1}' | paste -sd' ' -)
note "libraries not found: ${unresolved:-none}"
# Rendering on an NVIDIA machine: the driver's EGL vendor, when glvnd's default has none.
nvidia_egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
if [[ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" && -f "$nvidia_egl" ]]; then
  export __EGL_VENDOR_LIBRARY_FILENAMES=$nvidia_egl
  note "EGL vendor: $nvidia_egl"
fi
# The XLA CUDA PJRT plugin JAX installs (jax-cuda13-pjrt), found as troupe
# finds it for engine.device GPU (troupe devices prints the path).
export TROUPE_FAKE_PLUGIN_DIR=$here/bin/fake_plugins
"$here/bin/troupe" devices > "$out/devices.txt" 2>&1
note "troupe devices (exit $?):"
sed 's/^/  /' "$out/devices.txt" | tee -a "$out/env.txt"
plugin=$(sed -n 's/^PJRT GPU plugin: \([^ ]*\).*/\1/p' "$out/devices.txt" | head -n 1)
if [[ -n $stand_in ]]; then
  plugin=$stand_in
  export TROUPE_BENCH_STAND_IN=1
  note "dry run: $stand_in stands in for the GPU plugin"
fi
[[ -n $plugin ]] && note "PJRT plugin for the compiled step: $plugin" || note "PJRT plugin: none (the pjrt and correct parts have nothing to run)"
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1; then
  gpu=1
  note "GPU: $(head -n 1 "$out/nvidia-smi.txt")"
else
  note "GPU: none answers (nvidia-smi)"
fi
# The benchmarks' sizes: the lease's, or the dry run's quick ones; a dry
# run's `correct` and `tests` parts run a few cases of each suite (CI runs
# them all).
quick=(); bench_seconds=2; d4pg_batch=256; d4pg_updates=50; per_execution=8; tests_filter=(); correct_d4pg='*Pjrt*'
if [[ -n $stand_in ]]; then
  # (2 updates per execution, not 8: the same path, a quarter of the compile.)
  quick=(--quick); bench_seconds=1; d4pg_batch=32; d4pg_updates=4; per_execution=2; rounds=(--rounds 1)
  # A rehearsal's figures measure nothing: XLA compiles its CPU programs
  # without LLVM's optimisation (a third of the compile time), what the
  # caller's XLA_FLAGS do not already set.
  [[ ${XLA_FLAGS:-} == *xla_backend_optimization_level* ]] ||
    export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_backend_optimization_level=0"
  tests_filter=(--gtest_filter='*.Linear:PjrtPlugin*.*:CudaArchitectureTest.*:ChooseGpuPathTest.*:PjrtClientTest.*')
  correct_d4pg='D4pgAgentTest.PixelUpdatesOnPjrtMatchTheCpu'
fi

# A step runs in the background and is waited for, so that a signal to this
# script (an outer timeout) is handled at once, not when the step ends.
step() {  # LOG SHOW CMD...: CMD's output into LOG (and on stdout if SHOW is 1); returns CMD's exit code
  local log=$1 show=$2; shift 2
  if ((show)); then "$@" > >(tee "$log") 2>&1 & else "$@" > "$log" 2>&1 & fi
  wait $!
}
passed=0; failed=0; cut=0
run_test() {  # NAME CAP BINARY [ARGS...]: one test binary for at most CAP s of the budget; its XML, log and summary row
  local name=$1 cap=$2 t=$3; shift 3
  local seconds=$(capped "$cap")
  if ((seconds < 20)); then say "$name: skipped (budget spent)"; return; fi
  local start=$(date +%s)
  step "$out/$name.log" 0 timeout -k 5 "$seconds" "$t" --gtest_output="xml:$out/$name.xml" "$@"
  local rc=$?
  local verdict="FAILED (exit $rc)"
  if ((rc == 0)); then verdict=passed; passed=$((passed + 1));
  elif ((rc == 124)) && ! grep -q '^\[  FAILED  \]' "$out/$name.log"; then verdict="cut at $seconds s (the budget), none failed"; cut=$((cut + 1));
  else failed=$((failed + 1)); fi
  say "$name: $verdict in $(( $(date +%s) - start )) s, $(grep -c '^\[       OK \]' "$out/$name.log") cases ok, $(grep -c '^\[  SKIPPED \]' "$out/$name.log") skipped"
}
bench() {  # TAG CAP ARGS...: troupe bench ARGS --json, for at most CAP s; its rows printed as they come
  local tag=$1 cap=$2; shift 2
  local seconds=$(capped "$cap")
  if ((seconds < 30)); then say "troupe bench $* : skipped (budget spent)"; return; fi
  local start=$(date +%s)
  step "$out/bench_$tag.txt" 1 timeout -k 5 "$seconds" "$here/bin/troupe" bench "$@" "${quick[@]}" "${rounds[@]}" --json "$out/bench_$tag.json"
  local rc=$?
  say "troupe bench $* : exit $rc in $(( $(date +%s) - start )) s$( ((rc == 124)) && echo " (cut at $seconds s: the rows above are what it measured)")"
}
d4pg() {  # DEVICE BATCH [TAG]: D4PG pixel updates/s (the environment's TROUPE_CUDA_* apply; TAG peers: PyTorch and JAX beside it; perN: N updates per execution, learner.updates_per_execution, on the learner's own input: replay of 16 batches' transitions sampled into the device frame table, the host's time per update printed)
  local seconds=$(capped "$([[ ${3:-} == per* ]] && echo 90 || echo 200)")
  if ((seconds < 30)); then say "d4pg_bench pixels batch $2 on $1: skipped (budget spent)"; return; fi
  local file="$out/bench_d4pg_$1_$2${3:+_$3}.txt"
  local extra=()
  [[ ${3:-} == peers ]] && extra=(--peers "${rounds[@]}")
  local updates=$d4pg_updates n=${3:-}
  n=${n#per}
  # Whole executions (another count would compile another program for the rest).
  [[ ${3:-} == per* ]] && extra=(--per-execution "$n" --replay $((16 * $2))) &&
    updates=$(( (d4pg_updates + n - 1) / n * n ))
  step "$file" 1 timeout -k 5 "$seconds" "$here/bin/d4pg_bench" "${extra[@]}" pixels "$2" "$(nproc)" "$updates" 32 1024 "$1"
  say "d4pg_bench pixels batch $2 on $1${3:+ ($3)}: exit $?: $(grep 'updates/s' "$file" | head -n 1)"
  [[ ${3:-} == per* ]] && grep -E '^(replay of|pjrt: )' "$file" | sed "s/^/[$3] /" >> "$out/summary.txt"
  [[ ${3:-} == peers ]] && grep -E '^\| ' "$file" | tail -n +3 >> "$out/summary.txt"
}
part() {  # NAME: a part begins (said), and what the previous ones wrote goes back
  pack
  say "== $1 at $(( $(date +%s) - t0 )) s ($(left) s of the budget left)"
}

if has pjrt; then
  part pjrt
  if [[ -z $plugin ]]; then
    say "pjrt: no PJRT GPU plugin (devices.txt says why)"
  else
    # One compiled program per step against PyTorch eager (and compiled, unless
    # --fast-peers) and JAX jit on the same GPU; then the D4PG pixel update
    # compiled, 8 per execution, then one per execution against the PyTorch
    # and JAX updates; then the GAN step.
    bench learner_pjrt 240 learner --device pjrt --pjrt-plugin "$plugin" --seconds "$bench_seconds"
    # The D4PG update traced once and replayed, 8 per execution (issue 48's bar: 1,000/s at batch 256 on an H200;
    # the host's own time per update at most 0.01 ms), then one per execution (its host time at most 0.05 ms).
    TROUPE_PJRT_PLUGIN=$plugin d4pg pjrt "$d4pg_batch" "per$per_execution"
    TROUPE_PJRT_PLUGIN=$plugin d4pg pjrt "$d4pg_batch" per1
    TROUPE_PJRT_PLUGIN=$plugin d4pg pjrt "$d4pg_batch" peers
    bench gan_pjrt 120 gan --device pjrt --pjrt-plugin "$plugin" --seconds "$bench_seconds"
  fi
fi
if has correct; then
  part correct
  if [[ -z $plugin ]]; then
    say "correct: no PJRT GPU plugin (devices.txt says why)"
  else
    TROUPE_PJRT_PLUGIN=$plugin run_test pjrt_steps_d4pg 150 "$here/bin/agents_d4pg_test" --gtest_filter="$correct_d4pg"
    TROUPE_PJRT_PLUGIN=$plugin run_test pjrt_steps_gan 90 "$here/bin/gan_trainer_test" --gtest_filter='*Pjrt*'
  fi
fi
if has tests; then
  part tests
  # The GPU-bearing suites only (the CPU-only ones pass in CI): the CUDA
  # backend, every op on CUDA, GAN steps and device GPU's choice on a real
  # GPU, then the PJRT suites on the GPU plugin.
  for name in cuda_backend_test nn_ops_test gan_trainer_test engine_config_test; do
    if ((gpu || ${#stand_in})); then run_test "$name" 120 "$here/bin/$name" "${tests_filter[@]}"; fi
  done
  if ((gpu)); then TROUPE_CUDA_ASYNC=1 run_test cuda_backend_test_async 90 "$here/bin/cuda_backend_test"; fi
  if [[ -n $plugin ]]; then
    TROUPE_PJRT_PLUGIN=$plugin run_test pjrt_test 90 "$here/bin/pjrt_test" "${tests_filter[@]}"
    TROUPE_PJRT_PLUGIN=$plugin run_test nn_ops_pjrt_test 120 "$here/bin/nn_ops_pjrt_test" "${tests_filter[@]}"
  fi
  ((gpu || ${#plugin})) || say "tests: no GPU and no PJRT GPU plugin: none of these suites has anything to run"
  # A failed CUDA suite: its failed cases again under compute-sanitizer's
  # memcheck (out-of-bounds and misaligned accesses, API errors), for the log.
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  for name in cuda_backend_test nn_ops_test; do
    ((gpu)) && [[ -n $sanitizer ]] || break
    cases=$(sed -n 's/^\[  FAILED  \] \([A-Za-z0-9_/.]*\) .*/\1/p' "$out/$name.log" 2>/dev/null | sort -u | paste -sd: -)
    [[ -z $cases ]] && continue
    seconds=$(capped 60)
    ((seconds >= 20)) || break
    step "$out/${name}_memcheck.log" 0 timeout "$seconds" "$sanitizer" --tool memcheck "$here/bin/$name" --gtest_filter="$cases"
    say "$name's failed cases under memcheck: exit $? ($(grep -c 'Invalid\|Error' "$out/${name}_memcheck.log") error lines)"
  done
fi
if has job; then
  part job
  # The main job with its learner on the GPU (no evaluation videos: the bundle
  # carries no FFmpeg; checkpoints without replay). In a dry run, the state
  # task with its learner on the stand-in plugin (a bare root renders nothing).
  job=(--set learner.engine.device=GPU)
  task=cartpole_swingup
  cap=300; least=30  # at most CAP s of the budget, 20 of them kept for its ending; at least LEAST s of training
  if [[ -n $stand_in ]]; then
    job=(--set learner.engine.device=PJRT --set "learner.engine.pjrt_plugin=$stand_in")
    task=cartpole_swingup_state
    cap=30; least=10
  fi
  seconds=$(( $(capped $cap) - 20 ))
  if ((seconds >= least)); then
    step "$out/run_gpu.txt" 0 timeout -k 10 "$seconds" "$here/bin/troupe" run "$TROUPE_HOME/configs/$task.textproto" \
      "${job[@]}" --set evaluator.record_video=false --set learner.checkpoint_replay=false --set runs_dir="$out/runs"
    rc=$?
    # Which path device GPU took, as the learner said it; the learner's rates
    # over metrics.csv's rows after the first (warm-up, compile).
    path=$(grep -rho 'engine.device GPU: [^(]*' "$out/runs" "$out/run_gpu.txt" 2>/dev/null | head -n 1)
    metrics=$(ls "$out"/runs/*/metrics.csv 2>/dev/null | head -n 1)
    rates=$(awk -F, 'NR == 1 {for (i = 1; i <= NF; ++i) c[$i] = i; next}
                     NR > 2 {n++; u += $c["updates_per_s"]; f += $c["frames_per_s"]; w += $c["input_wait_ms"]
                             if ("device_idle_ms" in c) d += $c["device_idle_ms"]}
                     END {if (n) printf "%.1f updates/s, %.0f frames/s, input wait %.3f ms, device idle %.3f ms per update (mean of %d rows after the first)", u/n, f/n, w/n, d/n, n;
                          else print "no metrics row after the first"}' "${metrics:-/dev/null}")
    [[ -n $stand_in ]] && path="learner on the stand-in plugin"
    say "troupe run $task, ${path:-learner on the GPU (path not said)}, $seconds s: exit $rc; $rates"
  else
    say "troupe run: skipped (budget spent)"
  fi
fi
if has cuda; then
  part cuda
  if ((gpu)); then
    bench learner_cuda 150 learner --device cuda --seconds 2
    for device in cuda cuda-bf16; do d4pg "$device" 256; done
    bench gan_cuda 120 gan --device cuda --seconds 2
    # Synchronous against asynchronous kernels, and where a step's time goes
    # (TROUPE_CUDA_PROFILE=1: a table per backend at the end of its log).
    TROUPE_CUDA_ASYNC=1 d4pg cuda 256 async
    TROUPE_CUDA_PROFILE=1 d4pg cuda 256 profile
    # Writes its projection, scaling_cuda.csv and .png, into the results.
    (cd "$out" && bench scaling_cuda 120 scaling --device cuda --seconds 2)
    for device in cuda cuda-bf16; do d4pg "$device" 1024; done
  else
    say "cuda: no GPU answers: the CUDA backend's rows are not measured"
  fi
fi
if has cpu; then
  part cpu
  bench learner 120 learner --seconds 2
  d4pg cpu "$d4pg_batch"
  # TLS + token against plain gRPC on the insert path, on this machine's
  # cores (the 2-core development machines put both ends of ~500 MB/s of
  # AES-GCM on the same two cores).
  bench replay_tls 120 replay --only tls
fi
if ((cpu_only)); then
  # The CPU suites, all at once (a bare root's cores).
  cpu_tests=(nn_engine_test nn_strict_device_test nn_ops_test engine_config_test replicator_test cuda_backend_test
             agents_d4pg_test pjrt_test)
  for name in "${cpu_tests[@]}"; do
    [[ -x $here/bin/$name ]] && run_test "$name" 240 "$here/bin/$name" &
  done
  wait
  for name in "${cpu_tests[@]}"; do
    [[ -f $out/$name.log ]] || continue
    if grep -q "^$name: passed" "$out/summary.txt"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  done
fi
say "done at $(( $(date +%s) - t0 )) s$( ((cut)) && echo "; $cut suite(s) cut by the budget")"
say "$passed passed, $failed failed"
trap - TERM INT HUP
pack
echo "results: $out (and $out.tar.gz)${return_dir:+; returned: $return_dir}"
echo "$passed passed, $failed failed"
((failed == 0))
