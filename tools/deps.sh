#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tools/deps.sh [build|test|compare]: makes sure this machine has what `make` (build), `make
# test` (test, the default) or `make compare` and `make compare-hosts` (compare: the build set,
# both MPIs and matplotlib, iproute2 and iperf3 for the hosts, plus python3-torch for Gloo when
# this Debian release has a candidate for it) need.
# Debian packages are checked with dpkg-query; missing ones are installed with apt-get when we
# are root (after one `apt-get update`), or named on one line (exit 1) when we are not. The
# genuine NCCL of the ABI ncclshim implements is not Debian's: the Makefile fetches it from
# PyPI (tools/fetch_nccl.sh, which needs the python3 named here). Prints nothing when
# everything is present. Called by the Makefile's `deps` target and by CI.
set -euo pipefail

usage() {
    echo "usage: $0 [build|test|compare]" >&2
    exit 2
}

[[ $# -le 1 ]] || usage
build_pkgs=(gcc make libucx-dev ucx-utils binutils python3 ca-certificates)
# clang (14 on bookworm) builds the fuzz harnesses of test/fuzz; its libFuzzer and sanitizer
# runtimes (libclang-rt-dev) come only as a Recommends, which the install below skips.
# iproute2's `ip netns` builds the hosts of test/netns (make test-netns).
test_pkgs=("${build_pkgs[@]}" libcriterion-dev pkg-config procps clang libclang-rt-dev
           iproute2)
# compare-hosts makes its hosts with `ip netns` and measures their TCP with iperf3.
compare_pkgs=("${build_pkgs[@]}" openmpi-bin libopenmpi-dev mpich libmpich-dev python3
              python3-matplotlib iproute2 iperf3)
case ${1:-test} in
    build) wanted=("${build_pkgs[@]}") ;;
    test) wanted=("${test_pkgs[@]}") ;;
    compare)
        wanted=("${compare_pkgs[@]}")
        # Gloo comes with PyTorch; optional, so only asked for where Debian offers it.
        torch_policy=$(apt-cache policy python3-torch 2>/dev/null || true)
        if [[ $torch_policy == *"Candidate: "[0-9]* ]]; then
            wanted+=(python3-torch)
        fi
        ;;
    *) usage ;;
esac

missing=()
for pkg in "${wanted[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    if [[ $status != installed ]]; then
        missing+=("$pkg")
    fi
done

status=0
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $(id -u) -eq 0 ]]; then
        echo "deps: installing ${missing[*]}" >&2
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}" >&2
    else
        echo "deps: missing Debian packages; run: sudo apt-get install ${missing[*]}" >&2
        status=1
    fi
fi
exit "$status"
