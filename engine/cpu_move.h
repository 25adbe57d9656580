/* SPDX-License-Identifier: Apache-2.0 */
/* Moving the calling thread off a CPU it shares with the rank it waits for (cpu_move.c). */
#ifndef SHIM_CPU_MOVE_H
#define SHIM_CPU_MOVE_H

#include <stdbool.h>
#include <stdint.h>

/* Moves the calling thread to another CPU it is allowed on, leaving its allowed set as it
 * was; at most once per SHIM_CPU_MOVE_INTERVAL_NS per thread. now_ns: the caller's clock.
 * False when it did not move (no other CPU allowed, too soon, or the kernel refused). */
bool shim_cpu_move_away(uint64_t now_ns);

#endif
