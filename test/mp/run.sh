#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/mp/run.sh: the multi-process tests. Runs the programs built from test/mp/*.c (in
# $BUILD/test/mp, linked with our libnccl.so.2) through $BUILD/bin/ncclshim-launch at 1, 2,
# 3, 4, 5 and 8 ranks as a user runs them (on one host the collectives go through shared memory,
# shm/), and at two rank counts again over UCX's TCP with shared memory disabled. Every case
# runs under the launcher's timeout, which kills all its ranks; a case also fails when UCX warns
# of a UCX_* variable nothing read (the library sets some). Prints each case's name, result and
# time (and the end of its log when it fails; full logs stay in $BUILD/test/mp/logs), then
# `mp: N passed, M failed`; exits 1 on any failure. Run by `make test-mp`, and by
# `make test-asan` with MP_QUICK=1: a small subset, under AddressSanitizer with leak
# detection. Network transports are kept on the loopback device (UCX_NET_DEVICES=lo) unless
# the caller chose otherwise.
#
# collectives.c runs every collective: its full matrix under the library's own choice of
# algorithm at 3, 4, 5 and 8 ranks, and at 4 ranks again with NCCL_SHM_DISABLE=1 (the UCX
# algorithms' choice); its quick subset (-q) under every algorithm name forced with
# NCCLSHIM_ALGO at 2, 3 and 8 ranks, and under NCCL_ALGO=Tree, ^Tree and a per-collective
# list at 2 to 8; and the full matrix of the collectives each algorithm serves at 5 and 8.
# ncclCommShrink runs in cases of its own (-c shrink), so that a hang there is one failure.
# badinput.c makes one bad call per row of its table at 2 and 3 ranks. fault.c kills a rank in
# the middle of a loop of each collective (it forks its own ranks, so it runs as 1 launcher
# rank) and checks the survivors' error, abort, shrink and revoke, and that a group of the
# victim's communicator and another one still completes the other's call; hang.c turns a
# skipped call into an NCCLSHIM_TIMEOUT error with a report, prints a report on SIGUSR1, makes
# NCCLSHIM_CHECK=1 refuse mismatched calls, and shrinks a world on which one rank gave up
# alone. soak.c runs a random mix of checked collectives on
# two communicators from two threads per rank and bounds the growth of its RSS.
#
# The device cases run the same programs on device buffers (-D, and streams.c), through the
# CUDA driver's test double (LD_LIBRARY_PATH=$BUILD/test/doubles): collectives.c's matrix on
# every memory kind at 1 to 3 ranks (its quick subset at 8), on 2 to 8 fake devices with and
# without peer access; the stream semantics of streams.c; a rank killed (the device team's
# leader among them), a timeout, a report and mismatched calls on the device path. Then the same without a device
# team (NCCL_SHM_DISABLE=1, or a host of its own per rank through own_host.sh): device buffers
# over UCX, staged through pinned memory, under the library's choice and every algorithm
# forced; stream semantics, a rank killed (over TCP, which reports a dead peer at once), a
# timeout and a report. Both device paths also run soak.c on registered memory (-D). MP_GPU=1
# runs only the device cases, on the real driver of a GPU machine (tools/gpu-check runs it so there). MP_ONLY=REGEX
# runs only the cases whose names match it.
set -euo pipefail

BUILD=${BUILD:-build}
quick=${MP_QUICK:-0}
gpu=${MP_GPU:-0}
only=${MP_ONLY:-}
here=$(cd "$(dirname "$0")" && pwd)
launch=$BUILD/bin/ncclshim-launch
bindir=$BUILD/test/mp
logdir=$BUILD/test/mp/logs

needed=("$launch" "$bindir/allreduce" "$bindir/api" "$bindir/api_new" "$bindir/badinput"
    "$bindir/collectives"
    "$bindir/fault" "$bindir/hang" "$bindir/soak" "$bindir/streams" "$bindir/traffic")
if ((gpu == 0)); then
    needed+=("$BUILD/test/doubles/libcuda.so.1")
fi
for prog in "${needed[@]}"; do
    if [[ ! -x $prog ]]; then
        echo "mp: $prog is missing (run make first)"
        echo "mp: 0 passed, 1 failed"
        exit 1
    fi
done
mkdir -p "$logdir"

export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
# A sanitized build: leaks fail the run; UCX must not hook malloc or mmap under ASan. (UCX has
# no frame pointers: add fast_unwind_on_malloc=0 to ASAN_OPTIONS for whole leak stacks.)
if [[ $quick == 1 || $(ldd "$bindir/allreduce" 2>/dev/null) == *libasan* ]]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0}
    export UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
    if [[ -f $here/../lsan.supp ]]; then
        export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/../lsan.supp:print_suppressions=0}
    fi
fi

passed=0
failed=0
# The TCP cases: every message over UCX's TCP, none through shared memory.
tcp=(UCX_TLS=tcp NCCL_SHM_DISABLE=1)
# The device cases: the driver's test double stands in for libcuda.so.1 (not with MP_GPU=1),
# without its one rule the library is known to break (sync_exempt.sh says which and why).
. "$here/../doubles/sync_exempt.sh"
map_calls=$fake_cuda_map_calls
dev=(LD_LIBRARY_PATH=$BUILD/test/doubles FAKE_CUDA_SYNC_EXEMPT=$map_calls)
if ((gpu == 1)); then
    dev=()
fi

# collectives.c's parts but shrink, which runs on its own; and what each algorithm name of
# algorithms/select.c serves (groups go with direct, which serves ncclSend/ncclRecv).
colls=allreduce,reduce,reducescatter,broadcast,allgather,alltoall,gather,scatter,sendrecv
colls=$colls,groups,split
algos=(ring chain tree dbtree recdbl rabenseifner bruck pairwise direct hier)
declare -A algo_colls=(
    [ring]=allreduce,allgather,reducescatter
    [chain]=broadcast,reduce
    [tree]=broadcast,reduce,gather,scatter
    [dbtree]=allreduce
    [recdbl]=allreduce,allgather
    [rabenseifner]=allreduce
    [bruck]=allgather
    [pairwise]=alltoall
    [direct]=gather,scatter,sendrecv,groups
    [hier]=allreduce,allgather,reducescatter,broadcast,reduce,gather,scatter,alltoall
)

