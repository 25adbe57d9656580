#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/layers.sh FILE...: tests tools/check_layers.sh, the build step that refuses an include running
# up a layer. In a small tree of its own it plants one mistake per case and expects the check
# to fail naming the file and line (and to pass on the clean tree); then it runs the check on
# FILE..., the library's sources and headers, against ARCHITECTURE.md. Prints each failed case, then `layers: N passed,
# M failed`; exits 1 on any failure. Run by the Makefile's test-layers target.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
check=$root/tools/check_layers.sh
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT

passed=0
failed=0
out=$tree/out

# A three-layer library: top over mid over low.
make_tree() {
    rm -rf "$tree/lib"
    mkdir -p "$tree/lib/top" "$tree/lib/mid" "$tree/lib/low"
    cat >"$tree/lib/RULES.md" <<'EOF'
Some prose first; only the block counts.

```layers
# layer  may include
top:     mid low
mid:     low   # a comment
low:
```
EOF
    printf '#include <stdio.h>\n#include "mid/m.h"\n#include "low/l.h"\n#include "t.h"\n' \
        >"$tree/lib/top/t.c"
    printf '#include "low/l.h"\n' >"$tree/lib/top/t.h"
    printf '#include "m.h"\n#include "low/l.h"\n' >"$tree/lib/mid/m.c"
    printf '/* #include "top/t.h" is only a comment */\n' >"$tree/lib/mid/m.h"
    printf '#include "l.h"\n' >"$tree/lib/low/l.c"
    printf '#include <stdint.h>\n' >"$tree/lib/low/l.h"
}

# check CASE EXPECTED_RC PATTERN: runs the check on the tree; the exit code must be
# EXPECTED_RC and the output must match PATTERN (grep -E).
check() {
    local name=$1 want=$2 pattern=$3 rc=0
    (cd "$tree/lib" && "$check" RULES.md */*.c */*.h) >"$out" 2>&1 || rc=$?
    if [[ $rc -eq $want ]] && grep -qE -- "$pattern" "$out"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "layers: FAILED $name: exit $rc (want $want), output:"
        sed 's/^/    /' "$out"
    fi
}

make_tree
check "a clean tree passes" 0 'none runs up a layer'

make_tree
printf '#include "top/t.h"\n' >>"$tree/lib/low/l.c"
check "low includes top" 1 '^check_layers: low/l.c:2: includes top/t.h, but low/ may include only itself and nothing else$'

make_tree
printf '#include "top/t.h"\n' >>"$tree/lib/mid/m.h"
check "a header of mid includes top" 1 'mid/m.h:2: includes top/t.h'

make_tree
printf '#include "../top/t.h"\n' >>"$tree/lib/mid/m.c"
check "a relative path up a layer" 1 'mid/m.c:3: includes top/t.h'

make_tree
printf '  #  include   "top/t.h"\n' >>"$tree/lib/low/l.c"
check "spaces around the hash" 1 'low/l.c:2: includes top/t.h'

make_tree
printf '#include "t.h"\n' >>"$tree/lib/mid/m.c"
check "a bare name found only in another folder" 1 \
    'mid/m.c:3: "t.h" is neither beside the file nor under the root'

make_tree
mkdir -p "$tree/lib/gpu"
printf '#include "low/l.h"\n' >"$tree/lib/gpu/g.c"
check "a folder missing from the block" 1 'gpu/g.c: its folder is no layer'

make_tree
sed -i '/^```layers/,/^```$/d' "$tree/lib/RULES.md"
rc=0
(cd "$tree/lib" && "$check" RULES.md */*.c) >"$out" 2>&1 || rc=$?
if [[ $rc -eq 2 ]] && grep -q 'has no ```layers block' "$out"; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "layers: FAILED rules without a block: exit $rc (want 2)"
    sed 's/^/    /' "$out"
fi

# The library itself (the files the Makefile gives), against the real block.
rc=0
(cd "$root" && "$check" ARCHITECTURE.md "$@") >"$out" 2>&1 || rc=$?
if [[ $rc -eq 0 ]]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "layers: FAILED the library's own includes:"
    sed 's/^/    /' "$out"
fi

echo "layers: $passed passed, $failed failed"
((failed == 0))
