/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Windows and one-sided operations on host memory (window.h), over UCX's remote memory access
 * and atomics. Registering a window is collective: every rank registers its part with the
 * transport and the ranks trade base, size and packed key (exchange.h); the first window also
 * registers this rank's signal words and trades their keys. Then
 *
 *   ncclPutSignal:  put the bytes into the peer's part | flush to that peer | atomic add 1
 *                   to the peer's signal word (this rank, sigIdx, ctx)
 *   ncclSignal:     the atomic add alone
 *   ncclWaitSignal: until each word counts opCnt more than the waits before counted
 *
 * The flush makes the data land before the signal (UCX 1.13's fence does not order a put
 * and an atomic that go over different transports, CMA and shared memory say), so a rank
 * that counted a signal may read what came with it; it costs ncclPutSignal a round trip to
 * its peer, after which the source buffer is free again. The target takes no part where a
 * transport does these in hardware; where UCX emulates them (TCP, or memory its
 * shared-memory transports cannot share) the target's worker serves them while it
 * progresses, which its ncclWaitSignal does, and so does any call of it that talks over UCX.
 * A signal's atomic add may still be on its way when the call returns; this rank's later
 * one-sided calls look at it, and ncclWaitSignal waits for it. Deregistering is collective
 * too: each rank first flushes its own operations, so no peer's put is still on its way into
 * a part that goes.
 *
 * The stream argument of these calls has nothing to order on host memory: they run in the
 * call. Device memory is refused with a message.
 */
#include "window.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "comm.h"
#include "exchange.h"
#include "gpu/memory.h"
#include "transports/transport.h"
#include "window_device.h"
#include "window_remote.h"

#define SHIM_WINDOW_MAGIC 0x77696e646f77ull /* "window" */
/* A wait polls this long before it sleeps between looks (1 ms at a time): a signal that lands
 * in hardware wakes no one. */
#define SHIM_WINDOW_SPIN_NS 200000u

/* ncclWindow_t points at one of these: this rank's part of a window, and every rank's. */
struct ncclWindow_vidmem {
    uint64_t magic;
    struct ncclComm *comm;
    uint32_t id;              /* the communicator's n-th window, equal on every rank */
    void *buff;
    size_t size;
    struct tp_mem *mem;       /* host: NULL for an empty part */
    struct shim_remote *parts; /* host: every rank's part */
    struct shim_dwin *dwin;   /* device, one host: every rank's part, mapped */
    struct shim_rwin *rwin;   /* device, across hosts: mirrors and the proxy */
    struct ncclWindow_vidmem *next;
};

/* A signal whose atomic add is still out. */
struct shim_pending_op {
    struct tp_request add_req;
    uint64_t one;             /* the atomic's operand, read until the request is done */
    bool failed;              /* kept, since UCX may still read its operand, until the worker
                                 goes */
    struct shim_pending_op *next;
};

/* What a communicator's windows are: its first window decides. */
enum shim_window_kind {
    SHIM_WINDOWS_UNDECIDED,   /* no window yet (or an empty part: it cannot tell) */
    SHIM_WINDOWS_HOST,
    SHIM_WINDOWS_DEVICE,
};

struct shim_windows {
    enum shim_window_kind kind;
    struct shim_dsignals *dsignals; /* device windows' signal words, on one host */
    struct shim_rproxy *rproxy;     /* device windows across hosts: their proxy */
    struct ncclWindow_vidmem *list;
    uint32_t next_id;
    struct tp_mem *signals_mem;    /* this rank's signal words, which peers add to */
    bool signals_traded;           /* every rank can signal every rank: host signal keys
                                      traded, device words mapped, or proxies connected */
    uint64_t *signals;             /* [source rank][sigIdx][ctx] */
    uint64_t *counted;             /* the same words: what waits here counted */
    struct shim_remote *signal_parts; /* every rank's signal words */
    struct shim_pending_op *pending;
};

/* What a rank tells the others of its part of a new window; the packed keys follow. */
struct shim_window_hello {
    uint32_t ok;              /* 0: this rank refused its part (its WARN says why) */
    uint32_t kind;            /* enum shim_window_kind of its part */
    struct shim_dwin_hello dev; /* a device part */
    uint32_t window_key_len;
    uint32_t signal_key_len;  /* 0 unless this window brings the signal words */
    uint32_t pad;
    uint64_t base, size;
    uint64_t signal_base;
};

