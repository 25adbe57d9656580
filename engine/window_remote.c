/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The remote row of the window table (window_row.h): windows on device memory for
 * communicators whose ranks span hosts (no shared-memory team). No process maps another's
 * memory, so each part has a landing zone in pinned host memory (its mirror), which peers
 * write with UCX's remote memory access, and a proxy thread per communicator, with a UCX
 * worker of its own, moves the bytes on the host side:
 *
 *   ncclPutSignal(stream):  the stream copies src into a pinned staging ring and records an
 *                           event; the proxy, once the event passed, puts the bytes into the
 *                           peer's mirror, then a record (window, offset, bytes, sigIdx, ctx)
 *                           into the peer's log for this rank, flushes, and adds 1 to the
 *                           peer's log head for this rank
 *   the peer's proxy:       reads each new record in order, copies the bytes from its mirror
 *                           into the part on a stream of its own, and once that copy is done
 *                           counts the signal in a pinned word for (source, sigIdx, ctx)
 *   ncclWaitSignal(stream): the stream waits for those words to reach the count
 *
 * So the calls stay stream ordered and return at once, and nothing waits in a host function.
 * A log holds SHIM_RWIN_LOG records per pair; a source whose target has not read that many
 * waits (its proxy does), learning what the target read from counts the target puts back.
 * A put larger than the staging ring is refused with a message; the ring is as large as the
 * largest part of the window's peers. The proxy polls (nothing it waits for wakes it: puts
 * landing in hardware, streams reaching events), every 20 us while things move, backing off
 * to every 1 ms while nothing does.
 */
#include "window_row.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "comm.h"
#include "exchange.h"
#include "gpu/driver.h"
#include "gpu/memory.h"
#include "gpu/stream.h"
#include "signal.h"
#include "transports/transport.h"

#define SHIM_RWIN_LOG 1024 /* records a source may have unread in its target's log */
/* The proxy's sleep between looks when nothing moved: from this, doubling up to that. */
#define SHIM_RPROXY_IDLE_MIN_US 20u
#define SHIM_RPROXY_IDLE_MAX_US 1000u

/* What a put tells its target, after its bytes. */
struct shim_rrecord {
    uint64_t offset, bytes;
    uint32_t window, sig, ctx, pad;
};

/* A put or signal: queued by the call, sent by the proxy once its stream passed `ready`. */
struct shim_rjob {
    struct shim_rwin *win;      /* NULL for a signal alone */
    int peer;
    uint64_t stage_end;         /* the staging ring's head after this job's bytes */
    uint64_t stage_pos;         /* where its bytes lie in the ring */
    CUevent ready;
    struct shim_rrecord record; /* sent from here */
    uint64_t one;               /* the atomic add's operand */
    struct shim_rjob *next;
};

/* A record read from a log: counted once its copy into the part is done. */
struct shim_rdelivery {
    size_t word;                /* (source, sigIdx, ctx) */
    CUevent copied;             /* NULL: nothing to copy */
    struct shim_rdelivery *next;
};

struct shim_rwin {
    struct shim_rproxy *proxy;
    uint32_t id;
    void *part;
    size_t size;
    int mirror_fd;
    struct gpu_host_import mirror;  /* the landing zone, registered with the driver ... */
    struct tp_mem *mirror_mem;      /* ... and with UCX */
    int stage_fd;
    struct gpu_host_import stage;   /* the staging ring for this rank's puts */
    uint64_t stage_head, stage_tail; /* bytes reserved and freed so far (under the lock) */
    struct shim_remote *peers;     /* every rank's mirror */
    struct shim_rwin *next;
};

struct shim_rproxy {
    struct ncclComm *comm;
    const struct gpu_device *gpu;
    int nranks, rank;
    struct tp_worker *tp;           /* the proxy's own; under lock */
    pthread_mutex_t lock;
    pthread_cond_t room;            /* staging freed */
    pthread_t thread;
    bool running, stop;
    bool stopped;                   /* the thread joined and the worker gone */
    bool stuck;                     /* a put's copy into staging never ran: staging stays */
    struct tp_mem *recv_mem;        /* heads[source], then logs[source][SHIM_RWIN_LOG] */
    uint64_t *heads;
    struct shim_rrecord *logs;
    struct tp_mem *acks_mem;        /* acks[target]: records of ours the target read */
    uint64_t *acks;
    struct shim_remote *peer_recv, *peer_acks;
    uint64_t *sent, *processed, *ack_out;
    struct tp_request *ack_req;
    int words_fd;
    struct gpu_host_import words;   /* counted signals [source][sigIdx][ctx], host-written */
    uint32_t *counted;              /* what waits here expect */
    uint32_t *self_sent;            /* signals to itself, written by its streams */
    CUstream copy_stream;
    struct gpu_stream_marks waited;
    struct shim_rjob *jobs, **jobs_tail;
    struct shim_rdelivery *deliveries, **deliveries_tail;
    struct shim_rwin *windows;
    const void *addr;               /* the worker's address, for the first exchange */
    size_t addr_len;
};

