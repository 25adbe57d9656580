# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash disable=SC2034 # steps_last, steps_failed: read by the caller
#
# tools/gpu/steps.sh: steps under one deadline, for the stages of tools/gpu-check that must fit
# one call of the device tool (first, second). Sourced, not run.
#
# A stage is a list of steps in the order of what they tell. Each step runs under a timeout of
# min(its own budget, the time left before the deadline less a margin kept for the summary), in
# a session of its own: when the timeout ends it, whatever it left running (ranks, torchrun's
# workers, mpirun's) is killed by that session's id, so a hang costs its own step and nothing
# after it. Each step's line goes to the summary as soon as it ends, and the logs are packed
# into one file beside it after every step, so a call killed at its own limit still brings
# back what ran. Lines, one per step:
#
#   PASS NAME (12 s of 150): what it found         FAIL NAME (40 s of 150): what failed
#   TIMEOUT NAME (150 s of 150): over its own budget; what had run
#   CUT NAME (61 s of 61, budget 150): stopped at the deadline; what had run
#   CUT NAME (0 s, budget 150): not started, 3 s left before the deadline
#   SKIP NAME (0 s of 150): why (what this machine lacks)
#
# The step itself says what it found on the last line of STEPS_LOGS/NAME.result (tools/gpu-check
# writes "PASS NAME: text" there), or exits STEPS_SKIP with its reason there; failing that, its
# log's ok and FAIL lines are counted.
#
#   steps_init SECONDS MARGIN SUMMARY LOGS [PACK]   the deadline, SECONDS from now (kept in
#                                                   STEPS_END, exported, so that a nested
#                                                   invocation keeps it); PACK: the .tgz of LOGS
#   steps_run NAME BUDGET COMMAND...                one step, its output in LOGS/NAME.log
#   steps_left                                      seconds left before the deadline, margin off
#   steps_last                                      the last step's word

STEPS_SKIP=77
STEPS_MIN=5 # fewer seconds than this left: the step is not started
steps_failed=()
steps_last= # the last step's word: PASS, FAIL, TIMEOUT, CUT or SKIP

steps_init() {
    local seconds=$1
    steps_margin=$2
    steps_summary=$3
    STEPS_LOGS=$4
    steps_pack=${5:-}
    if [[ -z ${STEPS_END:-} ]]; then
        STEPS_END=$(($(date +%s) + seconds))
    fi
    export STEPS_END STEPS_LOGS
    mkdir -p "$STEPS_LOGS" "$(dirname "$steps_summary")"
}

steps_left() {
    echo $((STEPS_END - $(date +%s) - steps_margin))
}

# steps_line WORD NAME TEXT: one line of the summary, written now.
steps_line() {
    local line="$1 $2 $3"
    [[ $1 == PASS || $1 == SKIP ]] || steps_failed+=("$2")
    echo "$line" >>"$steps_summary"
    echo "gpu-check: $line"
}

# steps_progress LOG: what had run when a step was stopped, from its ok and FAIL lines
# (test/mp/run.sh's "ok   case" and "FAIL case", gpu-check's "ok name" and "FAILED: name").
steps_progress() {
    local log=$1 ok bad last
    ok=$(grep -cE '^(ok |gpu-check: ok )' "$log" 2>/dev/null)
    bad=$(grep -E '^(FAIL |gpu-check: FAILED)' "$log" 2>/dev/null | sed -E \
        's/^(FAIL +|gpu-check: FAILED:? *)//; s/ .*//; s/[:;,]$//' | tr '\n' ' ')
    last=$(grep -v '^ *$' "$log" 2>/dev/null | tail -1 | cut -c1-160)
    if ((ok > 0)) || [[ -n $bad ]]; then
        echo "${ok:-0} ok${bad:+, failed: ${bad% }}; last line: $last"
    else
        echo "last line: ${last:-none}"
    fi
}

# steps_session PID: the session id of process PID, from /proc (no procps needed).
steps_session() {
    local line
    read -r line 2>/dev/null <"/proc/$1/stat" || return 1
    line=${line##*) } # after the command's name: state ppid pgrp session ...
    read -r _ _ _ line _ <<<"$line"
    echo "$line"
}

# steps_reap SID: kills by its session id whatever the step left running.
steps_reap() {
    local sid=$1 stat pid
    [[ $sid =~ ^[0-9]+$ ]] && ((sid > 1)) && [[ $sid != "$(steps_session $$)" ]] || return 0
    for stat in /proc/[0-9]*/stat; do
        pid=${stat#/proc/}
        pid=${pid%/stat}
        [[ $(steps_session "$pid") == "$sid" ]] && kill -KILL "$pid" 2>/dev/null
    done
    return 0
}

steps_pack_logs() {
    [[ -n $steps_pack ]] || return 0
    tar czhf "$steps_pack.tmp" -C "$(dirname "$STEPS_LOGS")" "$(basename "$STEPS_LOGS")" \
        2>/dev/null
    mv -f "$steps_pack.tmp" "$steps_pack"
}

steps_run() {
    local name=$1 budget=$2
    shift 2
    local left limit log=$STEPS_LOGS/$name.log result=$STEPS_LOGS/$name.result
    local start took rc pid detail word
    left=$(steps_left)
    if ((left < STEPS_MIN)); then
        steps_line CUT "$name" "(0 s, budget $budget): not started, ${left} s left before the \
deadline"
        steps_last=CUT
        return 0
    fi
    limit=$((budget < left ? budget : left))
    rm -f "$result"
    start=$(date +%s)
    setsid timeout -k 5 "$limit" "$@" >"$log" 2>&1 </dev/null &
    pid=$!
    wait "$pid"
    rc=$?
    steps_reap "$pid"
    took=$(($(date +%s) - start))
    detail=$(grep -v '^ *$' "$result" 2>/dev/null | tail -1 | sed -E 's/^[A-Z]+ [^:]*: //')
    case $rc in
        0) word=PASS ;;
        "$STEPS_SKIP") word=SKIP ;;
        124 | 137)
            if ((limit < budget)); then
                word=CUT
                detail="stopped at the deadline; $(steps_progress "$log")"
            else
                word=TIMEOUT
                detail="over its own budget; $(steps_progress "$log")"
            fi
            ;;
        *) word=FAIL ;;
    esac
    [[ -n $detail ]] || detail="exit $rc; $(steps_progress "$log")"
    steps_last=$word
    if ((limit < budget)); then
        steps_line "$word" "$name" "($took s of $limit, budget $budget): $detail"
    else
        steps_line "$word" "$name" "($took s of $limit): $detail"
    fi
    if [[ $word != PASS && $word != SKIP ]]; then
        tail -12 "$log" | sed 's/^/    /'
    fi
    steps_pack_logs
}
