/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The op descriptor: one NCCL call, as api.c validated it. Everything below api.c (groups,
 * algorithm choice, the executor) works from this.
 */
#ifndef SHIM_OP_H
#define SHIM_OP_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "gpu/memory.h"
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
    /* Where the buffers live (api.c asks the driver): memory a kernel reaches makes the call
     * stream ordered (exec_device.c); plain host memory runs in the call. */
    bool device;
    struct gpu_mem_info send_mem, recv_mem;
    const void *scalar_dev; /* PreMulSum with ncclScalarDevice in device memory: the scalar */
    uint32_t seq;           /* device ops: the number shim_op_next_seq gave it when issued */
    bool capturing;         /* device ops: stream was being captured into a CUDA graph */
};

const char *shim_coll_name(enum shim_coll coll);
/* Whether a collective reduces (all-reduce, reduce, reduce-scatter): it takes an op. */
static inline bool
shim_coll_reduces(enum shim_coll coll)
{
    return coll == SHIM_COLL_ALLREDUCE || coll == SHIM_COLL_REDUCE ||
           coll == SHIM_COLL_REDUCESCATTER;
}
/* The algorithms' name for a collective. */
enum alg_coll shim_op_alg_coll(enum shim_coll coll);
/* op's number: a collective takes its communicator's next one (every rank calls collectives
 * in the same order), a send or receive the next of its (peer, direction), which is how NCCL
 * matches them: in order per pair of ranks. Consumed: call once per op. */
uint32_t shim_op_next_seq(struct ncclComm *comm, const struct shim_op *op);

#endif