# run_case NAME NRANKS TIMEOUT [VAR=VALUE...] -- PROGRAM [ARGS...]
run_case() {
    local name=$1 nranks=$2 limit=$3
    shift 3
    local envs=()
    while [[ $1 != -- ]]; do
        envs+=("$1")
        shift
    done
    shift
    if [[ -n $only && ! $name =~ $only ]]; then
        return 0
    fi
    local log=$logdir/$name.log rc=0 start=$SECONDS
    env "${envs[@]}" "$launch" -n "$nranks" -t "$limit" -- "$@" >"$log" 2>&1 || rc=$?
    local took=$((SECONDS - start)) complaint=
    # The driver's double complains where the real driver would answer an error that the
    # library might swallow (a call without a current context, say): that fails the case.
    if ((rc == 0)) && complaint=$(grep -m1 '^fake_cuda: ' "$log"); then
        rc=3
    fi
    # UCX warns of UCX_* variables nothing read, and a user sees it: the defaults the library
    # sets must follow UCX_TLS.
    local unused=
    if ((rc == 0)) && unused=$(grep -m1 -o 'unused env variables: [^ ]*' "$log"); then
        rc=3
    fi
    if ((rc == 0)); then
        printf 'ok   %-28s %4ds\n' "$name" "$took"
        grep -h '^device traffic:' "$log" | sed 's/^/     /' || true
        passed=$((passed + 1))
    else
        local why="exit $rc"
        ((rc == 124)) && why="timed out after ${limit}s"
        [[ -n $complaint ]] && why="the driver's double complained: ${complaint#fake_cuda: }"
        [[ -n $unused ]] && why="UCX warned of $unused"
        printf 'FAIL %-28s %4ds  %s (log: %s)\n' "$name" "$took" "$why" "$log"
        tail -n 25 "$log" | sed 's/^/    /'
        failed=$((failed + 1))
    fi
}

# One GPU runs the path of a GPU per rank: every rank leads its own share of it
# (NCCLSHIM_RANK_LEADERS=1), so ranks sharing the one device (the double's, or a GPU machine's)
# run their shares on their own streams, ring and tree levels between them, IPC between their
# processes and the host's gates, as on 8 GPUs: every collective at 2, 4 and 8 ranks, ring and
# tree forced, one hardware queue, captures and replays, abort, a rank killed, device windows,
# the soak.
rank_leader_cases() {
    local lead=("${dev[@]}" NCCLSHIM_RANK_LEADERS=1)
    for n in 2 4 8; do
        run_case "device-collectives-quick-n$n-rankleaders" "$n" 300 "${lead[@]}" -- \
            "$bindir/collectives" -q -D mixed
    done
    # At 8 ranks only on a GPU: through the double, 8 fake devices run the same levels
    # (device_cases), and CI's time is better spent there.
    for algo in ring tree; do
        for n in 4 8; do
            ((n < 8 || gpu == 1)) || continue
            run_case "device-collectives-quick-n$n-rankleaders-$algo" "$n" 300 "${lead[@]}" \
                NCCL_ALGO=$algo -- "$bindir/collectives" -q -D device
        done
    done
    run_case device-collectives-quick-n4-rankleaders-onequeue 4 300 "${lead[@]}" \
        CUDA_DEVICE_MAX_CONNECTIONS=1 -- "$bindir/collectives" -q -D mixed
    for part in returns order grouporder onequeuegraph window suspend; do
        run_case "device-streams-$part-n4-rankleaders" 4 60 "${lead[@]}" -- \
            "$bindir/streams" -p "$part"
    done
    for part in graph onequeuegraph; do
        run_case "device-streams-$part-n4-rankleaders-onequeue-ring" 4 60 "${lead[@]}" \
            CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_ALGO=ring -- "$bindir/streams" -p "$part"
    done
    run_case device-streams-abort-n4-rankleaders-leader2 4 60 "${lead[@]}" -- \
        "$bindir/streams" -p abort -r 2
    run_case device-fault-allreduce-n4-rankleaders 1 90 "${lead[@]}" -- \
        "$bindir/fault" -n 4 -c allreduce -D
    run_case device-soak-n4-rankleaders 4 120 "${lead[@]}" -- "$bindir/soak" -D -n 800
}

