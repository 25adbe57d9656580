/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device team's row of the back-end table (backend.h): ranks sharing a host, carried out
 * by cudaipc/ (cudaipc.h). It serves a communicator whose ranks formed a shared-memory team,
 * where a driver is present, and forms the device team then.
 */
#include "backend.h"

#include "base/check.h"
#include "comm.h"
#include "cudaipc/cudaipc.h"

static struct cipc_team *
shim_team_of(const struct ncclComm *comm)
{
    return comm->backend_state;
}

static bool
shim_team_serves(const struct ncclComm *comm, const struct shim_backend_peers *peers)
{
    return peers != NULL && comm->shm != NULL && gpu_device_count() > 0;
}

static ncclResult_t
shim_team_create(struct ncclComm *comm, const struct shim_backend_peers *peers)
{
    struct cipc_team_args args = {.shm = comm->shm, .device = comm->cuda_dev,
                                  .reach = peers->reach,
                                  .first_on_device = peers->first_on_device,
                                  .device_here = peers->device_here, .id = comm->id_hash,
                                  .policy = &comm->policy, .log = &comm->log,
                                  .ready_now = comm->cuda_dev_chosen};
    struct cipc_team *team;

    SHIM_CHECK(cipc_team_create(&args, &team));
    comm->backend_state = team;
    return ncclSuccess;
}

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
    res = cipc_post_arrive(shim_team_of(comm), cops, nops, stream, capturing);
    free(cops);
    return res;
}

static ncclResult_t
shim_team_launch(struct ncclComm *comm, CUstream stream)
{
    return cipc_post_launch(shim_team_of(comm), stream);
}

static ncclResult_t
shim_team_wait(struct ncclComm *comm, CUstream stream)
{
    return cipc_post_wait(shim_team_of(comm), stream);
}

static ncclResult_t
shim_team_drain(struct ncclComm *comm)
{
    return cipc_team_drain(shim_team_of(comm));
}

static bool
shim_team_busy(const struct ncclComm *comm)
{
    return cipc_team_busy(shim_team_of(comm));
}

static ncclResult_t
shim_team_error(const struct ncclComm *comm)
{
    return cipc_team_error(shim_team_of(comm));
}

static void
shim_team_release(struct ncclComm *comm)
{
    cipc_team_release(shim_team_of(comm));
}

static void
shim_team_interrupt(struct ncclComm *comm)
{
    cipc_team_interrupt(shim_team_of(comm));
}

static ncclResult_t
shim_team_release_memory(struct ncclComm *comm)
{
    return cipc_team_release_memory(shim_team_of(comm));
}

static void
shim_team_device_bytes(const struct ncclComm *comm, uint64_t *releasable, uint64_t *persistent)
{
    *releasable = cipc_team_device_bytes(shim_team_of(comm));
    *persistent = cipc_team_persistent_bytes(shim_team_of(comm));
}

static ncclResult_t
shim_team_pin(struct ncclComm *comm, void *buff, size_t size, const struct gpu_mem_info *mem,
              struct gpu_pin *pin)
{
    return cipc_team_pin(shim_team_of(comm), buff, size, mem, pin);
}

static ncclResult_t
shim_team_unpin(struct ncclComm *comm, const struct gpu_pin *pin)
{
    return cipc_team_unpin(shim_team_of(comm), pin);
}

static void
shim_team_destroy(struct ncclComm *comm, bool abort)
{
    cipc_team_destroy(shim_team_of(comm), abort);
    comm->backend_state = NULL;
}

const struct shim_backend shim_backend_team = {
    .name = "device team",
    .serves = shim_team_serves,
    .create = shim_team_create,
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
