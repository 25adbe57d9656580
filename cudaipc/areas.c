/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The work areas' pool per device and process (areas.h). Given-back areas are marked, not
 * listed: a host function or a user object's destructor gives areas back (hostpost.c) and must
 * not block, while a call holds the pool's lock across driver calls that may wait for the
 * driver's callback thread (cuMemHostRegister, cuMemAlloc, cuMemFree), so giving back is one
 * atomic store, and the lock's holder gathers the marked areas when it runs out.
 */
#include "areas.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"

static pthread_mutex_t cipc_areas_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cipc_area_pool *cipc_area_pools[GPU_MAX_DEVICES];

CUdeviceptr
cipc_areas_dev_of(const struct cipc_area_pool *pool, const void *at)
{
    return pool->host_dev + (CUdeviceptr)((uintptr_t)at - (uintptr_t)pool->host);
}

struct gpu_flag
cipc_areas_word(const struct cipc_area_pool *pool, uint32_t *word)
{
    return (struct gpu_flag){.host = word, .dev = cipc_areas_dev_of(pool, word)};
}

CUdeviceptr
cipc_areas_work_dev(const struct cipc_area_pool *pool, int area)
{
    return pool->dev + (CUdeviceptr)area * sizeof(struct cipc_area_work);
}

struct cipc_area_pool *
cipc_areas_of(const struct gpu_device *gpu)
{
    pthread_mutex_lock(&cipc_areas_lock);
    struct cipc_area_pool *pool = cipc_area_pools[gpu->ordinal];
    pthread_mutex_unlock(&cipc_areas_lock);
    return pool;
}

uint64_t
cipc_areas_device_bytes(void)
{
    return CIPC_AREAS * sizeof(struct cipc_area_work);
}

/* Moves the given-back areas whose stream passed them to the free list (with the lock). */
static void
cipc_areas_gather(struct cipc_area_pool *pool)
{
    for (int a = 0; a < CIPC_AREAS; a++) {
        if (__atomic_load_n(&pool->returned[a], __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&pool->host[a].go, __ATOMIC_ACQUIRE) == CIPC_AREA_PASSED &&
            !__atomic_load_n(&pool->host[a].running, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&pool->returned[a], 0, __ATOMIC_RELAXED);
            pool->free[pool->nfree++] = a;
        }
    }
}

/* Every area free, or given back and passed (with the lock). */
static bool
cipc_areas_idle(struct cipc_area_pool *pool)
{
    cipc_areas_gather(pool);
    return pool->nfree == CIPC_AREAS;
}

static void
cipc_areas_free(struct cipc_area_pool *pool)
{
    if (gpu_ctx_push(pool->ctx) == ncclSuccess) {
        if (pool->dev != 0) {
            gpu_cu.cuMemFree(pool->dev);
        }
        if (pool->host_dev != 0) {
            gpu_cu.cuMemHostUnregister(pool->host);
        }
        gpu_ctx_pop();
    }
    free(pool->host);
    free(pool);
}