/* What a rank sends of a window's part: its mirror, and the first time its proxy. */
struct shim_rhello {
    uint64_t size, mirror_base;
    uint32_t mirror_key_len;
    uint32_t proxy;                 /* the proxy's part follows */
    uint64_t recv_base, acks_base;
    uint32_t addr_len, recv_key_len, acks_key_len, pad;
};

static void shim_rproxy_free(struct shim_rproxy *p);
static void shim_rwin_free(struct shim_rwin *w);

/* --- the proxy's thread ------------------------------------------------------------------- */

/* Waits (progressing the worker, with the lock held) for req; the proxy stopping ends it. */
static ncclResult_t
shim_rproxy_wait(struct shim_rproxy *p, struct tp_request *req)
{
    for (;;) {
        bool done = false;
        SHIM_CHECK(tp_request_test(p->tp, req, &done));
        if (done) {
            return ncclSuccess;
        }
        if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
            tp_request_cancel(p->tp, req);
            return ncclRemoteError;
        }
        tp_worker_progress(p->tp);
    }
}

/* Sends the oldest job if its stream got there and its target has room in its log. */
static ncclResult_t
shim_rproxy_send(struct shim_rproxy *p, bool *sent_out)
{
    struct shim_rjob *job = p->jobs;

    *sent_out = false;
    if (job == NULL || gpu_cu.cuEventQuery(job->ready) != CUDA_SUCCESS ||
        p->sent[job->peer] - __atomic_load_n(&p->acks[job->peer], __ATOMIC_ACQUIRE) >=
            SHIM_RWIN_LOG) {
        return ncclSuccess;
    }
    int peer = job->peer;
    struct tp_request put = {0}, rec = {0}, flush = {0}, add = {0};
    if (job->record.bytes > 0) {
        const struct shim_remote *m = &job->win->peers[peer];
        SHIM_CHECK(tp_put_post(p->tp, peer, (char *)job->win->stage.host + job->stage_pos,
                               job->record.bytes, m->base + job->record.offset, m->rkey, 0,
                               &put));
    }
    uint64_t slot = p->sent[peer] % SHIM_RWIN_LOG;
    const struct shim_remote *r = &p->peer_recv[peer];
    uint64_t logs = r->base + (uint64_t)p->nranks * sizeof(uint64_t);
    SHIM_CHECK(tp_put_post(p->tp, peer, &job->record, sizeof(job->record),
                           logs + ((uint64_t)p->rank * SHIM_RWIN_LOG + slot) *
                                      sizeof(struct shim_rrecord),
                           r->rkey, 0, &rec));
    /* The bytes and the record land before the head moves (UCX 1.13's fence does not order
     * operations over different transports; a flush does). */
    SHIM_CHECK(tp_flush_post(p->tp, peer, &flush));
    SHIM_CHECK(shim_rproxy_wait(p, &flush));
    SHIM_CHECK(shim_rproxy_wait(p, &put));
    SHIM_CHECK(shim_rproxy_wait(p, &rec));
    SHIM_CHECK(tp_atomic_add_post(p->tp, peer, &job->one,
                                  r->base + (uint64_t)p->rank * sizeof(uint64_t), r->rkey, 0,
                                  &add));
    SHIM_CHECK(shim_rproxy_wait(p, &add));
    p->sent[peer]++;
    if (job->win != NULL) {
        job->win->stage_tail = job->stage_end;
    }
    p->jobs = job->next;
    if (p->jobs == NULL) {
        p->jobs_tail = &p->jobs;
    }
    gpu_cu.cuEventDestroy(job->ready);
    free(job);
    pthread_cond_broadcast(&p->room);
    *sent_out = true;
    return ncclSuccess;
}

static struct shim_rwin *
shim_rproxy_window(struct shim_rproxy *p, uint32_t id)
{
    for (struct shim_rwin *w = p->windows; w != NULL; w = w->next) {
        if (w->id == id) {
            return w;
        }
    }
    return NULL;
}

/* A record's bytes from the mirror into the part, on the proxy's stream, and d->copied after. */
static ncclResult_t
shim_rproxy_copy_in(struct shim_rproxy *p, struct shim_rwin *w, const struct shim_rrecord *rec,
                    struct shim_rdelivery *d)
{
    ncclResult_t res;

    GPU_CU_CHECK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)w->part + rec->offset,
                               w->mirror.dev + rec->offset, rec->bytes, p->copy_stream));
    GPU_CU_CHECK(cuEventCreate(&d->copied, CU_EVENT_DISABLE_TIMING));
    GPU_CU_CHECK_GOTO(cuEventRecord(d->copied, p->copy_stream), res, err);
    return ncclSuccess;

err:
    gpu_cu.cuEventDestroy(d->copied);
    d->copied = NULL;
    return res;
}

/* Reads the new records of source src: each copy from the mirror into the part is enqueued,
 * its count queued behind it; then tells src how far this rank read. */
