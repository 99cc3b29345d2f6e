# Sourced by the bundle's tests: a bare Debian 12 root (debootstrap minbase,
# none of troupe's packages), made once per machine under /var/cache/troupe
# and copied for each run. Tests that start together wait for one another's
# debootstrap (a lock per root) rather than each making its own.
#   bare_root NAME [PACKAGE,...]   sets $base to the cached root (with
#                                  PACKAGEs included); exits 77, saying so,
#                                  when debootstrap cannot make it (offline)
#   no_troupe_libraries ROOT       fails when ROOT holds troupe's libraries
#                                  (the test would prove nothing)
bare_root() {
  base=/var/cache/troupe/$1
  local include=${2:-}
  mkdir -p "$(dirname "$base")"
  local lock
  exec {lock}>"$base.lock"
  flock "$lock"
  if [[ ! -x "$base/bin/bash" ]]; then
    "$top/tools/install_deps.sh" bundle >&2
    local mirror
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)
    rm -rf "$base.tmp" && mkdir -p "$(dirname "$base")"
    if ! debootstrap --variant=minbase ${include:+--include=$include} bookworm "$base.tmp" \
        "${mirror:-http://deb.debian.org/debian}" > "$base.log" 2>&1; then
      tail -n 5 "$base.log" >&2
      echo "skipped: debootstrap could not make a Debian 12 root (offline?)"
      exit 77
    fi
    mv "$base.tmp" "$base"
  fi
  exec {lock}>&-
}

no_troupe_libraries() {
  if ls "$1"/usr/lib/x86_64-linux-gnu/ | grep -E '^lib(grpc|protobuf|mujoco|absl|mpi)' > /dev/null; then
    echo "the bare root $1 holds troupe's libraries already" >&2
    exit 1
  fi
}
