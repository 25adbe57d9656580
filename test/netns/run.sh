#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# test/netns/run.sh: several hosts on one machine. Builds a switch and three hosts out of
# network namespaces: ns-sw-TAG holds a bridge br0; each host ns-hI-TAG (I = 0, 1, 2; TAG is
# this script's pid, so runs do not collide) has one end of a veth pair, named vhI, addressed
# 10.77.0.(I+1)/24, whose other end is a port of br0; every host brings up lo as well.
# Nothing is added to the root namespace. Rank r runs as a plain process in host r mod 3
# (`ip netns exec`, under timeout(1)) with RANK, WORLD_SIZE, NCCL_COMM_ID=10.77.0.1:PORT
# (rank 0 hosts the bootstrap root), NCCL_SOCKET_IFNAME=vhI, UCX_TLS=tcp and
# UCX_NET_DEVICES=vhI. The library hashes the network namespace into its host identity, so
# each namespace is a host of its own and their ranks talk over UCX's TCP.
#
# Cases: test/mp/collectives, its full matrix (every collective, type, reduction, count,
# root, in and out of place, groups, split) at 3, 4 and 6 ranks (at 4, host 0 holds two
# ranks; at 6, every host does), shrink at 4, and the host-aware schedules (NCCLSHIM_ALGO=hier)
# at 6; the pipeline chunk a 64 MiB broadcast logs (512 KiB across hosts, or the user's
# NCCLSHIM_CHUNK_BYTES; the whole message between two ranks); then test/netns/hostloss at 4
# ranks, where in the middle of a loop of all-reduces one host goes away, and every other rank
# must get an error within HL_BOUND seconds and exit: host 2 (rank 2) and host 0 (ranks 0 and
# 3, and the bootstrap root) by SIGKILL of their ranks, which the survivors see at once as
# closed connections; and host 2 by deleting its veth (its rank lives on, cut off), which only
# NCCLSHIM_TIMEOUT=10 can tell (nothing of TCP or UCX notices a silent peer for minutes).
# Then device buffers across the hosts (collectives -D, staged through pinned memory over the
# same TCP), at 3 and 4 ranks (and at 4 with one hardware queue per context, and with the
# host-aware schedules forced), through the
# CUDA driver's test double, or with NETNS_GPU=1 on
# the real driver of a GPU machine (tools/gpu-check), every rank on its one GPU.
# NETNS_CASES='run_case ...; hostloss_case ...' runs those cases instead.
#
# Prints each case's name, result and time (and the end of its logs when it fails; logs stay in
# $BUILD/test/netns/logs), then `netns: N passed, M failed`; exits 1 on any failure. Skips
# (exit 0, a "netns: skipped: ..." line) when not root or when `ip netns` is unavailable.
# The namespaces and links go away on exit, whatever happened. Run by `make test-netns`.
set -euo pipefail

BUILD=${BUILD:-build}
bindir=$BUILD/test
logdir=$BUILD/test/netns/logs
tag=$$
nhosts=3
sw=ns-sw-$tag
hosts=()
for ((i = 0; i < nhosts; i++)); do
    hosts+=("ns-h$i-$tag")
done
port=29600
HL_BOUND=${HL_BOUND:-30}

skip() {
    echo "netns: skipped: $*"
    exit 0
}

if [[ $(id -u) -ne 0 ]]; then
    skip "not root (network namespaces need CAP_SYS_ADMIN)"
fi
if ! command -v ip >/dev/null || ! ip netns list >/dev/null 2>&1; then
    skip "\`ip netns\` is unavailable (apt-get install iproute2)"
fi
if ! probe=$(ip netns add "ns-probe-$tag" 2>&1); then
    skip "cannot create a network namespace: $probe"
fi
ip netns del "ns-probe-$tag"
for prog in "$bindir/mp/collectives" "$bindir/mp/streams" "$bindir/netns/hostloss" \
    "$BUILD/bin/broadcast_perf"; do
    if [[ ! -x $prog ]]; then
        echo "netns: $prog is missing (run make test-netns)"
        echo "netns: 0 passed, 1 failed"
        exit 1
    fi
done
mkdir -p "$logdir"

# --- topology -------------------------------------------------------------------------------

