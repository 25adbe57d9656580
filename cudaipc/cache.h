/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The leader's mappings of other ranks' memory (cache.c), keyed by (rank, how, key): the
 * allocation's unique id in its owner, or a staging segment's generation. Memory freed and
 * allocated again is a new id, so a mapping never stands for memory that changed under it.
 * Made on first use and kept: the same buffers come back call after call (PyTorch's caching
 * allocator hands out the same segments again and again). A mapping goes when its owner says
 * forget (exports.c: the allocation was freed, or the owner's table of exports, which bounds
 * this cache, made room), once the leader's last operation using it is done (the leader's
 * stream counts operations done). Cleared whole when the team ends.
 */
#ifndef CIPC_CACHE_H
#define CIPC_CACHE_H

#include <cuda.h>
#include <nccl.h>
#include <stdint.h>

#include "gpu/driver.h"
#include "gpu/memory.h"

struct cipc_buf;

struct cipc_map {
    int rank;             /* -1: a free entry */
    uint32_t how;         /* enum cipc_buf_how: LEGACY, CUMEM or STAGED */
    uint64_t key;
    size_t size;
    CUdeviceptr base;     /* where the leader's kernels reach the allocation's first byte */
    struct gpu_mem_import imported; /* CUMEM: the imported allocation */
    struct gpu_host_import segment;  /* STAGED: the segment mapped here (registered), or
                                        imported (cuMem host memory) */
    uint32_t last_use;    /* the leader's operation that used it last */
    bool forgotten;       /* its owner said forget: unmap once last_use is done */
};

struct cipc_cache {
    struct cipc_map *maps;
    int count, cap;
    int forgotten;        /* entries waiting to be unmapped */
    /* Registered staging segments (a driver without cuMem host memory) let go of but still
     * registered: cuMemHostUnregister may wait for the context's queued work, which may wait
     * for this very thread, so they are unregistered only when the cache goes. */
    struct gpu_host_import *retired;
    int nretired;
};

/* The entry for (rank, how, key) with its last use set to `use`, or NULL if not mapped (or
 * forgotten: the owner sends a cuMem allocation or a segment again after a forget). */
struct cipc_map *cipc_cache_find(struct cipc_cache *cache, int rank, uint32_t how, uint64_t key,
                                 uint32_t use);
/* Maps buf of rank for the leader's device (whose context is current) and enters it: a legacy
 * handle is opened, a cuMem allocation or a staging segment imported from fd (which this takes
 * over and closes; fd_flags: the channel message's, CIPC_STAGING_CUMEM for a segment of cuMem
 * host memory). The leader's thread maps while its rank's streams may wait for it: nothing here
 * synchronizes the device's context (cuIpcOpenMemHandle, cuMemImportFromShareableHandle,
 * cuMemMap, cuMemSetAccess), but a segment of registered shared memory, from a driver without
 * cuMem host memory, which cuMemHostRegister page-locks (review B6). */
ncclResult_t cipc_cache_map(struct cipc_cache *cache, const struct gpu_device *device,
                            int rank, const struct cipc_buf *buf, int fd, uint32_t fd_flags,
                            uint32_t use, struct cipc_map **map_out);
/* rank's word that (how, key) will not be named again: its mapping goes at the next reap
 * after its last use is done. Nothing if it is not mapped. */
void cipc_cache_forget(struct cipc_cache *cache, int rank, uint32_t how, uint64_t key);
/* Unmaps the forgotten entries whose last use is done by `completed` (the context is
 * current). */
void cipc_cache_reap(struct cipc_cache *cache, uint32_t completed);
/* Unmaps everything (the leader's stream must be idle). */
void cipc_cache_clear(struct cipc_cache *cache);
/* How many mappings are open, for logs. */
/* Whether a mapping of rank's that it said forget is still open. */
bool cipc_cache_holds_forgotten(const struct cipc_cache *cache, int rank);
int cipc_cache_count(const struct cipc_cache *cache);

#endif
