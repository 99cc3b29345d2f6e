#!/usr/bin/env bash
# Installs XLA CPU PJRT plugins from PyPI into a virtual environment DIR, for
# the PJRT backend's tests (ctest -L pjrt), and links them at fixed names:
#   DIR/pjrt_cpu_plugin.so       lammps-jax-pjrt-cpu: a current XLA CPU plugin (PJRT API 0.115)
#   DIR/pjrt_cpu_plugin_0.81.so  xla-cpu-pjrt: OpenXLA's CPU plugin at API 0.81, troupe's baseline
#   DIR/include/pjrt_c_api.h     the C API header xla-cpu-pjrt ships (the layout check reads it)
# The plugins alone (--no-deps: the JAX and SciPy they name are not what is
# loaded; 600 MB less to fetch). Offline (PyPI unreachable) it says so and
# exits 0: the pjrt tests then skip.
# Where PyPI answers but the plugins cannot be installed, it fails (exit 1).
#   tools/pjrt_cpu_plugin.sh DIR
set -uo pipefail
dir=${1:?usage: pjrt_cpu_plugin.sh DIR}
requirements="lammps-jax-pjrt-cpu==0.11.2 xla-cpu-pjrt==0.0.1"
if [[ -f $dir/.installed && $(cat "$dir/.installed") == "$requirements" && -e $dir/pjrt_cpu_plugin.so ]]; then
  echo "PJRT CPU plugins already in $dir"
  exit 0
fi
echo "installing PJRT CPU plugins ($requirements) into $dir (about 130 MB from PyPI)"
if ! python3 -m venv "$dir" >/dev/null 2>&1; then
  echo "skipped: cannot make a virtual environment in $dir (apt-get install python3-venv)"
  exit 0
fi
# Whether the package index answers at all (pip's own index settings).
if ! timeout 120 "$dir/bin/pip" index versions lammps-jax-pjrt-cpu >/dev/null 2>&1; then
  echo "skipped: PyPI not reachable; the PJRT tests skip"
  exit 0
fi
if ! timeout 540 "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps $requirements 2>&1 | tail -3; then
  echo "PyPI answers, but $requirements could not be installed into $dir" >&2
  exit 1
fi
site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
current=$site/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so
baseline=$site/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so
header=$site/xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h
for f in "$current" "$baseline" "$header"; do
  [[ -e $f ]] || { echo "$f is not in the installed wheels ($requirements)" >&2; exit 1; }
done
mkdir -p "$dir/include"
ln -sf "$current" "$dir/pjrt_cpu_plugin.so"
ln -sf "$baseline" "$dir/pjrt_cpu_plugin_0.81.so"
ln -sf "$header" "$dir/include/pjrt_c_api.h"
echo "$requirements" > "$dir/.installed"
echo "PJRT CPU plugins: $dir/pjrt_cpu_plugin.so (current), $dir/pjrt_cpu_plugin_0.81.so (baseline)"
