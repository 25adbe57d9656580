/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The drop-in test's program: a plain NCCL program, written as a user writes one, that
 * includes the genuine <nccl.h> and nothing of ncclshim's, and is built and linked against
 * NVIDIA's libnccl.so.2 (the Makefile's $(BUILD)/test/dropin/dropin rule). test/mp/dropin.sh
 * runs it on two ranks through tools/launcher with ncclshim swapped in at load time
 * (LD_LIBRARY_PATH, LD_PRELOAD), and once without it.
 *
 * Each rank reads RANK and WORLD_SIZE, makes a communicator from ncclGetUniqueId (equal on
 * every rank through NCCL_COMM_ID), all-reduces 1 Mi floats from host memory, checks them,
 * and destroys the communicator. It prints "dropin: rank R of N ok" and exits 0 on success.
 */
#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>

#define NCCLCHECK(call)                                                                       \
    do {                                                                                      \
        ncclResult_t res_ = (call);                                                           \
        if (res_ != ncclSuccess) {                                                            \
            fprintf(stderr, "dropin: rank %d: %s failed: %s: %s\n", rank, #call,              \
                    ncclGetErrorString(res_), ncclGetLastError(NULL));                        \
            return 1;                                                                         \
        }                                                                                     \
    } while (0)

int
main(void)
{
    const char *rank_env = getenv("RANK");
    const char *size_env = getenv("WORLD_SIZE");
    int rank = rank_env != NULL ? atoi(rank_env) : 0;
    int nranks = size_env != NULL ? atoi(size_env) : 1;
    size_t count = 1 << 20;
    ncclUniqueId id;
    ncclComm_t comm;
    float *send = malloc(count * sizeof(float));
    float *recv = malloc(count * sizeof(float));
    int version = 0;
    size_t wrong = 0;

    if (send == NULL || recv == NULL) {
        fprintf(stderr, "dropin: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        send[i] = (float)(rank + 1) * (float)(i % 1024);
    }

    NCCLCHECK(ncclGetVersion(&version));
    NCCLCHECK(ncclGetUniqueId(&id));
    NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
    NCCLCHECK(ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, NULL));

    /* sum over r of (r + 1) * v = v * n (n + 1) / 2, exact in float here */
    for (size_t i = 0; i < count; i++) {
        float expected = (float)(i % 1024) * (float)(nranks * (nranks + 1) / 2);
        if (recv[i] != expected && wrong++ < 5) {
            fprintf(stderr, "dropin: rank %d: element %zu is %g, expected %g\n", rank, i,
                    recv[i], expected);
        }
    }
    NCCLCHECK(ncclCommDestroy(comm));
    free(send);
    free(recv);
    if (wrong != 0) {
        fprintf(stderr, "dropin: rank %d: %zu wrong elements\n", rank, wrong);
        return 1;
    }
    printf("dropin: rank %d of %d ok (NCCL version code %d)\n", rank, nranks, version);
    return 0;
}
