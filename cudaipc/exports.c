/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A rank's exports (internal.h): the allocations it made reachable to the leaders of other
 * processes, by a legacy IPC handle or by a cuMem allocation's file descriptor, and how the
 * leaders learn to let them go.
 *
 * Each leader maps each once and keeps the mapping (cache.c) until this rank says forget on
 * its channel (every forget goes to every leader, so one count serves them all). A cudaMalloc
 * allocation is exported only while registered (or captured, for the team's life): its owner
 * may not free it before every leader closed its mapping (cuIpcOpenMemHandle), so
 * deregistration waits for every leader's word that it did. It does so for an allocation that
 * is gone (freed, or freed and another made at its address: the driver's unique id at its
 * first byte is no longer the exported one, checked when posting, a share of the table every
 * CIPC_SWEEP_NS), and for the least recently used entry when the table is full. Either way
 * only once the last operation that used it is done: no descriptor still waiting in the ring
 * names a mapping a leader let go, and a later use exports the allocation again, after the
 * forget on the channel. Without forgetting, a
 * mapping would keep a freed allocation's memory alive (an imported cuMem handle holds it) for
 * the life of the team.
 *
 * The table bounds each leader's mappings of this rank: CIPC_EXPORTS, more than the buffers
 * (three per operation) of a full ring, so some entry is always idle when it is full.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "internal.h"

#define CIPC_EXPORTS (4 * CIPC_RING)
#define CIPC_SWEEP_NS 10000000u /* 10 ms between looks at the table */
#define CIPC_SWEEP_SHARE 64     /* entries looked at per look */

struct cipc_export {
    uint64_t id;        /* the allocation's unique id; the leader's key */
    uintptr_t base;     /* its first byte, where its identity is asked */
    uint64_t used;      /* last use by the clock below, for the least recently used; 0: free */
    uint32_t last_seq;  /* the last operation that used it */
    uint32_t how;       /* CIPC_BUF_LEGACY: handle below; CIPC_BUF_CUMEM: its fd was sent */
    uint32_t pins;      /* registrations (ncclCommRegister): never the least recently used */
    bool gone;          /* freed: forget it once last_seq is done */
    CUipcMemHandle handle;
};

struct cipc_exports {
    uint64_t clock;
    uint64_t next_sweep;  /* shim_clock_ns */
    uint32_t cursor;      /* where the next look starts */
    struct cipc_export entries[CIPC_EXPORTS];
};

ncclResult_t
cipc_exports_create(struct cipc_team *team)
{
    return shim_calloc(&team->exports, 1);
}

void
cipc_exports_free(struct cipc_team *team)
{
    free(team->exports);
    team->exports = NULL;
}

ncclResult_t
cipc_forget(struct cipc_team *team, enum cipc_buf_how how, uint64_t key)
{
    struct cipc_channel_msg msg = {.kind = CIPC_FORGET, .rank = team->rank, .how = how,
                                   .key = key};

    SHIM_CHECK(cipc_channel_send_all(team, &msg, -1, false));
    team->forgets_sent++;
    /* A leader reads its channel when this moves, not on every step. */
    for (int k = 0; k < team->nleaders; k++) {
        __atomic_add_fetch(&team->ctrls[team->leaders[k]]->forgets, 1, __ATOMIC_RELEASE);
    }
    cipc_leaders_ring(team);
    return ncclSuccess;
}

/* Sleeps until every leader closed every mapping this rank told it to forget so far. */
static ncclResult_t
cipc_forgets_wait(struct cipc_team *team)
{
    const uint32_t *closed = team->ctrls[team->rank]->forgets_closed;

    for (int k = 0; k < team->nleaders; k++) {
        while (__atomic_load_n(&closed[k], __ATOMIC_ACQUIRE) != team->forgets_sent &&
               !cipc_leader_unmapped(team, k)) {
            SHIM_CHECK(cipc_team_error(team));
            if (__atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
                return ncclInvalidUsage;
            }
            usleep(100);
        }
    }
    return ncclSuccess;
}

static bool
cipc_export_idle(struct cipc_team *team, const struct cipc_export *e)
{
    /* Operations made for a host function to post (hostpost.c) have no number yet. */
    return __atomic_load_n(&team->hostposts_queued, __ATOMIC_ACQUIRE) == 0 &&
           cipc_done_reached(team, team->rank, e->last_seq);
}

/* Tells the leaders to let e go (why: for the log) and frees the entry. */
static ncclResult_t
cipc_export_drop(struct cipc_team *team, struct cipc_export *e, const char *why)
{
    ncclResult_t res = cipc_forget(team, (enum cipc_buf_how)e->how, e->id);

    INFO(SHIM_P2P, "rank %d: the leaders may unmap allocation %llu (%s)", team->rank,
         (unsigned long long)e->id, why);
    memset(e, 0, sizeof(*e));
    return res;
}

/* The live entry of allocation id at base, or NULL. */
static struct cipc_export *
cipc_export_lookup(struct cipc_exports *ex, uint64_t id, uintptr_t base)
{
    for (int i = 0; i < CIPC_EXPORTS; i++) {
        struct cipc_export *e = &ex->entries[i];
        if (e->used != 0 && e->id == id && e->base == base && !e->gone) {
            return e;
        }
    }
    return NULL;
}

/* The entry of allocation id, updated for operation seq; or a free one for it, made by
 * forgetting the least recently used idle entry if need be (*fresh_out). */
static ncclResult_t
cipc_export_find(struct cipc_team *team, uint64_t id, uintptr_t base, uint32_t seq,
                 struct cipc_export **entry_out, bool *fresh_out)
{
    struct cipc_exports *ex = team->exports;
    struct cipc_export *free_entry = NULL, *oldest = NULL;
    struct cipc_export *e = cipc_export_lookup(ex, id, base);

    ex->clock++;
    if (e != NULL) {
        e->used = ex->clock;
        e->last_seq = seq;
        *entry_out = e;
        *fresh_out = false;
        return ncclSuccess;
    }
    for (int i = 0; i < CIPC_EXPORTS && free_entry == NULL; i++) {
        struct cipc_export *e = &ex->entries[i];
        if (e->used == 0) {
            free_entry = e;
        } else if ((oldest == NULL || e->used < oldest->used) && e->pins == 0 &&
                   cipc_export_idle(team, e)) {
            oldest = e;
        }
    }
    if (free_entry == NULL) {
        if (oldest == NULL) {
            WARN("rank %d: all %d exported allocations are registered or in use by operations "
                 "not done", team->rank, CIPC_EXPORTS);
            return ncclInternalError;
        }
        SHIM_CHECK(cipc_export_drop(team, oldest, "least recently used"));
        free_entry = oldest;
    }
    *free_entry = (struct cipc_export){.id = id, .base = base, .used = ex->clock,
                                       .last_seq = seq};
    *entry_out = free_entry;
    *fresh_out = true;
    return ncclSuccess;
}

ncclResult_t
cipc_export_legacy(struct cipc_team *team, const struct gpu_mem_info *mem, uint32_t seq,
                   CUipcMemHandle *handle_out)
{
    struct cipc_export *e;
    bool fresh;

    SHIM_CHECK(cipc_export_find(team, mem->alloc_id, mem->alloc_base, seq, &e, &fresh));
    if (fresh) {
        CUresult cu = gpu_cu.cuIpcGetMemHandle(&e->handle, (CUdeviceptr)mem->alloc_base);
        if (cu != CUDA_SUCCESS) {
            e->used = 0;
            return gpu_cu_fail(cu, "cuIpcGetMemHandle(allocation)", __FILE__, __LINE__);
        }
        e->how = CIPC_BUF_LEGACY;
    }
    *handle_out = e->handle;
    return ncclSuccess;
}

ncclResult_t
cipc_export_cumem(struct cipc_team *team, const void *ptr, uint64_t id, uintptr_t base,
                  size_t size, uint32_t seq)
{
    struct cipc_export *e;
    bool fresh;
    CUmemGenericAllocationHandle handle;
    int fd = -1;
    ncclResult_t res;

    SHIM_CHECK(cipc_export_find(team, id, base, seq, &e, &fresh));
    if (!fresh) {
        return ncclSuccess;
    }
    e->used = 0; /* until sent */
    GPU_CU_CHECK(cuMemRetainAllocationHandle(&handle, (void *)ptr));
    GPU_CU_CHECK_GOTO(cuMemExportToShareableHandle(&fd, handle,
                                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                      res, out);
    struct cipc_channel_msg msg = {.kind = CIPC_FD_CUMEM, .rank = team->rank, .key = id,
                                   .size = size};
    /* A leader of this process uses the address as it is. */
    SHIM_CHECK_GOTO(cipc_channel_send_all(team, &msg, fd, true), res, out);
    e->how = CIPC_BUF_CUMEM;
    e->used = team->exports->clock;
    res = ncclSuccess;
out:
    if (fd >= 0) {
        close(fd);
    }
    gpu_cu.cuMemRelease(handle); /* the retain's reference; the allocation stays its owner's */
    return res;
}

bool
cipc_export_clash(struct cipc_team *team, uint64_t id, uintptr_t base)
{
    /* Gone entries too: until forgotten, a leader holds their mapping under that id. */
    for (int i = 0; i < CIPC_EXPORTS; i++) {
        const struct cipc_export *e = &team->exports->entries[i];
        if (e->used != 0 && e->id == id && e->base != base) {
            return true;
        }
    }
    return false;
}

bool
cipc_export_pinned(struct cipc_team *team, uint64_t id, uintptr_t base)
{
    const struct cipc_export *e = cipc_export_lookup(team->exports, id, base);
    return e != NULL && e->pins > 0;
}

ncclResult_t
cipc_export_pin(struct cipc_team *team, uint64_t id, uintptr_t base, int delta)
{
    struct cipc_export *e = cipc_export_lookup(team->exports, id, base);

    if (e == NULL) {
        return ncclSuccess;
    }
    e->pins = (uint32_t)((int)e->pins + delta);
    if (e->pins != 0 || delta > 0) {
        return ncclSuccess;
    }
    if (e->how == CIPC_BUF_LEGACY) {
        /* Its owner may free it once this returns: first the operations using it finish,
         * then every leader closes its mapping. */
        while (!cipc_export_idle(team, e)) {
            SHIM_CHECK(cipc_team_error(team));
            usleep(100);
        }
        SHIM_CHECK(cipc_export_drop(team, e, "deregistered"));
        return cipc_forgets_wait(team);
    }
    /* An imported cuMem handle keeps its memory: forgotten now if idle, else when found gone
     * or least recently used. */
    return cipc_export_idle(team, e) ? cipc_export_drop(team, e, "deregistered") : ncclSuccess;
}

ncclResult_t
cipc_export_release(struct cipc_team *team, uint64_t id, uintptr_t base)
{
    struct cipc_export *e = cipc_export_lookup(team->exports, id, base);
    return e != NULL ? cipc_export_drop(team, e, "staging replaced") : ncclSuccess;
}

ncclResult_t
cipc_export_pin_buf(struct cipc_team *team, const struct cipc_buf *buf, struct cipc_pin *pin)
{
    memset(pin, 0, sizeof(*pin));
    if (buf->how != CIPC_BUF_LEGACY && buf->how != CIPC_BUF_CUMEM) {
        return ncclSuccess; /* nothing exported: every leader is here, or staged */
    }
    *pin = (struct cipc_pin){.pinned = true, .how = buf->how, .key = buf->key,
                             .base = (uintptr_t)(buf->ptr - buf->offset)};
    return cipc_export_pin(team, pin->key, pin->base, 1);
}

ncclResult_t
cipc_exports_sweep(struct cipc_team *team)
{
    struct cipc_exports *ex = team->exports;
    uint64_t now = (uint64_t)shim_clock_ns();

    if (now < ex->next_sweep) {
        return ncclSuccess;
    }
    ex->next_sweep = now + CIPC_SWEEP_NS;
    /* Free entries cost a load each; the driver is asked about CIPC_SWEEP_SHARE at most. */
    for (int n = 0, asked = 0; n < CIPC_EXPORTS && asked < CIPC_SWEEP_SHARE; n++) {
        struct cipc_export *e = &ex->entries[ex->cursor++ % CIPC_EXPORTS];
        if (e->used == 0) {
            continue;
        }
        if (!e->gone) {
            e->gone = !gpu_mem_alive(e->base, e->id, e->how == CIPC_BUF_CUMEM);
            asked++;
        }
        if (e->gone && cipc_export_idle(team, e)) {
            SHIM_CHECK(cipc_export_drop(team, e, "freed"));
        }
    }
    return ncclSuccess;
}