# The device cases: through the driver's double (dev: its LD_LIBRARY_PATH), or with MP_GPU=1 on
# the real driver of a GPU machine (tools/gpu-check), every rank on the one GPU, where the
# double's own knobs (two fake devices, no peer access, an old compute capability) mean
# nothing and those cases are left out.
device_cases() {
    # Every memory kind, every collective, at 1 to 8 ranks.
    run_case device-collectives-n1 1 300 "${dev[@]}" -- "$bindir/collectives" -D mixed
    # One hardware queue per context (the double models CUDA_DEVICE_MAX_CONNECTIONS=1): a
    # stream wait on work not yet enqueued in its context would block that work for good.
    for n in 1 2 3; do
        run_case "device-collectives-quick-n$n-onequeue" "$n" 120 "${dev[@]}" \
            CUDA_DEVICE_MAX_CONNECTIONS=1 -- "$bindir/collectives" -q -D mixed
    done
    run_case device-collectives-quick-n2 2 300 "${dev[@]}" -- "$bindir/collectives" -q -D device
    run_case device-collectives-n3 3 300 "${dev[@]}" -- "$bindir/collectives" -D mixed
    if ((gpu == 1)); then
        run_case device-collectives-n4 4 300 -- "$bindir/collectives" -D device
    fi
    run_case device-collectives-quick-n4-memalloc 4 300 "${dev[@]}" -- \
        "$bindir/collectives" -q -D memalloc
    run_case device-collectives-quick-n5-registered 5 300 "${dev[@]}" -- \
        "$bindir/collectives" -q -D registered
    # cuMem memory the leaders must not map as one allocation: a memory pool's (its handle
    # types say file descriptor, but no cuMemMap made it), and a reservation mapped from
    # several allocations with buffers across their boundaries (each staged or exported
    # allocation by allocation).
    run_case device-collectives-quick-n3-pool 3 300 "${dev[@]}" -- \
        "$bindir/collectives" -q -D pool
    run_case device-collectives-quick-n3-chunked 3 300 "${dev[@]}" -- \
        "$bindir/collectives" -q -D chunked
    run_case device-collectives-quick-n8 8 300 "${dev[@]}" -- "$bindir/collectives" -q -D mixed
    if ((gpu == 0)); then
        # Ranks on two devices: with peer access, and without (their memory is staged).
        run_case device-collectives-quick-n4-2gpu 4 300 "${dev[@]}" FAKE_CUDA_DEVICES=2 -- \
            "$bindir/collectives" -q -D mixed
        run_case device-collectives-quick-n4-2gpu-nopeer 4 300 "${dev[@]}" FAKE_CUDA_DEVICES=2 \
            FAKE_CUDA_NO_PEER=1 -- "$bindir/collectives" -q -D device
        # One rank per device, a leader each doing its GPU's share: every collective on every
        # memory kind, with and without peer access.
        for n in 2 3 4 8; do
            run_case "device-collectives-quick-n$n-${n}gpu" "$n" 300 "${dev[@]}" \
                FAKE_CUDA_DEVICES=$n -- "$bindir/collectives" -q -D mixed
            ((n < 8)) || continue # without peer access at 8: n6-3gpu-nopeer below
            run_case "device-collectives-quick-n$n-${n}gpu-nopeer" "$n" 300 "${dev[@]}" \
                FAKE_CUDA_DEVICES=$n FAKE_CUDA_NO_PEER=1 -- "$bindir/collectives" -q -D mixed
        done
        # Leaders of several GPUs, each of more than one rank, and without peer access.
        run_case device-collectives-quick-n8-3gpu 8 300 "${dev[@]}" FAKE_CUDA_DEVICES=3 -- \
            "$bindir/collectives" -q -D mixed
        run_case device-collectives-quick-n6-3gpu-nopeer 6 300 "${dev[@]}" FAKE_CUDA_DEVICES=3 \
            FAKE_CUDA_NO_PEER=1 -- "$bindir/collectives" -q -D mixed
        # BUFFER_ID as cuda.h also allows it: one for a reservation's every allocation (the
        # leaders must not take one allocation's mapping for another's).
        run_case device-collectives-quick-n3-chunked-resid 3 300 "${dev[@]}" \
            FAKE_CUDA_BUFFER_ID=reservation -- "$bindir/collectives" -q -D chunked
        # A leader per GPU: registration (every leader closes before deregistration returns),
        # suspension, graphs, abort, a leader killed, a timeout, the soak's random mix.
        for part in returns register suspend graph twographs; do
            run_case "device-streams-$part-n4-4gpu" 4 60 "${dev[@]}" FAKE_CUDA_DEVICES=4 -- \
                "$bindir/streams" -p "$part"
        done
        run_case device-streams-register-n4-4gpu-graph 4 60 "${dev[@]}" FAKE_CUDA_DEVICES=4 -- \
            "$bindir/streams" -p register -g
        run_case device-streams-overtake-n4-4gpu 4 60 "${dev[@]}" FAKE_CUDA_DEVICES=4 -- \
            "$bindir/streams" -p overtake
        # Review B6: a leader of a communicator made without a current device is activated
        # (its control blocks registered) by its rank's first device call, before that call
        # enqueues a wait its thread opens.
        # Staging areas that grow, and leaders that map them, while earlier calls' waits are
        # queued: nothing synchronizes a context then (FAKE_CUDA_SYNC_STRICT=1 fails on it).
        for kind in registered device; do
            run_case "device-streams-staging-n3-3gpu-$kind" 3 60 "${dev[@]}" FAKE_CUDA_DEVICES=3 \
                FAKE_CUDA_SYNC_STRICT=1 -- "$bindir/streams" -p staging -k "$kind"
        done
        # A driver without cuMem host memory: host staging is registered shared memory.
        # Without cuMem host memory a leader maps a peer's host staging by page-locking it
        # (sync_exempt.sh).
        run_case device-streams-staging-n3-3gpu-nohostcumem 3 60 "${dev[@]}" FAKE_CUDA_DEVICES=3 \
            FAKE_CUDA_NO_HOST_CUMEM=1 \
            FAKE_CUDA_SYNC_EXEMPT=$map_calls,cuMemHostRegister -- \
            "$bindir/streams" -p staging -k registered
        # A GPU per rank: each leader runs its GPU's share on its own stream (ownstream.c), so
        # its calls return at once (returns, above), one queue takes a capture, and a group is
        # run in the order its operations match, whatever the order in which the rank gave them.
        run_case device-streams-grouporder-n3-3gpu 3 60 "${dev[@]}" FAKE_CUDA_DEVICES=3 -- \
            "$bindir/streams" -p grouporder
        # Pipeline parallelism: a send between two GPUs, which the third GPU's leader takes with
        # no work of its own while its stream's signal kernel of the all-reduce before may still
        # be writing done words, its stores reaching the host in any order between fences (the
        # double's): the leader must not write a done word the kernel then moves back.
        run_case device-streams-ppsend-n3-3gpu 3 60 "${dev[@]}" FAKE_CUDA_DEVICES=3 -- \
            "$bindir/streams" -p ppsend
        run_case device-streams-ppsend-n3-3gpu-onequeue 3 60 "${dev[@]}" FAKE_CUDA_DEVICES=3 \
            CUDA_DEVICE_MAX_CONNECTIONS=1 -- "$bindir/streams" -p ppsend
        run_case device-streams-graphfree-n2-2gpu 2 60 "${dev[@]}" FAKE_CUDA_DEVICES=2 -- \
            "$bindir/streams" -p graphfree
        for part in graph onequeuegraph returns order; do
            run_case "device-streams-$part-n4-4gpu-onequeue" 4 60 "${dev[@]}" \
                FAKE_CUDA_DEVICES=4 CUDA_DEVICE_MAX_CONNECTIONS=1 -- "$bindir/streams" -p "$part"
        done
        run_case device-streams-abort-n4-4gpu-leader2 4 60 "${dev[@]}" FAKE_CUDA_DEVICES=4 -- \
            "$bindir/streams" -p abort -r 2
        run_case device-fault-allreduce-n4-4gpu-leader2 1 90 "${dev[@]}" FAKE_CUDA_DEVICES=4 -- \
            "$bindir/fault" -n 4 -c allreduce -D -v 2
        run_case device-hang-timeout-n3-3gpu 3 60 "${dev[@]}" FAKE_CUDA_DEVICES=3 \
            NCCLSHIM_TIMEOUT=2 -- "$bindir/hang" -p devtimeout
        run_case device-soak-n4-2gpu 4 120 "${dev[@]}" FAKE_CUDA_DEVICES=2 -- \
            "$bindir/soak" -D -n 800
        # A GPU per rank: every share on its rank's own stream, two communicators per rank
        # driven from two threads, work areas taken and given back thousands of times.
        run_case device-soak-n4-4gpu 4 120 "${dev[@]}" FAKE_CUDA_DEVICES=4 -- \
            "$bindir/soak" -D -n 1500
        # Three GPUs of two ranks each: sends between ranks whose receiver's GPU leads them
        # (a leader once carried out another GPU's send posted while it looked). The double's
        # device memory is the leaders' RSS where they touch it, a part more of each new
        # buffer size: hence the wider bound.
        run_case device-soak-n6-3gpu 6 120 "${dev[@]}" FAKE_CUDA_DEVICES=3 -- \
            "$bindir/soak" -D -n 1500 -r 40
        # The bytes through each device's links, as the double counts them, against the
        # textbook algorithm's (-b: enforced, with and without peer access), and the results.
        for n in 2 3 4 8; do
            run_case "device-traffic-allreduce-n$n" "$n" 120 "${dev[@]}" FAKE_CUDA_DEVICES=$n \
                -- "$bindir/traffic" -c allreduce -m 16 -b
            run_case "device-traffic-allreduce-n$n-nopeer" "$n" 120 "${dev[@]}" \
                FAKE_CUDA_DEVICES=$n FAKE_CUDA_NO_PEER=1 -- "$bindir/traffic" -c allreduce -m 16 -b
        done
        for coll in allgather reducescatter broadcast reduce alltoall; do
            run_case "device-traffic-$coll-n8" 8 120 "${dev[@]}" FAKE_CUDA_DEVICES=8 -- \
                "$bindir/traffic" -c "$coll" -m 16 -b
            run_case "device-traffic-$coll-n8-nopeer" 8 120 "${dev[@]}" FAKE_CUDA_DEVICES=8 \
                FAKE_CUDA_NO_PEER=1 -- "$bindir/traffic" -c "$coll" -m 16 -b
        done
        # The ring and tree schedules between GPUs (cudaipc/levels.h), forced by NCCL_ALGO:
        # every collective's results at 2 to 8 GPUs (those without a ring or tree here, and
        # GPUs without peer access, keep direct parts), the bytes through each GPU against the
        # ring's or the tree's, one hardware queue, graphs, abort and the soak's random mix.
        for algo in ring tree; do
            for n in 2 3 4 8; do
                run_case "device-collectives-quick-n$n-${n}gpu-$algo" "$n" 300 "${dev[@]}" \
                    FAKE_CUDA_DEVICES=$n NCCL_ALGO=$algo -- "$bindir/collectives" -q -D mixed
                ((n >= 4)) || continue # two and three GPUs' bytes: the direct parts' cases
                run_case "device-traffic-allreduce-n$n-$algo" "$n" 120 "${dev[@]}" \
                    FAKE_CUDA_DEVICES=$n NCCL_ALGO=$algo -- "$bindir/traffic" -c allreduce \
                    -m 16 -b
            done
            run_case "device-traffic-broadcast-n8-$algo" 8 120 "${dev[@]}" FAKE_CUDA_DEVICES=8 \
                NCCL_ALGO=$algo -- "$bindir/traffic" -c broadcast -m 16 -b
            run_case "device-collectives-quick-n4-4gpu-nopeer-$algo" 4 300 "${dev[@]}" \
                FAKE_CUDA_DEVICES=4 FAKE_CUDA_NO_PEER=1 NCCL_ALGO=$algo -- \
                "$bindir/collectives" -q -D mixed
            run_case "device-collectives-quick-n4-4gpu-onequeue-$algo" 4 300 "${dev[@]}" \
                FAKE_CUDA_DEVICES=4 CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_ALGO=$algo -- \
                "$bindir/collectives" -q -D mixed
            for part in graph onequeuegraph; do
                run_case "device-streams-$part-n4-4gpu-onequeue-$algo" 4 60 "${dev[@]}" \
                    FAKE_CUDA_DEVICES=4 CUDA_DEVICE_MAX_CONNECTIONS=1 NCCL_ALGO=$algo -- \
                    "$bindir/streams" -p "$part"
            done
            run_case "device-streams-abort-n4-4gpu-leader2-$algo" 4 60 "${dev[@]}" \
                FAKE_CUDA_DEVICES=4 NCCL_ALGO=$algo -- "$bindir/streams" -p abort -r 2
            # The soak with the ring's levels (the tree's run in the cases above).
            [[ $algo == ring ]] || continue
            run_case "device-soak-n4-4gpu-$algo" 4 120 "${dev[@]}" FAKE_CUDA_DEVICES=4 \
                NCCL_ALGO=$algo -- "$bindir/soak" -D -n 800
        done
        run_case device-hang-algomismatch-n3-3gpu 3 60 "${dev[@]}" FAKE_CUDA_DEVICES=3 -- \
            "$bindir/hang" -p devalgomismatch
        run_case device-traffic-allgather-n8-ring 8 120 "${dev[@]}" FAKE_CUDA_DEVICES=8 \
            NCCL_ALGO=ring -- "$bindir/traffic" -c allgather -m 16 -b
    fi
    # Stream semantics, groups, several devices from one thread, refusals, the memory API.
    for part in returns order group refuse memapi register suspend grow churn window; do
        run_case "device-streams-$part-n3" 3 60 "${dev[@]}" -- "$bindir/streams" -p "$part"
    done
    run_case device-streams-window-n1 1 60 "${dev[@]}" -- "$bindir/streams" -p window
    # Device windows registered and deregistered in a group, whose calls run on threads of
    # their own: a clique of two devices in one process, and two communicators on each of 3.
    run_case device-streams-windowgroup-n1-2gpu 1 60 "${dev[@]}" FAKE_CUDA_DEVICES=2 -- \
        "$bindir/streams" -p windowgroup
    run_case device-streams-windowgroup-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p windowgroup
    run_case device-streams-window-n4-onequeue 4 60 "${dev[@]}" CUDA_DEVICE_MAX_CONNECTIONS=1 \
        -- "$bindir/streams" -p window
    run_case device-streams-group-n2 2 60 "${dev[@]}" -- "$bindir/streams" -p group
    run_case device-streams-grouporder-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p grouporder
    run_case device-streams-leaderleft-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p leaderleft
    # Captures with ranks on one GPU: every rank leads its own share (NCCLSHIM_RANK_LEADERS=1),
    # since a leader that shares its GPU refuses a capture in its process (onequeuegraph).
    local lead=("${dev[@]}" NCCLSHIM_RANK_LEADERS=1)
    run_case device-streams-graphfree-n2 2 60 "${lead[@]}" -- "$bindir/streams" -p graphfree
    run_case device-streams-register-n3-graph 3 60 "${lead[@]}" -- "$bindir/streams" -p register -g
    run_case device-streams-globalcapture-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p globalcapture
    run_case device-streams-hostonly-n2 2 60 "${dev[@]}" -- "$bindir/streams" -p hostonly
    run_case device-streams-hostonly-n2-memalloc 2 60 "${dev[@]}" -- \
        "$bindir/streams" -p hostonly -k memalloc
    for n in 1 2 4; do
        run_case "device-streams-graph-n$n" "$n" 60 "${lead[@]}" -- "$bindir/streams" -p graph
        run_case "device-streams-twographs-n$n" "$n" 60 "${lead[@]}" -- \
            "$bindir/streams" -p twographs
    done
    run_case device-streams-abort-n3-leader 3 60 "${dev[@]}" -- "$bindir/streams" -p abort -r 0
    run_case device-streams-abort-n3-member 3 60 "${dev[@]}" -- "$bindir/streams" -p abort -r 2
    run_case device-streams-abort-n3-graph 3 60 "${lead[@]}" -- "$bindir/streams" -p abort -r 1 -g
    run_case device-streams-abortblocked-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p abortblocked
    # A kernel that faults (an illegal address) leaves its context unusable for good: every
    # rank reports the failure, none hangs (the double models the sticky error).
    run_case device-streams-fault-n3 3 60 "${dev[@]}" FAKE_CUDA_EXPECT_FAULTS=1 -- \
        "$bindir/streams" -p fault
    run_case host-streams-abortblocked-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p abortblocked -H
    run_case device-streams-revokeblocked-n3 3 60 "${dev[@]}" -- \
        "$bindir/streams" -p abortblocked -R
    # A capture in the process of a leader that shares its GPU is refused, whatever the number
    # of hardware queues (its wait could sit in one queue ahead of the leader's work); the
    # other ranks' captures are not.
    run_case device-streams-capture-n2 2 60 "${dev[@]}" -- "$bindir/streams" -p onequeuegraph
    # Review B3: with the default 8 queues and 9 streams of the program's own, made after the
    # leader's, one shares the leader's stream's queue: a capture there would hang when its
    # graph runs (it did, with the refusal taken out); refused, with the message. Every rank
    # leading its own share, all nine capture and run.
    run_case device-streams-capture-n2-9streams 2 60 "${dev[@]}" -- \
        "$bindir/streams" -p onequeuegraph -S 9
    run_case device-streams-capture-n2-9streams-rankleaders 2 60 "${lead[@]}" -- \
        "$bindir/streams" -p onequeuegraph -S 9
    # Review B6: ranks of one process leading their own shares of one GPU (each one's stream
    # waits for another's arrive, enqueued later in the same context), one thread, groups:
    # nothing the library does in between synchronizes the context.
    # Ranks of several processes each leading its own share of the one GPU, staging growing
    # meanwhile; a communicator made with no current device, whose leaders are made ready by
    # their ranks' first device calls (its control blocks registered then, not by its thread
    # after a wait was queued).
    local strict=("${lead[@]}" FAKE_CUDA_SYNC_STRICT=1)
    run_case device-streams-clique-n3-rankleaders-managed 1 60 "${strict[@]}" -- \
        "$bindir/streams" -p clique -n 3 -k managed
    run_case device-streams-clique-n4-rankleaders-registered 1 60 "${strict[@]}" -- \
        "$bindir/streams" -p clique -n 4 -k registered
    run_case device-streams-staging-n3-rankleaders-managed 3 60 "${strict[@]}" -- \
        "$bindir/streams" -p staging -k managed
    run_case device-streams-hostonly-n2-rankleaders 2 60 "${strict[@]}" -- \
        "$bindir/streams" -p hostonly
    # Review B7: an eager call held back on its stream, a captured one launched meanwhile.
    run_case device-streams-overtake-n3-rankleaders 3 60 "${lead[@]}" -- \
        "$bindir/streams" -p overtake
    # What the H200 showed with a leader per rank: PyTorch's point-to-point (ungrouped, on a
    # pool stream, the receiver synchronising before it sends back, dozens of streams), and the
    # lifecycle (split, destroy, a one-rank drain, abort from another thread) under a global
    # capture of a blocking stream.
    run_case device-streams-torchp2p-n2-rankleaders 2 60 "${lead[@]}" -- \
        "$bindir/streams" -p torchp2p
    run_case device-streams-torchp2p-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p torchp2p
    run_case device-streams-capturelife-n3-rankleaders 3 60 "${lead[@]}" -- \
        "$bindir/streams" -p capturelife
    run_case device-streams-capturelife-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p capturelife
    # One hardware queue per context: stream semantics hold.
    local onequeue=("${dev[@]}" CUDA_DEVICE_MAX_CONNECTIONS=1)
    for part in returns order group; do
        run_case "device-streams-$part-n3-onequeue" 3 60 "${onequeue[@]}" -- \
            "$bindir/streams" -p "$part"
    done
    run_case device-streams-abort-n3-leader-onequeue 3 60 "${onequeue[@]}" -- \
        "$bindir/streams" -p abort -r 0
    run_case device-streams-onequeuegraph-n2 2 60 "${onequeue[@]}" -- \
        "$bindir/streams" -p onequeuegraph
    if ((gpu == 0)); then
        run_case device-streams-devices 1 60 "${dev[@]}" FAKE_CUDA_DEVICES=2 -- \
            "$bindir/streams" -p devices
        run_case device-streams-devices-nopeer 1 60 "${dev[@]}" FAKE_CUDA_DEVICES=2 \
            FAKE_CUDA_NO_PEER=1 -- "$bindir/streams" -p devices
        run_case device-streams-devices-expandable 1 60 "${dev[@]}" FAKE_CUDA_DEVICES=2 -- \
            "$bindir/streams" -p devices -k expandable
        # tools/gpu-check's probe, kept working (its figures mean nothing on the double).
        run_case device-ipc-probe 1 60 "${dev[@]}" -- "$(dirname "$launch")/ipc_probe" -s 2
        run_case device-streams-nodevice 1 60 "${dev[@]}" FAKE_CUDA_DEVICES=1 -- \
            "$bindir/streams" -p nodevice
        run_case device-streams-fp8-n2 2 60 "${dev[@]}" FAKE_CUDA_CC=80 -- \
            "$bindir/streams" -p fp8
        run_case device-streams-unsupported-sm70-n2 2 60 "${dev[@]}" FAKE_CUDA_CC=70 -- \
            "$bindir/streams" -p unsupported
        run_case device-streams-unsupported-driver-n2 2 60 "${dev[@]}" \
            FAKE_CUDA_DRIVER_VERSION=12040 -- "$bindir/streams" -p unsupported
    else
        run_case device-streams-fp8-n2 2 60 -- "$bindir/streams" -p fp8
    fi
    rank_leader_cases
    # Faults on the device path: a rank killed (the leader too), timeouts, reports, mismatch.
    run_case device-fault-allreduce-n3 1 90 "${dev[@]}" -- "$bindir/fault" -n 3 -c allreduce -D
    run_case device-fault-broadcast-n3-leader 1 90 "${dev[@]}" -- \
        "$bindir/fault" -n 3 -c broadcast -D -v 0
    run_case device-fault-sendrecv-n4 1 90 "${dev[@]}" -- "$bindir/fault" -n 4 -c sendrecv -D
    run_case device-fault-alltoall-n4-shrink 1 90 "${dev[@]}" -- \
        "$bindir/fault" -n 4 -c alltoall -D -s
    run_case device-fault-reducescatter-n3-revoke 1 90 "${dev[@]}" -- \
        "$bindir/fault" -n 3 -c reducescatter -D -r
    run_case device-hang-timeout-n3 3 60 "${dev[@]}" NCCLSHIM_TIMEOUT=2 -- \
        "$bindir/hang" -p devtimeout
    run_case device-hang-report-n2 2 60 "${dev[@]}" -- "$bindir/hang" -p devreport
    run_case device-hang-mismatch-n3 3 60 "${dev[@]}" -- "$bindir/hang" -p devmismatch
    # Soak: soak.c's checked random mix on registered host memory, stream ordered.
    run_case device-soak-n4 4 120 "${dev[@]}" -- "$bindir/soak" -D -n 1500
    staged_cases
}

