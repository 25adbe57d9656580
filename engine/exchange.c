/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Management exchanges (exchange.h): blobs of every member, over the transport.
 */
#include "exchange.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "comm.h"
#include "exec.h"
#include "exec_device.h"

void
shim_blobs_free(struct shim_blobs *blobs)
{
    free(blobs->data);
    free(blobs->offsets);
    free(blobs->lens);
}

ncclResult_t
shim_everyone(const struct ncclComm *comm, int **members_out)
{
    SHIM_CHECK(shim_calloc(members_out, (size_t)comm->nranks));
    for (int r = 0; r < comm->nranks; r++) {
        (*members_out)[r] = r;
    }
    return ncclSuccess;
}

ncclResult_t
shim_exchange_blobs(struct ncclComm *comm, const int *members, int nmembers, int me,
                    const void *blob, size_t len, struct shim_blobs *blobs_out)
{
    /* Device operations still running on the communicator's thread drive its worker: let
     * them end first. Their failure does not stop a split or a shrink. */
    (void)shim_devexec_drain(comm);
    struct shim_blobs blobs = {0};
    uint64_t *lens64 = NULL;
    struct alg_sched sched;
    ncclResult_t res;

    SHIM_CHECK_GOTO(shim_calloc(&lens64, (size_t)nmembers), res, out);
    SHIM_CHECK_GOTO(shim_calloc(&blobs.offsets, (size_t)nmembers), res, out);
    SHIM_CHECK_GOTO(shim_calloc(&blobs.lens, (size_t)nmembers), res, out);
    lens64[me] = len;
    alg_sched_init(&sched);
    alg_exchange_all(&sched, members, nmembers, me, 8);
    SHIM_CHECK_GOTO(alg_sched_finish(&sched), res, out_sched);
    SHIM_CHECK_GOTO(shim_exec_run_schedule(comm, &sched, &lens64[me], lens64), res, out);

    size_t total = 0;
    for (int i = 0; i < nmembers; i++) {
        if (lens64[i] > SHIM_EXCHANGE_MAX_BLOB) {
            WARN("rank %d: rank %d announced a %llu-byte blob in a management exchange",
                 comm->rank, members[i], (unsigned long long)lens64[i]);
            res = ncclRemoteError;
            goto out;
        }
        blobs.offsets[i] = total;
        blobs.lens[i] = (size_t)lens64[i];
        total += blobs.lens[i];
    }
    SHIM_CHECK_GOTO(shim_calloc(&blobs.data, total), res, out);
    if (len > 0) {
        memcpy(blobs.data + blobs.offsets[me], blob, len);
    }
    for (int i = 0; i < nmembers; i++) {
        if (i != me) {
            alg_send(&sched, members[i], alg_range_make(ALG_BUF_SEND, 0, len), -1, -1);
            alg_recv(&sched, members[i],
                     alg_range_make(ALG_BUF_RECV, blobs.offsets[i], blobs.lens[i]), -1, -1);
        }
    }
    SHIM_CHECK_GOTO(alg_sched_finish(&sched), res, out_sched);
    SHIM_CHECK_GOTO(shim_exec_run_schedule(comm, &sched, blob, blobs.data), res, out);
    *blobs_out = blobs;
    free(lens64);
    return ncclSuccess;

out_sched:
    alg_sched_free(&sched);
out:
    shim_blobs_free(&blobs);
    free(lens64);
    return res;
}
