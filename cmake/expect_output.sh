#!/bin/sh
# A test that passes only when its command exits 0 AND prints (stdout and
# stderr together) a line matching an extended regular expression; ctest's
# PASS_REGULAR_EXPRESSION alone passes on the output whatever the exit code.
# The output is shown as it was.
#   expect_output.sh REGEX COMMAND [ARG...]
if [ $# -lt 2 ]; then
  echo "usage: $0 REGEX COMMAND [ARG...]" >&2
  exit 2
fi
regex=$1
shift
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
code=$?
cat "$out"
if [ "$code" -ne 0 ]; then
  echo "FAILED: $1 exited $code (it must exit 0 and print a line matching: $regex)"
  exit 1
fi
if ! grep -Eq -- "$regex" "$out"; then
  echo "FAILED: $1 exited 0 without printing a line matching: $regex"
  exit 1
fi
