#!/usr/bin/env bash
# The N (default 10) slowest tests in the output of `make test`'s cargo call: libtest's result
# lines with their times (`test NAME ... ok <1.234s>`, scripts/test-runner.sh), each named with
# the test binary cargo said it was running.
#
#   scripts/slowest-tests.sh LOG [N]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/slowest-tests.sh LOG [N]" >&2; exit 2; }
log="$1"
n="${2:-10}"
times="$(awk '
  /^ *Running / { bin = ($2 == "unittests") ? $3 : $2; next }
  /^ *Doc-tests / { bin = "doc-tests " $2; next }
  $1 == "test" && $3 == "..." && $NF ~ /^<[0-9.]+s>$/ {
    t = substr($NF, 2, length($NF) - 3)
    printf "%10.3f s  %-6s  %s  %s\n", t, $4, bin, $2
  }' "$log" | sort -rn | sed -n "1,${n}p")"
if [ -z "$times" ]; then
  echo "slowest tests: no test times in $log"
  exit 0
fi
echo "The $(printf '%s\n' "$times" | wc -l) slowest tests:"
printf '%s\n' "$times"
