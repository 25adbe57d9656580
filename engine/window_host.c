/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host row of the window table (window_row.h): windows and one-sided operations on host
 * memory, over UCX's remote memory access and atomics. Registering, every rank registers its
 * part with the transport and the ranks trade base, size and packed key; the first window
 * also registers this rank's signal words and trades their keys. Then
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
 * one-sided calls look at it, and ncclWaitSignal waits for it. Deregistering, each rank
 * first flushes its own operations, so no peer's put is still on its way into a part that
 * goes.
 *
 * The stream argument of these calls has nothing to order on host memory: they run in the
 * call. Device memory is refused with a message.
 */
#include "window_row.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "comm.h"
#include "exchange.h"
#include "signal.h"
#include "transports/transport.h"

/* A wait polls this long before it sleeps between looks (1 ms at a time): a signal that lands
 * in hardware wakes no one. */
#define SHIM_WHOST_SPIN_NS 200000u

/* A signal whose atomic add is still out. */
struct shim_pending_op {
    struct tp_request add_req;
    uint64_t one;             /* the atomic's operand, read until the request is done */
    bool failed;              /* kept, since UCX may still read its operand, until the worker
                                 goes */
    struct shim_pending_op *next;
};

/* The row's state: this rank's signal words, which peers add to, and every rank's. */
struct shim_whost {
    struct tp_mem *signals_mem;
    uint64_t *signals;             /* [source rank][sigIdx][ctx] */
    uint64_t *counted;             /* the same words: what waits here counted */
    struct shim_remote *signal_parts; /* every rank's signal words */
    bool traded;                   /* every rank has every rank's signal key */
    bool worker_gone;              /* teardown: registrations and keys went with the worker */
    struct shim_pending_op *pending;
};

/* A window's parts: this rank's registration, and every rank's part. */
struct shim_whost_part {
    struct tp_mem *mem;            /* NULL for an empty part */
    struct shim_remote *parts;
};

/* What a rank tells the others of its part; the packed keys follow. */
struct shim_whost_hello {
    uint32_t window_key_len;
    uint32_t signal_key_len;       /* 0 unless this window brings the signal words */
    uint64_t base, size;
    uint64_t signal_base;
};

static bool
shim_whost_serves(const struct ncclComm *comm, enum gpu_mem_kind kind)
{
    (void)comm;
    return kind == GPU_MEM_HOST;
}

static void
shim_whost_destroy(void *state)
{
    struct shim_whost *hs = state;

    free(hs->counted);
    free(hs->signal_parts);
    free(hs);
}

/* The signal words, registered with the first window. */
static ncclResult_t
shim_whost_create(struct ncclComm *comm, struct shim_whost **out)
{
    size_t words = shim_signal_words(comm->nranks);
    struct shim_whost *hs;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&hs, 1));
    SHIM_CHECK_GOTO(shim_calloc(&hs->counted, words), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&hs->signal_parts, (size_t)comm->nranks), res, err);
    SHIM_CHECK_GOTO(tp_mem_register(comm->tp, NULL, words * sizeof(uint64_t),
                                    &hs->signals_mem),
                    res, err);
    hs->signals = tp_mem_base(hs->signals_mem);
    *out = hs;
    return ncclSuccess;

err:
    shim_whost_destroy(hs);
    return res;
}

/* Registers this rank's part (and the signal words the first time); its hello. */
static ncclResult_t
shim_whost_prepare(struct ncclComm *comm, void **state, struct ncclWindow_vidmem *win,
                   void **blob_out, size_t *len_out)
{
    struct shim_whost *hs = *state;
    struct shim_whost_part *part;
    const void *keys[2] = {NULL, NULL};
    size_t key_lens[2] = {0, 0};
    uint8_t *blob;

    if (hs == NULL) {
        SHIM_CHECK(shim_whost_create(comm, &hs));
        *state = hs;
    }
    SHIM_CHECK(shim_calloc(&part, 1));
    win->part = part;
    SHIM_CHECK(shim_calloc(&part->parts, (size_t)comm->nranks));
    if (win->size > 0) {
        SHIM_CHECK(tp_mem_register(comm->tp, win->buff, win->size, &part->mem));
        tp_mem_packed(part->mem, &keys[0], &key_lens[0]);
    }
    if (!hs->traded) {
        tp_mem_packed(hs->signals_mem, &keys[1], &key_lens[1]);
    }
    struct shim_whost_hello h = {.window_key_len = (uint32_t)key_lens[0],
                                 .signal_key_len = (uint32_t)key_lens[1],
                                 .base = (uintptr_t)win->buff,
                                 .size = win->size,
                                 .signal_base = (uintptr_t)hs->signals};
    size_t len = sizeof(h) + key_lens[0] + key_lens[1];
    SHIM_CHECK(shim_calloc(&blob, len));
    memcpy(blob, &h, sizeof(h));
    memcpy(blob + sizeof(h), keys[0], key_lens[0]);
    memcpy(blob + sizeof(h) + key_lens[0], keys[1], key_lens[1]);
    *blob_out = blob;
    *len_out = len;
    return ncclSuccess;
}

