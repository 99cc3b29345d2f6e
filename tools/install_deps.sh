#!/usr/bin/env bash
# Installs the Debian 12 packages troupe builds, tests and runs with.
# Idempotent: packages already present are skipped; apt-get runs only when
# something is missing. Called by both README commands (run and test).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libmujoco-dev libqhull-dev          # physics (MuJoCo 2.2.2; its CMake config names qhull's headers)
  libegl-dev libegl-mesa0 libgl-dev libopengl-dev libgles-dev  # headless EGL rendering (Mesa)
  libeigen3-dev                       # learner engine GEMM
  libgtest-dev libgmock-dev           # tests
  clang                               # tests: clang's -Wthread-safety over the lock annotations
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev  # wire + config
  libzstd-dev liblz4-dev              # frame compression
  libpng-dev                          # PNG output (goldens, curves, sample grids)
  libavcodec-dev libavformat-dev libswscale-dev libavutil-dev  # evaluation videos: MP4, H.264 (Debian's libavcodec has libx264)
  chromium                            # tests only: troupe report's HTML rendered headless
  libsdl2-dev                         # viewer
  libcli11-dev libspdlog-dev          # command line, logging
  libopenmpi-dev openmpi-bin          # Replicator MPI backend
  dataset-fashion-mnist               # GAN mode and the FID classifier (IDX files)
  xvfb xauth                          # viewer tests in a real window
  debootstrap patchelf                # the relocatable bundle (tools/bundle.sh) and its bare-root test
  slurm-wlm munge iproute2            # troupe run --slurm (sbatch, srun, ...); its test's private Slurm (ss: free ports)
  python3-venv                        # tests and benches: PyPI peers and PJRT CPU plugins in venvs under build/
  openssl libssl-dev                  # troupe certs (the openssl command); TLS key checks (libcrypto)
  pybind11-dev python3-dev python3-numpy python3-pytest  # the Python package (python/) and its tests
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install_deps: missing Debian packages: ${missing[*]}" >&2
  echo "install_deps: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "install_deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
