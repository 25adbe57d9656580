#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/run_unit.sh BIN...: runs each Criterion unit-test binary (the Makefile's test-unit
# passes $(BUILD)/test/unit/test_*), each under a time limit (UNIT_TIMEOUT seconds, default
# 300, then killed), and adds up Criterion's closing "Synthesis: Tested: X | Passing: Y |
# Failing: Z | Crashing: W" lines (a crash is among the failing). A binary that times out,
# dies without that line, or exits non-zero although its line says all passed counts as one
# more failure. Prints one line per binary, a binary's output when it fails, and last
# `unit: N passed, M failed`; exits 1 on any failure.
set -euo pipefail

limit=${UNIT_TIMEOUT:-300}
passed=0
failed=0
num='\([0-9]*\)'
synthesis="Synthesis: Tested: $num | Passing: $num | Failing: $num | Crashing: $num"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

for bin in "$@"; do
    name=$(basename "$bin")
    rc=0
    timeout -k 10 "$limit" "$bin" >"$log" 2>&1 || rc=$?
    # The last synthesis line, as "tested passing failing crashing".
    counts=$(sed -n "s/.*$synthesis.*/\\1 \\2 \\3 \\4/p" "$log" | tail -n 1)
    if [[ -z $counts ]]; then
        if ((rc == 124 || rc == 137)); then
            why="timed out after ${limit}s"
        else
            why="exit $rc without a Criterion synthesis line"
        fi
        echo "FAIL $name: $why"
        sed 's/^/    /' "$log" | tail -n 40
        failed=$((failed + 1))
        continue
    fi
    read -r tested pass fail crash <<<"$counts"
    # Criterion counts a crash among the failing too.
    passed=$((passed + pass))
    failed=$((failed + (fail > crash ? fail : crash)))
    if ((fail + crash > 0)); then
        echo "FAIL $name: $tested tested, $pass passing, $fail failing ($crash crashed)"
        grep -v '^\[====\]' "$log" | sed 's/^/    /' | tail -n 60 || true
    elif ((rc != 0)); then
        echo "FAIL $name: all $tested passed but the binary exited $rc"
        sed 's/^/    /' "$log" | tail -n 40
        failed=$((failed + 1))
    else
        echo "ok   $name: $tested passed"
    fi
done

echo "unit: $passed passed, $failed failed"
((failed == 0))
