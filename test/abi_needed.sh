#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/abi_needed.sh OUR_LIB LIST...: every function named in each LIST (one name a line, as
# test/abi/README.md says how they were made) is exported by OUR_LIB as a function, so that a
# program needing them loads with it. Prints each missing one, then `abi needed: N passed, M
# failed`; exits 1 on any failure.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 OUR_LIB LIST..." >&2
    exit 2
fi
ours=$1
shift
exported=$(nm -D --defined-only "$ours" | awk '($2 == "T" || $2 == "W" || $2 == "i") {
    sub(/@.*/, "", $3); print $3 }' | sort -u)
passed=0
failed=0
for list in "$@"; do
    while read -r name; do
        [[ -n $name ]] || continue
        if grep -qxF "$name" <<<"$exported"; then
            passed=$((passed + 1))
        else
            echo "FAIL $(basename "$list"): $name is not exported"
            failed=$((failed + 1))
        fi
    done <"$list"
done
echo "abi needed: $passed passed, $failed failed ($*)"
((failed == 0))