/* Unpacks rank r's keys from its hello into part (and the signal words' into hs). */
static ncclResult_t
shim_whost_take_hello(struct ncclComm *comm, struct shim_whost *hs,
                      const struct ncclWindow_vidmem *win, int r, const uint8_t *blob,
                      size_t len)
{
    struct shim_whost_part *part = win->part;
    struct shim_whost_hello h;

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
    part->parts[r] = (struct shim_remote){.base = h.base, .size = h.size};
    if (r == comm->rank) {
        return ncclSuccess;
    }
    if (h.size > 0) {
        SHIM_CHECK(tp_rkey_unpack(comm->tp, r, blob + sizeof(h), &part->parts[r].rkey));
    }
    if (h.signal_key_len > 0) {
        hs->signal_parts[r].base = h.signal_base;
        SHIM_CHECK(tp_rkey_unpack(comm->tp, r, blob + sizeof(h) + h.window_key_len,
                                  &hs->signal_parts[r].rkey));
    }
    return ncclSuccess;
}

static ncclResult_t
shim_whost_attach(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win,
                  const struct shim_blobs *blobs, size_t skip)
{
    struct shim_whost *hs = state;

    for (int r = 0; r < comm->nranks; r++) {
        SHIM_CHECK(shim_whost_take_hello(comm, hs, win, r, blobs->data + blobs->offsets[r] +
                                                               skip,
                                         blobs->lens[r] - skip));
    }
    hs->traded = true;
    return ncclSuccess;
}

static void
shim_whost_release(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win)
{
    const struct shim_whost *hs = state;
    struct shim_whost_part *part = win->part;

    if (part == NULL) {
        return;
    }
    if (!hs->worker_gone) {
        for (int r = 0; part->parts != NULL && r < comm->nranks; r++) {
            tp_rkey_release(comm->tp, part->parts[r].rkey);
        }
        tp_mem_deregister(comm->tp, part->mem);
    }
    free(part->parts);
    free(part);
    win->part = NULL;
}

static size_t
shim_whost_part_size(const struct ncclWindow_vidmem *win, int peer)
{
    const struct shim_whost_part *part = win->part;

    return part->parts[peer].size;
}

