#!/usr/bin/env bash
# The GPU lease rehearsed here, so the prepared call cannot rot between
# leases: the bundle of this build unpacked in a bare Debian 12 root that has
# what the GPU machine has and nothing else — no Debian -dev packages, no
# /usr/local/cuda, no NVIDIA driver; a Python virtual environment at
# /opt/torch/.venv, first on PATH, holding JAX's XLA CUDA PJRT plugin
# (jax-cuda13-pjrt, the device's version) and CUDA's libraries where the
# nvidia-* wheels put them (site-packages/nvidia/*/lib; here this machine's
# toolkit, mounted read-only, stands in for the wheels). Then run.sh runs the
# lease's whole order (docs/development.md "On a GPU machine") with an XLA
# CPU plugin standing in for the GPU plugin (--dry-run), and returns its
# files as the device does. Checked:
#   - every program's and library's dependencies resolve (the driver's
#     libcuda.so.1 aside, which nothing links);
#   - run.sh finds CUDA's libraries in the venv and the XLA CUDA plugin;
#   - the plugin passes troupe's version and table checks and fails only at
#     client creation (no GPU); engine.device GPU is refused naming why
#     each path is out;
#   - each part runs in its order, the benchmarks' rows and the job's line
#     are in summary.txt, the returned folder fits a device call's limits
#     (at most 8 files, 16 MiB each, 2 folders deep, plain names);
#   - run.sh stopped by SIGTERM (an outer timeout) still returns its files;
#   - the newest jax-cuda13-pjrt PyPI serves loads through the same checks.
# Usage: tests/lease_dry_run_test.sh BUILD_DIR  (as root; ctest runs it with
# TROUPE_PJRT_PLUGIN, the XLA CPU plugin its fixture fetched).
# TROUPE_LEASE_BUNDLE=.bundle/troupe.tar.gz rehearses that bundle (the one a
# lease carries, from tools/bundle.sh) instead of one made from BUILD_DIR.
set -euo pipefail
if [[ $(id -u) -ne 0 ]]; then echo "skipped: needs root (debootstrap, chroot, bind mounts)"; exit 77; fi
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "$1" && pwd)
cpu_plugin=${TROUPE_PJRT_PLUGIN:-}
if [[ -z $cpu_plugin || ! -e $cpu_plugin ]]; then
  echo "skipped: no XLA CPU plugin at TROUPE_PJRT_PLUGIN to stand in for the GPU one (PyPI unreachable?)"
  exit 77
fi
if ! ldd "$build/cli/troupe" | grep libcublas > /dev/null; then
  echo "skipped: this build has no CUDA backend (no toolkit): the lease's bundle needs one"
  exit 77
