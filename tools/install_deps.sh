#!/usr/bin/env bash
# Installs the Debian 12 packages a use of troupe needs, and only those.
#   tools/install_deps.sh [GROUP...]          install what is missing (default: run)
#   tools/install_deps.sh --print [GROUP...]  print the groups' packages, one per line
# Groups:
#   run      building troupe and running it: `./troupe` (the main job, GAN
#            mode, the viewer, MPI learners, troupe certs)
#   python   run + what `pip install .` (pyproject.toml) builds the Python
#            module with: pybind11, Python's headers, venv
#   test     run + python + what the tests and benchmarks need: `tools/test.sh`
#   slurm    a private Slurm for the Slurm tests (tests/slurm_cluster.sh)
#   bundle   the relocatable bundle (tools/bundle.sh) and its bare-root test
#   browser  headless Chromium: troupe report's page rendered in a test
#            (viz/report_test.cc); `troupe report` itself needs no browser
#   asan     the sanitizer runtimes: `tools/test.sh asan`
# Idempotent: apt-get runs only when something is missing. As root it
# installs (one installer at a time: parallel tests may each ask for a
# group); otherwise it names what is missing, prints the apt-get command and
# exits 1. tests/install_deps_test.sh checks that run stays a strict subset of
# test with none of the test-only packages.
set -euo pipefail

run=(
  build-essential cmake ninja-build pkg-config
  libmujoco-dev libqhull-dev          # physics (MuJoCo 2.2.2; its CMake config names qhull's headers)
  libegl-dev libegl-mesa0 libgl-dev libopengl-dev libgles-dev  # headless EGL rendering (Mesa)
  libeigen3-dev                       # learner engine GEMM
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libabsl-dev  # wire + config
  libzstd-dev liblz4-dev              # frame compression
  libpng-dev                          # PNG output (goldens, curves, sample grids)
  libavcodec-dev libavformat-dev libswscale-dev libavutil-dev  # evaluation videos: MP4, H.264 (Debian's libavcodec has libx264)
  libsdl2-dev                         # viewer
  libcli11-dev libspdlog-dev          # command line, logging
  libgoogle-perftools-dev             # tcmalloc, the programs' malloc (CMakeLists.txt TROUPE_TCMALLOC)
  libopenmpi-dev openmpi-bin          # Replicator MPI backend (mpirun -np K troupe learner)
  dataset-fashion-mnist               # GAN mode and the FID classifier (IDX files)
  openssl libssl-dev                  # troupe certs (the openssl command); TLS key checks (libcrypto)
)
python=(
  pybind11-dev python3-dev            # the Python module (python/), built by CMake or by pip
  python3-venv                        # a venv to pip install it into
)
test_only=(
  libgtest-dev libgmock-dev           # the C++ tests (CMake builds them when TROUPE_TESTS is on)
  ccache                              # a rebuild in any checkout on this machine from the cache (CMakeLists.txt)
  clang                               # ThreadSafety.*: clang's -Wthread-safety over the lock annotations
  xvfb xauth                          # viewer tests in a real window
  python3 python3-numpy python3-pytest  # the Python tests (Debian's numpy), tools' tests;
                                      # PyPI peers and PJRT CPU plugins in venvs under build/ (python3-venv)
  iproute2                            # ip netns, veth and tc netem (tests/network_end_to_end_test.cc); ss
                                      # (free ports, tests/slurm_cluster.sh)
  libtorch-dev                        # GanReferenceTest: the libtorch reference GAN the FID comparison
                                      # stands on (bench/gan_reference_test.cc); never linked into troupe
)
slurm=(slurm-wlm munge)               # sbatch, srun, slurmctld, slurmd, munged (ss: test's iproute2)
bundle=(debootstrap patchelf)         # the bundle's RUNPATHs; the bare Debian root it is tested in
browser=(chromium)
asan=(libasan8 libubsan1)             # GCC's runtimes (build-essential's gcc-12 brings them; named here)

# The packages of one group, on stdout, one per line.
group_packages() {
  case $1 in
    run) printf '%s\n' "${run[@]}" ;;
    python) printf '%s\n' "${run[@]}" "${python[@]}" ;;
    test) printf '%s\n' "${run[@]}" "${python[@]}" "${test_only[@]}" ;;
    slurm) printf '%s\n' "${slurm[@]}" ;;
    bundle) printf '%s\n' "${bundle[@]}" ;;
    browser) printf '%s\n' "${browser[@]}" ;;
    asan) printf '%s\n' "${asan[@]}" ;;
    *) echo "install_deps: unknown group '$1' (run, python, test, slurm, bundle, browser, asan)" >&2; return 2 ;;
  esac
}

print=0
if [[ ${1:-} == --print ]]; then
  print=1
  shift
fi
groups=("$@")
((${#groups[@]} > 0)) || groups=(run)
packages=()
for g in "${groups[@]}"; do
  listed=$(group_packages "$g") || exit 2
  mapfile -t -O "${#packages[@]}" packages <<<"$listed"
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | awk '!seen[$0]++')

if ((print)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install_deps: missing Debian packages (${groups[*]}): ${missing[*]}" >&2
  echo "install_deps: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

# One installer at a time; apt-get also waits for anyone else's dpkg lock.
exec 9>/var/lock/troupe-install-deps.lock
flock 9
echo "install_deps: installing (${groups[*]}) ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}" >/dev/null