# Device buffers without a device team: over UCX, staged through pinned host memory.
staged_cases() {
    local noteam=("${dev[@]}" NCCL_SHM_DISABLE=1) hosts=("$here/own_host.sh")
    run_case staged-collectives-n2 2 300 "${noteam[@]}" -- "$bindir/collectives" -D device
    run_case staged-collectives-n3-hosts 3 300 "${dev[@]}" -- \
        "${hosts[@]}" "$bindir/collectives" -D mixed
    run_case staged-collectives-quick-n5-tcp 5 300 "${noteam[@]}" UCX_TLS=tcp \
        NCCLSHIM_STAGED_PHASES=1 -- \
        "$bindir/collectives" -q -D mixed -c "$colls"
    for n in 2 4 8; do
        run_case "staged-collectives-quick-n$n-hosts" "$n" 300 "${dev[@]}" -- \
            "${hosts[@]}" "$bindir/collectives" -q -D device -c "$colls"
    done
    for algo in "${algos[@]}"; do
        run_case "staged-algo-$algo-quick-n5-hosts" 5 120 "${dev[@]}" NCCLSHIM_ALGO="$algo" -- \
            "${hosts[@]}" "$bindir/collectives" -q -D mixed -c "$colls"
    done
    if ((gpu == 0)); then
        # Device pointers straight to UCX, as with a UCX built with CUDA: the double lets the
        # host touch device memory here (elsewhere it faults, as on a GPU), so the ordering
        # around the messages is what is tested.
        run_case staged-direct-collectives-n3 3 300 "${noteam[@]}" NCCLSHIM_DEVICE_DIRECT=1 \
            FAKE_CUDA_HOST_VISIBLE=1 -- "$bindir/collectives" -D mixed
        run_case staged-direct-algo-ring-quick-n5 5 120 "${noteam[@]}" NCCLSHIM_DEVICE_DIRECT=1 \
            FAKE_CUDA_HOST_VISIBLE=1 NCCLSHIM_ALGO=ring -- "$bindir/collectives" -q -D device \
            -c "$colls"
    fi
    for part in returns order group memapi refuse; do
        run_case "staged-streams-$part-n3" 3 60 "${noteam[@]}" -- "$bindir/streams" -p "$part"
    done
    run_case staged-streams-window-n3 3 60 "${noteam[@]}" -- "$bindir/streams" -p window -X
    run_case staged-streams-suspend-n3 3 60 "${noteam[@]}" -- "$bindir/streams" -p suspend -X
    run_case staged-streams-window-n4-tcp 4 60 "${noteam[@]}" UCX_TLS=tcp -- \
        "$bindir/streams" -p window -X
    # One hardware queue per context: the lanes share the user's.
    run_case staged-collectives-quick-n3-onequeue 3 120 "${noteam[@]}" \
        CUDA_DEVICE_MAX_CONNECTIONS=1 -- "$bindir/collectives" -q -D mixed -c "$colls"
    run_case staged-streams-group-n3-onequeue 3 60 "${noteam[@]}" CUDA_DEVICE_MAX_CONNECTIONS=1 \
        -- "$bindir/streams" -p group
    # (No -p abort here: a call on the network path returns once its messages went and came,
    # so its own thread cannot abort it; abortblocked aborts it from another.)
    run_case staged-streams-abortblocked-n3 3 60 "${noteam[@]}" -- \
        "$bindir/streams" -p abortblocked
    run_case staged-fault-allreduce-n3 1 90 "${noteam[@]}" UCX_TLS=tcp -- \
        "$bindir/fault" -n 3 -c allreduce -D
    # Three ranks: a survivor that never talks to the dead rank learns of it only when the
    # others abort (a shrink does not), as over UCX for host memory.
    run_case staged-fault-sendrecv-n3-shrink 1 90 "${noteam[@]}" UCX_TLS=tcp -- \
        "$bindir/fault" -n 3 -c sendrecv -D -s
    run_case staged-fault-broadcast-n3-root 1 90 "${noteam[@]}" UCX_TLS=tcp -- \
        "$bindir/fault" -n 3 -c broadcast -D -v 0
    run_case staged-hang-timeout-n3 3 60 "${noteam[@]}" UCX_TLS=tcp NCCLSHIM_TIMEOUT=2 -- \
        "$bindir/hang" -p devtimeout
    run_case staged-hang-report-n2 2 60 "${noteam[@]}" -- "$bindir/hang" -p devreport
    run_case staged-soak-n4 4 120 "${noteam[@]}" -- "$bindir/soak" -D -n 1500
}

