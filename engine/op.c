/* SPDX-License-Identifier: Apache-2.0 */
/* What the op descriptor means for the rest of the library: names as NCCL's logs spell them,
 * the algorithms' collective, and op numbering. */
#include "op.h"

#include "comm.h"

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

enum alg_coll
shim_op_alg_coll(enum shim_coll coll)
{
    static const enum alg_coll map[SHIM_COLL_COUNT] = {
        [SHIM_COLL_ALLREDUCE] = ALG_COLL_ALLREDUCE,
        [SHIM_COLL_BROADCAST] = ALG_COLL_BROADCAST,
        [SHIM_COLL_REDUCE] = ALG_COLL_REDUCE,
        [SHIM_COLL_ALLGATHER] = ALG_COLL_ALLGATHER,
        [SHIM_COLL_REDUCESCATTER] = ALG_COLL_REDUCESCATTER,
        [SHIM_COLL_ALLTOALL] = ALG_COLL_ALLTOALL,
        [SHIM_COLL_GATHER] = ALG_COLL_GATHER,
        [SHIM_COLL_SCATTER] = ALG_COLL_SCATTER,
        [SHIM_COLL_SEND] = ALG_COLL_SEND,
        [SHIM_COLL_RECV] = ALG_COLL_RECV,
        [SHIM_COLL_BARRIER] = ALG_COLL_BARRIER,
    };
    return map[coll];
}

uint32_t
shim_op_next_seq(struct ncclComm *comm, const struct shim_op *op)
{
    switch (op->coll) {
    case SHIM_COLL_SEND:
        return comm->p2p_sent[op->root]++;
    case SHIM_COLL_RECV:
        return comm->p2p_received[op->root]++;
    default:
        return comm->seq++;
    }
}
