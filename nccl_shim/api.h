/* SPDX-License-Identifier: Apache-2.0 */
/* What the exporting files (api.c, api_coll_config.c, api_device.c) share: visibility, the
 * pnccl aliases and the table of collectives. */
#ifndef SHIM_API_H
#define SHIM_API_H

#define SHIM_API __attribute__((visibility("default")))
/* pnccl names are NCCL's profiling interface: the same functions under a second name. */
#define SHIM_ALIAS(name)                                                                     \
    extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")));

#include <nccl.h>

struct shim_op;

/*
 * The collectives of nccl.h that take a send and a receive buffer, a row each, from which
 * api.c defines ncclX and api_coll_config.c ncclXConfig. A row holds
 *   X       the name after "nccl"
 *   coll    the enum shim_coll after "SHIM_COLL_"
 *   count   nccl.h's name for the count (per rank in reduce-scatter and all-gather)
 *   mid     the parameters between datatype and comm, each with its comma, in parentheses
 *   op      the reduction operator the op descriptor gets (ncclSum, unused, where none)
 *   root    the root it gets (-1 where none)
 * and ncclX is
 *   ncclResult_t ncclX(const void *sendbuff, void *recvbuff, size_t count,
 *                      ncclDataType_t datatype, mid ncclComm_t comm, cudaStream_t stream);
 * ncclXConfig the same with a trailing const ncclCollConfig_t *config. nccl.h declares them
 * all, so the compiler checks every definition against NVIDIA's prototype.
 */
#define SHIM_API_COLLECTIVES(ROW)                                                             \
    ROW(AllReduce, ALLREDUCE, count, (ncclRedOp_t op,), op, -1)                                \
    ROW(Broadcast, BROADCAST, count, (int root,), ncclSum, root)                               \
    ROW(Reduce, REDUCE, count, (ncclRedOp_t op, int root,), op, root)                          \
    ROW(AllGather, ALLGATHER, sendcount, (), ncclSum, -1)                                      \
    ROW(ReduceScatter, REDUCESCATTER, recvcount, (ncclRedOp_t op,), op, -1)                    \
    ROW(AlltoAll, ALLTOALL, count, (), ncclSum, -1)                                            \
    ROW(Gather, GATHER, count, (int root,), ncclSum, root)                                     \
    ROW(Scatter, SCATTER, count, (int root,), ncclSum, root)

/* A row's mid without its parentheses. */
#define SHIM_API_UNPAREN(...) __VA_ARGS__

/* The op descriptor of a row's call, from the call's parameters (engine/op.h). */
#define SHIM_API_OP(coll_id, count_name, op_arg, root_arg)                                    \
    {.coll = SHIM_COLL_##coll_id, .sendbuff = sendbuff, .recvbuff = recvbuff,                 \
     .count = count_name, .datatype = datatype, .user_op = op_arg, .root = root_arg,          \
     .stream = stream, .comm = comm}

/* Every collective and point-to-point call (api.c): the argument checks, the NCCL-style
 * INFO(COLL) line, then the group (or a group of one). `api` names the call in messages. */
ncclResult_t shim_api_collective(struct shim_op *op, const char *api);

/* What asks a window for multimem addresses or CFT, LE or peer device handles (NVLink SHARP
 * and NCCL's device-side kernels, which ncclshim has not) gets ncclInvalidUsage, with a
 * message. */
ncclResult_t shim_api_no_device_window(const char *api);

#endif