static ncclResult_t
shim_rproxy_receive(struct shim_rproxy *p, int src, bool *moved_out)
{
    uint64_t head = __atomic_load_n(&p->heads[src], __ATOMIC_ACQUIRE);

    while (p->processed[src] < head) {
        struct shim_rrecord rec;
        memcpy(&rec, &p->logs[(size_t)src * SHIM_RWIN_LOG + p->processed[src] % SHIM_RWIN_LOG],
               sizeof(rec));
        if (rec.sig >= SHIM_SIGNAL_IDXS || rec.ctx >= SHIM_SIGNAL_CTXS) {
            WARN("rank %d: rank %d's log holds a record of signal %u, context %u: a broken "
                 "peer", p->rank, src, rec.sig, rec.ctx);
            return ncclRemoteError;
        }
        struct shim_rdelivery *d;
        SHIM_CHECK(shim_calloc(&d, 1));
        d->word = shim_signal_word(src, (int)rec.sig, (int)rec.ctx);
        struct shim_rwin *w = rec.bytes > 0 ? shim_rproxy_window(p, rec.window) : NULL;
        if (rec.bytes > 0 && (w == NULL || rec.offset > w->size ||
                              rec.bytes > w->size - rec.offset)) {
            WARN("rank %d: rank %d put %llu bytes at %llu of window %u, which this rank %s",
                 p->rank, src, (unsigned long long)rec.bytes, (unsigned long long)rec.offset,
                 rec.window, w == NULL ? "does not have" : "holds fewer bytes of");
            w = NULL; /* counted, not copied */
        }
        ncclResult_t res = w != NULL ? shim_rproxy_copy_in(p, w, &rec, d) : ncclSuccess;
        if (res != ncclSuccess) {
            free(d);
            return res;
        }
        *p->deliveries_tail = d;
        p->deliveries_tail = &d->next;
        p->processed[src]++;
        *moved_out = true;
    }
    bool idle = true;
    SHIM_CHECK(tp_request_test(p->tp, &p->ack_req[src], &idle));
    if (idle && p->ack_out[src] != p->processed[src]) {
        p->ack_out[src] = p->processed[src];
        const struct shim_remote *a = &p->peer_acks[src];
        SHIM_CHECK(tp_put_post(p->tp, src, &p->ack_out[src], sizeof(uint64_t),
                               a->base + (uint64_t)p->rank * sizeof(uint64_t), a->rkey, 0,
                               &p->ack_req[src]));
    }
    return ncclSuccess;
}

/* Counts, in order, the records whose copies are done. */
static void
shim_rproxy_deliver(struct shim_rproxy *p, bool *moved_out)
{
    while (p->deliveries != NULL) {
        struct shim_rdelivery *d = p->deliveries;
        if (d->copied != NULL) {
            if (gpu_cu.cuEventQuery(d->copied) != CUDA_SUCCESS) {
                return;
            }
            gpu_cu.cuEventDestroy(d->copied);
        }
        volatile uint32_t *word = (volatile uint32_t *)p->words.host + d->word;
        __atomic_store_n(word, *word + 1, __ATOMIC_RELEASE);
        p->deliveries = d->next;
        if (p->deliveries == NULL) {
            p->deliveries_tail = &p->deliveries;
        }
        free(d);
        *moved_out = true;
    }
}

static void *
shim_rproxy_main(void *arg)
{
    struct shim_rproxy *p = arg;
    ncclResult_t res = ncclSuccess;

    unsigned idle_us = SHIM_RPROXY_IDLE_MIN_US;

    shim_log_bind(&p->comm->log);
    gpu_capture_relax_thread(); /* a program may capture in global mode meanwhile */
    gpu_ctx_push(p->gpu->ctx);
    pthread_mutex_lock(&p->lock);
    while (!p->stop && res == ncclSuccess) {
        bool moved = tp_worker_progress(p->tp), sent = true;
        while (sent && res == ncclSuccess) {
            res = shim_rproxy_send(p, &sent);
            moved |= sent;
        }
        for (int src = 0; src < p->nranks && res == ncclSuccess; src++) {
            if (src != p->rank) {
                res = shim_rproxy_receive(p, src, &moved);
            }
        }
        shim_rproxy_deliver(p, &moved);
        /* Puts that land in hardware and streams that reach an event wake no one: poll, less
         * often the longer nothing moves. */
        if (moved) {
            idle_us = SHIM_RPROXY_IDLE_MIN_US;
        } else {
            pthread_mutex_unlock(&p->lock);
            usleep(idle_us);
            idle_us = idle_us * 2 > SHIM_RPROXY_IDLE_MAX_US ? SHIM_RPROXY_IDLE_MAX_US
                                                             : idle_us * 2;
            pthread_mutex_lock(&p->lock);
        }
    }
    if (res != ncclSuccess && !p->stop) {
        WARN("rank %d: the device windows' proxy stopped: %s", p->rank, shim_result_text(res));
        shim_comm_set_async_error(p->comm, res);
    }
    p->stop = true; /* whoever waits for it stops waiting */
    pthread_cond_broadcast(&p->room);
    pthread_mutex_unlock(&p->lock);
    gpu_ctx_pop();
    shim_log_bind(NULL);
    return NULL;
}

