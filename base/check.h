/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Error propagation. The function that detects a failure WARNs with the values that explain
 * it; callers only propagate with SHIM_CHECK, which leaves an INFO breadcrumb file:line -> code.
 * Foreign codes (errno, CUDA driver, UCX) are translated once, at the boundary.
 * ncclInProgress is not an error: non-blocking init passes it up.
 */
#ifndef SHIM_CHECK_H
#define SHIM_CHECK_H

#include <errno.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"

#define SHIM_FAILED(res) ((res) != ncclSuccess && (res) != ncclInProgress)

#define SHIM_CHECK(call)                                                                     \
    do {                                                                                     \
        ncclResult_t shim_res_ = (call);                                                     \
        if (SHIM_FAILED(shim_res_)) {                                                        \
            INFO(SHIM_ALL, "%s:%d -> %d", __FILE__, __LINE__, shim_res_);                    \
            return shim_res_;                                                                \
        }                                                                                    \
    } while (0)

#define SHIM_CHECK_GOTO(call, res, label)                                                    \
    do {                                                                                     \
        (res) = (call);                                                                      \
        if (SHIM_FAILED(res)) {                                                              \
            INFO(SHIM_ALL, "%s:%d -> %d", __FILE__, __LINE__, (res));                        \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

/* A system call that returns -1 and sets errno. */
#define SHIM_SYS_CHECK(call, what)                                                           \
    do {                                                                                     \
        if ((call) == -1) {                                                                  \
            WARN("%s failed: %s", (what), strerror(errno));                                  \
            return ncclSystemError;                                                          \
        }                                                                                    \
    } while (0)

/* Zeroed allocation of n objects of *ptr's type; WARNs with the size it asked for. */
#define shim_calloc(pptr, n)                                                                 \
    shim_calloc_bytes((void **)(pptr), (n), sizeof(**(pptr)), __FILE__, __LINE__)

static inline ncclResult_t
shim_calloc_bytes(void **ptr_out, size_t n, size_t size, const char *file, int line)
{
    void *p = calloc(n ? n : 1, size);
    *ptr_out = p; /* NULL on failure too, so cleanup paths may free it unconditionally */
    if (p == NULL) {
        WARN("%s:%d: out of memory allocating %zu x %zu bytes", file, line, n, size);
        return ncclSystemError;
    }
    return ncclSuccess;
}

/* Room for one more item in the growing array *pptr, which holds count of its *pcap items:
 * doubled when full (to `first` items when empty). WARNs and leaves the array as it was when
 * memory runs out. */
#define shim_grow(pptr, count, pcap, first)                                                  \
    shim_grow_bytes((void **)(pptr), (count), (pcap), (first), sizeof(**(pptr)), __FILE__,   \
                    __LINE__)

static inline ncclResult_t
shim_grow_bytes(void **items, int count, int *cap, int first, size_t size, const char *file,
                int line)
{
    if (count < *cap) {
        return ncclSuccess;
    }
    int grown = *cap > 0 ? 2 * *cap : first;
    void *p = realloc(*items, (size_t)grown * size);
    if (p == NULL) {
        WARN("%s:%d: out of memory growing to %d x %zu bytes", file, line, grown, size);
        return ncclSystemError;
    }
    *items = p;
    *cap = grown;
    return ncclSuccess;
}

#endif
