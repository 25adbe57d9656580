/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layout of one rank's segment, private to shm/. Each flag sits on a cache line of its
 * own (the owner writes it, every peer polls it), with the count of peers asleep on it next
 * to it so the owner knows when a futex wake is needed. Then SHM_SMALL_SLOTS small slots for
 * one-chunk messages, then two data slots and two result slots, one pair per chunk parity,
 * page aligned, then the area the layer above keeps for itself (SHM_AUX_BYTES).
 */
#ifndef SHM_REGION_H
#define SHM_REGION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shm.h"

struct shm_region {
    struct shm_flag ready;
    struct shm_flag reduced;
    struct shm_flag consumed;
    _Alignas(64) pid_t pid;      /* the owner, for liveness checks */
    uint64_t process;            /* the owner's shm_process_token: "the same process" */
    int32_t cpu;                 /* the owner's CPU when it last started an op or waited */
    uint64_t slot_bytes;
};

#define SHM_HEADER_BYTES 4096
#define SHM_SMALL_AREA ((size_t)SHM_SMALL_SLOTS * SHM_SMALL_BYTES)

/* Small slot seq % SHM_SMALL_SLOTS, for one-chunk messages: a deep ring, so a rank may run
 * up to SHM_SMALL_SLOTS small collectives ahead of the slowest reader. */
static inline uint8_t *
shm_region_small(struct shm_region *region, uint32_t seq)
{
    return (uint8_t *)region + SHM_HEADER_BYTES + (size_t)(seq % SHM_SMALL_SLOTS) * SHM_SMALL_BYTES;
}

/* Data slot seq % 2 and its result slot: two chunks in flight. */
static inline uint8_t *
shm_region_data(struct shm_region *region, size_t slot_bytes, uint32_t seq)
{
    return (uint8_t *)region + SHM_HEADER_BYTES + SHM_SMALL_AREA +
           (size_t)(seq & 1) * 2 * slot_bytes;
}

static inline uint8_t *
shm_region_result(struct shm_region *region, size_t slot_bytes, uint32_t seq)
{
    return shm_region_data(region, slot_bytes, seq) + slot_bytes;
}

static inline uint8_t *
shm_region_aux(struct shm_region *region, size_t slot_bytes)
{
    return (uint8_t *)region + SHM_HEADER_BYTES + SHM_SMALL_AREA + 4 * slot_bytes;
}

#endif