cleanup() {
    local pids
    # Whatever still runs inside our hosts (a case that failed half-way) dies with them.
    for ns in "${hosts[@]}"; do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [[ -n $pids ]] && kill -KILL $pids 2>/dev/null || true
    done
    # Deleting a namespace destroys the veth ends in it, and with them their peers.
    for ns in "${hosts[@]}" "$sw"; do
        ip netns del "$ns" 2>/dev/null || true
    done
    for ((i = 0; i < nhosts; i++)); do
        ip link del "vs$i-$tag" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'echo "netns: interrupted"; exit 130' INT TERM HUP

topology_up() {
    ip netns add "$sw"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    ip -n "$sw" link set lo up
    for ((i = 0; i < nhosts; i++)); do
        local ns=${hosts[$i]} swport=vs$i-$tag
        ip netns add "$ns"
        # Made in the root namespace under names unique to this run, then moved away.
        ip link add "$swport" type veth peer name "vh$i-$tag"
        ip link set "$swport" netns "$sw"
        ip link set "vh$i-$tag" netns "$ns" name "vh$i"
        ip -n "$sw" link set "$swport" master br0
        ip -n "$sw" link set "$swport" up
        ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev "vh$i"
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "vh$i" up
    done
}

if ! topology_up >"$logdir/topology.log" 2>&1; then
    echo "netns: could not build the hosts (log: $logdir/topology.log):"
    sed 's/^/    /' "$logdir/topology.log"
    echo "netns: 0 passed, 1 failed"
    exit 1
fi

# --- cases ----------------------------------------------------------------------------------

passed=0
failed=0

# rank_start CASE RANK NRANKS LIMIT [VAR=VALUE...] -- PROGRAM [ARGS...]: starts one rank in
# the background in host RANK mod 3, output in $logdir/CASE.rRANK.log; its pid in $rank_pid.
rank_start() {
    local name=$1 rank=$2 nranks=$3 limit=$4
    shift 4
    local envs=()
    while [[ $1 != -- ]]; do
        envs+=("$1")
        shift
    done
    shift
    local h=$((rank % nhosts))
    # In a subshell, so that a rank killed by a signal is reported in its log, not here.
    (
        timeout -k 5 "$limit" ip netns exec "${hosts[$h]}" env RANK="$rank" \
            WORLD_SIZE="$nranks" LOCAL_RANK=$((rank / nhosts)) NETNS_HOST="$h" \
            NCCL_COMM_ID="10.77.0.1:$port" NCCL_SOCKET_IFNAME="vh$h" UCX_TLS=tcp \
            UCX_NET_DEVICES="vh$h" "${envs[@]}" "$@"
        exit $?
    ) >"$logdir/$name.r$rank.log" 2>&1 &
    rank_pid=$!
}

report() {
    local name=$1 took=$2 why=$3
    if [[ -z $why ]]; then
        printf 'ok   %-34s %4ds\n' "$name" "$took"
        passed=$((passed + 1))
    else
        printf 'FAIL %-34s %4ds  %s (logs: %s/%s.r*.log)\n' "$name" "$took" "$why" \
            "$logdir" "$name"
        for log in "$logdir/$name".r*.log; do
            echo "    --- $log"
            tail -n 12 "$log" | sed 's/^/    /'
        done
        failed=$((failed + 1))
    fi
}

# wait_ranks STOP PID...: waits for every rank, in the order they end, into rank_rc[r] and
# rank_end[r] ($SECONDS then). STOP=1: the first rank to fail (exit not 0) ends the others,
# as tools/launcher does, rather than leaving them to wait out their timeout.
wait_ranks() {
    local stop=$1
    shift
    local pids=("$@") n=$# left=$# r rc
    rank_rc=()
    rank_end=()
    while ((left > 0)); do
        for ((r = 0; r < n; r++)); do
            if [[ -z ${rank_rc[$r]:-} ]] && ! kill -0 "${pids[$r]}" 2>/dev/null; then
                rc=0
                { wait "${pids[$r]}"; } 2>/dev/null || rc=$?
                rank_rc[$r]=$rc
                rank_end[$r]=$SECONDS
                left=$((left - 1))
                if ((stop && rc != 0)); then
                    for ns in "${hosts[@]}"; do
                        kill -KILL $(ip netns pids "$ns") 2>/dev/null || true
                    done
                    stop=0
                fi
            fi
        done
        ((left > 0)) && sleep 0.1
    done
    return 0
}

# run_case NAME NRANKS LIMIT [VAR=VALUE...] -- PROGRAM [ARGS...]: every rank must exit 0.
run_case() {
    local name=$1 nranks=$2 limit=$3
    shift 3
    local pids=() start=$SECONDS why= rc
    port=$((port + 1))
    for ((r = 0; r < nranks; r++)); do
        rank_start "$name" "$r" "$nranks" "$limit" "$@"
        pids+=("$rank_pid")
    done
    wait_ranks 1 "${pids[@]}"
    for ((r = 0; r < nranks; r++)); do
        rc=${rank_rc[$r]}
        if ((rc == 124)); then
            why+="rank $r timed out after ${limit}s; "
        elif ((rc == 137)); then
            why+="rank $r killed (timed out, or stopped after another failed); "
        elif ((rc != 0)); then
            why+="rank $r exit $rc; "
        fi
    done
    report "$name" $((SECONDS - start)) "${why%; }"
}

# hostloss_case NAME HOW HOST [VAR=VALUE...]: 4 ranks of hostloss (with the variables given),
# each with a communicator of its host too; once all have done their first rounds, HOST goes
# away: HOW=kill SIGKILLs its ranks, HOW=unplug deletes its veth. Every other rank must exit 3
# (an error seen within HL_BOUND s of its last good round, then an abort; after a kill, its
# host's communicator must still work) and do so within HL_BOUND + 10 s of the loss; an
# unplugged rank must exit too (any status).
hostloss_case() {
    local name=$1 how=$2 victim_host=$3 nranks=4 limit=120
    shift 3
    local pids=() start=$SECONDS why= rc lost ended r
    local ready=$logdir/$name.ready
    port=$((port + 1))
    rm -f "$ready".*
    for ((r = 0; r < nranks; r++)); do
        rank_start "$name" "$r" "$nranks" "$limit" "$@" -- \
            "$bindir/netns/hostloss" -d 90 -r 20 -b "$HL_BOUND" -f "$ready.$r" \
            $([[ $how == kill ]] && echo -k)
        pids+=("$rank_pid")
    done
    # Mid-run: every rank has finished 20 rounds (at most 60 s for that).
    local all=0
    for ((t = 0; t < 600 && !all; t++)); do
        all=1
        for ((r = 0; r < nranks; r++)); do
            [[ -e $ready.$r ]] || all=0
        done
        ((all)) || sleep 0.1
    done
    ((all)) || why+="not every rank got through 20 rounds in 60 s; "
    lost=$SECONDS
    case $how in
        kill) kill -KILL $(ip netns pids "${hosts[$victim_host]}") 2>/dev/null || true ;;
        unplug) ip -n "${hosts[$victim_host]}" link del "vh$victim_host" ;;
    esac
    wait_ranks 0 "${pids[@]}"
    for ((r = 0; r < nranks; r++)); do
        rc=${rank_rc[$r]}
        ended=$((rank_end[r] - lost))
        if ((r % nhosts == victim_host)); then
            if [[ $how == kill ]] && ((rc != 137)); then
                why+="victim rank $r exit $rc, not SIGKILL; "
            elif ((rc == 124)); then
                why+="cut-off rank $r hung until the ${limit}s timeout; "
            fi
        elif ((rc == 124 || rc == 137)); then
            why+="survivor rank $r hung until the ${limit}s timeout; "
        elif ((rc != 3)); then
            why+="survivor rank $r exit $rc, not 3 (an error seen, then abort); "
        elif ((ended > HL_BOUND + 10)); then
            why+="survivor rank $r exited ${ended}s after the loss; "
        fi
    done
    # The host's veth comes back for later cases.
    if [[ $how == unplug ]]; then
        local i=$victim_host
        ip link add "vs$i-$tag" type veth peer name "vh$i-$tag" &&
            ip link set "vs$i-$tag" netns "$sw" &&
            ip link set "vh$i-$tag" netns "${hosts[$i]}" name "vh$i" &&
            ip -n "$sw" link set "vs$i-$tag" master br0 &&
            ip -n "$sw" link set "vs$i-$tag" up &&
            ip -n "${hosts[$i]}" addr add "10.77.0.$((i + 1))/24" dev "vh$i" &&
            ip -n "${hosts[$i]}" link set "vh$i" up || why+="could not plug host $i back; "
    fi
    rm -f "$ready".*
    report "$name" $((SECONDS - start)) "${why%; }"
    # When each rank saw its error, after its last good round, and what it was.
    local seen='^hostloss: rank \([0-9]*\): error after [0-9]* rounds, \([0-9.]*\) s after'
    seen+=' the last good one: \([A-Za-z]*\) returned \(.*\) ([0-9]*); last.*'
    grep -h 'error after' "$logdir/$name".r*.log |
        sed -n "s/$seen/     rank \\1: \\3 failed after \\2 s: \\4/p"
}

