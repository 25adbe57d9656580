/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The back-end table (backend.h): its rows in the order they are asked, and the choice.
 */
#include "backend.h"

#include "base/check.h"
#include "comm.h"
#include "kernels/device.h"

/* The device team first: where ranks share a host it serves their device memory without the
 * network. The other two split what is left by rank count. */
static const struct shim_backend *const shim_backends[] = {
    &shim_backend_team,
    &shim_backend_solo,
    &shim_backend_staged,
};

#define SHIM_BACKENDS (sizeof(shim_backends) / sizeof(shim_backends[0]))

/* Where the program chose the communicator's device, its kernels load now: loading may
 * synchronize the context, which must not happen behind a wait the program queued before its
 * first device call (kernels/device.h). */
static void
shim_backend_preload(const struct ncclComm *comm)
{
    const struct gpu_device *gpu;

    if (comm->cuda_dev_chosen && comm->cuda_dev >= 0 && comm->cuda_dev < gpu_device_count() &&
        gpu_device_get(comm->cuda_dev, &gpu) == ncclSuccess) {
        kr_dev_preload(gpu);
    }
}

void
shim_backend_connect(struct ncclComm *comm, const struct shim_backend_peers *peers)
{
    for (size_t i = 0; i < SHIM_BACKENDS; i++) {
        const struct shim_backend *row = shim_backends[i];
        if (!row->serves(comm, peers)) {
            continue;
        }
        ncclResult_t res = row->create != NULL ? row->create(comm, peers) : ncclSuccess;
        if (res != ncclSuccess) {
            INFO(SHIM_INIT, "comm %p rank %d: no %s (%s): the next back-end serves it",
                 (void *)comm, comm->rank, row->name, shim_result_text(res));
            continue;
        }
        comm->backend = row;
        INFO(SHIM_INIT, "comm %p rank %d: device memory by the %s", (void *)comm, comm->rank,
             row->name);
        shim_backend_preload(comm);
        return;
    }
}

const struct shim_backend *
shim_backend_choose(const struct ncclComm *comm)
{
    for (size_t i = 0; i < SHIM_BACKENDS; i++) {
        if (shim_backends[i]->serves(comm, NULL)) {
            return shim_backends[i];
        }
    }
    return &shim_backend_staged; /* it serves every communicator of several ranks */
}
