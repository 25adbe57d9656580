/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the operations ask of the communicator (comm.h): the thread's current one, its first
 * failure, its cached scratch.
 */
#include "comm.h"

#include <stdlib.h>

#include "base/check.h"

void
shim_comm_bind(struct ncclComm *comm)
{
    shim_log_bind(comm != NULL ? &comm->log : NULL);
}

void
shim_comm_set_async_error(struct ncclComm *comm, ncclResult_t res)
{
    ncclResult_t none = ncclSuccess;
    __atomic_compare_exchange_n(&comm->async_error, &none, res, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    __atomic_store_n(&comm->state, SHIM_COMM_FAILED, __ATOMIC_RELEASE);
}

ncclResult_t
shim_comm_scratch_get(struct ncclComm *comm, size_t bytes, void **buf_out)
{
    if (bytes == 0) {
        *buf_out = NULL;
        return ncclSuccess;
    }
    if (comm->scratch != NULL && comm->scratch_bytes >= bytes) {
        *buf_out = comm->scratch;
        comm->scratch = NULL;
        return ncclSuccess;
    }
    void *buf = malloc(bytes);
    if (buf == NULL) {
        WARN("rank %d: out of memory allocating %zu bytes of scratch", comm->rank, bytes);
        return ncclSystemError;
    }
    *buf_out = buf;
    return ncclSuccess;
}

void
shim_comm_scratch_put(struct ncclComm *comm, void *buf, size_t bytes)
{
    if (buf == NULL) {
        return;
    }
    if (comm->scratch == NULL || comm->scratch_bytes < bytes) {
        free(comm->scratch);
        comm->scratch = buf;
        comm->scratch_bytes = bytes;
    } else {
        free(buf);
    }
}
