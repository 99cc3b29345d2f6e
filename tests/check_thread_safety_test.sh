#!/usr/bin/env bash
# tools/check_thread_safety.sh must fail, naming file and variable, on a
# source that touches a guarded member without its mutex, and pass the same
# source once it holds the lock.
set -euo pipefail
check="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tools/check_thread_safety.sh"
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/common" "$tree/build"
write_source() {  # $1: the body of Counter::Add
  cat > "$tree/common/counter.cc" <<CC
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
class Counter {
 public:
  void Add() { $1 }
 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};
int main() { Counter c; c.Add(); }
CC
}
cat > "$tree/build/compile_commands.json" <<JSON
[
{
  "directory": "$tree/build",
  "command": "/usr/bin/c++ -std=c++20 -o counter.o -c $tree/common/counter.cc",
  "file": "$tree/common/counter.cc"
}
]
JSON
write_source "++n_;"
if "$check" "$tree/build" "$tree" > "$tree/bad.out" 2>&1; then echo "FAIL: unguarded access passed"; cat "$tree/bad.out"; exit 1; fi
grep -q "counter.cc.*n_.*requires holding mutex 'mu_'" "$tree/bad.out" || { echo "FAIL: no report:"; cat "$tree/bad.out"; exit 1; }
write_source "absl::MutexLock lock(&mu_); ++n_;"
"$check" "$tree/build" "$tree" > "$tree/good.out" 2>&1 || { echo "FAIL: guarded access refused:"; cat "$tree/good.out"; exit 1; }
echo "PASS"
