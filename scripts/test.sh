#!/usr/bin/env bash
# The whole test suite: sets up (installs and builds what is missing), runs every Meson test
# (unit, MPI at 2 and 4 ranks, end to end), and ends with the line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

log=$(mktemp)
meson test -C build --print-errorlogs "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
count() { awk -v key="$1" -F: '$1 == key { gsub(/ /, "", $2); print $2 }' "$log" | tail -n 1; }
passed=$(( $(count "Ok") + $(count "Expected Fail") ))
failed=$(( $(count "Fail") + $(count "Unexpected Pass") + $(count "Timeout") ))
skipped=$(count "Skipped")
rm -f "$log"
[ "${skipped:-0}" -gt 0 ] && echo "$skipped skipped (see the reasons above)"
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "$passed passed, $failed failed"
exit "$status"
