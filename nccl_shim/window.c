/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Windows and one-sided operations on host memory (window.h), over the communicator's tagged
 * messages rather than UCX's remote memory access (which would need its RMA and atomics
 * features in every worker): a put is a header (window, offset, length) and the data, sent to
 * the peer under the signal's own tag, and the peer's ncclWaitSignal, which must count that
 * signal before it may look at the data, receives the header and lands the data straight in
 * its window part. So the target takes part only where NCCL's target does anyway: in its wait.
 *
 *   tag: comm | SIGNAL | source rank | k (the k-th signal on this channel) | payload, sig, ctx
 *
 * A channel is (peer, sigIdx, ctx); signals on one channel are counted in order on both sides.
 * The sender copies its data before it sends, so ncclPutSignal returns at once and its buffer
 * is free again. With no progress thread, a put larger than the transport takes at once
 * (UCX's rendezvous) moves only while its sender is in a one-sided call and its target waits:
 * so ncclWaitSignal also waits until this rank's own puts went. A program that never waits
 * for a signal sent to it leaves its sender waiting there (NCCL's proxy would not). Sends still
 * in flight at teardown go with the communicator. Device memory is refused with a message.
 */
#include "window.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "comm.h"
#include "exec_device.h"
#include "gpu/memory.h"
#include "tag.h"
#include "transports/transport.h"

#define SHIM_WINDOW_MAGIC 0x77696e646f77ull /* "window" */
#define SHIM_SIGNAL_CTX_BITS 7
#define SHIM_SIGNAL_IDX_BITS 12
#define SHIM_SIGNAL_PAYLOAD (1u << (SHIM_SIGNAL_IDX_BITS + SHIM_SIGNAL_CTX_BITS))

/* ncclWindow_t points at one of these: this rank's part of a window. */
struct ncclWindow_vidmem {
    uint64_t magic;
    struct ncclComm *comm;
    uint32_t id;              /* the communicator's n-th window, equal on every rank */
    void *buff;
    size_t size;
    struct ncclWindow_vidmem *next;
};

/* What goes ahead of a put's data. */
struct shim_put_header {
    uint32_t window;
    uint32_t reserved;
    uint64_t offset;
    uint64_t bytes;
};

/* One (peer, sigIdx, ctx): signals sent there, and signals from there counted by waits. */
struct shim_signal_chan {
    int peer, sig, ctx;
    uint32_t sent;
    uint32_t counted;
    uint32_t raised_self; /* peer is this rank: raised and not yet counted */
};

/* A put whose messages are still on their way, and the copy they send from. */
struct shim_pending_put {
    struct shim_put_header header;
    struct tp_request header_req, data_req;
    void *copy;
    bool failed;  /* a send that failed: kept, since UCX may still read its copy, until the
                     worker goes */
    struct shim_pending_put *next;
};

struct shim_windows {
    struct ncclWindow_vidmem *list;
    uint32_t next_id;
    struct shim_signal_chan *chans;
    int nchans, chans_cap;
    struct shim_pending_put *pending;
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

ncclResult_t
shim_window_register(struct ncclComm *comm, void *buff, size_t size, ncclWindow_t *win_out)
{
    struct shim_windows *ws;
    struct ncclWindow_vidmem *win;

    if (win_out == NULL || (buff == NULL && size > 0)) {
        WARN("ncclCommWindowRegister: %s is NULL", win_out == NULL ? "win" : "buff");
        return ncclInvalidArgument;
    }
    if (size > 0 && !shim_window_host_memory(buff)) {
        WARN("ncclCommWindowRegister: %p is device memory: ncclshim's windows are host "
             "memory only so far", buff);
        return ncclInvalidUsage;
    }
    SHIM_CHECK(shim_windows_of(comm, &ws));
    SHIM_CHECK(shim_calloc(&win, 1));
    *win = (struct ncclWindow_vidmem){.magic = SHIM_WINDOW_MAGIC, .comm = comm,
                                       .id = ws->next_id++, .buff = buff, .size = size,
                                       .next = ws->list};
    ws->list = win;
    INFO(SHIM_INIT, "comm %p rank %d: window %u at %p, %zu bytes", (void *)comm, comm->rank,
         win->id, buff, size);
    *win_out = win;
    return ncclSuccess;
}

ncclResult_t
shim_window_deregister(struct ncclComm *comm, ncclWindow_t win)
{
    SHIM_CHECK(shim_window_check(comm, win, "ncclCommWindowDeregister"));
    struct ncclWindow_vidmem **link = &comm->windows->list;
    while (*link != win) {
        link = &(*link)->next;
    }
    *link = win->next;
    win->magic = 0;
    free(win);
    return ncclSuccess;
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

static struct ncclWindow_vidmem *
shim_window_by_id(struct shim_windows *ws, uint32_t id)
{
    for (struct ncclWindow_vidmem *w = ws->list; w != NULL; w = w->next) {
        if (w->id == id) {
            return w;
        }
    }
    return NULL;
}

static ncclResult_t
shim_signal_chan(struct shim_windows *ws, int peer, int sig, int ctx,
                 struct shim_signal_chan **chan_out)
{
    for (int i = 0; i < ws->nchans; i++) {
        struct shim_signal_chan *c = &ws->chans[i];
        if (c->peer == peer && c->sig == sig && c->ctx == ctx) {
            *chan_out = c;
            return ncclSuccess;
        }
    }
    if (ws->nchans == ws->chans_cap) {
        int cap = ws->chans_cap ? 2 * ws->chans_cap : 16;
        struct shim_signal_chan *chans = realloc(ws->chans, (size_t)cap * sizeof(*chans));
        if (chans == NULL) {
            WARN("out of memory for %d signal channels", cap);
            return ncclSystemError;
        }
        ws->chans = chans;
        ws->chans_cap = cap;
    }
    ws->chans[ws->nchans] = (struct shim_signal_chan){.peer = peer, .sig = sig, .ctx = ctx};
    *chan_out = &ws->chans[ws->nchans++];
    return ncclSuccess;
}

static uint64_t
shim_signal_tag(const struct ncclComm *comm, int src, const struct shim_signal_chan *chan,
                uint32_t k, bool payload)
{
    uint32_t index = ((uint32_t)chan->sig << SHIM_SIGNAL_CTX_BITS) | (uint32_t)chan->ctx |
                     (payload ? SHIM_SIGNAL_PAYLOAD : 0);
    return shim_tag_make(comm->tag_base, SHIM_TAG_SIGNAL, src, k, index);
}

static ncclResult_t
shim_signal_args(const struct ncclComm *comm, int peer, int sig, int ctx, const char *api)
{
    if (peer < 0 || peer >= comm->nranks) {
        WARN("%s: peer %d is not a rank of the communicator's %d", api, peer, comm->nranks);
        return ncclInvalidArgument;
    }
    if (sig < 0 || sig >= (1 << SHIM_SIGNAL_IDX_BITS) || ctx < 0 ||
        ctx >= (1 << SHIM_SIGNAL_CTX_BITS)) {
        WARN("%s: sigIdx %d / ctx %d out of range (ncclshim has sigIdx 0..%d, ctx 0..%d)", api,
             sig, ctx, (1 << SHIM_SIGNAL_IDX_BITS) - 1, (1 << SHIM_SIGNAL_CTX_BITS) - 1);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* Frees the puts whose messages are done; an error if one failed. */
static ncclResult_t
shim_pending_test(struct ncclComm *comm, struct shim_windows *ws)
{
    ncclResult_t res = ncclSuccess;

    for (struct shim_pending_put **link = &ws->pending; *link != NULL;) {
        struct shim_pending_put *p = *link;
        bool header_done = true, data_done = true;
        ncclResult_t r = ncclSuccess;
        if (!p->failed) {
            r = tp_request_test(comm->tp, &p->header_req, &header_done);
            if (r == ncclSuccess) {
                r = tp_request_test(comm->tp, &p->data_req, &data_done);
            }
        }
        if (r != ncclSuccess) {
            res = res != ncclSuccess ? res : r;
            tp_request_cancel(comm->tp, &p->header_req);
            tp_request_cancel(comm->tp, &p->data_req);
            p->failed = true;
        }
        if (!p->failed && header_done && data_done) {
            *link = p->next;
            free(p->copy);
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
shim_signal_idle(struct ncclComm *comm, uint64_t start, const char *what)
{
    uint64_t timeout_ns = (uint64_t)shim_env_int(SHIM_ENV_TIMEOUT) * 1000000000u;

    if (tp_worker_progress(comm->tp)) {
        return ncclSuccess;
    }
    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        WARN("rank %d: communicator %p was aborted while waiting for %s", comm->rank,
             (void *)comm, what);
        return ncclInvalidUsage;
    }
    if (timeout_ns > 0 && (uint64_t)shim_clock_ns() - start > timeout_ns) {
        WARN("rank %d: NCCLSHIM_TIMEOUT: %s did not come in %llu s", comm->rank, what,
             (unsigned long long)(timeout_ns / 1000000000u));
        return ncclRemoteError;
    }
    return tp_worker_wait(&comm->tp, 1, 100);
}

/* Waits for req, finishing pending puts meanwhile; abort, a failed peer and NCCLSHIM_TIMEOUT
 * end the wait. */
static ncclResult_t
shim_signal_wait(struct ncclComm *comm, struct shim_windows *ws, struct tp_request *req,
                 const char *what)
{
    uint64_t start = (uint64_t)shim_clock_ns();
    bool done = false;

    for (;;) {
        SHIM_CHECK(tp_request_test(comm->tp, req, &done));
        if (done) {
            return shim_pending_test(comm, ws);
        }
        ncclResult_t res = shim_pending_test(comm, ws);
        if (res == ncclSuccess) {
            res = shim_signal_idle(comm, start, what);
        }
        if (res != ncclSuccess) {
            tp_request_cancel(comm->tp, req);
            return res;
        }
    }
}

/* Waits until this rank's puts went: a large one moves only while its sender progresses, and
 * its target waits for it; a rank's wait is where it gives its own puts that progress. */
static ncclResult_t
shim_pending_finish(struct ncclComm *comm, struct shim_windows *ws)
{
    uint64_t start = (uint64_t)shim_clock_ns();

    for (;;) {
        SHIM_CHECK(shim_pending_test(comm, ws));
        bool failed_only = true; /* failures were reported as they happened */
        for (struct shim_pending_put *p = ws->pending; p != NULL; p = p->next) {
            failed_only &= p->failed;
        }
        if (failed_only) {
            return ncclSuccess;
        }
        SHIM_CHECK(shim_signal_idle(comm, start, "the delivery of this rank's puts"));
    }
}

ncclResult_t
shim_put_signal(struct ncclComm *comm, const void *src, size_t bytes, int peer,
                ncclWindow_t win, size_t offset, int sig_idx, int ctx)
{
    struct shim_windows *ws;
    struct shim_signal_chan *chan;
    struct shim_pending_put *p;
    ncclResult_t res;

    SHIM_CHECK(shim_signal_args(comm, peer, sig_idx, ctx, "ncclPutSignal"));
    if (win != NULL || bytes > 0) {
        SHIM_CHECK(shim_window_check(comm, win, "ncclPutSignal"));
    }
    if (bytes > 0 && (src == NULL || !shim_window_host_memory(src))) {
        WARN("ncclPutSignal: the source %p is %s: ncclshim's one-sided operations are on host "
             "memory only so far", src, src == NULL ? "NULL" : "device memory");
        return src == NULL ? ncclInvalidArgument : ncclInvalidUsage;
    }
    SHIM_CHECK(shim_windows_of(comm, &ws));
    SHIM_CHECK(shim_signal_chan(ws, peer, sig_idx, ctx, &chan));
    if (peer == comm->rank) {
        /* To ourselves: the data lands now, the signal waits to be counted. */
        if (bytes > 0 && (offset > win->size || bytes > win->size - offset)) {
            WARN("ncclPutSignal: %zu bytes at offset %zu overrun this rank's window of %zu",
                 bytes, offset, win->size);
            return ncclInvalidArgument;
        }
        if (bytes > 0) {
            memmove((char *)win->buff + offset, src, bytes);
        }
        chan->raised_self++;
        return ncclSuccess;
    }
    SHIM_CHECK(shim_calloc(&p, 1));
    p->header = (struct shim_put_header){.window = win != NULL ? win->id : UINT32_MAX,
                                         .offset = offset, .bytes = bytes};
    if (bytes > 0) {
        p->copy = malloc(bytes);
        if (p->copy == NULL) {
            free(p);
            WARN("ncclPutSignal: out of memory for a %zu-byte copy", bytes);
            return ncclSystemError;
        }
        memcpy(p->copy, src, bytes);
    }
    uint32_t k = chan->sent++;
    res = tp_send_post(comm->tp, peer, &p->header, sizeof(p->header),
                       shim_signal_tag(comm, comm->rank, chan, k, false), &p->header_req);
    if (res == ncclSuccess && bytes > 0) {
        res = tp_send_post(comm->tp, peer, p->copy, bytes,
                           shim_signal_tag(comm, comm->rank, chan, k, true), &p->data_req);
    }
    p->next = ws->pending; /* its requests are tested, or cancelled, from now on */
    ws->pending = p;
    ncclResult_t tested = shim_pending_test(comm, ws);
    return res != ncclSuccess ? res : tested;
}

/* Counts one signal on chan from a peer: its header, then its data into our window. */
static ncclResult_t
shim_signal_receive(struct ncclComm *comm, struct shim_windows *ws,
                    struct shim_signal_chan *chan)
{
    struct shim_put_header header;
    struct tp_request req = {0};
    uint32_t k = chan->counted;

    SHIM_CHECK(tp_recv_post(comm->tp, chan->peer, &header, sizeof(header),
                            shim_signal_tag(comm, chan->peer, chan, k, false), &req));
    SHIM_CHECK(shim_signal_wait(comm, ws, &req, "a signal"));
    if (header.bytes > 0) {
        struct ncclWindow_vidmem *win = shim_window_by_id(ws, header.window);
        void *dst = NULL;
        bool fits = win != NULL && header.offset <= win->size &&
                    header.bytes <= win->size - header.offset;
        if (fits) {
            dst = (char *)win->buff + header.offset;
        } else if ((dst = malloc(header.bytes)) == NULL) { /* taken in, then dropped */
            WARN("ncclWaitSignal: out of memory for %llu bytes",
                 (unsigned long long)header.bytes);
            return ncclSystemError;
        }
        ncclResult_t res = tp_recv_post(comm->tp, chan->peer, dst, header.bytes,
                                        shim_signal_tag(comm, chan->peer, chan, k, true), &req);
        if (res == ncclSuccess) {
            res = shim_signal_wait(comm, ws, &req, "a put's data");
        }
        if (!fits) {
            free(dst);
            WARN("ncclWaitSignal: rank %d put %llu bytes at offset %llu of window %u, which "
                 "this rank %s", chan->peer, (unsigned long long)header.bytes,
                 (unsigned long long)header.offset, header.window,
                 win == NULL ? "does not have" : "holds fewer bytes of");
            res = res != ncclSuccess ? res : ncclInvalidUsage;
        }
        SHIM_CHECK(res);
    }
    chan->counted++;
    return ncclSuccess;
}

ncclResult_t
shim_wait_signal(struct ncclComm *comm, const ncclWaitSignalDesc_t *descs, int ndescs)
{
    struct shim_windows *ws;

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
    SHIM_CHECK(shim_windows_of(comm, &ws));
    for (int i = 0; i < ndescs; i++) {
        struct shim_signal_chan *chan;
        SHIM_CHECK(shim_signal_chan(ws, descs[i].peer, descs[i].sigIdx, descs[i].ctx, &chan));
        if (chan->peer == comm->rank) {
            if (chan->raised_self < (uint32_t)descs[i].opCnt) {
                WARN("ncclWaitSignal: waits for %d signals from this rank itself, which raised "
                     "%u: they could never come", descs[i].opCnt, chan->raised_self);
                return ncclInvalidUsage;
            }
            chan->raised_self -= (uint32_t)descs[i].opCnt;
            continue;
        }
        for (int k = 0; k < descs[i].opCnt; k++) {
            SHIM_CHECK(shim_signal_receive(comm, ws, chan));
        }
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
    while (ws->pending != NULL) { /* the worker went: its requests are reclaimed */
        struct shim_pending_put *p = ws->pending;
        ws->pending = p->next;
        free(p->copy);
        free(p);
    }
    while (ws->list != NULL) {
        struct ncclWindow_vidmem *w = ws->list;
        ws->list = w->next;
        w->magic = 0;
        free(w);
    }
    free(ws->chans);
    free(ws);
    comm->windows = NULL;
}