/* --- making and ending ---------------------------------------------------------------------- */

static ncclResult_t
shim_rproxy_create(struct ncclComm *comm, struct shim_rproxy **out)
{
    struct shim_rproxy *p;
    const int n = comm->nranks;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&p, 1));
    p->comm = comm;
    p->nranks = n;
    p->rank = comm->rank;
    p->words_fd = -1;
    p->jobs_tail = &p->jobs;
    p->deliveries_tail = &p->deliveries;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->room, NULL);
    SHIM_CHECK_GOTO(gpu_device_get(comm->cuda_dev >= 0 ? comm->cuda_dev : 0, &p->gpu), res,
                    err);
    SHIM_CHECK_GOTO(shim_calloc(&p->peer_recv, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&p->peer_acks, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&p->sent, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&p->processed, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&p->ack_out, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&p->ack_req, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&p->counted, shim_signal_words(n)), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&p->self_sent, (size_t)SHIM_SIGNAL_WORDS_PER_RANK), res, err);
    SHIM_CHECK_GOTO(tp_worker_create(&p->tp), res, err);
    SHIM_CHECK_GOTO(tp_worker_address(p->tp, &p->addr, &p->addr_len), res, err);
    size_t recv_bytes = (size_t)n * (sizeof(uint64_t) + SHIM_RWIN_LOG *
                                                            sizeof(struct shim_rrecord));
    SHIM_CHECK_GOTO(tp_mem_register(p->tp, NULL, recv_bytes, &p->recv_mem), res, err);
    p->heads = tp_mem_base(p->recv_mem);
    p->logs = (struct shim_rrecord *)(p->heads + n);
    SHIM_CHECK_GOTO(tp_mem_register(p->tp, NULL, (size_t)n * sizeof(uint64_t), &p->acks_mem),
                    res, err);
    p->acks = tp_mem_base(p->acks_mem);
    SHIM_CHECK_GOTO(gpu_ctx_push(p->gpu->ctx), res, err);
    res = gpu_host_segment("ncclshim-signals", shim_signal_words(n) * sizeof(uint32_t),
                           &p->words_fd, &p->words);
    if (res == ncclSuccess) {
        res = gpu_cu.cuStreamCreate(&p->copy_stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS
                  ? ncclSuccess
                  : ncclUnhandledCudaError;
    }
    gpu_ctx_pop();
    SHIM_CHECK_GOTO(res, res, err);
    *out = p;
    return ncclSuccess;

err:
    shim_rproxy_free(p);
    return res;
}

/* Teardown: stops the proxy's thread and its worker (puts not yet sent are dropped); windows
 * freed afterwards wait for nothing. Then shim_rproxy_free: streams waiting for signals are
 * let go. NULL ignored. */
static void
shim_rproxy_stop(struct shim_rproxy *p)
{
    if (p == NULL || p->stopped) {
        return;
    }
    if (p->running) {
        pthread_mutex_lock(&p->lock);
        p->stop = true;
        pthread_cond_broadcast(&p->room);
        pthread_mutex_unlock(&p->lock);
        pthread_join(p->thread, NULL);
        p->running = false;
    }
    /* The worker goes now, with its registrations and keys: windows freed later only free
     * their memory. */
    tp_worker_destroy(p->tp);
    p->tp = NULL;
    p->stopped = true;
    /* Streams waiting for signals that will never come go on; then the copies of puts never
     * sent, queued on users' streams, must have run before their staging goes (bounded: a
     * stream held for good keeps the staging). */
    bool ctx = p->gpu != NULL && gpu_ctx_push(p->gpu->ctx) == ncclSuccess;
    shim_signal_release_waits(p->words.host, p->counted, shim_signal_words(p->nranks));
    int64_t until = shim_clock_ms() + 5000;
    while (p->jobs != NULL) {
        struct shim_rjob *job = p->jobs;
        while (gpu_cu.cuEventQuery(job->ready) == CUDA_ERROR_NOT_READY &&
               shim_clock_ms() < until) {
            usleep(100);
        }
        if (gpu_cu.cuEventQuery(job->ready) == CUDA_ERROR_NOT_READY) {
            p->stuck = true; /* its stream never got there: staging stays */
        }
        p->jobs = job->next;
        gpu_cu.cuEventDestroy(job->ready);
        free(job);
    }
    p->jobs_tail = &p->jobs;
    if (ctx) {
        gpu_ctx_pop();
    }
}

