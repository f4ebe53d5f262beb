#!/usr/bin/env bash
# Runs a `cargo test` command that selects tests by name, and fails when the selection ran nothing.
# cargo exits 0 when a filter matches no test (a renamed module once made `make fuzz` pass without
# running any of the properties it reports), so every filtered run in the Makefile goes through here.
#
#   hack/selected-tests.sh MIN cargo test -p CRATE ... -- FILTER...
#
# MIN is the least number of tests the selection must run (at least 1). Prints how many ran.
set -euo pipefail
min=${1:?usage: selected-tests.sh MIN cargo test ...}
shift
[ "$min" -ge 1 ] || { echo "selected-tests.sh: MIN must be at least 1" >&2; exit 2; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$@" 2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
# libtest prints one `test result: ok. N passed; ...` line per test binary.
ran=$(sed -n 's/^test result: [a-zA-Z]*\. \([0-9][0-9]*\) passed.*/\1/p' "$log" | awk '{ s += $1 } END { print s + 0 }')
echo "selected-tests.sh: $ran tests ran (at least $min expected): $*"
if [ "$ran" -lt "$min" ]; then
  echo "selected-tests.sh: the selection ran $ran tests, fewer than $min: a filter that matches nothing passes silently" >&2
  exit 1
fi
