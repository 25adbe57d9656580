/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclCommRegister and ncclCommDeregister: buffers a communicator will see again.
 *
 * A registration is a record on its communicator; the handle is the record, looked up in the
 * communicator's list before use, so a stale handle or another communicator's is an error,
 * never a crash. What registering does depends on the path that will carry the buffer:
 *   - device memory a device team's leader maps (cudaipc/): exported at once (the legacy IPC
 *     handle made, or the cuMem allocation's file descriptor sent) and pinned in the rank's
 *     table of exports, so the leader maps it once, at its first use, and keeps the mapping
 *     until deregistration, however many other allocations come and go; deregistration lets
 *     it go (at once if no operation in flight uses it);
 *   - anything else (host memory, device memory across hosts or on a single rank): the record
 *     only. Our host paths send from user buffers as they are, and UCX keeps its own cache of
 *     registrations.
 * Destroy and abort drop every record; the device team's mappings go with the team. The
 * team's part runs in relaxed capture mode, as NCCL's registration does: a program may
 * capture in global mode meanwhile, which forbids exporting and registering memory.
 */
#include "register.h"

#include <pthread.h>
#include <stdlib.h>

#include "base/check.h"
#include "engine/backend.h"
#include "engine/exec_device.h"
#include "gpu/driver.h"
#include "gpu/memory.h"
#include "gpu/pin.h"

struct shim_reg {
    struct ncclComm *comm;
    void *ptr;
    size_t size;
    struct gpu_pin pin;      /* what the device back-end pinned, if anything */
    struct shim_reg *next;
};

ncclResult_t
shim_reg_add(struct ncclComm *comm, void *buff, size_t size, void **handle_out)
{
    struct shim_reg *reg;
    struct gpu_mem_info mem;

    SHIM_CHECK(shim_calloc(&reg, 1));
    reg->comm = comm;
    reg->ptr = buff;
    reg->size = size;
    gpu_mem_query(buff, &mem);
    const struct shim_backend *backend = shim_devexec_backend(comm);
    if (backend->pin != NULL && mem.kind == GPU_MEM_DEVICE && size > 0) {
        /* Exporting (and the team's first device call, which registers its control blocks)
         * is among what a program's capture in global mode forbids: relaxed, as NCCL does. */
        CUstreamCaptureMode mode = gpu_capture_relax();
        ncclResult_t res = backend->pin(comm, buff, size, &mem, &reg->pin);
        gpu_capture_restore(mode);
        if (res != ncclSuccess) {
            free(reg);
            return res;
        }
    }
    INFO(SHIM_REG, "rank %d: registered %zu bytes of %s at %p%s", comm->rank, size,
         gpu_mem_kind_name(mem.kind), buff,
         reg->pin.pinned ? ", exported to the device team's leader" : "");
    pthread_mutex_lock(&comm->lock);
    reg->next = comm->regs;
    comm->regs = reg;
    pthread_mutex_unlock(&comm->lock);
    *handle_out = reg;
    return ncclSuccess;
}

ncclResult_t
shim_reg_remove(struct ncclComm *comm, void *handle)
{
    struct shim_reg *reg = NULL;

    pthread_mutex_lock(&comm->lock);
    for (struct shim_reg **link = &comm->regs; *link != NULL; link = &(*link)->next) {
        if (*link == handle) {
            reg = *link;
            *link = reg->next;
            break;
        }
    }
    pthread_mutex_unlock(&comm->lock);
    if (reg == NULL) {
        WARN("ncclCommDeregister: handle %p is not a registration of this communicator (rank "
             "%d): never returned by its ncclCommRegister, or deregistered already",
             handle, comm->rank);
        return ncclInvalidArgument;
    }
    ncclResult_t res = ncclSuccess;
    if (reg->pin.pinned) {
        CUstreamCaptureMode mode = gpu_capture_relax(); /* as for the pin */
        res = shim_devexec_backend(comm)->unpin(comm, &reg->pin);
        gpu_capture_restore(mode);
    }
    free(reg);
    return res;
}

void
shim_reg_free_all(struct ncclComm *comm)
{
    while (comm->regs != NULL) {
        struct shim_reg *reg = comm->regs;
        comm->regs = reg->next;
        free(reg);
    }
}