fi
work=$(mktemp -d /tmp/troupe-lease-test.XXXXXX)
root="$work/root"
site_rel=opt/torch/.venv/lib/python3.11/site-packages
mounts=("$site_rel/nvidia/cu13/lib" opt/cpu_plugin.so proc dev)
cleanup() {
  for m in "${mounts[@]}"; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

# The bundle (its own sizes checked against a device call's by bundle.sh).
if [[ -n ${TROUPE_LEASE_BUNDLE:-} ]]; then
  tar xzf "$TROUPE_LEASE_BUNDLE" -C "$work"
  [[ -x $work/troupe/run.sh ]] || fail "$TROUPE_LEASE_BUNDLE holds no troupe/run.sh"
else
  "$top/tools/bundle.sh" --from "$build" "$work/troupe"
fi

# JAX's CUDA PJRT plugin wheels (py3-none: any python3 installs them), once
# per machine, by the pip of the CPU plugin's venv (Debian's python3 has none).
wheels=/var/cache/troupe/wheels
pip=("$(dirname "$cpu_plugin")/bin/python" -m pip)
[[ -x ${pip[0]} ]] || pip=(python3 -m pip)
fetch_wheel() {  # VERSION: the wheel's path on stdout; exit 77 when PyPI cannot give it
  local found
  found=$(ls "$wheels"/jax_cuda13_pjrt-"$1"-*.whl 2>/dev/null | head -n 1)
  if [[ -z $found ]]; then
    mkdir -p "$wheels"
    "${pip[@]}" download --quiet --disable-pip-version-check --no-deps --only-binary=:all: -d "$wheels" \
      "jax-cuda13-pjrt==$1" >&2 || { echo "skipped: PyPI could not give jax-cuda13-pjrt==$1"; exit 77; }
    found=$(ls "$wheels"/jax_cuda13_pjrt-"$1"-*.whl | head -n 1)
  fi
  echo "$found"
}
device_version=0.11.2  # the GPU machine's jax-cuda13-pjrt (KINDS.md)
wheel=$(fetch_wheel $device_version)
newest=$("${pip[@]}" index versions jax-cuda13-pjrt 2>/dev/null | sed -n 's/^jax-cuda13-pjrt (\(.*\))$/\1/p')
[[ -n $newest ]] || fail "pip index versions jax-cuda13-pjrt named no newest version"
newest_wheel=$(fetch_wheel "$newest")

# The device-like root: Debian 12 minbase with python3, a venv first on PATH.
source "$top/tests/bare_root.sh"
bare_root bare-debian-12-python python3
cp -a "$base" "$root"
no_troupe_libraries "$root"
[[ ! -e $root/usr/local/cuda ]] || fail "the bare root has /usr/local/cuda"
chroot "$root" python3 -m venv --without-pip /opt/torch/.venv
[[ -d $root/$site_rel ]] || fail "the venv has no $site_rel"
python3 -m zipfile -e "$wheel" "$root/$site_rel/"
mkdir -p "$work/newest" && python3 -m zipfile -e "$newest_wheel" "$work/newest/"
cp -a "$work/newest/jax_plugins/xla_cuda13/xla_cuda_plugin.so" "$root/opt/newest_cuda_plugin.so"
# CUDA's libraries where the nvidia-* wheels put them: this machine's toolkit stands in.
cuda_lib=$(dirname "$(ldd "$build/cli/troupe" | awk '/libcublas\./ {print $3}')")
mkdir -p "$root/$site_rel/nvidia/cu13/lib"
mount --bind -o ro "$cuda_lib" "$root/$site_rel/nvidia/cu13/lib"
touch "$root/opt/cpu_plugin.so"
mount --bind -o ro "$(readlink -f "$cpu_plugin")" "$root/opt/cpu_plugin.so"
cp -a "$work/troupe" "$root/opt/troupe"
for m in proc dev; do mount --bind "/$m" "$root/$m"; done
in_root() { chroot "$root" env -i HOME=/root PATH=/opt/torch/.venv/bin:/usr/bin:/bin "$@"; }
plugin_path=/$site_rel/jax_plugins/xla_cuda13/xla_cuda_plugin.so

# What troupe sees there (cuBLAS where run.sh finds it: the bundle's
# programs link it, and the machine keeps it in the venv).
devices() { in_root env LD_LIBRARY_PATH="/$site_rel/nvidia/cu13/lib" /opt/troupe/bin/troupe devices "$@"; }
devices > "$work/devices.txt" 2>&1 && fail "troupe devices found a GPU path: $(cat "$work/devices.txt")"
cat "$work/devices.txt"
grep -q "^PJRT GPU plugin: $plugin_path (PJRT API 0\.[0-9]*): no client: " "$work/devices.txt" ||
  fail "troupe devices did not find the CUDA plugin, or it did not load up to its client"
grep -q "learner.engine.device GPU: no GPU path here. PJRT: .*CUDA: " "$work/devices.txt" ||
  fail "engine.device GPU's refusal does not name both paths"
# The newest plugin PyPI serves: through the version and table checks, out only at its client.
devices --pjrt-plugin /opt/newest_cuda_plugin.so > "$work/newest.txt" 2>&1 || true
grep -q "^PJRT GPU plugin: /opt/newest_cuda_plugin.so (PJRT API 0\.[0-9]*): no client: " "$work/newest.txt" ||
  fail "jax-cuda13-pjrt $newest: $(cat "$work/newest.txt")"
echo "jax-cuda13-pjrt $newest: $(grep '^PJRT GPU plugin' "$work/newest.txt")"

# The lease's call as docs/development.md writes it (under 2,000 characters),
# the bundle already unpacked at /opt/troupe, $OUT at /opt/out, the CPU
# plugin standing in for the GPU one (--dry-run).
call=$(grep -m 1 '^tar xzf .bundle/troupe.tar.gz -C /tmp && ' "$top/docs/development.md") ||
  fail "docs/development.md has no line starting 'tar xzf .bundle/troupe.tar.gz -C /tmp && '"
((${#call} <= 2000)) || fail "the documented call is ${#call} characters, over the 2,000 a device call takes"
call=${call#tar xzf .bundle/troupe.tar.gz -C /tmp && }
call=${call//\/tmp\/troupe\/run.sh//opt/troupe/run.sh --dry-run /opt/cpu_plugin.so}
call=${call//\"\$OUT\"//opt/out}
call=${call//\/tmp\/results//opt/results}
[[ $call == *"/opt/troupe/run.sh --dry-run"*"--return /opt/out /opt/results" ]] || fail "unexpected call: $call"
echo "the documented call, rehearsed: $call"
status=0
in_root bash -c "$call" > "$work/run.log" 2>&1 || status=$?
cat "$root/opt/results/summary.txt"
grep -q "CUDA library libcublas.so.13: /$site_rel/nvidia/cu13/lib" "$root/opt/results/env.txt" ||
  fail "run.sh did not find cuBLAS in the venv's nvidia folders: $(grep 'CUDA library' "$root/opt/results/env.txt")"
grep -q "^libraries not found: none$" "$root/opt/results/env.txt" ||
  fail "unresolved libraries: $(grep '^libraries not found' "$root/opt/results/env.txt")"
grep -q "PJRT plugin for the compiled step: /opt/cpu_plugin.so" "$root/opt/results/env.txt" || fail "no stand-in plugin"
summary=$root/opt/results/summary.txt
# Each part, in its order.
[[ "$(grep -o '^== [a-z]*' "$summary" | paste -sd' ')" == "== pjrt == correct == tests == job == cuda" ]] ||
  fail "the parts ran out of order: $(grep '^== ' "$summary")"
grep -q "^troupe bench learner --device pjrt .*: exit 0 " "$summary" || fail "the compiled DrQ step's bench"
grep -q "one program per step, bfloat16" "$root/opt/results/bench_learner_pjrt.txt" || fail "no bfloat16 row"
grep -q "PyTorch on the GPU, eager" "$root/opt/results/bench_learner_pjrt.txt" || fail "no PyTorch eager row"
! grep -q "PyTorch on the GPU, compile" "$root/opt/results/bench_learner_pjrt.txt" || fail "--fast-peers ran torch.compile"
grep -q "^d4pg_bench pixels batch 32 on pjrt (per2): exit 0: .*updates/s" "$summary" || fail "the D4PG row, 2 per execution"
grep -qE "^pjrt: 0\.50 program executions per update \(and [0-9.]+ frame table scatters\), 100% of the steps replayed" "$root/opt/results/bench_d4pg_pjrt_32_per2.txt" ||
  fail "2 updates per execution, replayed: $(grep '^pjrt:' "$root/opt/results/bench_d4pg_pjrt_32_per2.txt")"
grep -q "^\[per2\] replay of 512 transitions, .*into the device frame table" "$summary" &&
  grep -qE "^\[per2\] pjrt: .* ms of host time per update outside the executions" "$summary" ||
  fail "the 2-per-execution row on the learner's own input, and its host time, in summary.txt"
# Then one per execution on the same input (the host-time bar of one update an execution).
grep -q "^d4pg_bench pixels batch 32 on pjrt (per1): exit 0: .*updates/s" "$summary" || fail "the D4PG row, 1 per execution"
grep -qE "^\[per1\] pjrt: 1\.00 program executions per update" "$summary" &&
  grep -qE "^\[per1\] pjrt: the learner's thread used .* ms of CPU per update: .* troupe's own" "$summary" ||
  fail "the 1-per-execution row and its host time in summary.txt: $(grep '^\[per1\]' "$summary")"
grep -q "^d4pg_bench pixels batch 32 on pjrt (peers): exit 0: .*updates/s" "$summary" || fail "the D4PG update's row"
grep -q "^pjrt_steps_d4pg: passed" "$summary" || fail "the D4PG PJRT-vs-CPU tests on the stand-in"
grep -q "^troupe run cartpole_swingup_state, .*exit [0-9]*; " "$summary" || fail "the job's line"
grep -q "^cuda: no GPU answers" "$summary" || fail "the cuda part"
tail -n 1 "$summary" | grep -qE '^[1-9][0-9]* passed, 0 failed$' || fail "run.sh: $(tail -n 1 "$summary") (exit $status)"
[[ $status -eq 0 ]] || fail "run.sh exit $status"
# What comes back from a device call: at most 8 files, 16 MiB each, 2
# folders deep, named in letters, digits, '.', '_' and '-'.
files=$(cd "$root/opt/out" && find . -type f | sort)
echo "returned: $(echo "$files" | paste -sd' ')"
(( $(echo "$files" | wc -l) <= 8 )) || fail "more than 8 files returned"
while read -r f; do
  [[ $f =~ ^\./([A-Za-z0-9._-]+/){0,2}[A-Za-z0-9._-]+$ ]] || fail "returned file $f: too deep or an odd name"
  (( $(stat -c %s "$root/opt/out/$f") <= 16 * 1024 * 1024 )) || fail "returned file $f is over 16 MiB"
done <<< "$files"
for f in summary.txt env.txt results.tar.gz; do [[ -f $root/opt/out/$f ]] || fail "$f not returned"; done
listing=$(tar tzf "$root/opt/out/results.tar.gz")
grep -q "results/bench_learner_pjrt.json" <<< "$listing" || fail "the results tar has no bench JSON"
! grep -q "/checkpoints/" <<< "$listing" || fail "the results tar carries checkpoints"

# Stopped by an outer timeout mid-part (a lease's 550 s end in the middle
# of a part): the outer timeout told to stop once the pjrt part has begun,
# as a machine's load cannot move that moment into run.sh's set-up; what
# ran still comes back.
chroot "$root" env -i HOME=/root PATH=/opt/torch/.venv/bin:/usr/bin:/bin timeout -s TERM 600 /opt/troupe/run.sh \
  --parts pjrt --return /opt/out2 --dry-run /opt/cpu_plugin.so /opt/results2 > "$work/run2.log" 2>&1 &
outer=$!  # chroot and env exec: timeout's own pid
for _ in $(seq 1 240); do
  grep -q '^== pjrt' "$root/opt/results2/summary.txt" 2>/dev/null && break
  sleep 0.5
done
if ! grep -q '^== pjrt' "$root/opt/results2/summary.txt"; then
  kill -TERM "$outer"
  fail "the pjrt part did not begin within 120 s: $(tail -n 20 "$work/run2.log")"
fi
sleep 3
# And run.sh a second TERM just after, as timeout's signal to its process
# group can land while run.sh's handler runs (under load; a handler that
# reset TERM to its default then died before returning anything). 32 MiB
# of noise in its results make its handler pack for about a second, so the
# second TERM lands inside the handler on any machine, not by luck.
head -c 32M /dev/urandom > "$root/opt/results2/noise.bin"
runsh=$(pgrep -o -f '^bash /opt/troupe/run.sh --parts pjrt --return /opt/out2') || fail "no run.sh found to stop"
kill -TERM "$outer"
sleep 0.05
kill -TERM "$runsh" 2>/dev/null || fail "run.sh had stopped within 50 ms of the first TERM, before its handler packed"
status2=0
wait "$outer" || status2=$?
((status2 != 0)) || fail "run.sh was not stopped by SIGTERM (exit 0)"
grep -q "^stopped by SIGTERM" "$root/opt/out2/summary.txt" ||
  fail "no 'stopped by SIGTERM' in the returned summary: $(cat "$root/opt/out2/summary.txt" 2>&1); its log: $(tail -n 20 "$work/run2.log")"
[[ -s $root/opt/out2/results.tar.gz ]] || fail "no results tar after SIGTERM"
echo "lease dry run: every part ran in order, $(tail -n 1 "$summary"); stopped by SIGTERM mid-part, its files came back"