/* Frees the signals whose atomic adds are done; an error if one failed. */
static ncclResult_t
shim_whost_pending_test(struct ncclComm *comm, struct shim_whost *hs)
{
    ncclResult_t res = ncclSuccess;

    for (struct shim_pending_op **link = &hs->pending; *link != NULL;) {
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
shim_whost_idle(struct ncclComm *comm, uint64_t start, const char *what)
{
    uint64_t timeout_ns = (uint64_t)shim_env_int(SHIM_ENV_TIMEOUT) * 1000000000u;
    uint64_t waited = (uint64_t)shim_clock_ns() - start;

    if (tp_worker_progress(comm->tp) || waited < SHIM_WHOST_SPIN_NS) {
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

/* Waits for req, progressing the worker; abort and NCCLSHIM_TIMEOUT end the wait. */
static ncclResult_t
shim_whost_wait_request(struct ncclComm *comm, struct tp_request *req, const char *what)
{
    uint64_t start = (uint64_t)shim_clock_ns();

    for (;;) {
        bool done = false;
        SHIM_CHECK(tp_request_test(comm->tp, req, &done));
        if (done) {
            return ncclSuccess;
        }
        ncclResult_t res = shim_whost_idle(comm, start, what);
        if (res != ncclSuccess) {
            tp_request_cancel(comm->tp, req);
            return res;
        }
    }
}

/* Waits until this rank's signals went (a wait is where a rank gives its own operations
 * progress). */
static ncclResult_t
shim_whost_pending_finish(struct ncclComm *comm, struct shim_whost *hs)
{
    uint64_t start = (uint64_t)shim_clock_ns();

    for (;;) {
        SHIM_CHECK(shim_whost_pending_test(comm, hs));
        bool failed_only = true; /* failures were reported as they happened */
        for (struct shim_pending_op *p = hs->pending; p != NULL; p = p->next) {
            failed_only &= p->failed;
        }
        if (failed_only) {
            return ncclSuccess;
        }
        SHIM_CHECK(shim_whost_idle(comm, start, "the delivery of this rank's signals"));
    }
}

static ncclResult_t
shim_whost_drain(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win)
{
    struct tp_request flush = {0};

    (void)win; /* the flush covers every put of this rank */
    SHIM_CHECK(shim_whost_pending_finish(comm, state));
    SHIM_CHECK(tp_flush_post(comm->tp, -1, &flush));
    return shim_whost_wait_request(comm, &flush, "this rank's puts to land");
}

static bool
shim_whost_is_host(const void *ptr)
{
    struct gpu_mem_info info;
    gpu_mem_query(ptr, &info);
    return info.kind == GPU_MEM_HOST;
}

static ncclResult_t
shim_whost_put_signal(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win,
                      const void *src, size_t bytes, int peer, size_t offset, int sig, int ctx,
                      cudaStream_t stream)
{
    struct shim_whost *hs = state;
    struct shim_pending_op *p;
    ncclResult_t res = ncclSuccess;

    (void)stream; /* nothing to order: the call carries it out */
    if (bytes > 0 && !shim_whost_is_host(src)) {
        WARN("ncclPutSignal: the source %p is device memory, and this communicator's windows "
             "are host memory", src);
        return ncclInvalidUsage;
    }
    size_t word = shim_signal_word(comm->rank, sig, ctx);
    if (peer == comm->rank) {
        if (bytes > 0) {
            memmove((char *)win->buff + offset, src, bytes);
        }
        __atomic_add_fetch(&hs->signals[word], 1, __ATOMIC_RELEASE);
        return ncclSuccess;
    }
    if (bytes > 0) {
        /* The data must land before the signal; UCX 1.13's fence does not order a put and an
         * atomic that go over different transports, so the put is flushed first. */
        const struct shim_remote *to = &((const struct shim_whost_part *)win->part)->parts[peer];
        struct tp_request put = {0}, flush = {0};
        SHIM_CHECK(tp_put_post(comm->tp, peer, src, bytes, to->base + offset, to->rkey, word,
                               &put));
        res = tp_flush_post(comm->tp, peer, &flush);
        if (res == ncclSuccess) {
            res = shim_whost_wait_request(comm, &flush, "a put to land");
        }
        if (res == ncclSuccess) {
            res = shim_whost_wait_request(comm, &put, "a put's source to be read");
        }
        tp_request_cancel(comm->tp, &put);
        SHIM_CHECK(res);
    }
    SHIM_CHECK(shim_calloc(&p, 1));
    p->one = 1;
    const struct shim_remote *s = &hs->signal_parts[peer];
    res = tp_atomic_add_post(comm->tp, peer, &p->one, s->base + word * sizeof(uint64_t), s->rkey,
                             word, &p->add_req);
    p->next = hs->pending; /* its requests are tested, or cancelled, from now on */
    hs->pending = p;
    ncclResult_t tested = shim_whost_pending_test(comm, hs);
    return res != ncclSuccess ? res : tested;
}

/* Waits until this rank's word for chan counts `want`. */
static ncclResult_t
shim_whost_await(struct ncclComm *comm, struct shim_whost *hs, size_t word, uint64_t want,
                 int peer)
{
    uint64_t start = (uint64_t)shim_clock_ns();

    while (__atomic_load_n(&hs->signals[word], __ATOMIC_ACQUIRE) < want) {
        if (tp_worker_failed_peer(comm->tp) == peer) {
            WARN("rank %d: peer %d failed while this rank waited for its signal", comm->rank,
                 peer);
            return ncclRemoteError;
        }
        SHIM_CHECK(shim_whost_idle(comm, start, "a signal"));
    }
    return ncclSuccess;
}

static ncclResult_t
shim_whost_wait_signal(struct ncclComm *comm, void *state, int peer, int sig, int ctx,
                       uint32_t count, cudaStream_t stream)
{
    struct shim_whost *hs = state;
    size_t word = shim_signal_word(peer, sig, ctx);
    uint64_t want = hs->counted[word] + count;
    uint64_t now = __atomic_load_n(&hs->signals[word], __ATOMIC_ACQUIRE);

    (void)stream; /* the call returns once the signals came */
    if (peer == comm->rank && now < want) {
        WARN("ncclWaitSignal: waits for %u signals from this rank itself, which raised %llu: "
             "they could never come", count, (unsigned long long)(now - hs->counted[word]));
        return ncclInvalidUsage;
    }
    SHIM_CHECK(shim_whost_await(comm, hs, word, want, peer));
    hs->counted[word] = want;
    return ncclSuccess;
}

/* The waits are where a rank gives its own signals progress: they went before it returns. */
static ncclResult_t
shim_whost_wait_done(struct ncclComm *comm, void *state)
{
    return shim_whost_pending_finish(comm, state);
}

static void
shim_whost_stop(void *state)
{
    struct shim_whost *hs = state;

    /* The worker went with the requests and every registration and key: only our records
     * are left. */
    while (hs->pending != NULL) {
        struct shim_pending_op *p = hs->pending;
        hs->pending = p->next;
        free(p);
    }
    hs->worker_gone = true;
}

const struct shim_window_row shim_window_host = {
    .name = "host memory",
    .serves = shim_whost_serves,
    .prepare = shim_whost_prepare,
    .attach = shim_whost_attach,
    .drain = shim_whost_drain,
    .release = shim_whost_release,
    .part_size = shim_whost_part_size,
    .peer_ptr = NULL, /* a peer's host memory is not this process's */
    .put_signal = shim_whost_put_signal,
    .wait_signal = shim_whost_wait_signal,
    .wait_done = shim_whost_wait_done,
    .stop = shim_whost_stop,
    .destroy = shim_whost_destroy,
};