if [[ $gpu == 1 ]]; then
    device_cases
elif [[ $quick == 1 ]]; then
    for n in 1 2 3 5 8; do
        run_case "allreduce-quick-n$n" "$n" 240 -- "$bindir/allreduce" -q
    done
    run_case api-n2 2 60 -- "$bindir/api"
    run_case api-n3 3 60 -- "$bindir/api"
    run_case api-new-n1 1 60 -- "$bindir/api_new"
    run_case api-new-n3 3 60 -- "$bindir/api_new"
    run_case badinput-n2 2 60 -- "$bindir/badinput"
    run_case allreduce-quick-n2-tcp 2 240 "${tcp[@]}" -- "$bindir/allreduce" -q
    for n in 1 2 3 5; do
        run_case "collectives-quick-n$n" "$n" 240 -- "$bindir/collectives" -q -c "$colls"
    done
    run_case collectives-quick-n3-tree 3 240 NCCLSHIM_ALGO=tree -- \
        "$bindir/collectives" -q -c "$colls"
    run_case shrink-n3 3 20 -- "$bindir/collectives" -c shrink
    run_case fault-allreduce-n3-shrink 1 90 -- "$bindir/fault" -n 3 -c allreduce -s
    run_case hang-timeout-n2 2 60 NCCLSHIM_TIMEOUT=2 -- "$bindir/hang" -p timeout
    run_case soak-n4-quick 4 240 -- "$bindir/soak" -n 2000
    run_case device-collectives-quick-n3 3 240 "${dev[@]}" -- \
        "$bindir/collectives" -q -D mixed -c "$colls"
    run_case device-streams-abort-n2 2 60 "${dev[@]}" -- "$bindir/streams" -p abort -r 1
    run_case device-streams-abortblocked-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p abortblocked
    run_case host-streams-abortblocked-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p abortblocked -H
    # Captures with ranks on one GPU need a leader per rank (device_cases).
    run_case device-streams-graph-n2 2 60 "${dev[@]}" NCCLSHIM_RANK_LEADERS=1 -- \
        "$bindir/streams" -p graph
    run_case device-streams-churn-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p churn
    run_case device-streams-window-n3 3 60 "${dev[@]}" -- "$bindir/streams" -p window
    run_case staged-streams-window-n3 3 60 "${dev[@]}" NCCL_SHM_DISABLE=1 -- \
        "$bindir/streams" -p window -X
    run_case device-fault-allreduce-n3-leader 1 90 "${dev[@]}" -- \
        "$bindir/fault" -n 3 -c allreduce -D -v 0
    # A leader per GPU, some with two ranks; and registration with several leaders.
    run_case device-collectives-quick-n4-3gpu 4 240 "${dev[@]}" FAKE_CUDA_DEVICES=3 -- \
        "$bindir/collectives" -q -D mixed -c "$colls"
    run_case device-streams-register-n3-3gpu 3 60 "${dev[@]}" FAKE_CUDA_DEVICES=3 -- \
        "$bindir/streams" -p register
    run_case staged-collectives-quick-n3 3 240 "${dev[@]}" NCCL_SHM_DISABLE=1 -- \
        "$bindir/collectives" -q -D mixed -c "$colls"
