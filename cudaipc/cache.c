/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The leader's mapping cache (cache.h). A plain array searched in full: a team maps a few
 * allocations per rank, and the search costs nothing next to an IPC open.
 */
#include "cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "internal.h"

struct cipc_map *
cipc_cache_find(struct cipc_cache *cache, int rank, uint32_t how, uint64_t key, uint32_t use)
{
    for (int i = 0; i < cache->cap; i++) {
        struct cipc_map *m = &cache->maps[i];
        if (m->rank != rank || m->how != how || m->key != key) {
            continue;
        }
        if (m->forgotten) {
            if (how != CIPC_BUF_LEGACY) {
                continue; /* the owner sent the allocation again: a new entry takes it */
            }
            /* The owner exported the allocation again (the descriptor carries the handle);
             * opening a handle twice in one context is not portable, so keep this one. */
            m->forgotten = false;
            cache->forgotten--;
        }
        /* The newest use: a GPU's share may be built out of its order of running (ownstream.c). */
        if ((int32_t)(use - m->last_use) > 0) {
            m->last_use = use;
        }
        return m;
    }
    return NULL;
}

/* Keeps a registered segment for cipc_cache_clear; false if there is no room to. */
static bool
cipc_cache_retire(struct cipc_cache *cache, const struct gpu_host_import *segment)
{
    struct gpu_host_import *more =
        realloc(cache->retired, (size_t)(cache->nretired + 1) * sizeof(*more));
    if (more == NULL) {
        return false;
    }
    more[cache->nretired++] = *segment;
    cache->retired = more;
    return true;
}

static void
cipc_map_close(struct cipc_cache *cache, struct cipc_map *m, bool now)
{
    switch (m->how) {
    case CIPC_BUF_LEGACY:
        gpu_cu.cuIpcCloseMemHandle(m->base);
        break;
    case CIPC_BUF_CUMEM:
        gpu_mem_unimport(&m->imported);
        break;
    case CIPC_BUF_STAGED:
        if (m->imported.base != 0) {
            gpu_mem_unimport(&m->imported); /* cuMem host memory */
        } else if (!now && cipc_cache_retire(cache, &m->segment)) {
            break; /* a driver's without: registered, unregistered with the cache */
        } else {
            gpu_host_unimport(&m->segment);
        }
        break;
    }
    memset(m, 0, sizeof(*m));
    m->rank = -1;
}

/* A free entry: a fresh one, else more room. */
static ncclResult_t
cipc_cache_slot(struct cipc_cache *cache, struct cipc_map **slot_out)
{
    for (int i = 0; i < cache->cap; i++) {
        if (cache->maps[i].rank < 0) {
            *slot_out = &cache->maps[i];
            return ncclSuccess;
        }
    }
    int cap = cache->cap ? 2 * cache->cap : 16;
    struct cipc_map *maps = realloc(cache->maps, (size_t)cap * sizeof(*maps));
    if (maps == NULL) {
        WARN("cudaipc: out of memory for %d mappings", cap);
        return ncclSystemError;
    }
    for (int i = cache->cap; i < cap; i++) {
        memset(&maps[i], 0, sizeof(maps[i]));
        maps[i].rank = -1;
    }
    *slot_out = &maps[cache->cap];
    cache->maps = maps;
    cache->cap = cap;
    return ncclSuccess;
}

ncclResult_t
cipc_cache_map(struct cipc_cache *cache, const struct gpu_device *device, int rank,
               const struct cipc_buf *buf, int fd, uint32_t fd_flags, uint32_t use,
               struct cipc_map **map_out)
{
    struct cipc_map *m;
    ncclResult_t res;

    res = cipc_cache_slot(cache, &m);
    if (res != ncclSuccess) {
        goto out;
    }
    m->how = buf->how;
    m->key = buf->key;
    m->size = buf->size;
    switch (buf->how) {
    case CIPC_BUF_LEGACY: {
        CUresult cu = gpu_cu.cuIpcOpenMemHandle(&m->base, buf->handle,
                                                CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        res = cu == CUDA_SUCCESS ? ncclSuccess
                                 : gpu_cu_fail(cu, "cuIpcOpenMemHandle(a rank's allocation)",
                                               __FILE__, __LINE__);
        break;
    }
    case CIPC_BUF_CUMEM:
        res = gpu_mem_import(fd, m->size, device->ordinal, &m->imported);
        m->base = m->imported.base;
        break;
    case CIPC_BUF_STAGED:
        if (fd_flags & CIPC_STAGING_CUMEM) {
            res = gpu_mem_import(fd, m->size, device->ordinal, &m->imported);
            m->base = m->imported.base;
        } else {
            res = gpu_host_import(fd, m->size, &m->segment);
            m->base = m->segment.dev;
        }
        break;
    default:
        WARN("cudaipc: rank %d described a buffer the leader cannot map (how %u)", rank,
             buf->how);
        res = ncclInternalError;
    }
    if (res != ncclSuccess) {
        memset(m, 0, sizeof(*m));
        m->rank = -1;
        goto out;
    }
    m->rank = rank;
    m->last_use = use;
    cache->count++;
    INFO(SHIM_P2P, "cudaipc: mapped rank %d's %s %llu (%zu bytes) at %p; %d mappings", rank,
         buf->how == CIPC_BUF_STAGED ? "staging segment" : "allocation",
         (unsigned long long)buf->key, m->size, (void *)(uintptr_t)m->base, cache->count);
    *map_out = m;
out:
    if (fd >= 0) {
        close(fd);
    }
    return res;
}

void
cipc_cache_forget(struct cipc_cache *cache, int rank, uint32_t how, uint64_t key)
{
    for (int i = 0; i < cache->cap; i++) {
        struct cipc_map *m = &cache->maps[i];
        if (m->rank == rank && m->how == how && m->key == key && !m->forgotten) {
            m->forgotten = true;
            cache->forgotten++;
        }
    }
}

void
cipc_cache_reap(struct cipc_cache *cache, uint32_t completed)
{
    for (int i = 0; i < cache->cap && cache->forgotten > 0; i++) {
        struct cipc_map *m = &cache->maps[i];
        if (m->rank >= 0 && m->forgotten && (int32_t)(completed - m->last_use) >= 0) {
            INFO(SHIM_P2P, "cudaipc: unmapped rank %d's %s %llu; %d mappings", m->rank,
                 m->how == CIPC_BUF_STAGED ? "staging segment" : "allocation",
                 (unsigned long long)m->key, cache->count - 1);
            cipc_map_close(cache, m, false);
            cache->count--;
            cache->forgotten--;
        }
    }
}

void
cipc_cache_clear(struct cipc_cache *cache)
{
    for (int i = 0; i < cache->cap; i++) {
        if (cache->maps[i].rank >= 0) {
            cipc_map_close(cache, &cache->maps[i], true);
        }
    }
    for (int i = 0; i < cache->nretired; i++) {
        gpu_host_unimport(&cache->retired[i]);
    }
    free(cache->retired);
    free(cache->maps);
    memset(cache, 0, sizeof(*cache));
}

bool
cipc_cache_holds_forgotten(const struct cipc_cache *cache, int rank)
{
    for (int i = 0; i < cache->cap && cache->forgotten > 0; i++) {
        if (cache->maps[i].rank == rank && cache->maps[i].forgotten) {
            return true;
        }
    }
    return false;
}

int
cipc_cache_count(const struct cipc_cache *cache)
{
    return cache->count;
}
