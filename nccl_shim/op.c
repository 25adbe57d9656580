/* SPDX-License-Identifier: Apache-2.0 */
/* Names of collectives as NCCL's logs spell them. */
#include "op.h"

const char *
shim_coll_name(enum shim_coll coll)
{
    static const char *const names[SHIM_COLL_COUNT] = {
        [SHIM_COLL_ALLREDUCE] = "AllReduce",
        [SHIM_COLL_BROADCAST] = "Broadcast",
        [SHIM_COLL_REDUCE] = "Reduce",
        [SHIM_COLL_ALLGATHER] = "AllGather",
        [SHIM_COLL_REDUCESCATTER] = "ReduceScatter",
        [SHIM_COLL_ALLTOALL] = "AlltoAll",
        [SHIM_COLL_GATHER] = "Gather",
        [SHIM_COLL_SCATTER] = "Scatter",
        [SHIM_COLL_SEND] = "Send",
        [SHIM_COLL_RECV] = "Recv",
        [SHIM_COLL_BARRIER] = "Barrier",
    };
    return (unsigned)coll < SHIM_COLL_COUNT ? names[coll] : "?";
}
