#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Runs a rank as if it had a host of its own: NCCL_HOSTID differs per rank (RANK, as
# ncclshim-launch and torchrun set it), so no shared-memory or device team forms and every
# message goes through the algorithms over UCX. UCX itself still picks its transports.
#   own_host.sh PROGRAM [ARGS...]
export NCCL_HOSTID=mp-host-${RANK:?own_host.sh needs RANK}
exec "$@"