static void
shim_rproxy_free(struct shim_rproxy *p)
{
    if (p == NULL) {
        return;
    }
    shim_rproxy_stop(p);
    bool ctx = p->gpu != NULL && gpu_ctx_push(p->gpu->ctx) == ncclSuccess;
    bool passed = gpu_stream_marks_wait(&p->waited, 5000);
    gpu_stream_marks_free(&p->waited);
    if (p->copy_stream != NULL) {
        gpu_cu.cuStreamSynchronize(p->copy_stream);
    }
    while (p->deliveries != NULL) {
        struct shim_rdelivery *d = p->deliveries;
        p->deliveries = d->next;
        if (d->copied != NULL) {
            gpu_cu.cuEventDestroy(d->copied);
        }
        free(d);
    }
    if (p->copy_stream != NULL) {
        gpu_cu.cuStreamDestroy(p->copy_stream);
    }
    if (passed) {
        gpu_host_unimport(&p->words);
    }
    if (ctx) {
        gpu_ctx_pop();
    }
    if (p->words_fd >= 0) {
        close(p->words_fd);
    }
    free(p->peer_recv);
    free(p->peer_acks);
    free(p->sent);
    free(p->processed);
    free(p->ack_out);
    free(p->ack_req);
    free(p->counted);
    free(p->self_sent);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->room);
    free(p);
}

/* This rank's part of a new window: its mirror registered, and (the communicator's first such
 * window) the proxy made; *blob_out (freed by the caller) describes them for the exchange. */
static ncclResult_t
shim_rwin_prepare(struct ncclComm *comm, struct shim_rproxy **proxy, uint32_t id, void *buff,
                  size_t size, struct shim_rwin **rwin_out, void **blob_out, size_t *len_out)
{
    struct shim_rwin *w;
    ncclResult_t res;

    if (size > 0) {
        struct gpu_mem_info info;
        gpu_mem_query(buff, &info);
        if (info.kind != GPU_MEM_DEVICE) {
            WARN("ncclCommWindowRegister: %p is %s memory, not device memory", buff,
                 gpu_mem_kind_name(info.kind));
            return ncclInvalidUsage;
        }
    }
    if (*proxy == NULL) {
        SHIM_CHECK(shim_rproxy_create(comm, proxy));
    }
    struct shim_rproxy *p = *proxy;
    /* Until a registration connected the proxies (an earlier one may have failed), every
     * one brings the proxy's address and keys. */
    bool first = !p->running;
    SHIM_CHECK(shim_calloc(&w, 1));
    w->proxy = p;
    w->id = id;
    w->part = buff;
    w->size = size;
    w->mirror_fd = w->stage_fd = -1;
    SHIM_CHECK_GOTO(shim_calloc(&w->peers, (size_t)p->nranks), res, err);
    const void *key = NULL;
    size_t key_len = 0;
    if (size > 0) {
        SHIM_CHECK_GOTO(gpu_ctx_push(p->gpu->ctx), res, err);
        res = gpu_host_segment("ncclshim-mirror", size, &w->mirror_fd, &w->mirror);
        gpu_ctx_pop();
        SHIM_CHECK_GOTO(res, res, err);
        pthread_mutex_lock(&p->lock);
        res = tp_mem_register(p->tp, w->mirror.host, size, &w->mirror_mem);
        pthread_mutex_unlock(&p->lock);
        SHIM_CHECK_GOTO(res, res, err);
        tp_mem_packed(w->mirror_mem, &key, &key_len);
    }
    const void *recv_key = NULL, *acks_key = NULL;
    size_t recv_len = 0, acks_len = 0;
    if (first) {
        tp_mem_packed(p->recv_mem, &recv_key, &recv_len);
        tp_mem_packed(p->acks_mem, &acks_key, &acks_len);
    }
    struct shim_rhello h = {
        .size = size,
        .mirror_base = (uintptr_t)w->mirror.host,
        .mirror_key_len = (uint32_t)key_len,
        .proxy = first,
        .recv_base = (uintptr_t)p->heads,
        .acks_base = (uintptr_t)p->acks,
        .addr_len = first ? (uint32_t)p->addr_len : 0,
        .recv_key_len = (uint32_t)recv_len,
        .acks_key_len = (uint32_t)acks_len,
    };
    size_t len = sizeof(h) + key_len + h.addr_len + recv_len + acks_len;
    uint8_t *blob;
    SHIM_CHECK_GOTO(shim_calloc(&blob, len), res, err);
    uint8_t *at = blob;
    memcpy(at, &h, sizeof(h));
    at += sizeof(h);
    memcpy(at, key, key_len);
    at += key_len;
    if (first) {
        memcpy(at, p->addr, p->addr_len);
        at += p->addr_len;
        memcpy(at, recv_key, recv_len);
        at += recv_len;
        memcpy(at, acks_key, acks_len);
    }
    /* Known to the proxy before any peer learns of it: a peer may put as soon as its own
     * registration returned, before this rank's does. */
    pthread_mutex_lock(&p->lock);
    w->next = p->windows;
    p->windows = w;
    pthread_mutex_unlock(&p->lock);
    *blob_out = blob;
    *len_out = len;
    *rwin_out = w;
    return ncclSuccess;

err:
    shim_rwin_free(w);
    return res;
}

/* With every rank's blob (blobs->data + offsets[r] + skip): the peers' keys taken, the proxy
 * connected and started the first time. */