# chunk_case NAME NRANKS BYTES WANT [VAR=VALUE...]: a broadcast of BYTES over NRANKS hosts
# (the benchmark, with NCCL_DEBUG_SUBSYS=TUNING) must log the pipeline chunk WANT bytes. For
# 64 MiB at 3, the largest the communicator allows there (512 KiB across hosts unless
# NCCLSHIM_CHUNK_BYTES says otherwise); at 2, the whole message (no pipeline to fill) unless
# the user set a chunk; for 32 KiB at 3, whole (524288: the largest, nothing cut), not cut in
# two (the model's optimum under the smallest chunk across hosts, 32 KiB).
chunk_case() {
    local name=$1 nranks=$2 bytes=$3 want=$4
    shift 4
    run_case "$name" "$nranks" 120 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING "$@" -- \
        "$BUILD/bin/broadcast_perf" -b "$bytes" -e "$bytes" -w 0 -n 1
    local line
    line=$(grep -h -o "Broadcast: $bytes bytes on $nranks ranks -> .*" \
        "$logdir/$name".r*.log | head -n 1)
    if [[ ${line:-} != *", chunk $want bytes"* ]]; then
        passed=$((passed - 1))
        local why="the broadcast of $bytes bytes chose \"${line:-nothing logged}\""
        report "$name" 0 "$why, not a chunk of $want bytes"
    fi
}

