#!/usr/bin/env bash
# A relocatable troupe for a machine without troupe's Debian packages: the
# GPU machine (driver, CUDA toolkit, Python; no gRPC, MuJoCo, abseil, ...), or
# a cluster where users cannot apt-get.
#
#   tools/bundle.sh DIR               builds Release with CUDA for x86-64-v3 in
#                                     build/bundle, troupe's libraries shared
#                                     (the programs and tests share one copy
#                                     of each), then writes DIR
#   tools/bundle.sh --from BUILD DIR  writes DIR from an existing build (tests)
#
# DIR/bin/          troupe, troupe_env_worker, d4pg_bench, the test binaries;
#                   RUNPATH $ORIGIN/../lib
# DIR/lib/          troupe's own libraries and every shared library they load
#                   that such a machine may lack
#                   (from ldd), but glibc, libstdc++/libgcc_s, the NVIDIA driver
#                   and CUDA's own runtime, cuBLAS and NCCL (run.sh finds those)
# DIR/share/troupe/ configs, MuJoCo models, test data, peer scripts (the
#                   binaries find them there: common/files.h ProjectPath)
# DIR/run.sh        runs the tests and benchmarks there; every result goes
#                   into one folder (DIR/run.sh --help)
# DIR.tar.gz (DIR packed, what travels) and the repository's tree stay under the 64 MiB a device call carries (checked).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=""
from=""
if [[ "${1:-}" == "--from" ]]; then
  build=$(cd "$2" && pwd)
  from=1
  shift 2
fi
if [[ $# -ne 1 ]]; then
  echo "usage: tools/bundle.sh [--from BUILD_DIR] DIR" >&2
  exit 2
fi
dir=$1
# patchelf (and debootstrap, for its test): the bundle group.
"$top/tools/install_deps.sh" bundle

if [[ -z "$build" ]]; then
  # The bundle carries test binaries: the test group builds them.
  "$top/tools/install_deps.sh" test
  build="$top/build/bundle"
  launchers=()
  if command -v ccache >/dev/null; then
    launchers=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
               -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$top" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_MARCH=x86-64-v3 -DTROUPE_CUDA=ON \
    -DTROUPE_TESTS=ON -DBUILD_SHARED_LIBS=ON "${launchers[@]}" >/dev/null
  cmake --build "$build"
fi

# What goes in: the programs, and the tests that matter on a GPU machine.
programs=(cli/troupe envs/troupe_env_worker bench/d4pg_bench)
tests=(engine/nn_engine_test engine/nn_strict_device_test engine/nn_ops_test engine/engine_config_test
       engine/replicator_test agents/agents_d4pg_test envs/envs_test gan/gan_trainer_test
       engine/pjrt/pjrt_test engine/nn_ops_pjrt_test)
# pjrt_test's fake plugins (the loader's error paths), beside it in bin/.
fake_plugins=(engine/pjrt/libtroupe_fake_pjrt_no_symbol.so engine/pjrt/libtroupe_fake_pjrt_version_9.so)
cuda_tests=(engine/cuda/cuda_backend_test)  # required when building here; taken if built with --from
# Never carried: glibc, the C++ runtime every Linux has, the NVIDIA driver,
# and CUDA's libraries, which the GPU machine has in its own version.
system='linux-vdso|ld-linux|/libc\.so|/libm\.so|/libpthread\.so|/libdl\.so|/librt\.so|/libresolv\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia|libcublas|libcudart|libnccl'

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib" "$dir/share/troupe"
for f in "${programs[@]}" "${tests[@]}" "${cuda_tests[@]}"; do
  if [[ ! -x "$build/$f" ]]; then
    if [[ " ${cuda_tests[*]} " == *" $f "* && -n "${from:-}" ]]; then
      echo "bundle: $f not built (a build without CUDA): left out" >&2
      continue
    fi
    echo "bundle: $build/$f not built" >&2
    exit 1
  fi
  install -m 755 "$build/$f" "$dir/bin/"
done
mkdir -p "$dir/bin/fake_plugins"
for f in "${fake_plugins[@]}"; do install -m 755 "$build/$f" "$dir/bin/fake_plugins/"; done
# Libraries, from each binary's ldd (which resolves their own dependencies too).
for f in "$dir"/bin/*; do
  [[ -f $f ]] || continue
  ldd "$f" | awk '/=> \// {print $3}' | grep -Ev "$system" || true
done | sort -u | while read -r lib; do
  install -m 644 "$(readlink -f "$lib")" "$dir/lib/$(basename "$lib")"
done
strip --strip-unneeded "$dir"/bin/* "$dir"/lib/* "$dir"/bin/fake_plugins/* 2>/dev/null || true
for f in "$dir"/bin/*; do [[ -f $f ]] && patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$dir"/lib/*; do patchelf --set-rpath '$ORIGIN' "$f"; done
# The data the binaries and tests read, in the source tree's layout.
(cd "$top" && cp -r --parents configs envs/assets envs/testdata bench/peers/*.py "$dir/share/troupe/")
install -m 755 "$top/tools/bundle_run.sh" "$dir/run.sh"
git -C "$top" describe --always --dirty > "$dir/VERSION" 2>/dev/null || echo unknown > "$dir/VERSION"

size=$(du -sm --apparent-size "$dir" | cut -f1)
# The same as one file to carry: DIR.tar.gz, unpacked with `tar xzf`. A
# device call carries it with the repository's tree (tracked and untracked
# files git does not ignore), 64 MiB in all; unpacked there, DIR's size does
# not matter (the machine's disk is 64 GiB).
tar -C "$(dirname "$dir")" -czf "$dir.tar.gz" "$(basename "$dir")"
packed=$(stat -c %s "$dir.tar.gz")
tree=0
if git -C "$top" rev-parse --git-dir > /dev/null 2>&1; then
  # (a tracked file deleted in the work tree is not carried: stat skips it)
  tree=$(cd "$top" && { git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null || true; } |
         awk '{s += $1} END {print s + 0}')
fi
mib() { echo $((($1 + 1048575) / 1048576)); }
echo "bundle: $dir: $(ls "$dir/bin" | wc -l) programs, $(ls "$dir/lib" | wc -l) libraries, ${size} MiB unpacked;" \
     "$dir.tar.gz $(mib "$packed") MiB, with the repository's tree ($(mib "$tree") MiB) $(mib $((packed + tree))) MiB of the 64 a device call carries"
if ((packed + tree > 64 * 1048576)); then
  echo "bundle: $dir.tar.gz and the repository's tree are $(mib $((packed + tree))) MiB, over the 64 MiB a device call carries" >&2
  exit 1
fi
