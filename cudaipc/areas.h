/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Work areas: what a stream that runs its GPU's share before anyone knows it reads when it
 * gets there (ownstream.c). One per operation in flight, from a pool per device and process
 * made with the first team that needs it: page-locked host memory the leader's thread builds
 * the operation's kernel batch and done words in, and a copy of those in device memory that the
 * kernels read. Each area has a `go` word its stream waits for (held, open, passed) and, for a
 * ring or tree schedule (levels.h), a gate per level and the count of levels run.
 *
 * An eager operation's area comes back once its stream passed it; one captured into a graph
 * is kept for good (the graph may be launched any time, and its host function holds the area
 * again at each launch: hostpost.c), and the pool with it. The pool's lock is taken by calls
 * and by the leader's thread only, never by a host function or a user object's destructor,
 * which must not block (cuda.h): those only write an area's words.
 */
#ifndef CIPC_AREAS_H
#define CIPC_AREAS_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

#include "levels.h"
#include "gpu/driver.h"
#include "gpu/stream.h"
#include "kernels/device_abi.h"

/* Areas per device and process: every eager operation in flight (a rank's ring bounds them)
 * and every one captured into a graph. */
#define CIPC_AREAS 1024
#define CIPC_AREA_HELD 0u
#define CIPC_AREA_OPEN 1u
#define CIPC_AREA_PASSED 2u

/* What one operation's kernels read, on the device. */
struct cipc_area_work {
    struct kr_dev_batch batch;
    struct kr_dev_signals signals;
};

struct cipc_area {
    struct cipc_area_work work; /* built here by the leader's thread, copied to the device */
    _Alignas(64) uint32_t go;   /* HELD, OPEN (built, every rank arrived), PASSED */
    uint32_t tasks;             /* its launch's size: the most tasks of its group's operations */
    uint64_t task_bytes;        /* ... and their largest task's bytes */
    uint32_t levels;            /* its launches: the most levels of its group's operations */
    uint32_t follow;            /* some of them run a ring or tree schedule: the stream counts
                                   the levels it ran, the thread publishes them */
    int running;                /* atomic: the thread still follows its levels (not reusable) */
    /* Levels past the first (levels.h): each waits for its gate, which the thread opens once
     * the levels of other GPUs it waits for ran, and the stream counts those it ran. */
    _Alignas(64) uint32_t level_go[CIPC_MAX_LEVELS];
    _Alignas(64) uint32_t level_done;
};

struct cipc_area_pool {
    struct cipc_area *host;      /* page-locked */
    CUdeviceptr host_dev;        /* the same, as the device sees it: the go words */
    CUdeviceptr dev;             /* CIPC_AREAS struct cipc_area_work */
    CUcontext ctx;               /* the device's primary context, where they were made */
    int teams;                   /* alive, prepared */
    bool captured;               /* an area was captured: the pool stays */
    int nfree;
    int free[CIPC_AREAS];
    int returned[CIPC_AREAS];    /* atomic: given back, reusable once their stream passed
                                    them (areas.c) */
};

/* The device's pool, made with its first team where the program chose its device (page-locked
 * registration and device allocation happen then, not between a queued wait and its release);
 * each team that prepared it lets it go, the last one freeing it unless an area was captured or
 * a stream still waits on one (given a moment: abort must return at once). */
ncclResult_t cipc_areas_prepare(const struct gpu_device *gpu, struct cipc_area_pool **pool_out);
void cipc_areas_unprepare(struct cipc_area_pool *pool);
/* The device's pool, if it was made (an area taken from it keeps it). */
struct cipc_area_pool *cipc_areas_of(const struct gpu_device *gpu);
/* The device memory a pool holds. */
uint64_t cipc_areas_device_bytes(void);

/* A free area, held and empty, for an operation (captured: kept for good); -1 when none is
 * left. */
int cipc_areas_take(struct cipc_area_pool *pool, bool captured);
/* An area whose stream may still read it comes back once that stream passed it. */
void cipc_areas_give_back(struct cipc_area_pool *pool, int area);
/* Held and empty again (a graph's launch reuses its areas); no lock taken. */
void cipc_areas_hold(struct cipc_area_pool *pool, int area);
/* Opened with nothing to do, every level's gate with it, for a stream that may read it but
 * that no team will build (failure, abort); no lock taken. */
void cipc_areas_open_empty(struct cipc_area_pool *pool, int area);
/* Every gate of an area's levels open: they run what they hold (abort, release). */
void cipc_areas_open_levels(struct cipc_area *a);

/* A word of an area's, as the host and the device reach it. */
struct gpu_flag cipc_areas_word(const struct cipc_area_pool *pool, uint32_t *word);
/* Where area's work is in device memory. */
CUdeviceptr cipc_areas_work_dev(const struct cipc_area_pool *pool, int area);
/* Where the device reaches a byte of the pool's page-locked areas. */
CUdeviceptr cipc_areas_dev_of(const struct cipc_area_pool *pool, const void *at);

#endif
