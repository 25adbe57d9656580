/* SPDX-License-Identifier: Apache-2.0 */
/* Random numbers that must not be guessed (the bootstrap's secrets), from the kernel. */
#ifndef SHIM_RANDOM_H
#define SHIM_RANDOM_H

#include <errno.h>
#include <nccl.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>

#include "debug.h"

/* A random 64-bit value; ncclSystemError with a WARN naming `what` if the kernel gave none. */
static inline ncclResult_t
shim_random_u64(const char *what, uint64_t *value_out)
{
    uint64_t value;
    ssize_t got;

    do {
        got = getrandom(&value, sizeof(value), 0);
    } while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof(value)) {
        WARN("getrandom for %s failed: %s", what, got < 0 ? strerror(errno) : "short read");
        return ncclSystemError;
    }
    *value_out = value;
    return ncclSuccess;
}

#endif
