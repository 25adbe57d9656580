#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/mp/dropin.sh: the drop-in test. $BUILD/test/dropin/dropin is a plain NCCL program built
# and linked against NVIDIA's libnccl.so.2 (in $NCCL_LIBDIR). On 2 ranks through the launcher,
# with NCCL_DEBUG=VERSION, it must succeed and print our banner ("ncclshim") when our library
# is swapped in (a) by LD_LIBRARY_PATH=$BUILD/lib, and (b) by LD_PRELOAD of our
# libnccl.so.2 while LD_LIBRARY_PATH=$NCCL_LIBDIR makes NVIDIA's findable too. (c) runs it
# with NVIDIA's library alone, which on a machine without a GPU should fail: that shows the
# test can tell the two apart. (c) is only reported, never counted, as NVIDIA's library may
# behave otherwise elsewhere. Prints `dropin: N passed, M failed`; exits 1 on any failure. Run
# by `make test-dropin`.
set -euo pipefail

BUILD=${BUILD:-build}
NCCL_LIBDIR=${NCCL_LIBDIR:-/usr/local/cuda/lib64}
build=$(cd "$BUILD" && pwd)
launch=$build/bin/ncclshim-launch
prog=$build/test/dropin/dropin
ours=$build/lib/libnccl.so.2
logdir=$build/test/dropin
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}

for file in "$launch" "$prog" "$ours" "$NCCL_LIBDIR/libnccl.so.2"; do
    if [[ ! -e $file ]]; then
        echo "dropin: $file is missing"
        echo "dropin: 0 passed, 1 failed"
        exit 1
    fi
done

passed=0
failed=0

# Our banner: a line saying "ncclshim" that is not the launcher's own ("ncclshim-launch: ...").
has_banner() {
    awk '!/^ncclshim-launch/ && /ncclshim/ { found = 1 } END { exit !found }' "$1"
}

# run_dropin NAME [VAR=VALUE...]: runs the program on 2 ranks; sets rc and log.
run_dropin() {
    local name=$1
    shift
    log=$logdir/$name.log
    rc=0
    env "$@" NCCL_DEBUG=VERSION "$launch" -n 2 -t 60 -- "$prog" >"$log" 2>&1 || rc=$?
}

# check_ours NAME [VAR=VALUE...]: ours must have run (banner) and both ranks succeeded.
check_ours() {
    local name=$1 problem=
    run_dropin "$@"
    if ((rc != 0)); then
        problem="exit $rc"
    elif ! has_banner "$log"; then
        problem="no ncclshim banner: NVIDIA's library (or none) was loaded"
    elif (($(grep -c '^dropin: rank [01] of 2 ok' "$log") != 2)); then
        problem="not both ranks reported success"
    fi
    if [[ -z $problem ]]; then
        echo "ok   $name"
        passed=$((passed + 1))
    else
        echo "FAIL $name: $problem (log: $log)"
        tail -n 20 "$log" | sed 's/^/    /'
        failed=$((failed + 1))
    fi
}

check_ours ld-library-path LD_LIBRARY_PATH="$build/lib"
check_ours ld-preload LD_PRELOAD="$ours" LD_LIBRARY_PATH="$NCCL_LIBDIR"

run_dropin genuine LD_LIBRARY_PATH="$NCCL_LIBDIR"
if has_banner "$log"; then
    echo "note genuine: ncclshim was loaded although only $NCCL_LIBDIR was on the path"
elif ((rc != 0)); then
    echo "note genuine: NVIDIA's libnccl.so.2 alone fails here (exit $rc), as expected" \
        "without a GPU: $(grep -m1 'failed' "$log" || tail -n 1 "$log")"
else
    echo "note genuine: NVIDIA's libnccl.so.2 alone succeeded here (a GPU is present?)"
fi

echo "dropin: $passed passed, $failed failed"
((failed == 0))