static ncclResult_t
shim_rwin_attach(struct ncclComm *comm, struct shim_rproxy *p, struct shim_rwin *w,
                 const struct shim_blobs *blobs, size_t skip)
{
    const int n = p->nranks;
    const void **addrs = NULL;
    size_t *addr_lens = NULL, stage = 0;
    bool connect = !p->running;
    ncclResult_t res = ncclSuccess;

    (void)comm;
    SHIM_CHECK(shim_calloc(&addrs, (size_t)n));
    SHIM_CHECK_GOTO(shim_calloc(&addr_lens, (size_t)n), res, out);
    for (int r = 0; r < n; r++) {
        struct shim_rhello h;
        const uint8_t *at = blobs->data + blobs->offsets[r] + skip;
        if (blobs->lens[r] < skip + sizeof(h)) {
            WARN("rank %d: rank %d's part of a window came short", p->rank, r);
            res = ncclRemoteError;
            goto out;
        }
        memcpy(&h, at, sizeof(h));
        if (h.proxy != (uint32_t)connect ||
            blobs->lens[r] < skip + sizeof(h) + h.mirror_key_len + h.addr_len +
                                 h.recv_key_len + h.acks_key_len) {
            WARN("rank %d: rank %d's part of a window does not match this rank's", p->rank, r);
            res = ncclRemoteError;
            goto out;
        }
        at += sizeof(h);
        w->peers[r] = (struct shim_remote){.base = h.mirror_base, .size = h.size};
        stage = h.size > stage ? h.size : stage;
        const uint8_t *key = at;
        at += h.mirror_key_len;
        if (connect) {
            addrs[r] = at;
            addr_lens[r] = h.addr_len;
            at += h.addr_len;
        }
        if (r == p->rank) {
            continue;
        }
        if (connect) {
            p->peer_recv[r].base = h.recv_base;
            p->peer_acks[r].base = h.acks_base;
        }
        /* Keys go against endpoints: connected first, below, the first time. */
        (void)key;
    }
    pthread_mutex_lock(&p->lock);
    if (connect) {
        res = tp_worker_connect(p->tp, n, p->rank, addrs, addr_lens);
    }
    for (int r = 0; r < n && res == ncclSuccess; r++) {
        if (r == p->rank) {
            continue;
        }
        struct shim_rhello h;
        const uint8_t *at = blobs->data + blobs->offsets[r] + skip;
        memcpy(&h, at, sizeof(h));
        at += sizeof(h);
        if (h.size > 0) {
            res = tp_rkey_unpack(p->tp, r, at, &w->peers[r].rkey);
        }
        at += h.mirror_key_len + h.addr_len;
        if (res == ncclSuccess && connect) {
            res = tp_rkey_unpack(p->tp, r, at, &p->peer_recv[r].rkey);
            at += h.recv_key_len;
            if (res == ncclSuccess) {
                res = tp_rkey_unpack(p->tp, r, at, &p->peer_acks[r].rkey);
            }
        }
    }
    pthread_mutex_unlock(&p->lock);
    SHIM_CHECK_GOTO(res, res, out);
    if (stage > 0) {
        SHIM_CHECK_GOTO(gpu_ctx_push(p->gpu->ctx), res, out);
        res = gpu_host_segment("ncclshim-stage", stage, &w->stage_fd, &w->stage);
        gpu_ctx_pop();
        SHIM_CHECK_GOTO(res, res, out);
    }
    if (connect) {
        if (pthread_create(&p->thread, NULL, shim_rproxy_main, p) != 0) {
            WARN("rank %d: cannot start the device windows' proxy thread", p->rank);
            res = ncclSystemError;
            goto out;
        }
        p->running = true;
    }
out:
    free(addrs);
    free(addr_lens);
    return res;
}

/* Deregistering, before the exchange that tells the peers: waits until this rank's puts into
 * the window left (the proxy sent and flushed them). */
static void
shim_rwin_drain(struct shim_rwin *w)
{
    struct shim_rproxy *p = w->proxy;

    pthread_mutex_lock(&p->lock);
    while (p->running && !p->stop && w->stage_tail != w->stage_head) {
        pthread_cond_wait(&p->room, &p->lock);
    }
    pthread_mutex_unlock(&p->lock);
}

/* Whether every record that arrived was read and counted (with the lock). */
static bool
shim_rproxy_caught_up(const struct shim_rproxy *p)
{
    for (int src = 0; src < p->nranks; src++) {
        if (src != p->rank &&
            p->processed[src] != __atomic_load_n(&p->heads[src], __ATOMIC_ACQUIRE)) {
            return false;
        }
    }
    return p->deliveries == NULL;
}

/* After that exchange: once the proxy read what the peers put (bounded), unregisters and frees
 * it. NULL ignored. */