colls=allreduce,reduce,reducescatter,broadcast,allgather,alltoall,gather,scatter,sendrecv
colls=$colls,groups,split
# The double without its one rule the library is known to break (sync_exempt.sh says why).
. "$(dirname "$0")/../doubles/sync_exempt.sh"
dev=(LD_LIBRARY_PATH="$(cd "$BUILD" && pwd)/test/doubles"
     FAKE_CUDA_SYNC_EXEMPT=$fake_cuda_map_calls)
if [[ ${NETNS_GPU:-0} == 1 ]]; then
    dev=()
fi
if [[ -n ${NETNS_CASES:-} ]]; then
    eval "$NETNS_CASES"
else
    # The full matrix at 3 ranks (one a host), 4 (host 0 holds ranks 0 and 3) and 6 (two
    # ranks a host); shrink on its own, as test/mp does.
    for n in 3 4 6; do
        run_case "collectives-n$n" "$n" 180 -- "$bindir/mp/collectives" -c "$colls"
    done
    run_case collectives-shrink-n4 4 60 -- "$bindir/mp/collectives" -c shrink
    # The host-aware schedules forced, two ranks a host (host memory) and 2, 1, 1 (device).
    run_case collectives-hier-n6 6 180 NCCLSHIM_ALGO=hier -- "$bindir/mp/collectives" \
        -c allreduce,allgather,reducescatter,broadcast,reduce,gather,scatter,alltoall
    # The pipeline chunk across hosts: 512 KiB, or the user's; two ranks, the whole message;
    # nothing under 32 KiB.
    chunk_case chunk-across-hosts-n3 3 67108864 524288
    chunk_case chunk-user-n3 3 67108864 65536 NCCLSHIM_CHUNK_BYTES=65536
    chunk_case chunk-whole-n2 2 67108864 67108864
    chunk_case chunk-user-n2 2 67108864 524288 NCCLSHIM_CHUNK_BYTES=524288
    chunk_case chunk-floor-n3 3 32768 524288
    # A host goes away: killed (host 2: rank 2; host 0: ranks 0 and 3, with the bootstrap
    # root), or cut off (its veth deleted), where only NCCLSHIM_TIMEOUT can tell.
    hostloss_case hostloss-kill-h2-n4 kill 2
    hostloss_case hostloss-kill-h0-n4 kill 0
    hostloss_case hostloss-unplug-h2-n4 unplug 2 NCCLSHIM_TIMEOUT=10
    # Device buffers across hosts: every kind at 3 ranks, device memory at 4.
    run_case device-collectives-quick-n3 3 180 "${dev[@]}" -- \
        "$bindir/mp/collectives" -q -D mixed -c "$colls"
    run_case device-collectives-n4 4 180 "${dev[@]}" -- \
        "$bindir/mp/collectives" -D device -c "$colls"
    run_case device-collectives-hier-n4 4 180 "${dev[@]}" NCCLSHIM_ALGO=hier -- \
        "$bindir/mp/collectives" -q -D mixed \
        -c allreduce,allgather,reducescatter,broadcast,reduce,gather,scatter,alltoall
    # One hardware queue per context (CUDA_DEVICE_MAX_CONNECTIONS=1): the lanes share the
    # user's streams' queue.
    run_case device-collectives-quick-n4-onequeue 4 180 "${dev[@]}" \
        CUDA_DEVICE_MAX_CONNECTIONS=1 -- "$bindir/mp/collectives" -q -D mixed -c "$colls"
    # Device windows across the hosts: mirrors, logs and each rank's proxy, over TCP.
    run_case device-streams-window-n4 4 120 "${dev[@]}" -- "$bindir/mp/streams" -p window -X
fi

echo "netns: $passed passed, $failed failed"
((failed == 0))
