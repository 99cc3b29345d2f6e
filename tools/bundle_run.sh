#!/usr/bin/env bash
# run.sh of a troupe bundle (tools/bundle.sh): runs its tests and benchmarks
# on this machine and writes every result into one folder.
#
#   ./run.sh [--cpu-only] [--budget SECONDS] [--parts LIST] [RESULTS_DIR]   (default: ./results)
#
# --cpu-only: the tests that need neither a GPU, rendering nor data sets (a
# bare Linux root), and no benchmarks. Otherwise, most telling first, since a
# GPU lease is short: every test binary at once (the GPU conformance suites
# among them, and the PJRT ones through the CUDA plugin), then the GPU
# benchmarks one at a time on a quiet machine, then the main job with its
# learner on the GPU, then the CPU benchmarks. --budget: stop starting work
# after SECONDS (the main job gets what is left, at most 300 s). --parts: a
# comma-separated subset of tests,gpu,job,cpu (the GPU benchmarks; the GPU
# scaling bench and the main job; the CPU benchmarks), to split the work
# between calls of a short lease; default all.
# Results: NAME.xml and NAME.log per test binary, bench_*.json/.txt,
# scaling_cuda.csv/.png (the scaling projection on the GPU's step times), env.txt
# (what was found where), summary.txt; the last line printed is
# "N passed, M failed". RESULTS_DIR.tar.gz holds them all.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cpu_only=0
budget=100000
parts=tests,gpu,job,cpu
while (($# > 0)); do
  case "$1" in
    --cpu-only) cpu_only=1; shift ;;
    --budget) budget=${2:?--budget SECONDS}; shift 2 ;;
    --parts) parts=${2:?--parts LIST}; shift 2 ;;
    --help|-h) sed -n '2,21p' "$0"; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (--help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
for part in ${parts//,/ }; do
  [[ " tests gpu job cpu " == *" $part "* ]] || { echo "run.sh: --parts: unknown part $part (tests,gpu,job,cpu)" >&2; exit 2; }
done
has() { [[ ",$parts," == *",$1,"* ]]; }
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
capped() { local l=$(left); echo $((l < $1 ? l : $1)); }  # CAP: the seconds left, at most CAP
out=$(mkdir -p "${1:-results}" && cd "${1:-results}" && pwd)
export TROUPE_HOME="$here/share/troupe"
: > "$out/env.txt"
note() { echo "$*" | tee -a "$out/env.txt"; }
note "troupe bundle $(cat "$here/VERSION" 2>/dev/null) on $(uname -srm), $(nproc) cores"

# CUDA's own libraries (cuBLAS, NCCL) are not in the bundle: find the versions
# the binaries need where such a machine keeps them, the toolkit's lib64 or
# the lib folders of the nvidia-* Python wheels.
candidates=()
for d in "${CUDA_HOME:-}/lib64" "${CUDA_HOME:-}/lib" /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
  [[ -d "$d" ]] && candidates+=("$d")
done
for py in python3 /opt/torch/.venv/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
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
# Rendering on an NVIDIA machine: the driver's EGL vendor, when glvnd's default has none.
nvidia_egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
if [[ -z "${__EGL_VENDOR_LIBRARY_FILENAMES:-}" && -f "$nvidia_egl" ]]; then
  export __EGL_VENDOR_LIBRARY_FILENAMES=$nvidia_egl
  note "EGL vendor: $nvidia_egl"
fi
# The XLA CUDA PJRT plugin JAX installs (jax-cuda13-pjrt), for the PJRT
# backend's tests and benchmark on the GPU.
pjrt_cuda=$(python3 -c 'import os, jax_plugins.xla_cuda13 as m; print(os.path.join(os.path.dirname(m.__file__), "xla_cuda_plugin.so"))' 2>/dev/null)
if [[ -n $pjrt_cuda && -f $pjrt_cuda ]]; then
  note "PJRT CUDA plugin: $pjrt_cuda"
else
  pjrt_cuda=""
  note "PJRT CUDA plugin: not found (python3 -c 'import jax_plugins.xla_cuda13')"
fi
export TROUPE_FAKE_PLUGIN_DIR=$here/bin/fake_plugins
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L > "$out/nvidia-smi.txt" 2>&1; then
  gpu=1
  note "GPU: $(head -n 1 "$out/nvidia-smi.txt")"
else
  note "GPU: none answers (nvidia-smi)"
fi

# Tests: each binary with its XML report and log, all at once (a GPU
# machine's cores; the GPU suites share the card, which changes no result).
cpu_tests=(nn_engine_test nn_strict_device_test nn_ops_test engine_config_test replicator_test cuda_backend_test
           agents_d4pg_test pjrt_test)
: > "$out/summary.txt"
run_test() {  # NAME BINARY [ARGS...]: one test binary, its XML report, log and one summary line (NAME.line)
  local name=$1 t=$2; shift 2
  local start=$(date +%s)
  (cd "$TROUPE_HOME" && timeout 240 "$t" --gtest_output="xml:$out/$name.xml" "$@") > "$out/$name.log" 2>&1
  local rc=$?
  echo "$name: $( ((rc == 0)) && echo passed || echo "FAILED (exit $rc)") in $(( $(date +%s) - start )) s, $(grep -c '^\[       OK \]' "$out/$name.log") cases ok, $(grep -c '^\[  SKIPPED \]' "$out/$name.log") skipped" > "$out/$name.line"
}
names=()
if has tests; then
  for t in "$here"/bin/*_test; do
    name=$(basename "$t")
    if ((cpu_only)) && [[ ! " ${cpu_tests[*]} " == *" $name "* ]]; then continue; fi
    [[ $name == nn_ops_pjrt_test ]] && continue  # needs a plugin: below
    names+=("$name")
    run_test "$name" "$t" &
  done
  # The CUDA suites again with asynchronous kernels (TROUPE_CUDA_ASYNC=1).
  if ((gpu)); then
    for name in cuda_backend_test nn_ops_test agents_d4pg_test; do
      [[ -x $here/bin/$name ]] || continue
      names+=("${name}_async")
      TROUPE_CUDA_ASYNC=1 run_test "${name}_async" "$here/bin/$name" &
    done
  fi
  # The PJRT backend through the XLA CUDA plugin: every op and kernel against
  # the CPU, a D4PG pixel update and GAN steps (one after another: one plugin
  # client at a time is enough for the card's memory).
  if ((!cpu_only)) && [[ -n $pjrt_cuda ]]; then
    names+=(pjrt_cuda_pjrt_test pjrt_cuda_nn_ops_pjrt_test pjrt_cuda_steps_d4pg pjrt_cuda_steps_gan)
    (
      export TROUPE_PJRT_PLUGIN=$pjrt_cuda
      run_test pjrt_cuda_pjrt_test "$here/bin/pjrt_test"
      run_test pjrt_cuda_nn_ops_pjrt_test "$here/bin/nn_ops_pjrt_test"
      run_test pjrt_cuda_steps_d4pg "$here/bin/agents_d4pg_test" --gtest_filter='*Pjrt*'
      run_test pjrt_cuda_steps_gan "$here/bin/gan_trainer_test" --gtest_filter='*Pjrt*'
    ) &
  fi
fi
wait
passed=0; failed=0
for name in "${names[@]}"; do
  line=$(cat "$out/$name.line" 2>/dev/null || echo "$name: FAILED (no result)")
  echo "$line" | tee -a "$out/summary.txt"
  rm -f "$out/$name.line"
  if [[ $line == "$name: passed"* ]]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
has tests && echo "tests done at $(( $(date +%s) - t0 )) s" | tee -a "$out/summary.txt"
# The NCCL the CUDA suite ran with (2.30+ lets two ranks share the GPU).
grep -m 1 '^NCCL [0-9]' "$out/cuda_backend_test.log" 2>/dev/null | tee -a "$out/summary.txt"
# A failed CUDA suite: its failed cases again under compute-sanitizer's
# memcheck (out-of-bounds and misaligned accesses, API errors), for the log.
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if ((gpu)) && [[ -n $sanitizer ]] && has tests; then
  for name in cuda_backend_test nn_ops_test; do
    cases=$(sed -n 's/^\[  FAILED  \] \([A-Za-z0-9_/.]*\) .*/\1/p' "$out/$name.log" 2>/dev/null | sort -u | paste -sd: -)
    [[ -z $cases ]] && continue
    (cd "$TROUPE_HOME" && timeout 90 "$sanitizer" --tool memcheck "$here/bin/$name" --gtest_filter="$cases") \
      > "$out/${name}_memcheck.log" 2>&1
    echo "$name's failed cases under memcheck: exit $? ($(grep -c 'Invalid\|Error' "$out/${name}_memcheck.log") error lines)" | tee -a "$out/summary.txt"
  done
fi

# Benchmarks, one at a time, GPU first; each skipped once the budget is spent.
if ((!cpu_only)); then
  bench() {  # NAME ARGS...: troupe bench NAME ARGS --json, its output kept
    local tag=$1; shift
    if (( $(left) < 30 )); then echo "troupe bench $* : skipped (budget spent)" | tee -a "$out/summary.txt"; return; fi
    local start=$(date +%s)
    timeout "$(capped 300)" "$here/bin/troupe" bench "$@" --json "$out/bench_$tag.json" > "$out/bench_$tag.txt" 2>&1
    echo "troupe bench $* : exit $? in $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
  }
  d4pg() {  # DEVICE BATCH [TAG]: D4PG pixel updates/s (the environment's TROUPE_CUDA_* apply; TAG peers: PyTorch and JAX beside it)
    if (( $(left) < 30 )); then return; fi
    local file="$out/bench_d4pg_$1_$2${3:+_$3}.txt"
    local peers=()
    [[ ${3:-} == peers ]] && peers=(--peers)
    timeout "$(capped 200)" "$here/bin/d4pg_bench" "${peers[@]}" pixels "$2" "$(nproc)" 50 32 1024 "$1" > "$file" 2>&1
    echo "d4pg_bench pixels batch $2 on $1${3:+ ($3)}: $(grep 'updates/s' "$file" | tail -n 1)" | tee -a "$out/summary.txt"
  }
  if ((gpu)) && has gpu; then
    bench learner_cuda learner --device cuda --seconds 3
    bench gan_cuda gan --device cuda --seconds 3
    for device in cuda cuda-bf16; do d4pg "$device" 256; done
    # Synchronous against asynchronous kernels, and where a step's time goes
    # (TROUPE_CUDA_PROFILE=1: a table per backend at the end of its log).
    TROUPE_CUDA_ASYNC=1 d4pg cuda 256 async
    TROUPE_CUDA_PROFILE=1 d4pg cuda 256 profile
    if [[ -n $pjrt_cuda ]]; then
      # One compiled program per step against JAX jit, kernel at a time, the
      # CUDA backend and PyTorch eager; then the D4PG pixel update compiled.
      # The bars: the DrQ step at batch 256 and 1024, float32 and bfloat16,
      # against PyTorch and JAX; the D4PG update at 256 against the PyTorch
      # and JAX updates; the GAN step at 256 and 4096 against PyTorch.
      bench learner_pjrt_cuda learner --device pjrt --pjrt-plugin "$pjrt_cuda" --seconds 3
      TROUPE_PJRT_PLUGIN=$pjrt_cuda d4pg pjrt 256 peers
      bench gan_pjrt_cuda gan --device pjrt --pjrt-plugin "$pjrt_cuda" --seconds 3
      TROUPE_PJRT_PLUGIN=$pjrt_cuda d4pg pjrt 1024
    fi
    for device in cuda cuda-bf16; do d4pg "$device" 1024; done
  fi
  if ((gpu)) && has job; then
    # Writes its projection, scaling_cuda.csv and .png, into the working directory: the results.
    (cd "$out" && bench scaling_cuda scaling --device cuda --seconds 3)
    # The main job with its learner on the GPU, for what the budget leaves
    # (at most five minutes): its curves (no evaluation videos: the bundle
    # carries no FFmpeg).
    seconds=$(( $(capped 340) - 40 ))
    if ((seconds >= 60)); then
      timeout "$seconds" "$here/bin/troupe" run "$TROUPE_HOME/configs/cartpole_swingup.textproto" \
        --set learner.engine.device=GPU --set evaluator.record_video=false --set runs_dir="$out/runs" \
        > "$out/run_gpu.txt" 2>&1
      rc=$?
      # Which path device GPU took, as the learner said it.
      path=$(grep -rho 'engine.device GPU: [^(]*' "$out/runs" "$out/run_gpu.txt" 2>/dev/null | head -n 1)
      echo "troupe run cartpole_swingup, learner on the GPU (${path:-path not said}), $seconds s: exit $rc ($(tail -n 1 "$out/run_gpu.txt"))" | tee -a "$out/summary.txt"
    else
      echo "troupe run cartpole_swingup on the GPU: skipped (budget spent)" | tee -a "$out/summary.txt"
    fi
  fi
  if has cpu; then
    bench learner learner --seconds 3
    d4pg cpu 256
    # TLS + token against plain gRPC on the insert path, on this machine's
    # cores (the 2-core development machines put both ends of ~500 MB/s of
    # AES-GCM on the same two cores).
    bench replay_tls replay --only tls
  fi
fi
echo "$passed passed, $failed failed" >> "$out/summary.txt"
# Everything as one file too (for a transfer that takes few files).
tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
echo "results: $out (and $out.tar.gz)"
echo "$passed passed, $failed failed"
((failed == 0))
