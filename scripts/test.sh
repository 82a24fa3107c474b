#!/usr/bin/env bash
# The whole test suite: sets up (installs and builds what is missing), runs every Meson test
# (unit, MPI at 2 and 4 ranks, end to end), then builds again with AddressSanitizer and
# UndefinedBehaviorSanitizer (build-sanitize/) and runs the unit and MPI tests and the bad-input
# corpus there, and ends with the line "N passed, N failed". MLPTRAIN_SANITIZERS=0 skips the
# sanitizer build.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/build/setup.sh || { echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
skipped=0
status=0
# Runs `meson test` with the given arguments and adds its counts to the totals.
run_tests() {
  local log
  log=$(mktemp)
  meson test --print-errorlogs "$@" 2>&1 | tee "$log"
  local result=${PIPESTATUS[0]}
  count() { awk -v key="$1" -F: '$1 == key { gsub(/ /, "", $2); print $2 }' "$log" | tail -n 1; }
  local ok=$(( $(count "Ok") + $(count "Expected Fail") ))
  local bad=$(( $(count "Fail") + $(count "Unexpected Pass") + $(count "Timeout") ))
  if [ "$result" -ne 0 ] && [ "$bad" -eq 0 ]; then bad=1; fi
  passed=$(( passed + ok ))
  failed=$(( failed + bad ))
  skipped=$(( skipped + $(count "Skipped") ))
  # A skipping test prints why ("...: skipped: reason"); Meson keeps that in its log only.
  grep -h ": skipped: " "$2/meson-logs/testlog.txt" 2>/dev/null | sort -u
  [ "$result" -eq 0 ] || status=$result
  rm -f "$log"
}

run_tests -C build "$@"

if [ "${MLPTRAIN_SANITIZERS:-1}" != 0 ]; then
  echo "test: building with AddressSanitizer and UndefinedBehaviorSanitizer (build-sanitize/)"
  if [ ! -f build-sanitize/build.ninja ]; then
    # Without CUDA: nvcc takes no sanitizer flags, and the GPU tests are not in these suites.
    # Unoptimized: the build is most of this stage's time, the tests a minute.
    meson setup build-sanitize --buildtype=debug -Db_sanitize=address,undefined \
      -Db_lundef=false -Dcuda=disabled >/dev/null
  fi
  # Only what the suites below run: the test programs and mlptrain (not the other programs). The
  # target list is read after Meson has regenerated the build for a changed tree.
  ninja -C build-sanitize build.ninja >/dev/null
  sanitized_targets=$(meson introspect build-sanitize --targets | /usr/bin/python3 -c '
import json, sys
print(" ".join(target["filename"][0].split("/build-sanitize/", 1)[1] for target in json.load(sys.stdin)
               if target["type"] == "executable" and (target["name"].startswith("test_") or target["name"] == "mlptrain")))')
  if [ -n "$sanitized_targets" ] && ninja -C build-sanitize $sanitized_targets >/dev/null; then
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    # Leaks are checked in the unit tests. Under mpiexec they are not: MPICH's transport modules
    # leak at exit and are unloaded before LeakSanitizer could name (and so suppress) them.
    ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 run_tests -C build-sanitize --no-rebuild --suite unit
    ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 run_tests -C build-sanitize --no-rebuild --suite mpi
    # The bad-input corpus through the sanitized program: one clear line and no report.
    ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 run_tests -C build-sanitize --no-rebuild bad_input
  else
    echo "test: the sanitizer build failed"
    failed=$(( failed + 1 ))
    status=1
  fi
fi

[ "$skipped" -gt 0 ] && echo "$skipped skipped (see the reasons above)"
echo "$passed passed, $failed failed"
exit "$status"