static void
shim_rwin_free(struct shim_rwin *w)
{
    if (w == NULL) {
        return;
    }
    struct shim_rproxy *p = w->proxy;
    /* Every peer's puts into it landed (they drained before the deregistration's exchange):
     * the proxy reads and copies them before the mirror goes, within a bound. */
    int64_t until = shim_clock_ms() + 5000;
    pthread_mutex_lock(&p->lock);
    while (p->running && !p->stop && !shim_rproxy_caught_up(p) && shim_clock_ms() < until) {
        pthread_mutex_unlock(&p->lock);
        usleep(100);
        pthread_mutex_lock(&p->lock);
    }
    for (struct shim_rwin **link = &p->windows; *link != NULL; link = &(*link)->next) {
        if (*link == w) {
            *link = w->next;
            break;
        }
    }
    if (!p->stopped) {
        for (int r = 0; r < p->nranks; r++) {
            tp_rkey_release(p->tp, w->peers[r].rkey);
        }
        tp_mem_deregister(p->tp, w->mirror_mem);
    }
    pthread_mutex_unlock(&p->lock);
    if (gpu_ctx_push(p->gpu->ctx) == ncclSuccess) {
        if (p->copy_stream != NULL) {
            gpu_cu.cuStreamSynchronize(p->copy_stream); /* copies out of its mirror */
        }
        gpu_host_unimport(&w->mirror);
        if (!p->stuck) {
            gpu_host_unimport(&w->stage);
        }
        gpu_ctx_pop();
    }
    if (w->mirror_fd >= 0) {
        close(w->mirror_fd);
    }
    if (w->stage_fd >= 0) {
        close(w->stage_fd);
    }
    free(w->peers);
    free(w);
}

static size_t
shim_rwin_peer_size(const struct shim_rwin *w, int peer)
{
    return w->peers[peer].size;
}

/* --- the operations ----------------------------------------------------------------------- */

/* Room for bytes in w's staging ring, contiguous: where, and the head after them. */
static ncclResult_t
shim_rwin_reserve(struct shim_rproxy *p, struct shim_rwin *w, size_t bytes, uint64_t *pos_out,
                  uint64_t *end_out)
{
    const size_t size = w->stage.size;
    ncclResult_t res = ncclSuccess;

    if (bytes > size) {
        WARN("ncclPutSignal: %zu bytes, past this window's staging of %zu (its largest part)",
             bytes, size);
        return ncclInvalidArgument;
    }
    pthread_mutex_lock(&p->lock);
    uint64_t start = w->stage_head;
    if (start % size + bytes > size) {
        start += size - start % size; /* wraps: from the ring's start */
    }
    while (start + bytes - w->stage_tail > size && res == ncclSuccess) {
        if (p->stop || __atomic_load_n(&p->comm->abort_flag, __ATOMIC_ACQUIRE)) {
            WARN("ncclPutSignal: the communicator was aborted, or its proxy stopped, while "
                 "waiting for staging room");
            res = ncclRemoteError;
        } else {
            /* Looks again every 10 ms: an abort from another thread wakes no one here. */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 10 * 1000 * 1000;
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&p->room, &p->lock, &until);
        }
    }
    if (res == ncclSuccess) {
        w->stage_head = start + bytes;
        *pos_out = start % size;
        *end_out = start + bytes;
    }
    pthread_mutex_unlock(&p->lock);
    return res;
}

/* The one-sided operations, as window_device.c's, on stream (not captured): a put or signal
 * to a peer queued for the proxy behind an event, one to itself on the stream; a wait on the
 * stream for the word the proxy counts. */
static ncclResult_t
shim_rwin_put_signal(struct ncclComm *comm, struct shim_rproxy *p, struct shim_rwin *w,
                     const void *src, size_t bytes, int peer, size_t offset, int sig, int ctx,
                     cudaStream_t stream)
{
    struct shim_rjob *job = NULL;
    ncclResult_t res;

    SHIM_CHECK(shim_signal_check_stream(p->gpu, stream, bytes > 0 ? "ncclPutSignal"
                                                                : "ncclSignal"));
    SHIM_CHECK(gpu_ctx_push(p->gpu->ctx));
    if (peer == comm->rank) {
        /* To itself: the copy and the count on the stream; one writer per word. */
        size_t w_self = shim_signal_word(comm->rank, sig, ctx);
        if (bytes > 0) {
            GPU_CU_CHECK_GOTO(cuMemcpyAsync((CUdeviceptr)(uintptr_t)w->part + offset,
                                            (CUdeviceptr)(uintptr_t)src, bytes,
                                            (CUstream)stream),
                              res, out);
        }
        struct gpu_flag flag = {.host = (volatile uint32_t *)p->words.host + w_self,
                                .dev = p->words.dev + w_self * sizeof(uint32_t)};
        uint32_t seq = ++p->self_sent[shim_signal_word(0, sig, ctx)];
        res = gpu_stream_post_flag((CUstream)stream, &flag, seq);
        goto out;
    }
    SHIM_CHECK_GOTO(shim_calloc(&job, 1), res, out);
    job->win = bytes > 0 ? w : NULL;
    job->peer = peer;
    job->one = 1;
    job->record = (struct shim_rrecord){.offset = offset, .bytes = bytes,
                                        .window = w != NULL ? w->id : UINT32_MAX,
                                        .sig = (uint32_t)sig, .ctx = (uint32_t)ctx};
    if (bytes > 0) {
        SHIM_CHECK_GOTO(shim_rwin_reserve(p, w, bytes, &job->stage_pos, &job->stage_end), res,
                        out);
        /* From here the ring's room is the job's: it must reach the queue. */
        GPU_CU_CHECK_GOTO(cuMemcpyAsync(w->stage.dev + job->stage_pos,
                                        (CUdeviceptr)(uintptr_t)src, bytes, (CUstream)stream),
                          res, out);
    }
    GPU_CU_CHECK_GOTO(cuEventCreate(&job->ready, CU_EVENT_DISABLE_TIMING), res, out);
    GPU_CU_CHECK_GOTO(cuEventRecord(job->ready, (CUstream)stream), res, out);
    pthread_mutex_lock(&p->lock);
    *p->jobs_tail = job;
    p->jobs_tail = &job->next;
    pthread_mutex_unlock(&p->lock);
    job = NULL;
    res = ncclSuccess;
out:
    if (job != NULL) {
        if (job->ready != NULL) {
            gpu_cu.cuEventDestroy(job->ready);
        }
        free(job);
    }
    gpu_ctx_pop();
    return res;
}

