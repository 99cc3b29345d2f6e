#!/usr/bin/env bash
# Checks that every #include runs down the layers: a folder includes only
# itself and the folders listed for it below (the layer table of
# docs/design.md says the same; tools/check_docs.py keeps the two equal,
# so change both together). Prints each include
# that runs up or sideways with file and line, and exits 1 if there is one.
# One more rule of where code lives: an algorithm is named only in agents/
# (each agent and the registry, agents/agents.h) and in what compares or
# configures them (bench/, configs/, the config schema's per-agent
# messages in proto/config.proto, tests); every other part reaches its
# agent through the Agent interface. A source, proto or CMake file elsewhere
# that names D4PG or APPO is printed with its line.
#   tools/check_layers.sh [ROOT]     ROOT: the source tree (default: this one)
# ctest runs it as Layers.IncludesRunDownOnly (tests/CMakeLists.txt).
set -euo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}

# folder: the troupe folders it may include besides itself.
declare -A allowed=(
  [proto]=""
  [common]="proto"
  [engine]="common proto"
  [envs]="common proto"
  [replay]="common proto"
  [agents]="engine envs replay common proto"
  [gan]="engine common proto"
  [actors]="agents envs replay engine common proto"
  [learner]="actors agents envs replay engine common proto"
  [launch]="learner actors agents gan envs replay engine common proto"
  [viz]="actors agents envs engine common proto"
  [bench]="launch learner actors agents gan envs replay engine common proto"
  [cli]="bench viz launch learner actors agents gan envs replay engine common proto"
  [python]="viz agents envs replay engine common proto"  # the Python package binds what it includes
  [tests]="common proto"  # end-to-end tests drive processes; a few also call services (wire schemas, credentials)
)
folders=" ${!allowed[*]} "

status=0
for folder in "${!allowed[@]}"; do
  [[ -d "$root/$folder" ]] || continue
  while IFS= read -r hit; do
    # hit: path:line:#include "top/..."
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    target=$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$rest")
    [[ "$target" == "$folder" ]] && continue
    [[ "$folders" == *" $target "* ]] || continue  # not a troupe folder (absl/, gtest/, google/, ...)
    [[ " ${allowed[$folder]} " == *" $target "* ]] && continue
    echo "${file#"$root"/}:$line: $folder/ includes $target/, which is not below it (${folder}/ may include: ${allowed[$folder]:-nothing})"
    status=1
  done < <(grep -rnE '^\s*#\s*include "[a-z_]+/' "$root/$folder" --include='*.h' --include='*.cc' --include='*.cu' || true)
done

while IFS= read -r hit; do
  echo "${hit#"$root"/}: names an algorithm outside agents/ (reach it through agents/agent.h)"
  status=1
done < <(grep -rniE '\b(d4pg|appo)' "$root" --include='*.h' --include='*.cc' --include='*.cu' --include='*.proto' \
           --include='CMakeLists.txt' --include='*.cmake' \
           --exclude='*_test.cc' --exclude=config.proto --exclude=SlowTests.cmake \
           --exclude-dir=agents --exclude-dir=bench --exclude-dir=configs --exclude-dir=tests --exclude-dir=testing \
           --exclude-dir=build --exclude-dir=.git --exclude-dir=.bundle | cut -d: -f1,2 || true)
if ((status == 0)); then echo "check_layers: every include runs down the layers, and no algorithm is named outside agents/"; fi
exit $status
