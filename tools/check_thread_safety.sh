#!/usr/bin/env bash
# Clang's thread-safety analysis (-Wthread-safety) over every source whose
# code or own header uses absl's lock annotations (ABSL_GUARDED_BY,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...): each is compiled syntax-only with
# clang++ and the flags of BUILD_DIR's compile_commands.json, warnings as
# errors. The build itself stays GCC; this checks what the annotations claim.
#   tools/check_thread_safety.sh BUILD_DIR [ROOT]   ROOT: the source tree (default: this one)
# ctest runs it as ThreadSafety.AnnotatedLocking (tests/CMakeLists.txt).
set -euo pipefail
build=$(cd "${1:?usage: check_thread_safety.sh BUILD_DIR [ROOT]}" && pwd)
root=$(cd "${2:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)
commands="$build/compile_commands.json"
[[ -f "$commands" ]] || { echo "check_thread_safety: no $commands (configure first)"; exit 1; }
command -v clang++ >/dev/null || { echo "check_thread_safety: clang++ not found (tools/install_deps.sh test installs clang)"; exit 1; }

# Sources with annotations in themselves or in the header of the same name.
cd "$root"
folders=$(for f in common engine envs replay agents gan actors learner launch viz cli bench; do if [[ -d $f ]]; then echo "$f"; fi; done)
annotated=$(grep -rlE 'ABSL_(GUARDED_BY|PT_GUARDED_BY|EXCLUSIVE_LOCKS_REQUIRED|SHARED_LOCKS_REQUIRED|ACQUIRED_AFTER)' \
              --include='*.h' --include='*.cc' $folders | sed -E 's/\.h$/.cc/' | sort -u)
# In a unity build (TROUPE_UNITY_BUILD) a source is compiled inside its
# target's batch file: the batches this build compiles, read once.
batches=$(grep -oE -- '-c [^ "]*/Unity/unity_[0-9]+_cxx\.cxx' "$commands" | cut -c4- | sort -u || true)
# Sources that share a batch are checked together, one clang++ call on a
# file that includes just them (they compile as one file in the build too):
# the headers are parsed once per batch, not once per source.
declare -A group_sources=() group_command=()
order=()
for source in $annotated; do
  [[ -f "$source" ]] || continue
  # This source's compile command: compiler -> clang++, no object output.
  line=$(grep -F "\"command\":" "$commands" | grep -F -- "-c $root/$source\"" | head -1 || true)
  # Else the batch that includes it: that batch's command.
  key=$source
  if [[ -z "$line" && -n "$batches" ]]; then
    batch=$(grep -lF "\"$root/$source\"" $batches 2>/dev/null | head -1 || true)
    if [[ -n "$batch" ]]; then
      line=$(grep -F "\"command\":" "$commands" | grep -F -- "-c $batch\"" | head -1 || true)
      key=$batch
    fi
  fi
  [[ -n "$line" ]] || continue
  if [[ -z ${group_command[$key]:-} ]]; then
    order+=("$key")
    group_command[$key]=$(sed -E 's/^ *"command": "//; s/",?$//; s/\\"/"/g' <<<"$line")
  fi
  group_sources[$key]+=" $source"
done
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
checked=0
for key in "${order[@]}"; do
  command=${group_command[$key]}
  unit="$scratch/unit_$checked.cc"  # (checked: the sources before this group)
  for source in ${group_sources[$key]}; do
    echo "#include \"$root/$source\"" >> "$unit"
    checked=$((checked + 1))
  done
  # The unit in place of what the command compiled (the batch or the source).
  command=$(sed -E "s| -c [^ ]+| -c $unit|" <<<"$command")
  command=$(sed -E 's/^[^ ]+ /clang++ /; s/ -o [^ ]+ / /; s/ -c / -fsyntax-only -Wthread-safety -Werror=thread-safety /' <<<"$command")
  command=${command// -Wno-maybe-uninitialized/}
  # GCC's precompiled headers (troupe_lib_pch) are not clang's: the sources
  # include what they use, so clang parses the headers itself.
  command=$(sed -E 's/ -include [^ ]*cmake_pch\.hxx//; s/ -Winvalid-pch//' <<<"$command")
  if ! output=$(cd "$build" && eval "$command" 2>&1); then
    echo "$output" | grep -E 'error|warning' | head -20
    status=1
  fi
done
((checked > 0)) || { echo "check_thread_safety: no annotated source found in $commands"; exit 1; }
((status == 0)) && echo "check_thread_safety: $checked annotated sources pass clang's -Wthread-safety"
exit $status
