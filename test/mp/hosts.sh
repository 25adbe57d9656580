#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs a rank on one of MP_HOSTS pretend hosts, RANK mod MP_HOSTS (ranks dealt round-robin,
# so hosts may be uneven): NCCL_HOSTID names the host, so ranks of one pretend host count as
# sharing it and the host-aware schedules see hosts apart; no shared-memory or device team
# forms, since not every rank is on one host. UCX still picks its own transports.
#   MP_HOSTS=K hosts.sh PROGRAM [ARGS...]
export NCCL_HOSTID=mp-host-$((${RANK:?hosts.sh needs RANK} % ${MP_HOSTS:?hosts.sh needs MP_HOSTS}))
exec "$@"
