#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tools/compare/netns_ssh.sh [OPTION...] HOST COMMAND...: ssh into one of the hosts that
# tools/compare/hosts.py (`make compare-hosts`) makes out of namespaces. Open MPI's mpirun
# (--mca plm_rsh_agent) and MPICH's mpiexec (-launcher ssh -launcher-exec) start their daemons
# on the other hosts of a job through ssh; given this instead, they start them in HOST's
# network namespace (`ip netns exec HOST`, which also shows that namespace's /sys/class/net)
# and in its IPC and UTS namespaces, which hosts.py keeps bind-mounted at
# /run/ncclshim-hosts/HOST.ipc and HOST.uts. The IPC namespace is what makes two hosts two to
# UCX, whose shared-memory transports otherwise reach across network namespaces (they compare
# boot ids); the UTS namespace gives each host its own host name, on which Open MPI keys its
# session directories. COMMAND's words are joined by spaces and run by sh, as ssh's remote
# shell would. Options before HOST (mpiexec passes -x) are ignored. Exits 255, as ssh does,
# when HOST is not such a host.
set -uo pipefail

while [[ $# -gt 0 && $1 == -* ]]; do
    shift
done
if [[ $# -lt 2 ]]; then
    echo "usage: $0 [OPTION...] HOST COMMAND..." >&2
    exit 255
fi
host=$1
shift
dir=/run/ncclshim-hosts
if [[ ! -e /run/netns/$host || ! -e $dir/$host.ipc || ! -e $dir/$host.uts ]]; then
    echo "netns_ssh: $host: no such host (no network namespace or no $dir/$host.ipc)" >&2
    exit 255
fi
exec ip netns exec "$host" nsenter --ipc="$dir/$host.ipc" --uts="$dir/$host.uts" \
    /bin/sh -c "$*"