else
    for n in 1 2 3 4 5 8; do
        if ((n == 2)); then
            # This one also waits NCCLSHIM_BOOTSTRAP_TIMEOUT=3 s for a root that never comes.
            run_case "api-n$n" "$n" 60 -- "$bindir/api" -d 3
        else
            run_case "api-n$n" "$n" 60 -- "$bindir/api"
        fi
        # The full matrix at 1, 2 and 3 ranks; its quick subset above (collectives.c's full
        # matrix has the all-reduce at 4, 5 and 8).
        if ((n > 3)); then
            run_case "allreduce-quick-n$n" "$n" 300 -- "$bindir/allreduce" -q
        else
            run_case "allreduce-n$n" "$n" 300 -- "$bindir/allreduce"
        fi
    done
    # The functions NCCL 2.29-2.32 added.
    run_case api-new-n1 1 60 -- "$bindir/api_new"
    run_case api-new-n3 3 60 -- "$bindir/api_new"
    run_case api-new-n4-tcp 4 60 "${tcp[@]}" -- "$bindir/api_new"
    for n in 2 3; do
        run_case "api-n$n-tcp" "$n" 60 "${tcp[@]}" -- "$bindir/api"
        # Bad arguments to every entry point (a table; each row then checks the communicator).
        run_case "badinput-n$n" "$n" 60 -- "$bindir/badinput"
        run_case "allreduce-n$n-tcp" "$n" 300 "${tcp[@]}" -- "$bindir/allreduce" -m 65537
    done

    # Every collective under the library's own choice: the full matrix at a few rank counts.
    for n in 1 2; do
        run_case "collectives-quick-n$n" "$n" 120 -- "$bindir/collectives" -q -c "$colls"
    done
    for n in 3 4 5 8; do
        run_case "collectives-n$n" "$n" 300 -- "$bindir/collectives" -c "$colls"
    done
    run_case collectives-n4-ucx 4 300 NCCL_SHM_DISABLE=1 -- "$bindir/collectives" -c "$colls"
    run_case collectives-quick-n3-tcp 3 240 "${tcp[@]}" -- "$bindir/collectives" -q -c "$colls"
    for n in 2 3 5; do
        run_case "shrink-n$n" "$n" 20 -- "$bindir/collectives" -c shrink
    done

    # Faults: a rank killed in every collective; shrink, revoke; the UCX path over TCP.
    for coll in allreduce broadcast reduce allgather reducescatter alltoall gather scatter \
        sendrecv; do
        run_case "fault-$coll-n3" 1 90 -- "$bindir/fault" -n 3 -c "$coll"
    done
    run_case fault-allreduce-n4-shrink 1 90 -- "$bindir/fault" -n 4 -c allreduce -s
    run_case fault-alltoall-n4-revoke 1 90 -- "$bindir/fault" -n 4 -c alltoall -r
    run_case fault-allreduce-n3-tcp-shrink 1 90 "${tcp[@]}" -- \
        "$bindir/fault" -n 3 -c allreduce -s
    # A ring of 4 over TCP: rank 1 never talks to the victim (3) and waits on rank 0, which
    # saw the death and goes on to shrink; only rank 0's failure notice can tell rank 1.
    run_case fault-allreduce-n4-tcp-ring-shrink 1 90 "${tcp[@]}" NCCLSHIM_ALGO=ring -- \
        "$bindir/fault" -n 4 -c allreduce -s
    run_case fault-sendrecv-n3-tcp 1 90 "${tcp[@]}" -- "$bindir/fault" -n 3 -c sendrecv
    # The victim's communicator in one group with one it is not in, whose all-reduce must
    # still complete for the ranks that wait on it.
    run_case fault-grouped-allreduce-n3 1 90 -- "$bindir/fault" -n 3 -c allreduce -g
    run_case fault-grouped-allreduce-n4-tcp 1 90 "${tcp[@]}" -- \
        "$bindir/fault" -n 4 -c allreduce -g
    # Hangs: timeout with a report, a report on request, mismatched calls.
    run_case hang-timeout-n3 3 60 NCCLSHIM_TIMEOUT=2 -- "$bindir/hang" -p timeout
    run_case hang-timeout-n2-tcp 2 60 NCCLSHIM_TIMEOUT=2 "${tcp[@]}" -- "$bindir/hang" -p timeout
    run_case hang-report-n2 2 60 -- "$bindir/hang" -p report
    run_case hang-idle-n2 2 60 -- "$bindir/hang" -p idle
    run_case hang-idle-n4 4 60 -- "$bindir/hang" -p idle
    run_case hang-idle-n2-tcp 2 60 "${tcp[@]}" -- "$bindir/hang" -p idle
    run_case hang-mismatch-n3 3 60 NCCLSHIM_CHECK=1 -- "$bindir/hang" -p mismatch
    run_case hang-mismatch-n2-tcp 2 60 NCCLSHIM_CHECK=1 "${tcp[@]}" -- "$bindir/hang" -p mismatch
    # A shrink among ranks whose world counted different numbers of operations (one gave up
    # alone at its timeout).
    run_case hang-shrink-n3 3 60 -- "$bindir/hang" -p shrink
    run_case hang-shrink-n4-tcp 4 60 "${tcp[@]}" -- "$bindir/hang" -p shrink
    # Soak: two communicators, two threads, a mixed random stream; results and RSS checked.
    run_case soak-n4 4 120 -- "$bindir/soak" -n 10000
    run_case soak-n4-ucx 4 120 NCCL_SHM_DISABLE=1 -- "$bindir/soak" -n 5000

    # Every algorithm forced, on every collective (a name that does not serve one is ignored
    # for it): the quick subset at 2, 3 and 8 ranks, then the full matrix of the collectives
    # the algorithm serves at 5 ranks (no power of two, uneven blocks) and at 8.
    for algo in "${algos[@]}"; do
        for n in 2 3 8; do
            run_case "algo-$algo-quick-n$n" "$n" 120 NCCLSHIM_ALGO="$algo" -- \
                "$bindir/collectives" -q -c "$colls"
        done
        # hier on one host is a direct reduce-scatter and all-gather: its full matrix runs on
        # pretend hosts below.
        for n in 5 8; do
            [[ $algo == hier ]] && continue
            run_case "algo-$algo-n$n" "$n" 300 NCCLSHIM_ALGO="$algo" -- \
                "$bindir/collectives" -c "${algo_colls[$algo]}"
        done
    done
    for nccl_algo in Tree ^Tree; do
        for n in 2 3 4 5 8; do
            run_case "nccl-algo-$nccl_algo-quick-n$n" "$n" 120 NCCL_ALGO="$nccl_algo" -- \
                "$bindir/collectives" -q -c "$colls"
        done
    done
    # The host-aware schedules on pretend hosts (hosts.sh): 3 + 2 ranks, 3 + 3 + 2, and
    # chosen by the cost model at 2 x 2.
    run_case algo-hier-n5-hosts2 5 300 MP_HOSTS=2 NCCLSHIM_ALGO=hier -- "$here/hosts.sh" \
        "$bindir/collectives" -c "${algo_colls[hier]}"
    run_case algo-hier-quick-n8-hosts3 8 120 MP_HOSTS=3 NCCLSHIM_ALGO=hier -- "$here/hosts.sh" \
        "$bindir/collectives" -q -c "${algo_colls[hier]}"
    run_case collectives-quick-n4-hosts2 4 120 MP_HOSTS=2 -- "$here/hosts.sh" \
        "$bindir/collectives" -q -c "$colls"
    run_case nccl-algo-per-coll-quick-n5 5 120 \
        NCCL_ALGO="allreduce:tree;broadcast:ring;reduce:tree" -- \
        "$bindir/collectives" -q -c "$colls"

    device_cases
fi

echo "mp: $passed passed, $failed failed"
((failed == 0))
