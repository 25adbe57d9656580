/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one clock every layer measures waits and deadlines with: CLOCK_MONOTONIC in
 * nanoseconds, which wall-clock changes do not move. Read through the vDSO, no system call.
 */
#ifndef SHIM_CLOCK_H
#define SHIM_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t
shim_clock_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t
shim_clock_ms(void)
{
    return shim_clock_ns() / 1000000;
}

#endif
