#!/usr/bin/env bash
# The relocatable bundle (tools/bundle.sh) in a bare Debian 12 root made by
# debootstrap, with none of troupe's packages: its CPU tests must pass there
# (run.sh --cpu-only) with only what the bundle carries, plus CUDA's own
# libraries where a GPU machine keeps them (/usr/local/cuda/lib64, copied in
# from this machine's toolkit, mounted read-only, when the build uses CUDA).
# Usage: tests/bundle_bare_root_test.sh BUILD_DIR   (as root; ctest runs it)
set -euo pipefail
if [[ $(id -u) -ne 0 ]]; then echo "skipped: needs root (debootstrap, chroot, bind mounts)"; exit 77; fi
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "$1" && pwd)
work=$(mktemp -d /tmp/troupe-bundle-test.XXXXXX)
root="$work/root"
cleanup() {
  for m in usr/local/cuda/lib64 proc dev; do umount -l "$root/$m" 2>/dev/null || true; done
  # Never into a mount that outlived its umount (the host's /dev, /proc).
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

"$top/tools/bundle.sh" --from "$build" "$work/troupe"

source "$top/tests/bare_root.sh"
# The lease rehearsal's root (python3 is all it adds; the bundle uses none of
# it): one debootstrap serves both tests.
bare_root bare-debian-12-python python3
cp -a "$base" "$root"
no_troupe_libraries "$root"
cp -a "$work/troupe" "$root/opt/troupe"
# (grep reads all of ldd's output: an early exit would fail the pipeline.)
if ldd "$build/cli/troupe" | grep libcublas > /dev/null; then
  # Where a GPU machine keeps them: the toolkit's, mounted read-only.
  cuda_lib=$(dirname "$(ldd "$build/cli/troupe" | awk '/libcublas\./ {print $3}')")
  mkdir -p "$root/usr/local/cuda/lib64"
  mount --bind -o ro "$cuda_lib" "$root/usr/local/cuda/lib64"
fi
# /proc for /proc/self/exe, /dev for /dev/null (best effort: TROUPE_HOME covers the former).
for m in proc dev; do mount --bind "/$m" "$root/$m" || echo "could not bind-mount /$m into the root"; done
status=0
chroot "$root" /opt/troupe/run.sh --cpu-only /opt/results > "$work/run.log" 2>&1 || status=$?
cat "$work/run.log"
last=$(tail -n 1 "$work/run.log")
if [[ $status -ne 0 || ! "$last" =~ ^[1-9][0-9]*\ passed,\ 0\ failed$ ]]; then
  echo "bundle tests in the bare root failed (exit $status); logs:" >&2
  for f in "$root"/opt/results/*.log; do grep -lq "FAILED\|error" "$f" && { echo "== $f"; tail -n 30 "$f"; }; done >&2 || true
  exit 1
fi