static ncclResult_t
shim_windows_of(struct ncclComm *comm, struct shim_windows **out)
{
    if (comm->windows == NULL) {
        SHIM_CHECK(shim_calloc(&comm->windows, 1));
    }
    *out = comm->windows;
    return ncclSuccess;
}

static ncclResult_t
shim_window_check(struct ncclComm *comm, ncclWindow_t win, const char *api)
{
    if (win == NULL || win->magic != SHIM_WINDOW_MAGIC || win->comm != comm) {
        WARN("%s: %p is not a window of communicator %p (ncclCommWindowRegister gives them)",
             api, (void *)win, (void *)comm);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static bool
shim_window_host_memory(const void *ptr)
{
    struct gpu_mem_info info;
    gpu_mem_query(ptr, &info);
    return info.kind == GPU_MEM_HOST;
}

/* Waits for req, progressing the worker; abort and NCCLSHIM_TIMEOUT end the wait. */
static ncclResult_t shim_window_wait_request(struct ncclComm *comm, struct tp_request *req,
                                             const char *what);

/* The signal words, registered with the first window (the caller's part of the exchange). */
static ncclResult_t
shim_signals_register(struct ncclComm *comm, struct shim_windows *ws)
{
    size_t words = shim_signal_words(comm->nranks);

    SHIM_CHECK(shim_calloc(&ws->counted, words));
    SHIM_CHECK(shim_calloc(&ws->signal_parts, (size_t)comm->nranks));
    SHIM_CHECK(tp_mem_register(comm->tp, NULL, words * sizeof(uint64_t), &ws->signals_mem));
    ws->signals = tp_mem_base(ws->signals_mem);
    return ncclSuccess;
}

/* Unpacks rank r's keys from its hello into win (and the signal words' into ws). */
static ncclResult_t
shim_window_take_hello(struct ncclComm *comm, struct shim_windows *ws,
                       struct ncclWindow_vidmem *win, int r, const uint8_t *blob, size_t len)
{
    struct shim_window_hello h;

    if (len < sizeof(h)) {
        WARN("rank %d: rank %d's part of window %u came in %zu bytes", comm->rank, r, win->id,
             len);
        return ncclRemoteError;
    }
    memcpy(&h, blob, sizeof(h));
    if ((size_t)h.window_key_len + h.signal_key_len > len - sizeof(h)) {
        WARN("rank %d: rank %d's part of window %u announces keys past its %zu bytes",
             comm->rank, r, win->id, len);
        return ncclRemoteError;
    }
    win->parts[r] = (struct shim_remote){.base = h.base, .size = h.size};
    if (r == comm->rank) {
        return ncclSuccess;
    }
    if (h.size > 0) {
        SHIM_CHECK(tp_rkey_unpack(comm->tp, r, blob + sizeof(h), &win->parts[r].rkey));
    }
    if (h.signal_key_len > 0) {
        ws->signal_parts[r].base = h.signal_base;
        SHIM_CHECK(tp_rkey_unpack(comm->tp, r, blob + sizeof(h) + h.window_key_len,
                                  &ws->signal_parts[r].rkey));
    }
    return ncclSuccess;
}

/* Gives back what win holds here (the peers were told, or never learned of it) and frees it. */
static void
shim_window_release(struct ncclComm *comm, struct ncclWindow_vidmem *win)
{
    for (int r = 0; win->parts != NULL && r < comm->nranks; r++) {
        tp_rkey_release(comm->tp, win->parts[r].rkey);
    }
    tp_mem_deregister(comm->tp, win->mem);
    shim_dwin_free(win->dwin, comm->windows->dsignals);
    shim_rwin_free(win->rwin);
    free(win->parts);
    win->magic = 0;
    free(win);
}

/* Device windows of ranks that do not share a host go through a proxy (window_remote.h). */
static bool
shim_window_remote(const struct ncclComm *comm)
{
    return comm->nranks > 1 && comm->shm == NULL;
}

/* The kind of this rank's part: by its memory, or, for an empty one, the communicator's. */
static ncclResult_t
shim_window_part_kind(const struct shim_windows *ws, void *buff, size_t size,
                      enum shim_window_kind *kind_out)
{
    enum shim_window_kind kind = ws->kind;

    if (size > 0) {
        struct gpu_mem_info info;
        gpu_mem_query(buff, &info);
        if (info.kind != GPU_MEM_HOST && info.kind != GPU_MEM_DEVICE) {
            WARN("ncclCommWindowRegister: %p is %s memory: a window is host memory or device "
                 "memory from ncclMemAlloc", buff, gpu_mem_kind_name(info.kind));
            return ncclInvalidUsage;
        }
        kind = info.kind == GPU_MEM_HOST ? SHIM_WINDOWS_HOST : SHIM_WINDOWS_DEVICE;
    }
    if (ws->kind != SHIM_WINDOWS_UNDECIDED && kind != ws->kind) {
        WARN("ncclCommWindowRegister: %p is %s memory, and this communicator's windows are %s "
             "memory (its signals follow its windows, so they are all of one kind)", buff,
             kind == SHIM_WINDOWS_HOST ? "host" : "device",
             ws->kind == SHIM_WINDOWS_HOST ? "host" : "device");
        return ncclInvalidUsage;
    }
    *kind_out = kind;
    return ncclSuccess;
}

/* This rank's hello for a host part (undecided ones too): registers it, and the signal words
 * the first time. */
static ncclResult_t
shim_window_host_prepare(struct ncclComm *comm, struct shim_windows *ws,
                         struct ncclWindow_vidmem *win, struct shim_window_hello *h,
                         const void **keys, size_t *key_lens)
{
    if (ws->signals_mem == NULL) {
        SHIM_CHECK(shim_signals_register(comm, ws));
    }
    if (win->size > 0) {
        SHIM_CHECK(tp_mem_register(comm->tp, win->buff, win->size, &win->mem));
        tp_mem_packed(win->mem, &keys[0], &key_lens[0]);
    }
    if (!ws->signals_traded) {
        tp_mem_packed(ws->signals_mem, &keys[1], &key_lens[1]);
    }
    h->window_key_len = (uint32_t)key_lens[0];
    h->signal_key_len = (uint32_t)key_lens[1];
    h->base = (uintptr_t)win->buff;
    h->size = win->size;
    h->signal_base = (uintptr_t)ws->signals;
    return ncclSuccess;
}

/* Every rank's hello agrees: all accepted their parts, all of one kind. The kind, or an
 * error (every rank reaches the same verdict from the same hellos). */
static ncclResult_t
shim_window_agree(const struct ncclComm *comm, const struct shim_blobs *blobs, uint32_t id,
                  enum shim_window_kind *kind_out)
{
    enum shim_window_kind kind = SHIM_WINDOWS_UNDECIDED;
    bool undecided = false;

    for (int r = 0; r < comm->nranks; r++) {
        struct shim_window_hello h;
        if (blobs->lens[r] < sizeof(h)) {
            WARN("rank %d: rank %d's part of window %u came in %zu bytes", comm->rank, r, id,
                 blobs->lens[r]);
            return ncclRemoteError;
        }
        memcpy(&h, blobs->data + blobs->offsets[r], sizeof(h));
        if (!h.ok) {
            WARN("ncclCommWindowRegister: rank %d refused its part of window %u", r, id);
            return ncclInvalidUsage;
        }
        if (h.kind == SHIM_WINDOWS_UNDECIDED) {
            undecided = true;
        } else if (kind != SHIM_WINDOWS_UNDECIDED && h.kind != kind) {
            WARN("ncclCommWindowRegister: window %u has parts in host memory and in device "
                 "memory (rank %d's): all must be one or the other", id, r);
            return ncclInvalidUsage;
        } else {
            kind = (enum shim_window_kind)h.kind;
        }
    }
    if (kind == SHIM_WINDOWS_DEVICE && undecided) {
        WARN("ncclCommWindowRegister: the communicator's first device window has empty parts, "
             "which cannot tell that they are device memory: give every rank a part");
        return ncclInvalidUsage;
    }
    *kind_out = kind == SHIM_WINDOWS_UNDECIDED ? SHIM_WINDOWS_HOST : kind;
    return ncclSuccess;
}

ncclResult_t
shim_window_register(struct ncclComm *comm, void *buff, size_t size, ncclWindow_t *win_out)
{
    struct shim_windows *ws;
    struct ncclWindow_vidmem *win = NULL;
    struct shim_blobs blobs = {0};
    struct shim_dwin_hello *dev_hellos = NULL;
    int *everyone = NULL;
    uint8_t *hello = NULL;
    enum shim_window_kind kind = SHIM_WINDOWS_UNDECIDED;
    ncclResult_t res, mine = ncclSuccess;

    if (win_out == NULL || (buff == NULL && size > 0)) {
        WARN("ncclCommWindowRegister: %s is NULL", win_out == NULL ? "win" : "buff");
        mine = ncclInvalidArgument;
    }
    SHIM_CHECK(shim_windows_of(comm, &ws));
    SHIM_CHECK(shim_calloc(&win, 1));
    *win = (struct ncclWindow_vidmem){.magic = SHIM_WINDOW_MAGIC, .comm = comm,
                                       .id = ws->next_id++, .buff = buff, .size = size};
    SHIM_CHECK_GOTO(shim_calloc(&win->parts, (size_t)comm->nranks), res, out);
    /* A rank that refused still takes part, so that every rank learns it and none waits. */
    if (mine == ncclSuccess) {
        mine = shim_window_part_kind(ws, buff, size, &kind);
    }
    struct shim_window_hello h = {.kind = kind};
    const void *keys[2] = {NULL, NULL};
    size_t key_lens[2] = {0, 0};
    void *remote = NULL;
    size_t remote_len = 0;
    if (mine == ncclSuccess && kind == SHIM_WINDOWS_DEVICE && shim_window_remote(comm)) {
        mine = shim_rwin_prepare(comm, &ws->rproxy, win->id, buff, size, &win->rwin, &remote,
                                 &remote_len);
    } else if (mine == ncclSuccess && kind == SHIM_WINDOWS_DEVICE) {
        mine = shim_dwin_prepare(comm, &ws->dsignals, !ws->signals_traded, buff, size,
                                 &win->dwin, &h.dev);
    } else if (mine == ncclSuccess) {
        mine = shim_window_host_prepare(comm, ws, win, &h, keys, key_lens);
    }
    h.ok = mine == ncclSuccess;
    size_t len = sizeof(h) + key_lens[0] + key_lens[1] + remote_len;
    res = shim_calloc(&hello, len);
    if (res == ncclSuccess) {
        memcpy(hello, &h, sizeof(h));
        memcpy(hello + sizeof(h), keys[0], key_lens[0]);
        memcpy(hello + sizeof(h) + key_lens[0], keys[1], key_lens[1]);
        memcpy(hello + sizeof(h) + key_lens[0] + key_lens[1], remote, remote_len);
    }
    free(remote);
    SHIM_CHECK_GOTO(res, res, out);
    SHIM_CHECK_GOTO(shim_everyone(comm, &everyone), res, out);
    SHIM_CHECK_GOTO(shim_exchange_blobs(comm, everyone, comm->nranks, comm->rank, hello, len,
                                        &blobs),
                    res, out);
    res = mine != ncclSuccess ? mine : shim_window_agree(comm, &blobs, win->id, &kind);
    if (res == ncclSuccess && kind == SHIM_WINDOWS_DEVICE && win->rwin != NULL) {
        res = shim_rwin_attach(comm, ws->rproxy, win->rwin, &blobs, sizeof(h));
    } else if (res == ncclSuccess && kind == SHIM_WINDOWS_DEVICE) {
        SHIM_CHECK_GOTO(shim_calloc(&dev_hellos, (size_t)comm->nranks), res, out);
        for (int r = 0; r < comm->nranks; r++) {
            memcpy(&dev_hellos[r], blobs.data + blobs.offsets[r] +
                                       offsetof(struct shim_window_hello, dev),
                   sizeof(dev_hellos[r]));
        }
        res = shim_dwin_attach(comm, ws->dsignals, win->dwin, dev_hellos);
    } else {
        for (int r = 0; r < comm->nranks && res == ncclSuccess; r++) {
            res = shim_window_take_hello(comm, ws, win, r, blobs.data + blobs.offsets[r],
                                         blobs.lens[r]);
        }
    }
    if (res != ncclSuccess) {
        goto out;
    }
    ws->signals_traded = true; /* one kind per communicator: the signals of that kind */
    ws->kind = kind;
    win->next = ws->list;
    ws->list = win;
    INFO(SHIM_INIT, "comm %p rank %d: %s window %u at %p, %zu bytes", (void *)comm, comm->rank,
         kind == SHIM_WINDOWS_DEVICE ? "device" : "host", win->id, buff, size);
    *win_out = win;
    win = NULL;

out:
    if (win != NULL) {
        shim_window_release(comm, win);
    }
    shim_blobs_free(&blobs);
    free(dev_hellos);
    free(everyone);
    free(hello);
    return res;
}

/* Frees the signals whose atomic adds are done; an error if one failed. */
static ncclResult_t
shim_pending_test(struct ncclComm *comm, struct shim_windows *ws)
{
    ncclResult_t res = ncclSuccess;

    for (struct shim_pending_op **link = &ws->pending; *link != NULL;) {
        struct shim_pending_op *p = *link;
        bool done = true;
        ncclResult_t r = p->failed ? ncclSuccess : tp_request_test(comm->tp, &p->add_req, &done);
        if (r != ncclSuccess) {
            res = res != ncclSuccess ? res : r;
            tp_request_cancel(comm->tp, &p->add_req);
            p->failed = true;
        }
        if (!p->failed && done) {
            *link = p->next;
            free(p);
        } else {
            link = &p->next;
        }
    }
    return res;
}

/* Between two looks at what a wait waits for, since start: progress, or an error once the
 * communicator was aborted or NCCLSHIM_TIMEOUT passed. */
static ncclResult_t
shim_window_idle(struct ncclComm *comm, uint64_t start, const char *what)
{
    uint64_t timeout_ns = (uint64_t)shim_env_int(SHIM_ENV_TIMEOUT) * 1000000000u;
    uint64_t waited = (uint64_t)shim_clock_ns() - start;

    if (tp_worker_progress(comm->tp) || waited < SHIM_WINDOW_SPIN_NS) {
        return ncclSuccess;
    }
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        WARN("rank %d: communicator %p was aborted while waiting for %s", comm->rank,
             (void *)comm, what);
        return ncclInvalidUsage;
    }
    if (timeout_ns > 0 && waited > timeout_ns) {
        WARN("rank %d: NCCLSHIM_TIMEOUT: %s did not come in %llu s", comm->rank, what,
             (unsigned long long)(timeout_ns / 1000000000u));
        return ncclRemoteError;
    }
    /* Short: an emulated signal lands while we progress, a hardware one wakes no one. */
    sched_yield();
    return tp_worker_wait(&comm->tp, 1, 1);
}

static ncclResult_t
shim_window_wait_request(struct ncclComm *comm, struct tp_request *req, const char *what)
{
    uint64_t start = (uint64_t)shim_clock_ns();

    for (;;) {
        bool done = false;
        SHIM_CHECK(tp_request_test(comm->tp, req, &done));
        if (done) {
            return ncclSuccess;
        }
        ncclResult_t res = shim_window_idle(comm, start, what);
        if (res != ncclSuccess) {
            tp_request_cancel(comm->tp, req);
            return res;
        }
    }
}

/* Waits until this rank's signals went (a wait is where a rank gives its own operations
 * progress). */
static ncclResult_t
shim_pending_finish(struct ncclComm *comm, struct shim_windows *ws)
{
    uint64_t start = (uint64_t)shim_clock_ns();

    for (;;) {
        SHIM_CHECK(shim_pending_test(comm, ws));
        bool failed_only = true; /* failures were reported as they happened */
        for (struct shim_pending_op *p = ws->pending; p != NULL; p = p->next) {
            failed_only &= p->failed;
        }
        if (failed_only) {
            return ncclSuccess;
        }
        SHIM_CHECK(shim_window_idle(comm, start, "the delivery of this rank's signals"));
    }
}

ncclResult_t
shim_window_deregister(struct ncclComm *comm, ncclWindow_t win)
{
    struct shim_blobs blobs = {0};
    int *everyone = NULL;
    ncclResult_t res;

    SHIM_CHECK(shim_window_check(comm, win, "ncclCommWindowDeregister"));
    /* Collective: every rank is done with every part before any part goes. */
    struct ncclWindow_vidmem **link = &comm->windows->list;
    while (*link != win) {
        link = &(*link)->next;
    }
    if (win->dwin != NULL) {
        /* Waits for this rank's puts into the peers' parts, and unmaps them. */
        shim_dwin_free(win->dwin, comm->windows->dsignals);
        win->dwin = NULL;
    } else if (win->rwin != NULL) {
        shim_rwin_drain(win->rwin); /* this rank's puts left; the mirror goes after */
    } else {
        struct tp_request flush = {0};
        SHIM_CHECK(shim_pending_finish(comm, comm->windows));
        SHIM_CHECK(tp_flush_post(comm->tp, -1, &flush));
        SHIM_CHECK(shim_window_wait_request(comm, &flush, "this rank's puts to land"));
    }
    *link = win->next;
    SHIM_CHECK_GOTO(shim_everyone(comm, &everyone), res, out);
    res = shim_exchange_blobs(comm, everyone, comm->nranks, comm->rank, NULL, 0, &blobs);
out:
    shim_window_release(comm, win);
    free(everyone);
    shim_blobs_free(&blobs);
    return res;
}

ncclResult_t
shim_window_user_ptr(struct ncclComm *comm, ncclWindow_t win, void **ptr_out)
{
    SHIM_CHECK(shim_window_check(comm, win, "ncclWinGetUserPtr"));
    if (ptr_out == NULL) {
        WARN("ncclWinGetUserPtr: outUserPtr is NULL");
        return ncclInvalidArgument;
    }
    *ptr_out = win->buff;
    return ncclSuccess;
}

ncclResult_t
shim_window_device_ptr(ncclWindow_t win, size_t offset, int peer, void **ptr_out,
                       const char *api)
{
    if (win == NULL || win->magic != SHIM_WINDOW_MAGIC || ptr_out == NULL) {
        WARN("%s: %s", api, ptr_out == NULL ? "outPtr is NULL" : "not a window");
        return ncclInvalidArgument;
    }
    if (win->dwin == NULL) {
        WARN("%s: window %u is %s: only device windows of ranks on one host have device "
             "pointers", api, win->id, win->rwin != NULL ? "a device window across hosts"
                                                        : "host memory");
        return ncclInvalidUsage;
    }
    if (peer < 0 || peer >= win->comm->nranks || offset > shim_dwin_peer_size(win->dwin, peer)) {
        WARN("%s: peer %d, offset %zu: outside window %u", api, peer, offset, win->id);
        return ncclInvalidArgument;
    }
    *ptr_out = (char *)shim_dwin_peer_ptr(win->dwin, peer) + offset;
    return ncclSuccess;
}

static ncclResult_t
shim_signal_args(const struct ncclComm *comm, int peer, int sig, int ctx, const char *api)
{
    if (peer < 0 || peer >= comm->nranks) {
        WARN("%s: peer %d is not a rank of the communicator's %d", api, peer, comm->nranks);
        return ncclInvalidArgument;
    }
    if (sig < 0 || sig >= SHIM_SIGNAL_IDXS || ctx < 0 || ctx >= SHIM_SIGNAL_CTXS) {
        WARN("%s: sigIdx %d / ctx %d out of range (ncclshim has sigIdx 0..%d, ctx 0..%d)", api,
             sig, ctx, SHIM_SIGNAL_IDXS - 1, SHIM_SIGNAL_CTXS - 1);
        return ncclInvalidArgument;
    }
    const struct shim_windows *ws = comm->windows;
    if (ws == NULL || !ws->signals_traded) {
        WARN("%s: no window was registered on communicator %p yet: ncclshim's ranks trade "
             "their signal words when the first window is registered", api, (void *)comm);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* Raises word (src, sig, ctx) of this rank's own signals by one. */
static void
shim_signal_self(struct shim_windows *ws, size_t word)
{
    __atomic_add_fetch(&ws->signals[word], 1, __ATOMIC_RELEASE);
}

/* The size of peer's part of win. */
static size_t
shim_window_part_size(const struct ncclWindow_vidmem *win, int peer)
{
    if (win->dwin != NULL) {
        return shim_dwin_peer_size(win->dwin, peer);
    }
    return win->rwin != NULL ? shim_rwin_peer_size(win->rwin, peer) : win->parts[peer].size;
}

ncclResult_t
shim_put_signal(struct ncclComm *comm, const void *src, size_t bytes, int peer,
                ncclWindow_t win, size_t offset, int sig_idx, int ctx, cudaStream_t stream)
{
    struct shim_windows *ws;
    struct shim_pending_op *p;
    ncclResult_t res = ncclSuccess;

    SHIM_CHECK(shim_signal_args(comm, peer, sig_idx, ctx, "ncclPutSignal"));
    if (win != NULL || bytes > 0) {
        SHIM_CHECK(shim_window_check(comm, win, "ncclPutSignal"));
    }
    if (bytes > 0 && src == NULL) {
        WARN("ncclPutSignal: the source is NULL");
        return ncclInvalidArgument;
    }
    if (bytes > 0 && (offset > shim_window_part_size(win, peer) ||
                      bytes > shim_window_part_size(win, peer) - offset)) {
        WARN("ncclPutSignal: %zu bytes at offset %zu overrun rank %d's part of window %u "
             "(%zu bytes)", bytes, offset, peer, win->id, shim_window_part_size(win, peer));
        return ncclInvalidArgument;
    }
    if (comm->windows->kind == SHIM_WINDOWS_DEVICE && comm->windows->rproxy != NULL) {
        return shim_rwin_put_signal(comm, comm->windows->rproxy,
                                    win != NULL ? win->rwin : NULL, src, bytes, peer, offset,
                                    sig_idx, ctx, stream);
    }
    if (comm->windows->kind == SHIM_WINDOWS_DEVICE) {
        return shim_dwin_put_signal(comm, comm->windows->dsignals,
                                    win != NULL ? win->dwin : NULL, src, bytes, peer, offset,
                                    sig_idx, ctx, stream);
    }
    if (bytes > 0 && !shim_window_host_memory(src)) {
        WARN("ncclPutSignal: the source %p is device memory, and this communicator's windows "
             "are host memory", src);
        return ncclInvalidUsage;
    }
    ws = comm->windows;
    size_t word = shim_signal_word(comm->rank, sig_idx, ctx);
    if (peer == comm->rank) {
        if (bytes > 0) {
            memmove((char *)win->buff + offset, src, bytes);
        }
        shim_signal_self(ws, word);
        return ncclSuccess;
    }
    if (bytes > 0) {
        /* The data must land before the signal; UCX 1.13's fence does not order a put and an
         * atomic that go over different transports, so the put is flushed first. */
        struct tp_request put = {0}, flush = {0};
        SHIM_CHECK(tp_put_post(comm->tp, peer, src, bytes, win->parts[peer].base + offset,
                               win->parts[peer].rkey, word, &put));
        res = tp_flush_post(comm->tp, peer, &flush);
        if (res == ncclSuccess) {
            res = shim_window_wait_request(comm, &flush, "a put to land");
        }
        if (res == ncclSuccess) {
            res = shim_window_wait_request(comm, &put, "a put's source to be read");
        }
        tp_request_cancel(comm->tp, &put);
        SHIM_CHECK(res);
    }
    SHIM_CHECK(shim_calloc(&p, 1));
    p->one = 1;
    const struct shim_remote *s = &ws->signal_parts[peer];
    res = tp_atomic_add_post(comm->tp, peer, &p->one, s->base + word * sizeof(uint64_t), s->rkey,
                             word, &p->add_req);
    p->next = ws->pending; /* its requests are tested, or cancelled, from now on */
    ws->pending = p;
    ncclResult_t tested = shim_pending_test(comm, ws);
    return res != ncclSuccess ? res : tested;
}

/* Waits until this rank's word for chan counts `want`. */
static ncclResult_t
shim_signal_await(struct ncclComm *comm, struct shim_windows *ws, size_t word, uint64_t want,
                  int peer)
{
    uint64_t start = (uint64_t)shim_clock_ns();

    while (__atomic_load_n(&ws->signals[word], __ATOMIC_ACQUIRE) < want) {
        if (tp_worker_failed_peer(comm->tp) == peer) {
            WARN("rank %d: peer %d failed while this rank waited for its signal", comm->rank,
                 peer);
            return ncclRemoteError;
        }
        SHIM_CHECK(shim_window_idle(comm, start, "a signal"));
    }
    return ncclSuccess;
}

ncclResult_t
shim_wait_signal(struct ncclComm *comm, const ncclWaitSignalDesc_t *descs, int ndescs,
                 cudaStream_t stream)
{
    if (ndescs < 0 || (ndescs > 0 && descs == NULL)) {
        WARN("ncclWaitSignal: %d descriptors at %p", ndescs, (const void *)descs);
        return ncclInvalidArgument;
    }
    for (int i = 0; i < ndescs; i++) {
        SHIM_CHECK(shim_signal_args(comm, descs[i].peer, descs[i].sigIdx, descs[i].ctx,
                                    "ncclWaitSignal"));
        if (descs[i].opCnt < 0) {
            WARN("ncclWaitSignal: descriptor %d waits for %d signals", i, descs[i].opCnt);
            return ncclInvalidArgument;
        }
    }
    struct shim_windows *ws = comm->windows;
    if (ws != NULL && ws->kind == SHIM_WINDOWS_DEVICE) {
        for (int i = 0; i < ndescs; i++) {
            if (ws->rproxy != NULL) {
                SHIM_CHECK(shim_rwin_wait_signal(comm, ws->rproxy, descs[i].peer,
                                                 descs[i].sigIdx, descs[i].ctx,
                                                 (uint32_t)descs[i].opCnt, stream));
            } else {
                SHIM_CHECK(shim_dwin_wait_signal(comm, ws->dsignals, descs[i].peer,
                                                 descs[i].sigIdx, descs[i].ctx,
                                                 (uint32_t)descs[i].opCnt, stream));
            }
        }
        return ncclSuccess;
    }
    for (int i = 0; i < ndescs; i++) {
        size_t word = shim_signal_word(descs[i].peer, descs[i].sigIdx, descs[i].ctx);
        uint64_t want = ws->counted[word] + (uint64_t)descs[i].opCnt;
        uint64_t now = __atomic_load_n(&ws->signals[word], __ATOMIC_ACQUIRE);
        if (descs[i].peer == comm->rank && now < want) {
            WARN("ncclWaitSignal: waits for %d signals from this rank itself, which raised "
                 "%llu: they could never come", descs[i].opCnt,
                 (unsigned long long)(now - ws->counted[word]));
            return ncclInvalidUsage;
        }
        SHIM_CHECK(shim_signal_await(comm, ws, word, want, descs[i].peer));
        ws->counted[word] = want;
    }
    return shim_pending_finish(comm, ws);
}

void
shim_windows_free(struct ncclComm *comm)
{
    struct shim_windows *ws = comm->windows;

    if (ws == NULL) {
        return;
    }
    /* The worker went, and with it every registration and key: only our records, and the
     * device windows' mappings, are left. */
    while (ws->pending != NULL) {
        struct shim_pending_op *p = ws->pending;
        ws->pending = p->next;
        free(p);
    }
    shim_rproxy_stop(ws->rproxy); /* first: its windows then wait for nothing */
    while (ws->list != NULL) {
        struct ncclWindow_vidmem *w = ws->list;
        ws->list = w->next;
        shim_dwin_free(w->dwin, ws->dsignals);
        shim_rwin_free(w->rwin);
        w->magic = 0;
        free(w->parts);
        free(w);
    }
    shim_dsignals_free(ws->dsignals);
    shim_rproxy_free(ws->rproxy);
    free(ws->counted);
    free(ws->signal_parts);
    free(ws);
    comm->windows = NULL;
}