static ncclResult_t
shim_wrem_wait_signal(struct ncclComm *comm, void *state, int peer, int sig, int ctx,
                      uint32_t count, cudaStream_t stream)
{
    struct shim_rproxy *p = state;
    size_t w = shim_signal_word(peer, sig, ctx);
    ncclResult_t res;

    (void)comm;
    SHIM_CHECK(shim_signal_check_stream(p->gpu, stream, "ncclWaitSignal"));
    if (count == 0) {
        return ncclSuccess;
    }
    SHIM_CHECK(gpu_ctx_push(p->gpu->ctx));
    p->counted[w] += count;
    struct gpu_flag flag = {.host = (volatile uint32_t *)p->words.host + w,
                            .dev = p->words.dev + w * sizeof(uint32_t)};
    SHIM_CHECK_GOTO(gpu_stream_wait_flag((CUstream)stream, &flag, p->counted[w]), res, out);
    res = gpu_stream_mark(&p->waited, (CUstream)stream);
out:
    gpu_ctx_pop();
    return res;
}

/* --- the row ------------------------------------------------------------------------------ */

/* Device memory of ranks whose processes cannot map each other's: no shared-memory team. */
static bool
shim_wrem_serves(const struct ncclComm *comm, enum gpu_mem_kind kind)
{
    return kind == GPU_MEM_DEVICE && comm->nranks > 1 && comm->shm == NULL;
}

static ncclResult_t
shim_wrem_prepare(struct ncclComm *comm, void **state, struct ncclWindow_vidmem *win,
                  void **blob_out, size_t *len_out)
{
    struct shim_rproxy *proxy = *state;
    struct shim_rwin *w;

    ncclResult_t res = shim_rwin_prepare(comm, &proxy, win->id, win->buff, win->size, &w,
                                         blob_out, len_out);
    *state = proxy; /* made even where the part was refused: the next window's */
    SHIM_CHECK(res);
    win->part = w;
    return ncclSuccess;
}

static ncclResult_t
shim_wrem_attach(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win,
                 const struct shim_blobs *blobs, size_t skip)
{
    return shim_rwin_attach(comm, state, win->part, blobs, skip);
}

/* This rank's puts into the window left; the mirror goes after the exchange. */
static ncclResult_t
shim_wrem_drain(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win)
{
    (void)comm, (void)state;
    shim_rwin_drain(win->part);
    return ncclSuccess;
}

static void
shim_wrem_release(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win)
{
    (void)comm, (void)state;
    shim_rwin_free(win->part);
    win->part = NULL;
}

static size_t
shim_wrem_part_size(const struct ncclWindow_vidmem *win, int peer)
{
    return shim_rwin_peer_size(win->part, peer);
}

static ncclResult_t
shim_wrem_put_signal(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win,
                     const void *src, size_t bytes, int peer, size_t offset, int sig, int ctx,
                     cudaStream_t stream)
{
    return shim_rwin_put_signal(comm, state, win != NULL ? win->part : NULL, src, bytes, peer,
                                offset, sig, ctx, stream);
}

static void
shim_wrem_stop(void *state)
{
    shim_rproxy_stop(state);
}

static void
shim_wrem_destroy(void *state)
{
    shim_rproxy_free(state);
}

const struct shim_window_row shim_window_remote = {
    .name = "device memory across hosts",
    .serves = shim_wrem_serves,
    .prepare = shim_wrem_prepare,
    .attach = shim_wrem_attach,
    .drain = shim_wrem_drain,
    .release = shim_wrem_release,
    .part_size = shim_wrem_part_size,
    .peer_ptr = NULL, /* nothing is mapped across hosts */
    .put_signal = shim_wrem_put_signal,
    .wait_signal = shim_wrem_wait_signal,
    .stop = shim_wrem_stop,
    .destroy = shim_wrem_destroy,
};
