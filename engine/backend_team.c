/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device team's row of the back-end table (backend.h): ranks sharing a host, carried out
 * by cudaipc/ (cudaipc.h), whose team comm_shm.c made with the shared-memory team.
 */
#include "backend.h"

#include "base/check.h"
#include "comm.h"

static struct cipc_op
shim_team_op(const struct shim_op *op)
{
    return (struct cipc_op){
        .coll = shim_op_alg_coll(op->coll),
        .send = op->sendbuff,
        .recv = op->recvbuff,
        .send_mem = op->send_mem,
        .recv_mem = op->recv_mem,
        .count = op->count,
        .redop = op->redop,
        .scalar_dev = op->scalar_dev,
        .root = op->root,
        .match = op->seq,
    };
}

static ncclResult_t
shim_team_arrive(struct ncclComm *comm, const struct shim_op *ops, int nops,
                 const struct gpu_device *gpu, CUstream stream, bool capturing)
{
    struct cipc_op *cops;
    ncclResult_t res;

    (void)gpu; /* the team's own */
    SHIM_CHECK(shim_calloc(&cops, (size_t)nops));
    for (int i = 0; i < nops; i++) {
        cops[i] = shim_team_op(&ops[i]);
    }
    res = cipc_post_arrive(comm->dev, cops, nops, stream, capturing);
    free(cops);
    return res;
}

static ncclResult_t
shim_team_launch(struct ncclComm *comm, CUstream stream)
{
    return cipc_post_launch(comm->dev, stream);
}

static ncclResult_t
shim_team_wait(struct ncclComm *comm, CUstream stream)
{
    return cipc_post_wait(comm->dev, stream);
}

static ncclResult_t
shim_team_drain(struct ncclComm *comm)
{
    return cipc_team_drain(comm->dev);
}

static bool
shim_team_busy(const struct ncclComm *comm)
{
    return cipc_team_busy(comm->dev);
}

static ncclResult_t
shim_team_error(const struct ncclComm *comm)
{
    return cipc_team_error(comm->dev);
}

static void
shim_team_release(struct ncclComm *comm)
{
    cipc_team_release(comm->dev);
}

static void
shim_team_interrupt(struct ncclComm *comm)
{
    cipc_team_interrupt(comm->dev);
}

static ncclResult_t
shim_team_release_memory(struct ncclComm *comm)
{
    return cipc_team_release_memory(comm->dev);
}

static void
shim_team_device_bytes(const struct ncclComm *comm, uint64_t *releasable, uint64_t *persistent)
{
    *releasable = cipc_team_device_bytes(comm->dev);
    *persistent = cipc_team_persistent_bytes(comm->dev);
}

static ncclResult_t
shim_team_pin(struct ncclComm *comm, void *buff, size_t size, const struct gpu_mem_info *mem,
              struct cipc_pin *pin)
{
    return cipc_team_pin(comm->dev, buff, size, mem, pin);
}

static ncclResult_t
shim_team_unpin(struct ncclComm *comm, const struct cipc_pin *pin)
{
    return cipc_team_unpin(comm->dev, pin);
}

static void
shim_team_destroy(struct ncclComm *comm, bool abort)
{
    cipc_team_destroy(comm->dev, abort);
    comm->dev = NULL;
}

const struct shim_backend shim_backend_team = {
    .name = "device team",
    .captures = true,
    .drives_worker = false,
    .arrive = shim_team_arrive,
    .launch = shim_team_launch,
    .wait = shim_team_wait,
    .drain = shim_team_drain,
    .busy = shim_team_busy,
    .error = shim_team_error,
    .release = shim_team_release,
    .interrupt = shim_team_interrupt,
    .release_memory = shim_team_release_memory,
    .device_bytes = shim_team_device_bytes,
    .pin = shim_team_pin,
    .unpin = shim_team_unpin,
    .destroy = shim_team_destroy,
};

const struct shim_backend *
shim_backend_choose(const struct ncclComm *comm)
{
    if (comm->dev != NULL) {
        return &shim_backend_team;
    }
    return comm->nranks == 1 ? &shim_backend_solo : &shim_backend_staged;
}
