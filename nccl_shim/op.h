/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The op descriptor: one NCCL call, as api.c validated it. Everything below api.c (groups,
 * algorithm choice, the executor) works from this.
 */
#ifndef SHIM_OP_H
#define SHIM_OP_H

#include <nccl.h>
#include <stddef.h>

#include "kernels/kernels.h"

enum shim_coll {
    SHIM_COLL_ALLREDUCE,
    SHIM_COLL_BROADCAST,
    SHIM_COLL_REDUCE,
    SHIM_COLL_ALLGATHER,
    SHIM_COLL_REDUCESCATTER,
    SHIM_COLL_ALLTOALL,
    SHIM_COLL_GATHER,
    SHIM_COLL_SCATTER,
    SHIM_COLL_SEND,
    SHIM_COLL_RECV,
    SHIM_COLL_BARRIER, /* internal: ncclCommFinalize's "everyone is done" */
    SHIM_COLL_COUNT
};

struct ncclComm;

struct shim_op {
    enum shim_coll coll;
    const void *sendbuff;
    void *recvbuff;
    size_t count;           /* elements, as the call counts them */
    ncclDataType_t datatype;
    ncclRedOp_t user_op;    /* as the user passed it, for logs */
    struct kr_redop redop;  /* resolved: built-in, Avg or PreMulSum made concrete */
    int root;               /* root or peer; -1 where none */
    cudaStream_t stream;
    struct ncclComm *comm;
};

const char *shim_coll_name(enum shim_coll coll);

#endif