ncclResult_t
cipc_areas_prepare(const struct gpu_device *gpu, struct cipc_area_pool **pool_out)
{
    const size_t bytes = CIPC_AREAS * sizeof(struct cipc_area);
    struct cipc_area_pool *pool;
    ncclResult_t res = ncclSuccess;

    pthread_mutex_lock(&cipc_areas_lock);
    pool = cipc_area_pools[gpu->ordinal];
    if (pool != NULL) {
        pool->teams++;
        goto out;
    }
    SHIM_CHECK_GOTO(shim_calloc(&pool, 1), res, out);
    pool->ctx = gpu->ctx;
    pool->host = aligned_alloc(4096, bytes);
    if (pool->host == NULL) {
        WARN("out of memory for %zu bytes of device work areas", bytes);
        free(pool);
        pool = NULL;
        res = ncclSystemError;
        goto out;
    }
    memset(pool->host, 0, bytes);
    SHIM_CHECK_GOTO(gpu_ctx_push(gpu->ctx), res, err);
    CUstreamCaptureMode mode = gpu_capture_relax();
    CUresult cu = gpu_cu.cuMemHostRegister(pool->host, bytes, CU_MEMHOSTREGISTER_PORTABLE |
                                                                  CU_MEMHOSTREGISTER_DEVICEMAP);
    if (cu == CUDA_SUCCESS) {
        cu = gpu_cu.cuMemHostGetDevicePointer(&pool->host_dev, pool->host, 0);
        if (cu != CUDA_SUCCESS) {
            gpu_cu.cuMemHostUnregister(pool->host);
        }
    }
    if (cu == CUDA_SUCCESS) {
        cu = gpu_cu.cuMemAlloc(&pool->dev, cipc_areas_device_bytes());
    }
    gpu_capture_restore(mode);
    gpu_ctx_pop();
    if (cu != CUDA_SUCCESS) {
        res = gpu_cu_fail(cu, "making the device work areas", __FILE__, __LINE__);
        goto err;
    }
    for (int i = 0; i < CIPC_AREAS; i++) {
        pool->free[i] = CIPC_AREAS - 1 - i;
    }
    pool->nfree = CIPC_AREAS;
    pool->teams = 1;
    cipc_area_pools[gpu->ordinal] = pool;
    goto out;
err:
    cipc_areas_free(pool);
    pool = NULL;
out:
    pthread_mutex_unlock(&cipc_areas_lock);
    *pool_out = pool;
    return res;
}

void
cipc_areas_unprepare(struct cipc_area_pool *pool)
{
    pthread_mutex_lock(&cipc_areas_lock);
    if (--pool->teams > 0 || pool->captured) {
        pthread_mutex_unlock(&cipc_areas_lock);
        return;
    }
    uint64_t until = (uint64_t)shim_clock_ns() + 200000000u;
    while (!cipc_areas_idle(pool) && (uint64_t)shim_clock_ns() < until) {
        pthread_mutex_unlock(&cipc_areas_lock);
        usleep(100);
        pthread_mutex_lock(&cipc_areas_lock);
    }
    if (pool->teams == 0 && cipc_areas_idle(pool)) {
        for (int d = 0; d < GPU_MAX_DEVICES; d++) {
            if (cipc_area_pools[d] == pool) {
                cipc_area_pools[d] = NULL;
            }
        }
        cipc_areas_free(pool);
    }
    pthread_mutex_unlock(&cipc_areas_lock);
}

int
cipc_areas_take(struct cipc_area_pool *pool, bool captured)
{
    int area = -1;

    pthread_mutex_lock(&cipc_areas_lock);
    if (pool->nfree == 0) {
        cipc_areas_gather(pool);
    }
    if (pool->nfree > 0) {
        area = pool->free[--pool->nfree];
        cipc_areas_hold(pool, area);
        pool->captured |= captured;
    }
    pthread_mutex_unlock(&cipc_areas_lock);
    return area;
}

void
cipc_areas_give_back(struct cipc_area_pool *pool, int area)
{
    __atomic_store_n(&pool->returned[area], 1, __ATOMIC_RELEASE);
}

void
cipc_areas_hold(struct cipc_area_pool *pool, int area)
{
    struct cipc_area *a = &pool->host[area];

    a->work.batch.ntasks = 0;
    a->work.signals.n = 0;
    memset(a->level_go, 0, sizeof(a->level_go));
    a->level_done = 0;
    __atomic_store_n(&a->go, CIPC_AREA_HELD, __ATOMIC_RELEASE);
}

void
cipc_areas_open_levels(struct cipc_area *a)
{
    for (uint32_t l = 0; l < CIPC_MAX_LEVELS; l++) {
        __atomic_store_n(&a->level_go[l], CIPC_AREA_OPEN, __ATOMIC_RELEASE);
    }
}

void
cipc_areas_open_empty(struct cipc_area_pool *pool, int area)
{
    cipc_areas_hold(pool, area);
    cipc_areas_open_levels(&pool->host[area]);
    __atomic_store_n(&pool->host[area].go, CIPC_AREA_OPEN, __ATOMIC_RELEASE);
}
