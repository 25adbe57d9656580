/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fake driver's streams, events, copies and launches, the hardware queues that run them,
 * the implicit synchronization of a context, and the callback thread.
 *
 * Hardware queues. A context's streams share CUDA_DEVICE_MAX_CONNECTIONS queues (default 8,
 * at most 32), each a worker thread that runs what its streams enqueue in the order it was
 * enqueued: a stream waiting on a flag or an event holds up everything behind it in its
 * queue, other streams' work included, as on a GPU. The driver does not say which streams
 * share a queue; the double gives them out round-robin in the order the streams are made
 * (the NULL stream at its first use), so that a run is reproducible, or at random with
 * FAKE_CUDA_QUEUE_SEED=n (any n but 0). With one queue (=1) every stream of a context runs
 * in submission order.
 *
 * Implicit synchronization (fake_ctx_sync): the CUDA programming guide's list (a page-locked
 * host allocation, a device allocation, a device memory set, a copy within one device's
 * memory, any command to the NULL stream). A barrier of a context: work enqueued on any of
 * its streams after it starts only once all work enqueued before it on all of them is done.
 * The legacy NULL stream is one both ways for the context's blocking streams (those not
 * made CU_STREAM_NON_BLOCKING, which cuda.h says "does not synchronize with stream 0").
 * A synchronizing call may block until the context's earlier work is done, as the driver may,
 * so the double's never returns while a stream memory operation enqueued before it is not met
 * (a call that returns only once all earlier work is done, block, waits for that too). A wait
 * that another process or thread meets in time only delays it; one still unmet after
 * FAKE_CUDA_SYNC_HANG_MS (default 5000) is a complaint with the call's stack, and the process
 * stops (abort), where a GPU may hang for good; FAKE_CUDA_SYNC_STRICT=1 complains at once, for
 * programs that make no such call while their streams wait. FAKE_CUDA_SYNC_EXEMPT names calls
 * (cuMemMap,cuMemSetAccess,...) whose synchronization is left out altogether: for a program
 * whose known defect is making them while its streams wait, until it is fixed; whoever sets it
 * says why there.
 *
 * Callbacks. Host functions (cuLaunchHostFunc) and user objects' destructors run on one
 * internal thread of the process, one at a time, in the order they became due ("executed
 * by a shared internal thread"): a destructor or host function that blocks holds up every
 * later one, and a host function's stream (and queue) waits until it returned. Neither may
 * make a CUDA call (fake_check_not_in_host_fn).
 *
 * CUDA graphs, as far as one stream goes: a stream being captured appends its operations
 * (host functions among them) to a graph instead of running them; an instantiated graph
 * launched on a stream enqueues copies of them. Events have no place in these graphs (CUDA's
 * fork and join across streams): an event recorded or awaited while capturing invalidates the
 * capture.
 */
#include <execinfo.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "kernels/device_abi.h"

enum fake_op_kind {
    FAKE_OP_WRITE32,
    FAKE_OP_WAIT32,
    FAKE_OP_COPY,
    FAKE_OP_SET,
    FAKE_OP_RECORD,
    FAKE_OP_WAIT_EVENT,
    FAKE_OP_KERNEL,
    FAKE_OP_HOST,
    FAKE_OP_FREE,
};

struct CUevent_st {
    struct CUctx_st *ctx; /* the current one when it was made: records go on its streams only */
    uint64_t recorded;  /* records enqueued */
    uint64_t completed; /* records the stream has reached; atomic */
    int refs;           /* the handle's, until cuEventDestroy, and one per queued operation */
    bool captured;      /* last recorded on a capturing stream (under fake_event_lock) */
};

struct CUfunc_st {
    const struct fake_kernel *kernel;
    struct CUctx_st *ctx; /* its module's */
    bool loaded;          /* by cuFuncLoad or its first launch (atomic) */
};

struct CUmod_st {
    struct CUctx_st *ctx; /* the current one when it was loaded */
    int functions;
};

struct fake_op {
    enum fake_op_kind kind;
    volatile uint32_t *addr; /* WRITE32, WAIT32 */
    uint32_t value;
    unsigned int flags;
    void *dst;               /* COPY, SET (value: the byte) */
    const void *src;
    size_t bytes;
    struct CUevent_st *event; /* RECORD, WAIT_EVENT */
    uint64_t generation;
    const struct fake_kernel *kernel; /* KERNEL */
    void *params;
    size_t params_bytes;
    struct fake_dim3 grid, block; /* its blocks, and threads a block */
    int device;               /* KERNEL: the device it runs on */
    CUhostFn host_fn;         /* HOST */
    void *host_data;
    /* Once enqueued (with fake_sched_lock): */
    struct CUstream_st *owner; /* the stream it was enqueued on */
    struct CUctx_st *ctx;      /* ... and its context */
    const char *fault;         /* what it touches that its device may not: it faults when run */
    uint64_t seq;              /* its number in its context, from 1 */
    uint64_t after;            /* it starts once every operation of its context numbered
                                  below this is done (a barrier before it; 0: none) */
    uint64_t after_blocking;   /* ... every one of a blocking stream (it is the NULL stream's) */
    uint64_t after_null;       /* ... the NULL stream's first this many (a blocking stream's) */
    struct fake_op *next;
};

/* References to user objects (cuGraphRetainUserObject) a graph, an instantiated graph or a
 * launch of one holds. */
#define FAKE_MAX_USER_REFS 256
struct fake_user_refs {
    int n;
    struct {
        struct CUuserObject_st *object;
        unsigned int count;
    } refs[FAKE_MAX_USER_REFS];
};

/* A captured graph and an instantiated one: a list of operations. */
struct CUgraph_st {
    struct fake_op *head, *tail;
    struct fake_user_refs users;
};

struct CUgraphExec_st {
    struct fake_op *head;
    struct fake_user_refs users;
};

/* A hardware queue: its worker runs the operations in the order they were enqueued, on
 * whichever of its context's streams. */
struct fake_queue {
    struct CUctx_st *ctx;
    int index;
    pthread_cond_t cond;         /* work enqueued */
    struct fake_op *head, *tail; /* enqueued, not done; the head is running or waiting */
};

/* A stream. Kept for the process's life once made (a destroyed one, once idle, is made
 * again by a later cuStreamCreate), so that nothing that names one can outlive it; its
 * counts only grow. Everything here is under fake_sched_lock. */
struct CUstream_st {
    struct CUctx_st *ctx;
    struct fake_queue *queue;
    bool blocking;               /* synchronizes with the legacy NULL stream */
    bool legacy;                 /* it is the context's NULL stream */
    uint64_t enqueued, completed;
    bool capturing;              /* atomic; set alone by fake_cuda_set_capturing */
    struct CUgraph_st *graph;    /* capturing into it (cuStreamBeginCapture) */
    bool invalidated;            /* the capture took something a graph here cannot hold */
    CUstreamCaptureMode capture_mode; /* of cuStreamBeginCapture */
    pthread_t capture_thread;    /* the thread that began the capture */
    bool destroyed;
    struct CUstream_st *next;    /* the context's streams */
};

/* A context's scheduling state, beside the public part fake_cuda.h keeps. */
struct fake_ctx_sched {
    struct fake_queue *queues[FAKE_MAX_QUEUES]; /* made on first use */
    unsigned int given;          /* queues given to streams so far (round-robin) */
    unsigned int seed;           /* FAKE_CUDA_QUEUE_SEED: random queues */
    struct CUstream_st *streams;
    uint64_t ops;                /* operations enqueued: the last number given */
    uint64_t barrier;            /* later operations wait for every one numbered below */
    uint64_t null_enqueued;      /* later blocking streams' operations wait for the NULL
                                    stream to complete this many */
};

/* Every queue's, stream's and context's scheduling state: one lock. fake_sched_cond: an
 * operation done (streams synchronized, barriers waited for, look again). */
static pthread_mutex_t fake_sched_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_sched_cond = PTHREAD_COND_INITIALIZER;
static struct fake_ctx_sched fake_scheds[FAKE_MAX_DEVICES];

static struct fake_ctx_sched *
fake_sched(const struct CUctx_st *ctx)
{
    return &fake_scheds[ctx->device];
}

/* One lock and condition for every event's completion. */
static pthread_mutex_t fake_event_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_event_cond = PTHREAD_COND_INITIALIZER;

/* Drops a reference to event (under fake_event_lock); the last one frees it. As in CUDA, an
 * event destroyed while a stream still records or waits on it lives until that is done. */
static void
fake_event_unref_locked(struct CUevent_st *event)
{
    if (--event->refs == 0) {
        free(event);
    }
}

/* An operation done or never queued: what it holds goes. */
static void
fake_op_free(struct fake_op *op)
{
    if (op->event != NULL) {
        pthread_mutex_lock(&fake_event_lock);
        fake_event_unref_locked(op->event);
        pthread_mutex_unlock(&fake_event_lock);
    }
    free(op->params);
    free(op);
}

/* --- the callback thread -------------------------------------------------------------------- */

/* Something due on the callback thread: a host function (its queue waits for `done`) or a
 * user object's destructor (`object` freed after it). */
struct fake_callback {
    CUhostFn fn;
    void *data;
    bool host_fn;
    bool done;
    void *object;
    struct fake_callback *next;
};

static pthread_mutex_t fake_cb_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_cb_cond = PTHREAD_COND_INITIALIZER; /* due, or done */
static struct fake_callback *fake_cb_head, *fake_cb_tail;
static pthread_once_t fake_cb_once = PTHREAD_ONCE_INIT;
static __thread bool fake_in_host_fn;

CUresult
fake_check_not_in_host_fn(const char *call)
{
    if (fake_in_host_fn) {
        fake_complain("%s from inside a host function or a user object's destructor "
                      "(cuLaunchHostFunc: \"CUDA API calls are not permitted\"; "
                      "cuUserObjectCreate: \"cannot make CUDA API calls\")", call);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    return CUDA_SUCCESS;
}

static void *
fake_cb_main(void *arg)
{
    (void)arg;
    fake_in_host_fn = true; /* everything this thread runs is a callback */
    pthread_mutex_lock(&fake_cb_lock);
    for (;;) {
        while (fake_cb_head == NULL) {
            pthread_cond_wait(&fake_cb_cond, &fake_cb_lock);
        }
        struct fake_callback *cb = fake_cb_head;
        fake_cb_head = cb->next;
        if (fake_cb_head == NULL) {
            fake_cb_tail = NULL;
        }
        pthread_mutex_unlock(&fake_cb_lock);
        cb->fn(cb->data);
        pthread_mutex_lock(&fake_cb_lock);
        if (cb->host_fn) {
            cb->done = true; /* its queue's worker frees it */
            pthread_cond_broadcast(&fake_cb_cond);
        } else {
            free(cb->object);
            free(cb);
        }
    }
    return NULL;
}

static void
fake_cb_start(void)
{
    pthread_attr_t attr;
    pthread_t thread;

    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, fake_cb_main, NULL) != 0) {
        fake_complain("cannot start the callback thread");
        abort();
    }
    pthread_attr_destroy(&attr);
}

/* Puts cb last on the callback thread's list. */
static void
fake_cb_due(struct fake_callback *cb)
{
    pthread_once(&fake_cb_once, fake_cb_start);
    cb->next = NULL;
    pthread_mutex_lock(&fake_cb_lock);
    if (fake_cb_tail != NULL) {
        fake_cb_tail->next = cb;
    } else {
        fake_cb_head = cb;
    }
    fake_cb_tail = cb;
    pthread_cond_broadcast(&fake_cb_cond);
    pthread_mutex_unlock(&fake_cb_lock);
}

/* A host function, from its queue's worker: runs on the callback thread, after whatever is
 * due there before it; the queue waits until it returned. */
static void
fake_cb_run_host_fn(CUhostFn fn, void *data)
{
    struct fake_callback cb = {.fn = fn, .data = data, .host_fn = true};

    fake_cb_due(&cb);
    pthread_mutex_lock(&fake_cb_lock);
    while (!cb.done) {
        pthread_cond_wait(&fake_cb_cond, &fake_cb_lock);
    }
    pthread_mutex_unlock(&fake_cb_lock);
}

/* --- running operations ---------------------------------------------------------------- */

static void
fake_pause(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* --- sticky errors ------------------------------------------------------------------------ */

/* FAKE_CUDA_EXPECT_FAULTS=1: a test that makes device work fault on purpose; the fault is then
 * said without the "fake_cuda: " prefix that fails a multi-process case. */
static void __attribute__((format(printf, 1, 2)))
fake_fault_say(const char *fmt, ...)
{
    const char *expect = getenv("FAKE_CUDA_EXPECT_FAULTS");
    char text[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (expect != NULL && atoi(expect) != 0) {
        fprintf(stderr, "fake_cuda (an expected fault): %s\n", text);
    } else {
        fake_complain("%s", text);
    }
}

CUresult
fake_ctx_sticky(struct CUctx_st *ctx)
{
    return ctx != NULL ? (CUresult)__atomic_load_n(&ctx->sticky, __ATOMIC_ACQUIRE)
                       : CUDA_SUCCESS;
}

void
fake_ctx_fault(struct CUctx_st *ctx, CUresult error, const char *what)
{
    int none = CUDA_SUCCESS;

    if (__atomic_compare_exchange_n(&ctx->sticky, &none, (int)error, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
        fake_fault_say("%s on device %d: its context is unusable from now on (sticky error %d)",
                       what, ctx->device, (int)error);
    }
    /* Event waits end (stream.c's waits look at the context each turn); barriers and
     * synchronizations see the context's work drain (fake_op_run runs none of it). */
    pthread_mutex_lock(&fake_event_lock);
    pthread_cond_broadcast(&fake_event_cond);
    pthread_mutex_unlock(&fake_event_lock);
    pthread_mutex_lock(&fake_sched_lock);
    pthread_cond_broadcast(&fake_sched_cond);
    pthread_mutex_unlock(&fake_sched_lock);
}

#define FAKE_STREAM_STICKY_CHECK(s)                                                          \
    do {                                                                                     \
        CUresult fake_sticky_ = (s) != NULL ? fake_ctx_sticky((s)->ctx) : CUDA_SUCCESS;       \
        if (fake_sticky_ != CUDA_SUCCESS) {                                                  \
            return fake_sticky_;                                                             \
        }                                                                                    \
    } while (0)

/* GEQ compares cyclically, as CUDA documents: (int32_t)(*addr - value) >= 0. */
static bool
fake_wait_done(const struct fake_op *op)
{
    uint32_t now = __atomic_load_n(op->addr, __ATOMIC_ACQUIRE);
    switch (op->flags & 0xf) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        return (int32_t)(now - op->value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
        return now == op->value;
    case CU_STREAM_WAIT_VALUE_AND:
        return (now & op->value) != 0;
    default:
        return ~(now | op->value) != 0;
    }
}

static void fake_kernel_execute(const struct fake_op *op);

static void
fake_op_run(struct fake_op *op)
{
    /* A faulted context runs nothing more; work touching what it may not faults it. */
    if (fake_ctx_sticky(op->ctx) != CUDA_SUCCESS) {
        return;
    }
    if (op->fault != NULL) {
        fake_ctx_fault(op->ctx, CUDA_ERROR_ILLEGAL_ADDRESS, op->fault);
        return;
    }
    switch (op->kind) {
    case FAKE_OP_WRITE32:
        __atomic_store_n(op->addr, op->value, __ATOMIC_RELEASE);
        break;
    case FAKE_OP_WAIT32:
        while (!fake_wait_done(op) && fake_ctx_sticky(op->ctx) == CUDA_SUCCESS) {
            fake_pause();
        }
        break;
    case FAKE_OP_COPY:
        memmove(op->dst, op->src, op->bytes);
        break;
    case FAKE_OP_SET:
        memset(op->dst, (int)op->value, op->bytes);
        break;
    case FAKE_OP_RECORD:
        pthread_mutex_lock(&fake_event_lock);
        if (op->event->completed < op->generation) {
            __atomic_store_n(&op->event->completed, op->generation, __ATOMIC_RELEASE);
        }
        pthread_cond_broadcast(&fake_event_cond);
        pthread_mutex_unlock(&fake_event_lock);
        break;
    case FAKE_OP_WAIT_EVENT:
        pthread_mutex_lock(&fake_event_lock);
        while (op->event->completed < op->generation &&
               fake_ctx_sticky(op->ctx) == CUDA_SUCCESS &&
               fake_ctx_sticky(op->event->ctx) == CUDA_SUCCESS) {
            pthread_cond_wait(&fake_event_cond, &fake_event_lock);
        }
        pthread_mutex_unlock(&fake_event_lock);
        break;
    case FAKE_OP_FREE:
        fake_pool_free((uintptr_t)op->dst);
        break;
    case FAKE_OP_KERNEL:
        fake_kernel_execute(op);
        break;
    case FAKE_OP_HOST:
        fake_cb_run_host_fn(op->host_fn, op->host_data);
        break;
    }
}

/* Whether every operation of ctx numbered below `before` (of a blocking stream only, if
 * blocking_only) is done, but `except` (with fake_sched_lock). A queue's operations are in
 * number order. */
static bool
fake_ctx_done_before(const struct CUctx_st *ctx, uint64_t before, bool blocking_only,
                     const struct fake_op *except)
{
    const struct fake_ctx_sched *sc = fake_sched(ctx);

    for (int q = 0; q < FAKE_MAX_QUEUES; q++) {
        if (sc->queues[q] == NULL) {
            continue;
        }
        for (const struct fake_op *o = sc->queues[q]->head; o != NULL && o->seq < before;
             o = o->next) {
            if (o != except && (!blocking_only || o->owner->blocking)) {
                return false;
            }
        }
    }
    return true;
}

/* Whether op, at the head of its queue, may start: the barriers before it are met (with
 * fake_sched_lock). */
static bool
fake_op_may_start(const struct fake_op *op)
{
    const struct CUctx_st *ctx = op->owner->ctx;

    if (op->after_null != 0 && ctx->null_stream->completed < op->after_null) {
        return false;
    }
    if (op->after != 0 && !fake_ctx_done_before(ctx, op->after, false, op)) {
        return false;
    }
    return op->after_blocking == 0 || fake_ctx_done_before(ctx, op->after_blocking, true, op);
}

static void *
fake_queue_worker(void *arg)
{
    struct fake_queue *q = arg;

    pthread_mutex_lock(&fake_sched_lock);
    for (;;) {
        while (q->head == NULL) {
            pthread_cond_wait(&q->cond, &fake_sched_lock);
        }
        struct fake_op *op = q->head;
        while (!fake_op_may_start(op)) {
            pthread_cond_wait(&fake_sched_cond, &fake_sched_lock);
        }
        pthread_mutex_unlock(&fake_sched_lock);
        fake_op_run(op);
        pthread_mutex_lock(&fake_sched_lock);
        q->head = op->next;
        if (q->head == NULL) {
            q->tail = NULL;
        }
        op->owner->completed++;
        pthread_cond_broadcast(&fake_sched_cond);
        pthread_mutex_unlock(&fake_sched_lock);
        fake_op_free(op);
        pthread_mutex_lock(&fake_sched_lock);
    }
    return NULL;
}

/* FAKE_CUDA_DUMP_S=n: n seconds after the first queue is made, every queue's waiting work on
 * stderr, for whoever debugs a hang. */
static const char *const fake_op_names[] = {"write", "wait", "copy", "set", "record",
                                            "wait-event", "kernel", "host-fn", "free"};

static void *
fake_dump_main(void *arg)
{
    sleep((unsigned int)(uintptr_t)arg);
    pthread_mutex_lock(&fake_sched_lock);
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        for (int q = 0; q < FAKE_MAX_QUEUES; q++) {
            const struct fake_queue *queue = fake_scheds[d].queues[q];
            int n = 0;
            for (const struct fake_op *o = queue != NULL ? queue->head : NULL; o != NULL && n < 8;
                 o = o->next, n++) {
                fprintf(stderr, "fake_cuda dump: device %d queue %d #%d: %s of stream %p, op %llu "
                        "after %llu%s%s\n", d, q, n, fake_op_names[o->kind], (void *)o->owner,
                        (unsigned long long)o->seq, (unsigned long long)o->after,
                        o->kind == FAKE_OP_WAIT32 ? (fake_wait_done(o) ? " (met)" : " (not met)")
                                                  : "",
                        o->kind == FAKE_OP_WAIT_EVENT ? " (an event)" : "");
            }
        }
    }
    pthread_mutex_unlock(&fake_sched_lock);
    return NULL;
}

static void
fake_dump_start(void)
{
    const char *text = getenv("FAKE_CUDA_DUMP_S");
    pthread_t thread;

    if (text != NULL && atoi(text) > 0 &&
        pthread_create(&thread, NULL, fake_dump_main, (void *)(uintptr_t)atoi(text)) == 0) {
        pthread_detach(thread);
    }
}

/* The queue a new stream of ctx runs on: the next one round-robin, or one at random
 * (FAKE_CUDA_QUEUE_SEED); made, with its worker, on first use (with fake_sched_lock). NULL if
 * no thread can be started. */
static struct fake_queue *
fake_queue_give(struct CUctx_st *ctx)
{
    struct fake_ctx_sched *sc = fake_sched(ctx);
    const struct fake_config *cfg = fake_config();
    int index;

    if (cfg->queue_seed != 0) {
        if (sc->seed == 0) {
            sc->seed = cfg->queue_seed + (unsigned int)ctx->device;
        }
        index = rand_r(&sc->seed) % cfg->queues;
    } else {
        index = (int)(sc->given++ % (unsigned int)cfg->queues);
    }
    static pthread_once_t dump_once = PTHREAD_ONCE_INIT;
    pthread_once(&dump_once, fake_dump_start);
    if (sc->queues[index] == NULL) {
        struct fake_queue *q = calloc(1, sizeof(*q));
        pthread_attr_t attr;
        pthread_t thread;
        if (q == NULL) {
            return NULL;
        }
        q->ctx = ctx;
        q->index = index;
        pthread_cond_init(&q->cond, NULL);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int err = pthread_create(&thread, &attr, fake_queue_worker, q);
        pthread_attr_destroy(&attr);
        if (err != 0) {
            pthread_cond_destroy(&q->cond);
            free(q);
            return NULL;
        }
        sc->queues[index] = q;
    }
    return sc->queues[index];
}

/* A new stream of ctx, or a destroyed idle one made again (with fake_sched_lock). */
static struct CUstream_st *
fake_stream_new(struct CUctx_st *ctx, bool blocking, bool legacy)
{
    struct fake_ctx_sched *sc = fake_sched(ctx);
    struct CUstream_st *s = sc->streams, **link = &sc->streams;

    while (s != NULL && !(s->destroyed && s->completed == s->enqueued)) {
        link = &s->next;
        s = s->next;
    }
    struct fake_queue *q = fake_queue_give(ctx);
    if (q == NULL) {
        return NULL;
    }
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL) {
            return NULL;
        }
        *link = s;
    }
    uint64_t counted = s->enqueued; /* a stream made again keeps counting */
    struct CUstream_st *next = s->next;
    *s = (struct CUstream_st){.ctx = ctx, .queue = q, .blocking = blocking, .legacy = legacy,
                              .enqueued = counted, .completed = counted, .next = next};
    return s;
}

/* The stream a handle names: NULL and the legacy/per-thread handles are the current context's
 * NULL stream, made on first use. NULL if there is none (no current context: said, since every
 * caller answers CUDA_ERROR_INVALID_CONTEXT). */
static struct CUstream_st *
fake_stream(CUstream handle)
{
    if (handle != NULL && handle != CU_STREAM_LEGACY && handle != CU_STREAM_PER_THREAD) {
        return handle;
    }
    if (fake_need_context("the NULL stream") != CUDA_SUCCESS) {
        return NULL;
    }
    struct CUctx_st *ctx = fake_ctx_current();
    pthread_mutex_lock(&fake_sched_lock);
    if (ctx->null_stream == NULL) {
        ctx->null_stream = fake_stream_new(ctx, true, true);
    }
    pthread_mutex_unlock(&fake_sched_lock);
    return ctx->null_stream;
}

/* Calls that necessarily conflict with a capture, refused even on a RELAXED thread
 * (cuThreadExchangeStreamCaptureMode). The legacy NULL stream (handle NULL or CU_STREAM_LEGACY;
 * the double's per-thread stream is the same stream, but CUDA's is a blocking stream of its
 * own, so it is not refused) "is in an unusable state until the blocking stream capture is
 * terminated" (cuStreamIsCapturing) while a blocking stream of its context captures: whatever
 * uses it fails with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, and the captures it would have
 * depended on are invalidated (invalidate false: cuStreamIsCapturing and
 * cuStreamGetCaptureInfo, which leave them be). */
static CUresult
fake_legacy_check(CUstream handle, const struct CUstream_st *s, const char *call,
                  bool invalidate)
{
    const struct CUstream_st *capturing = NULL;

    if (s == NULL || !s->legacy || handle == CU_STREAM_PER_THREAD) {
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&fake_sched_lock);
    for (struct CUstream_st *o = fake_sched(s->ctx)->streams; o != NULL; o = o->next) {
        if (o->blocking && !o->legacy && !o->destroyed &&
            __atomic_load_n(&o->capturing, __ATOMIC_ACQUIRE)) {
            capturing = o;
            if (invalidate && o->graph != NULL) {
                o->invalidated = true;
            }
        }
    }
    pthread_mutex_unlock(&fake_sched_lock);
    if (capturing == NULL) {
        return CUDA_SUCCESS;
    }
    fake_complain("%s on the legacy NULL stream of device %d while its blocking stream %p "
                  "captures (cuStreamIsCapturing: \"the legacy stream is in an unusable state "
                  "until the blocking stream capture is terminated\"; not even RELAXED)%s",
                  call, s->ctx->device, (const void *)capturing,
                  invalidate ? ": the capture is invalidated" : "");
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
}

/* Synchronizing or querying a stream that is capturing: not permitted whatever the thread's
 * mode (it has no work to wait for, only a graph being built); the capture is invalidated. */
static CUresult
fake_capturing_check(struct CUstream_st *s, const char *call)
{
    if (s == NULL || !__atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE)) {
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&fake_sched_lock);
    if (s->graph != NULL) {
        s->invalidated = true;
    }
    pthread_mutex_unlock(&fake_sched_lock);
    fake_complain("%s of stream %p, which is capturing (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED "
                  "whatever the thread's mode): the capture is invalidated", call, (void *)s);
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* What no capture mode allows of a stream's query or synchronization: the legacy stream beside
 * a blocking stream's capture, or the stream's own capture. */
static CUresult
fake_wait_check(CUstream handle, struct CUstream_st *s, const char *call)
{
    CUresult res = fake_legacy_check(handle, s, call, true);
    return res != CUDA_SUCCESS ? res : fake_capturing_check(s, call);
}

static void
fake_op_append(struct fake_op **head, struct fake_op **tail, struct fake_op *op)
{
    op->next = NULL;
    if (*tail != NULL) {
        (*tail)->next = op;
    } else {
        *head = op;
    }
    *tail = op;
}

static CUresult
fake_enqueue(CUstream handle, struct fake_op *op)
{
    struct CUstream_st *s = fake_stream(handle);

    if (s == NULL || fake_check_not_in_host_fn("enqueueing stream work") != CUDA_SUCCESS) {
        fake_op_free(op);
        return s == NULL ? CUDA_ERROR_INVALID_CONTEXT : CUDA_ERROR_NOT_PERMITTED;
    }
    CUresult legacy = fake_legacy_check(handle, s, "stream work", true);
    if (legacy != CUDA_SUCCESS) {
        fake_op_free(op);
        return legacy;
    }
    CUresult sticky = fake_ctx_sticky(s->ctx);
    if (sticky != CUDA_SUCCESS) {
        fake_op_free(op);
        return sticky;
    }
    op->ctx = s->ctx;
    op->next = NULL;
    pthread_mutex_lock(&fake_sched_lock);
    if (s->graph != NULL) {
        bool takes = op->event == NULL;
        if (takes) {
            fake_op_append(&s->graph->head, &s->graph->tail, op);
        } else {
            s->invalidated = true;
        }
        pthread_mutex_unlock(&fake_sched_lock);
        if (!takes) {
            fake_op_free(op);
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        return CUDA_SUCCESS;
    }
    struct fake_ctx_sched *sc = fake_sched(s->ctx);
    op->owner = s;
    op->seq = ++sc->ops;
    op->after = sc->barrier;
    s->enqueued++;
    if (s->legacy) {
        /* The legacy stream: after every blocking stream's earlier work, and before their
         * later work. */
        op->after_blocking = op->seq;
        sc->null_enqueued = s->enqueued;
    } else if (s->blocking) {
        op->after_null = sc->null_enqueued;
    }
    fake_op_append(&s->queue->head, &s->queue->tail, op);
    pthread_cond_signal(&s->queue->cond);
    pthread_mutex_unlock(&fake_sched_lock);
    return CUDA_SUCCESS;
}

static struct fake_op *
fake_op_new(enum fake_op_kind kind)
{
    struct fake_op *op = calloc(1, sizeof(*op));
    if (op != NULL) {
        op->kind = kind;
    }
    return op;
}

/* Waits until stream s ran everything enqueued on it so far. */
static void
fake_stream_wait_idle(struct CUstream_st *s)
{
    pthread_mutex_lock(&fake_sched_lock);
    uint64_t target = s->enqueued;
    while (s->completed < target) {
        pthread_cond_wait(&fake_sched_cond, &fake_sched_lock);
    }
    pthread_mutex_unlock(&fake_sched_lock);
}

/* --- implicit synchronization ------------------------------------------------------------ */

/* The first stream memory wait of ctx numbered below `before` that is not met, and how many
 * there are (with fake_sched_lock). A faulted context's waits have ended. */
static const struct fake_op *
fake_ctx_unmet_wait(const struct CUctx_st *ctx, uint64_t before, int *count_out)
{
    const struct fake_ctx_sched *sc = fake_sched(ctx);
    const struct fake_op *first = NULL;

    *count_out = 0;
    if (fake_ctx_sticky((struct CUctx_st *)ctx) != CUDA_SUCCESS) {
        return NULL;
    }
    for (int q = 0; q < FAKE_MAX_QUEUES; q++) {
        for (const struct fake_op *o = sc->queues[q] != NULL ? sc->queues[q]->head : NULL;
             o != NULL && o->seq < before; o = o->next) {
            if (o->kind == FAKE_OP_WAIT32 && !fake_wait_done(o) && (*count_out)++ == 0) {
                first = o;
            }
        }
    }
    return first;
}

static long
fake_ms_since(const struct timespec *start)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
}

/* Says where a synchronization is held up by a stream memory wait (with fake_sched_lock, which
 * it drops and takes again), with the caller's stack, and stops the process if `fatal`. */
static void
fake_sync_complain(struct CUctx_st *ctx, const char *call, const struct fake_op *wait,
                   int nwaiting, long waited, bool fatal)
{
    static const char *const how[] = {"GEQ", "EQ", "AND", "NOR"};
    const void *stream = wait->owner, *word = (const void *)wait->addr;
    uint32_t now = __atomic_load_n(wait->addr, __ATOMIC_ACQUIRE), value = wait->value;
    const char *cmp = how[wait->flags & 0x3];
    void *frames[32];

    pthread_mutex_unlock(&fake_sched_lock);
    fake_complain("%s synchronizes device %d's context (it may wait for all earlier work of "
                  "every stream) while stream %p waits on a stream memory operation not met "
                  "for %ld ms (the word at %p is %u, the wait is %s %u; %d such waits): on a GPU "
                  "this may hang for good where whoever releases the wait is this thread or "
                  "waits for it; nothing that may synchronize a context may come between a "
                  "queued wait and its release%s", call, ctx->device, stream, waited, word, now,
                  cmp, value, nwaiting, fatal ? "; the process is stopped" : "");
    int n = backtrace(frames, 32);
    backtrace_symbols_fd(frames, n, 2);
    if (fatal) {
        abort();
    }
    pthread_mutex_lock(&fake_sched_lock);
}

/* Waits on fake_sched_cond (with fake_sched_lock) for at most a millisecond. */
static void
fake_sched_nap(void)
{
    struct timespec until;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&fake_sched_cond, &fake_sched_lock, &until);
}

/* Whether FAKE_CUDA_SYNC_EXEMPT names `call` (a list separated by commas or spaces). */
static bool
fake_sync_exempt(const char *call)
{
    const char *list = fake_config()->sync_exempt;
    const size_t n = strlen(call);

    for (const char *p = strstr(list, call); p != NULL; p = strstr(p + 1, call)) {
        bool starts = p == list || p[-1] == ',' || p[-1] == ' ';
        bool ends = p[n] == '\0' || p[n] == ',' || p[n] == ' ';
        if (starts && ends) {
            return true;
        }
    }
    return false;
}

void
fake_ctx_sync(struct CUctx_st *ctx, const char *call, bool block)
{
    const struct fake_config *cfg = fake_config();
    struct timespec start;
    bool said = false;

    if (ctx == NULL || fake_sync_exempt(call)) {
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &start);
    pthread_mutex_lock(&fake_sched_lock);
    struct fake_ctx_sched *sc = fake_sched(ctx);
    uint64_t before = sc->ops + 1;
    sc->barrier = before;
    for (;;) {
        int nwaiting;
        const struct fake_op *wait = fake_ctx_unmet_wait(ctx, before, &nwaiting);
        if (block ? fake_ctx_done_before(ctx, before, false, NULL) : wait == NULL) {
            break;
        }
        long waited = fake_ms_since(&start);
        if (wait != NULL && (waited >= cfg->sync_hang_ms || (cfg->sync_strict && !said))) {
            fake_sync_complain(ctx, call, wait, nwaiting, waited, waited >= cfg->sync_hang_ms);
            said = true;
            continue;
        }
        fake_sched_nap(); /* words change without a signal: look again each millisecond */
    }
    pthread_mutex_unlock(&fake_sched_lock);
}

/* A synchronous command of the legacy NULL stream of the current context (cuMemcpyHtoD,
 * cuMemsetD8): op enqueued there, and waited for. */
static CUresult
fake_null_stream_run(struct fake_op *op)
{
    struct CUstream_st *s = fake_stream(CU_STREAM_LEGACY);
    CUresult res = fake_enqueue(CU_STREAM_LEGACY, op);

    if (res != CUDA_SUCCESS) {
        return res;
    }
    /* As fake_ctx_sync: it waits for the earlier work of the context's blocking streams (and of
     * its queue), so a stream memory wait among it still unmet after FAKE_CUDA_SYNC_HANG_MS is
     * a complaint and an abort, where a GPU may hang for good. */
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    pthread_mutex_lock(&fake_sched_lock);
    uint64_t target = s->enqueued, before = fake_sched(s->ctx)->ops + 1;
    while (s->completed < target) {
        int nwaiting;
        const struct fake_op *wait = fake_ctx_unmet_wait(s->ctx, before, &nwaiting);
        long waited = fake_ms_since(&start);
        if (wait != NULL && waited >= fake_config()->sync_hang_ms) {
            fake_sync_complain(s->ctx, "a synchronous command of the legacy NULL stream "
                               "(cuMemcpyHtoD, cuMemcpyDtoH, cuMemsetD8)", wait, nwaiting,
                               waited, true);
        }
        fake_sched_nap();
    }
    pthread_mutex_unlock(&fake_sched_lock);
    return CUDA_SUCCESS;
}

CUresult
fake_null_stream_copy(void *dst, const void *src, size_t bytes)
{
    struct fake_op *op = fake_op_new(FAKE_OP_COPY);

    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->dst = dst;
    op->src = src;
    op->bytes = bytes;
    return fake_null_stream_run(op);
}

CUresult
fake_null_stream_set(void *dst, unsigned char value, size_t bytes)
{
    struct fake_op *op = fake_op_new(FAKE_OP_SET);

    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->dst = dst;
    op->value = value;
    op->bytes = bytes;
    return fake_null_stream_run(op);
}

/* --- streams -------------------------------------------------------------------------------- */

FAKE_API CUresult
cuStreamCreate(CUstream *stream, unsigned int flags)
{
    struct CUctx_st *ctx = fake_ctx_current();

    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT(); /* a stream of the current context */
    FAKE_STICKY_CHECK();
    if ((flags & ~(unsigned int)CU_STREAM_NON_BLOCKING) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* cuda.h does not say; this project's design counts stream creation among what can
     * serialize the device (DESIGN.md), so the double makes it a barrier as an allocation. */
    fake_ctx_sync(ctx, "cuStreamCreate", false);
    pthread_mutex_lock(&fake_sched_lock);
    *stream = fake_stream_new(ctx, (flags & CU_STREAM_NON_BLOCKING) == 0, false);
    pthread_mutex_unlock(&fake_sched_lock);
    if (*stream == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    FAKE_STAT_ADD(streams, 1);
    return CUDA_SUCCESS;
}

/* As CUDA: returns at once; the stream goes once its work is done (then a later
 * cuStreamCreate may make it again). */
FAKE_API CUresult
cuStreamDestroy(CUstream stream)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&fake_sched_lock);
    stream->destroyed = true;
    pthread_mutex_unlock(&fake_sched_lock);
    FAKE_STAT_ADD(streams, -1);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuStreamSynchronize(CUstream handle)
{
    struct CUstream_st *s = fake_stream(handle);

    FAKE_CAPTURE_CHECK_UNSAFE();
    if (s == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    CUresult res = fake_wait_check(handle, s, __func__);
    if (res != CUDA_SUCCESS) {
        return res;
    }
    FAKE_STREAM_STICKY_CHECK(s);
    /* A fault meanwhile ends the wait: the context's streams then drain without running. */
    fake_stream_wait_idle(s);
    return fake_ctx_sticky(s->ctx);
}

/* A potentially unsafe call (the H200 refused it during another thread's global capture). */
FAKE_API CUresult
cuStreamQuery(CUstream handle)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    struct CUstream_st *s = fake_stream(handle);

    if (s == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    CUresult res = fake_wait_check(handle, s, __func__);
    if (res != CUDA_SUCCESS) {
        return res;
    }
    FAKE_STREAM_STICKY_CHECK(s);
    pthread_mutex_lock(&fake_sched_lock);
    bool idle = s->completed == s->enqueued;
    pthread_mutex_unlock(&fake_sched_lock);
    return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE_API CUresult
cuStreamGetCtx(CUstream handle, CUcontext *ctx)
{
    struct CUstream_st *s = fake_stream(handle);

    if (s == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    FAKE_STREAM_STICKY_CHECK(s);
    *ctx = s->ctx;
    return CUDA_SUCCESS;
}

/* The variant of CUDA 12.5: the context, and through the third pointer the green context the
 * stream belongs to, always written (NULL: the double has no green contexts). */
FAKE_API CUresult
cuStreamGetCtx_v2(CUstream handle, CUcontext *ctx, CUgreenCtx *green)
{
    CUresult res = cuStreamGetCtx(handle, ctx);

    if (res == CUDA_SUCCESS) {
        *green = NULL;
    }
    return res;
}

FAKE_API CUresult
cuStreamIsCapturing(CUstream handle, CUstreamCaptureStatus *status)
{
    struct CUstream_st *s = fake_stream(handle);

    if (s == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    CUresult res = fake_legacy_check(handle, s, __func__, false);
    if (res != CUDA_SUCCESS) {
        return res; /* "*captureStatus is unspecified after the call" */
    }
    *status = __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE) ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                                               : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

/* For tests (test.c): puts a stream into or out of the capturing state. */
void
fake_stream_set_capturing(CUstream handle, bool capturing)
{
    struct CUstream_st *s = fake_stream(handle);
    if (s != NULL) {
        __atomic_store_n(&s->capturing, capturing, __ATOMIC_RELEASE);
    }
}

/* addr as the device sees it turned into the host address the double touches; false (with a
 * complaint) where work on `device` may not touch it. */
static bool
fake_device_address(uint64_t *addr, int device, const char *what)
{
    if (!fake_mem_device_reaches((uintptr_t)*addr, device)) {
        fake_fault_say("%s on device %d touches cuMem memory at 0x%llx that cuMemSetAccess did "
                       "not open to it (an illegal address on a GPU)", what, device,
                       (unsigned long long)*addr);
        return false;
    }
    *addr = fake_mem_host_of((uintptr_t)*addr);
    return true;
}

/* --- link traffic ------------------------------------------------------------------------- */

/* The device whose memory addr is (-1: host memory, registered or not). */
static int
fake_owner(uint64_t addr)
{
    enum fake_mem_kind kind;
    int device;
    return fake_mem_lookup((uintptr_t)addr, &kind, &device) && kind == FAKE_MEM_DEVICE ? device
                                                                                        : -1;
}

/* bytes moved from device `from` to device `to` (-1: host memory) cross their links: out of
 * the one, into the other; nothing moves within one place. A kernel on device k reads from
 * its operand's place into k and writes from k into its destination's; a copy moves from its
 * source's place into its destination's, whichever engine does it. */
static void
fake_traffic(int from, int to, unsigned long long bytes)
{
    if (from == to) {
        return;
    }
    pthread_mutex_lock(&fake_stats_lock);
    if (from >= 0) {
        fake_stats.link_out[from] += bytes;
    }
    if (to >= 0) {
        fake_stats.link_in[to] += bytes;
    }
    pthread_mutex_unlock(&fake_stats_lock);
}

/* The tasks of a batch that a launch runs: every one (level -1), or kr_dev_from's of a level. */
static bool
fake_task_runs(const struct kr_dev_task *task, int level)
{
    return level < 0 || task->level == level;
}

/* A kernel batch's reads and writes (untranslated addresses) of the tasks a launch on device
 * `by` runs. */
static void
fake_traffic_kernel(const struct kr_dev_batch *b, size_t elem_bytes, int by, int level)
{
    for (uint32_t t = 0; t < b->ntasks && t < KR_DEV_MAX_TASKS; t++) {
        const struct kr_dev_task *task = &b->tasks[t];
        if (!fake_task_runs(task, level)) {
            continue;
        }
        unsigned long long bytes = task->count * elem_bytes;
        for (uint32_t i = 0; i < task->nsrc && task->first_src + i < KR_DEV_MAX_SRCS; i++) {
            fake_traffic(fake_owner(b->srcs[task->first_src + i].ptr), by, bytes);
        }
        for (uint32_t i = 0; i < task->ndst && task->first_dst + i < KR_DEV_MAX_DSTS; i++) {
            fake_traffic(by, fake_owner(b->dsts[task->first_dst + i]), bytes);
        }
    }
}

/* --- memory operations ---------------------------------------------------------------------- */

/* A stream memory operation of `kind` on the 32-bit word at addr, whose flags were checked. */
static CUresult
fake_mem_op_enqueue(CUstream stream, enum fake_op_kind kind, CUdeviceptr addr,
                    cuuint32_t value, unsigned int flags)
{
    struct CUstream_st *s = fake_stream(stream);
    uintptr_t host = 0;
    bool fault = false;

    if (s == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    FAKE_STREAM_STICKY_CHECK(s);
    CUresult res = fake_mem_op_check((uintptr_t)addr, s->ctx->device, &host, &fault);
    if (res != CUDA_SUCCESS) {
        return res;
    }
    struct fake_op *op = fake_op_new(kind);
    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->addr = (volatile uint32_t *)host;
    op->value = value;
    op->flags = flags;
    op->fault = fault ? "a stream memory operation on cuMem memory cuMemSetAccess did not open "
                        "to its device"
                      : NULL;
    return fake_enqueue(stream, op);
}

/* CUstreamWriteValue_flags: DEFAULT alone; NO_MEMORY_BARRIER "is not supported in the v2 API"
 * (which cuStreamWriteValue32 is since 11.7; cuda.h names no error for it: NOT_SUPPORTED here,
 * unsure). */
FAKE_API CUresult
cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    if (flags != CU_STREAM_WRITE_VALUE_DEFAULT) {
        fake_complain("cuStreamWriteValue32_v2 with flags 0x%x (only DEFAULT: NO_MEMORY_BARRIER "
                      "is not supported in the v2 API)", flags);
        return flags == CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER ? CUDA_ERROR_NOT_SUPPORTED
                                                                : CUDA_ERROR_INVALID_VALUE;
    }
    return fake_mem_op_enqueue(stream, FAKE_OP_WRITE32, addr, value, flags);
}

/* CUstreamWaitValue_flags: one of GEQ, EQ, AND, NOR (every device the double is has NOR), and
 * FLUSH only where CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES says the platform can: else
 * CUDA_ERROR_NOT_SUPPORTED, as cuda.h lists for an operation a device lacks. The flush itself
 * has nothing to do here: the double's writes are visible at once. */
FAKE_API CUresult
cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    const unsigned int known = 0x3u | CU_STREAM_WAIT_VALUE_FLUSH;

    if ((flags & ~known) != 0) {
        fake_complain("cuStreamWaitValue32_v2 with flags 0x%x, bits cuda.h does not define",
                      flags);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((flags & CU_STREAM_WAIT_VALUE_FLUSH) && !fake_config()->can_flush) {
        fake_complain("cuStreamWaitValue32_v2 with CU_STREAM_WAIT_VALUE_FLUSH on a device whose "
                      "CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES is 0");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    CUresult res = fake_mem_op_enqueue(stream, FAKE_OP_WAIT32, addr, value, flags);
    if (res == CUDA_SUCCESS && (flags & CU_STREAM_WAIT_VALUE_FLUSH)) {
        FAKE_STAT_ADD(flush_waits, 1);
    }
    return res;
}

FAKE_API CUresult
cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream)
{
    struct fake_op *op = fake_op_new(FAKE_OP_COPY);
    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct CUstream_st *s = fake_stream(stream);
    uint64_t to = dst, from = src;
    fake_traffic(fake_owner(src), fake_owner(dst), bytes);
    /* Taken, and an illegal address when it runs, as on a GPU. */
    if (s != NULL && (!fake_device_address(&to, s->ctx->device, "a copy") ||
                      !fake_device_address(&from, s->ctx->device, "a copy"))) {
        op->fault = "a copy touched cuMem memory its device may not";
    }
    op->dst = (void *)(uintptr_t)to;
    op->src = (const void *)(uintptr_t)from;
    op->bytes = bytes;
    return fake_enqueue(stream, op);
}

/* --- events --------------------------------------------------------------------------------- */

FAKE_API CUresult
cuEventCreate(CUevent *event, unsigned int flags)
{
    (void)flags;
    /* "Creates an event *phEvent for the current context". */
    FAKE_NEED_CONTEXT();
    struct CUctx_st *ctx = fake_ctx_current();
    FAKE_STICKY_CHECK();
    *event = calloc(1, sizeof(**event));
    if (*event == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*event)->ctx = ctx;
    (*event)->refs = 1;
    FAKE_STAT_ADD(events, 1);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuEventDestroy(CUevent event)
{
    pthread_mutex_lock(&fake_event_lock);
    fake_event_unref_locked(event);
    pthread_mutex_unlock(&fake_event_lock);
    FAKE_STAT_ADD(events, -1);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuEventRecord(CUevent event, CUstream stream)
{
    /* "hEvent and hStream must be from the same context otherwise CUDA_ERROR_INVALID_HANDLE
     * is returned." */
    struct CUstream_st *s = fake_stream(stream);
    if (s != NULL && s->ctx != event->ctx) {
        fake_complain("cuEventRecord of an event of another context than the stream's");
        return CUDA_ERROR_INVALID_HANDLE;
    }
    struct fake_op *op = fake_op_new(FAKE_OP_RECORD);
    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fake_event_lock);
    /* Recorded inside a capture (which the double's graphs cannot hold: the capture is
     * invalidated), the event is the capture's from now on: querying or waiting for it from
     * the host necessarily conflicts with the capture. */
    event->captured = s != NULL && __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE);
    op->generation = ++event->recorded;
    event->refs++;
    pthread_mutex_unlock(&fake_event_lock);
    op->event = event;
    return fake_enqueue(stream, op);
}

/* cuThreadExchangeStreamCaptureMode's example of a call that necessarily conflicts with a
 * capture, even RELAXED: cuEventQuery "on an event that was last recorded inside a capture
 * sequence" (CUDA_ERROR_CAPTURED_EVENT: "not permitted on an event which was last recorded in
 * a capturing stream"); cuEventSynchronize alike. */
static bool
fake_event_captured(CUevent event, const char *call)
{
    pthread_mutex_lock(&fake_event_lock);
    bool captured = event->captured;
    pthread_mutex_unlock(&fake_event_lock);
    if (captured) {
        fake_complain("%s of an event last recorded inside a stream capture (not permitted "
                      "whatever the thread's mode)", call);
    }
    return captured;
}

FAKE_API CUresult
cuEventQuery(CUevent event)
{
    FAKE_CAPTURE_CHECK_UNSAFE(); /* as cuStreamQuery */
    if (fake_event_captured(event, __func__)) {
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    CUresult sticky = fake_ctx_sticky(event->ctx);
    if (sticky != CUDA_SUCCESS) {
        return sticky;
    }
    pthread_mutex_lock(&fake_event_lock);
    bool done = event->completed >= event->recorded;
    pthread_mutex_unlock(&fake_event_lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FAKE_API CUresult
cuEventSynchronize(CUevent event)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    if (fake_event_captured(event, __func__)) {
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    pthread_mutex_lock(&fake_event_lock);
    uint64_t target = event->recorded;
    while (event->completed < target && fake_ctx_sticky(event->ctx) == CUDA_SUCCESS) {
        pthread_cond_wait(&fake_event_cond, &fake_event_lock);
    }
    pthread_mutex_unlock(&fake_event_lock);
    return fake_ctx_sticky(event->ctx);
}

FAKE_API CUresult
cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    (void)flags;
    struct fake_op *op = fake_op_new(FAKE_OP_WAIT_EVENT);
    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fake_event_lock);
    op->generation = event->recorded; /* the record most recently enqueued, as CUDA */
    event->refs++;
    pthread_mutex_unlock(&fake_event_lock);
    op->event = event;
    return fake_enqueue(stream, op);
}

/* --- modules and launches ------------------------------------------------------------------- */

/* The fatbin's magic number, which every image nvcc writes starts with. */
#define FAKE_FATBIN_MAGIC 0xba55ed50u

static uint64_t
fake_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

/* What the driver does with a fatbin for a GPU of compute capability cc: a cubin of the same
 * major and a minor not above cc's runs as it is; else PTX of an architecture not above cc is
 * compiled, if the driver knows its ISA (the double's fatbin comes from the toolkit of the
 * cuda.h it is built with: a driver older than that major refuses it). */
static CUresult
fake_fatbin_check(const uint8_t *p, int cc)
{
    bool cubin = false, ptx = false;

    uint64_t header = fake_le(p + 6, 2), end = header + fake_le(p + 8, 8);
    for (uint64_t off = header; off + 32 <= end;) {
        const uint8_t *e = p + off;
        uint64_t kind = fake_le(e, 2), arch = fake_le(e + 28, 4);
        if (kind == 2 && arch / 10 == (uint64_t)cc / 10 && arch % 10 <= (uint64_t)cc % 10) {
            cubin = true;
        } else if (kind == 1 && arch <= (uint64_t)cc) {
            ptx = true;
        }
        off += fake_le(e + 4, 4) + fake_le(e + 8, 8);
    }
    bool old_driver = fake_config()->driver_version / 1000 < CUDA_VERSION / 1000;
    if ((cubin || ptx) && !old_driver) {
        return CUDA_SUCCESS;
    }
    fake_complain("cuModuleLoadData: %s for compute capability %d.%d under driver %d",
                  cubin || ptx ? "code of a newer CUDA than the driver's" : "no cubin or PTX",
                  cc / 10, cc % 10, fake_config()->driver_version);
    return old_driver && ptx && !cubin ? CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                                       : CUDA_ERROR_NO_BINARY_FOR_GPU;
}

FAKE_API CUresult
cuModuleLoadData(CUmodule *module, const void *image)
{
    uint32_t magic;

    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT(); /* "into the current context" */
    FAKE_STICKY_CHECK();
    memcpy(&magic, image, sizeof(magic));
    if (magic != FAKE_FATBIN_MAGIC) {
        return CUDA_ERROR_INVALID_IMAGE;
    }
    CUresult res = fake_fatbin_check(image, fake_config()->cc);
    if (res != CUDA_SUCCESS) {
        return res;
    }
    /* Loading code may synchronize the context (lazy loading): as blocking as cuMemFree. */
    fake_ctx_sync(fake_ctx_current(), "cuModuleLoadData", true);
    *module = calloc(1, sizeof(**module));
    if (*module == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*module)->ctx = fake_ctx_current();
    FAKE_STAT_ADD(modules, 1);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuModuleUnload(CUmodule module)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT(); /* "from the current context" */
    free(module);
    FAKE_STAT_ADD(modules, -1);
    return CUDA_SUCCESS;
}

/* Under lazy loading it may load the function: as unsafe during a capture, and as
 * synchronizing, as cuModuleLoadData. The function is not loaded yet for all that (cuFuncLoad
 * or its first launch load it), as lazy loading also allows. */
FAKE_API CUresult
cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    const struct fake_kernel *kernel = fake_kernel_find(name);

    if (kernel == NULL) {
        return CUDA_ERROR_NOT_FOUND;
    }
    fake_ctx_sync(module->ctx, "cuModuleGetFunction", true);
    *function = calloc(1, sizeof(**function));
    if (*function == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*function)->kernel = kernel;
    (*function)->ctx = module->ctx;
    module->functions++;
    return CUDA_SUCCESS;
}

/* The limits of every device since compute capability 3.0, where the driver answers
 * CUDA_ERROR_INVALID_VALUE: no dimension 0, at most 1024 threads a block (1024 x, 1024 y, 64
 * z), fewer than 2^31 blocks in x and 65536 in y and z; and no more threads a block than the
 * kernel's __launch_bounds__. In 64 bits, where a product of three dimensions cannot wrap. */
static bool
fake_launch_valid(const struct fake_kernel *kernel, unsigned int gx, unsigned int gy,
                  unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz)
{
    uint64_t threads = (uint64_t)bx * by * bz;

    if (gx == 0 || gy == 0 || gz == 0 || threads == 0) {
        return false;
    }
    return gx <= INT32_MAX && gy <= 65535 && gz <= 65535 && bx <= 1024 && by <= 1024 &&
           bz <= 64 && threads <= 1024 && threads <= fake_kernel_max_threads(kernel);
}

/* A function's loading, by cuFuncLoad or lazily at its first launch: it may synchronize the
 * context, as cuModuleLoadData (blocking); once loaded, "no effect". */
static void
fake_func_load(CUfunction function, const char *call)
{
    if (!__atomic_load_n(&function->loaded, __ATOMIC_ACQUIRE)) {
        fake_ctx_sync(function->ctx, call, true);
        __atomic_store_n(&function->loaded, true, __ATOMIC_RELEASE);
    }
}

/* Loads the function: as unsafe during a capture as cuModuleLoadData. */
FAKE_API CUresult
cuFuncLoad(CUfunction function)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    if (function == NULL || function->kernel == NULL) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    fake_func_load(function, "cuFuncLoad");
    return CUDA_SUCCESS;
}

/* Our kernels' one parameter (kernels/device_abi.h) with every address of the tasks a launch
 * runs (level: as fake_task_runs) translated, as fake_device_address does; false where one may
 * not be touched. A task whose operands or destinations lie past the batch's arrays (a bug in
 * its builder, which the GPU would run over garbage) is refused. */
static bool
fake_batch_translate(struct kr_dev_batch *b, int device, int level)
{
    uint64_t srcs_done = 0, dsts_done = 0; /* each translated once, though tasks share it */
    bool ok = true;

    for (uint32_t t = 0; t < b->ntasks && t < KR_DEV_MAX_TASKS; t++) {
        const struct kr_dev_task *task = &b->tasks[t];
        if (!fake_task_runs(task, level)) {
            continue;
        }
        if (task->first_src + task->nsrc > KR_DEV_MAX_SRCS ||
            task->first_dst + task->ndst > KR_DEV_MAX_DSTS) {
            fake_complain("a kernel's task %u reads operands %u..%u and writes destinations "
                          "%u..%u: past the batch's %d and %d", t, task->first_src,
                          task->first_src + task->nsrc, task->first_dst,
                          task->first_dst + task->ndst, KR_DEV_MAX_SRCS, KR_DEV_MAX_DSTS);
            return false;
        }
        for (uint32_t i = task->first_src; i < (uint32_t)task->first_src + task->nsrc; i++) {
            if (srcs_done & (1ull << i)) {
                continue;
            }
            srcs_done |= 1ull << i;
            ok &= fake_device_address(&b->srcs[i].ptr, device, "a kernel");
            if (b->srcs[i].scalar_ptr != 0) {
                ok &= fake_device_address(&b->srcs[i].scalar_ptr, device, "a kernel");
            }
        }
        for (uint32_t i = task->first_dst; i < (uint32_t)task->first_dst + task->ndst; i++) {
            if (!(dsts_done & (1ull << i))) {
                dsts_done |= 1ull << i;
                ok &= fake_device_address(&b->dsts[i], device, "a kernel");
            }
        }
    }
    return ok;
}

/* The struct of `bytes` at device address `at`, as work on `device` reads it when it runs: the
 * double's address of it; 0 (having complained) where it may not be read. */
static uintptr_t
fake_read_at(uint64_t at, int device, size_t bytes, const char *what)
{
    uint64_t first = at, last = at + bytes - 1;
    if (at == 0 || !fake_device_address(&first, device, what) ||
        !fake_device_address(&last, device, what) || last - first != bytes - 1) {
        fake_complain("%s reads its parameter block of %zu bytes at 0x%llx, which device %d "
                      "cannot read", what, bytes, (unsigned long long)at, device);
        return 0;
    }
    return (uintptr_t)first;
}

/* kr_dev_from's batch as the launch reads it: checked, counted, and its level's addresses
 * translated (the kernel itself copies it into shared memory, finds the level's tasks and
 * runs them). What the GPU would run wrongly, being a bug of the batch's builder, is refused:
 * an unknown kernel, more tasks than a batch holds, levels that do not ascend (the kernel's
 * scan assumes they do), a level with more tasks than the launch has blocks in y (the rest
 * would never run). */
static void
fake_from_prepare(struct kr_dev_batch *batch, const struct kr_dev_from_args *args,
                  const struct fake_op *op)
{
    uint32_t in_level = 0;
    const struct fake_kernel *kernel = fake_kernel_by_id(batch->kernel);

    if (batch->ntasks > KR_DEV_MAX_TASKS || kernel == NULL) {
        fake_complain("kr_dev_from: a batch of %u tasks naming kernel %u", batch->ntasks,
                      batch->kernel);
        abort();
    }
    for (uint32_t t = 0; t < batch->ntasks; t++) {
        if (t > 0 && batch->tasks[t].level < batch->tasks[t - 1].level) {
            fake_complain("kr_dev_from: task %u's level %u after level %u: the levels of a "
                          "batch must ascend", t, batch->tasks[t].level,
                          batch->tasks[t - 1].level);
            abort();
        }
        in_level += batch->tasks[t].level == args->level;
    }
    if (in_level > op->grid.y) {
        fake_complain("kr_dev_from: level %u of the batch has %u tasks, the launch %u blocks "
                      "in y: the rest would never run", args->level, in_level, op->grid.y);
        abort();
    }
    fake_traffic_kernel(batch, fake_kernel_elem_bytes(kernel), op->device, (int)args->level);
    if (!fake_batch_translate(batch, op->device, (int)args->level)) {
        abort();
    }
}

/* A launch, when it runs: its kernel's own code (kernels_cpu.cpp). kr_dev_from reads its batch
 * now (what it reads and writes is counted and checked then), from a copy whose addresses are
 * the double's; kr_dev_signal reads its list of words where it lies, and its stores reach the
 * host as stores.c has them. An address the kernel may not touch is an illegal address on a
 * GPU, which ends the context's every later call: the process ends here. */
static void
fake_kernel_execute(const struct fake_op *op)
{
    switch (fake_kernel_param_of(op->kernel)) {
    case FAKE_PARAM_BATCH:
        fake_kernel_run(op->kernel, op->params, &op->grid, &op->block);
        return;
    case FAKE_PARAM_BATCH_AT: {
        struct kr_dev_batch batch; /* on the worker's stack while the kernel runs */
        struct kr_dev_from_args args;
        memcpy(&args, op->params, sizeof(args));
        uintptr_t at = fake_read_at(args.batch, op->device, sizeof(batch), "kr_dev_from");
        if (at == 0) {
            abort();
        }
        memcpy(&batch, (const void *)at, sizeof(batch));
        fake_from_prepare(&batch, &args, op);
        args.batch = (uint64_t)(uintptr_t)&batch;
        fake_kernel_run(op->kernel, &args, &op->grid, &op->block);
        return;
    }
    case FAKE_PARAM_SIGNALS_AT: {
        uint64_t at;
        memcpy(&at, op->params, sizeof(at));
        uintptr_t signals = fake_read_at(at, op->device, sizeof(struct kr_dev_signals),
                                         "kr_dev_signal");
        if (signals == 0) {
            abort();
        }
        uint32_t n = ((const struct kr_dev_signals *)signals)->n;
        if (n > KR_DEV_MAX_SIGNALS) {
            fake_complain("kr_dev_signal: a list of %u words (at most %d)", n,
                          KR_DEV_MAX_SIGNALS);
            abort();
        }
        uint64_t param = signals;
        fake_kernel_run(op->kernel, &param, &op->grid, &op->block);
        return;
    }
    }
}

FAKE_API CUresult
cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
               unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
               CUstream stream, void **params, void **extra)
{
    (void)shmem, (void)extra;
    if (!fake_launch_valid(f->kernel, gx, gy, gz, bx, by, bz) || params == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    fake_func_load(f, "cuLaunchKernel (the first launch of a function cuFuncLoad did not load)");
    struct fake_op *op = fake_op_new(FAKE_OP_KERNEL);
    size_t bytes = fake_kernel_params_bytes(f->kernel);
    if (op == NULL || (op->params = malloc(bytes)) == NULL) {
        free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(op->params, params[0], bytes);
    struct CUstream_st *s = fake_stream(stream);
    op->device = s != NULL ? s->ctx->device : 0;
    /* A batch by value is looked at now; one read at run time, when the launch runs. */
    bool by_value = fake_kernel_param_of(f->kernel) == FAKE_PARAM_BATCH;
    if (s != NULL && by_value) {
        fake_traffic_kernel(op->params, fake_kernel_elem_bytes(f->kernel), s->ctx->device, -1);
    }
    /* The launch is taken; it faults when it runs (its context's sticky error), as on a GPU. */
    if (s != NULL && by_value && !fake_batch_translate(op->params, s->ctx->device, -1)) {
        op->fault = "a kernel touched cuMem memory its device may not";
    }
    op->params_bytes = bytes;
    op->kernel = f->kernel;
    op->grid = (struct fake_dim3){gx, gy, gz};
    op->block = (struct fake_dim3){bx, by, bz};
    FAKE_STAT_ADD(kernels_launched, 1);
    return fake_enqueue(stream, op);
}

CUresult
fake_stream_free(CUstream stream, uintptr_t p)
{
    struct fake_op *op = fake_op_new(FAKE_OP_FREE);

    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->dst = (void *)p;
    return fake_enqueue(stream, op);
}

/* A host function runs on the callback thread when its stream gets there, holding up its
 * queue until it returns. */
FAKE_API CUresult
cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *data)
{
    struct fake_op *op = fake_op_new(FAKE_OP_HOST);

    if (op == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    op->host_fn = fn;
    op->host_data = data;
    return fake_enqueue(stream, op);
}

/* --- capture and graphs --------------------------------------------------------------------- */

/* A copy of op (a graph's: no event), or NULL when out of memory. */
static struct fake_op *
fake_op_clone(const struct fake_op *op)
{
    struct fake_op *copy = malloc(sizeof(*copy));

    if (copy == NULL) {
        return NULL;
    }
    *copy = *op;
    copy->next = NULL;
    if (op->params != NULL) {
        copy->params = malloc(op->params_bytes);
        if (copy->params == NULL) {
            free(copy);
            return NULL;
        }
        memcpy(copy->params, op->params, op->params_bytes);
    }
    return copy;
}

static void
fake_op_list_free(struct fake_op *op)
{
    while (op != NULL) {
        struct fake_op *next = op->next;
        fake_op_free(op);
        op = next;
    }
}

/* Captures under way (cuStreamBeginCapture until cuStreamEndCapture), for the rule of
 * cuThreadExchangeStreamCaptureMode: while a capture that was not begun RELAXED runs, its own
 * thread may not make a potentially unsafe call unless that thread's mode is RELAXED, and while
 * a GLOBAL one runs, no other thread may unless its mode is THREAD_LOCAL or RELAXED. */
#define FAKE_MAX_CAPTURES 64
static pthread_mutex_t fake_capture_lock = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *fake_captures[FAKE_MAX_CAPTURES];
static __thread CUstreamCaptureMode fake_thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

FAKE_API CUresult
cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    if (mode == NULL || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
                         *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                         *mode != CU_STREAM_CAPTURE_MODE_RELAXED)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUstreamCaptureMode old = fake_thread_capture_mode;
    fake_thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* Whether `capture` forbids the calling thread's unsafe calls (with fake_capture_lock held). */
static bool
fake_capture_forbids(const struct CUstream_st *capture)
{
    if (capture->capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED ||
        fake_thread_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) {
        return false;
    }
    if (pthread_equal(capture->capture_thread, pthread_self())) {
        return true;
    }
    return capture->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
           fake_thread_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

CUresult
fake_capture_check_unsafe(const char *call)
{
    bool forbidden = false;

    if (fake_check_not_in_host_fn(call) != CUDA_SUCCESS) {
        return CUDA_ERROR_NOT_PERMITTED;
    }
    pthread_mutex_lock(&fake_capture_lock);
    for (int i = 0; i < FAKE_MAX_CAPTURES; i++) {
        struct CUstream_st *c = fake_captures[i];
        if (c != NULL && fake_capture_forbids(c)) {
            /* As the driver: the call fails and the capture it would have broken is lost. */
            pthread_mutex_lock(&fake_sched_lock);
            c->invalidated = true;
            pthread_mutex_unlock(&fake_sched_lock);
            forbidden = true;
        }
    }
    pthread_mutex_unlock(&fake_capture_lock);
    if (forbidden) {
        fake_complain("%s during a stream capture that forbids it on this thread (mode %d): "
                      "the capture is invalidated", call, (int)fake_thread_capture_mode);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;
}

static bool
fake_capture_track(struct CUstream_st *s, bool begin)
{
    bool done = false;

    pthread_mutex_lock(&fake_capture_lock);
    for (int i = 0; i < FAKE_MAX_CAPTURES && !done; i++) {
        if (begin ? fake_captures[i] == NULL : fake_captures[i] == s) {
            fake_captures[i] = begin ? s : NULL;
            done = true;
        }
    }
    pthread_mutex_unlock(&fake_capture_lock);
    return done;
}

/* --- user objects ------------------------------------------------------------------------ */

/* cuUserObjectCreate: the destructor runs when the last reference goes, "executed by a shared
 * internal thread": the callback thread, which runs host functions too, after whatever is
 * due there already; it "cannot make CUDA API calls" (a call from it complains). References:
 * the caller's, a graph's, an instantiated graph's, and each launch's until its work is
 * done. */
struct CUuserObject_st {
    void *ptr;
    CUhostFn destroy;
    unsigned int refs; /* under fake_user_lock */
};

static pthread_mutex_t fake_user_lock = PTHREAD_MUTEX_INITIALIZER;

/* Drops count references; the last one makes the destructor due on the callback thread. */
static CUresult
fake_user_release(struct CUuserObject_st *object, unsigned int count)
{
    pthread_mutex_lock(&fake_user_lock);
    bool wrong = count == 0 || count > INT_MAX || count > object->refs;
    bool last = !wrong && (object->refs -= count) == 0;
    pthread_mutex_unlock(&fake_user_lock);
    if (wrong) {
        fake_complain("cuUserObjectRelease of %u references, %u held (\"undefined behavior to "
                      "release references not owned by the caller\")", count, object->refs);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (last) {
        struct fake_callback *cb = calloc(1, sizeof(*cb));
        if (cb == NULL) {
            fake_complain("out of memory for a user object's destructor");
            abort();
        }
        *cb = (struct fake_callback){.fn = object->destroy, .data = object->ptr,
                                     .object = object};
        fake_cb_due(cb);
    }
    return CUDA_SUCCESS;
}

static void
fake_user_retain(struct CUuserObject_st *object, unsigned int count)
{
    pthread_mutex_lock(&fake_user_lock);
    object->refs += count;
    pthread_mutex_unlock(&fake_user_lock);
}

/* Adds count references of object to refs (already retained for it). */
static CUresult
fake_user_refs_add(struct fake_user_refs *refs, struct CUuserObject_st *object,
                   unsigned int count)
{
    for (int i = 0; i < refs->n; i++) {
        if (refs->refs[i].object == object) {
            refs->refs[i].count += count;
            return CUDA_SUCCESS;
        }
    }
    if (refs->n == FAKE_MAX_USER_REFS) {
        fake_complain("more than %d user objects in one graph", FAKE_MAX_USER_REFS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    refs->refs[refs->n].object = object;
    refs->refs[refs->n++].count = count;
    return CUDA_SUCCESS;
}

static void
fake_user_refs_retain(const struct fake_user_refs *refs)
{
    for (int i = 0; i < refs->n; i++) {
        fake_user_retain(refs->refs[i].object, refs->refs[i].count);
    }
}

static void
fake_user_refs_release(struct fake_user_refs *refs)
{
    for (int i = 0; i < refs->n; i++) {
        fake_user_release(refs->refs[i].object, refs->refs[i].count);
    }
    refs->n = 0;
}

/* A launch's references, let go when its work is done (a host function at its end). */
static void CUDA_CB
fake_user_refs_launch_done(void *arg)
{
    fake_user_refs_release(arg);
    free(arg);
}

FAKE_API CUresult
cuUserObjectCreate(CUuserObject *object_out, void *ptr, CUhostFn destroy,
                   unsigned int initialRefcount, unsigned int flags)
{
    if (object_out == NULL || destroy == NULL || initialRefcount == 0 ||
        initialRefcount > INT_MAX || flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUuserObject_st *object = calloc(1, sizeof(*object));
    if (object == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *object = (struct CUuserObject_st){.ptr = ptr, .destroy = destroy, .refs = initialRefcount};
    *object_out = object;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuUserObjectRelease(CUuserObject object, unsigned int count)
{
    return object != NULL ? fake_user_release(object, count) : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult
cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                        unsigned int flags)
{
    if (graph == NULL || object == NULL || count == 0 || count > INT_MAX ||
        (flags != 0 && flags != CU_GRAPH_USER_OBJECT_MOVE)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (flags == 0) {
        fake_user_retain(object, count);
    }
    return fake_user_refs_add(&graph->users, object, count);
}

/* cuStreamGetCaptureInfo as of 11.3 (the variant asked for at 11030): the graph being
 * captured into, which the caller does not own. */
CUresult
fake_stream_get_capture_info_v11030(CUstream handle, CUstreamCaptureStatus *status_out,
                                    cuuint64_t *id_out, CUgraph *graph_out,
                                    const CUgraphNode **dependencies_out,
                                    size_t *num_dependencies_out)
{
    struct CUstream_st *s = fake_stream(handle);

    if (status_out == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (s == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    CUresult res = fake_legacy_check(handle, s, "cuStreamGetCaptureInfo", false);
    if (res != CUDA_SUCCESS) {
        return res;
    }
    pthread_mutex_lock(&fake_sched_lock);
    struct CUgraph_st *graph = s->graph;
    *status_out = graph == NULL   ? CU_STREAM_CAPTURE_STATUS_NONE
                  : s->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                   : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&fake_sched_lock);
    if (id_out != NULL) {
        *id_out = (cuuint64_t)(uintptr_t)graph;
    }
    if (graph_out != NULL) {
        *graph_out = graph;
    }
    if (dependencies_out != NULL) {
        *dependencies_out = NULL;
    }
    if (num_dependencies_out != NULL) {
        *num_dependencies_out = 0;
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuStreamBeginCapture(CUstream handle, CUstreamCaptureMode mode)
{
    struct CUstream_st *s = fake_stream(handle);

    if (s == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (s->legacy && handle != CU_STREAM_PER_THREAD) {
        fake_complain("cuStreamBeginCapture on the legacy NULL stream (\"Capture may not be "
                      "initiated if stream is CU_STREAM_LEGACY\")");
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    CUresult legacy = fake_legacy_check(handle, s, __func__, true);
    if (legacy != CUDA_SUCCESS) {
        return legacy;
    }
    struct CUgraph_st *graph = calloc(1, sizeof(*graph));
    if (graph == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fake_sched_lock);
    bool busy = s->graph != NULL || s->capturing;
    if (!busy) {
        s->graph = graph;
        s->invalidated = false;
        s->capture_mode = mode;
        s->capture_thread = pthread_self();
        __atomic_store_n(&s->capturing, true, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&fake_sched_lock);
    if (busy) {
        free(graph);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (!fake_capture_track(s, true)) {
        fake_complain("more than %d stream captures at once", FAKE_MAX_CAPTURES);
        abort();
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuStreamEndCapture(CUstream handle, CUgraph *graph_out)
{
    struct CUstream_st *s = fake_stream(handle);

    *graph_out = NULL;
    if (s == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    pthread_mutex_lock(&fake_sched_lock);
    struct CUgraph_st *graph = s->graph;
    bool invalidated = s->invalidated;
    s->graph = NULL;
    __atomic_store_n(&s->capturing, false, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&fake_sched_lock);
    if (graph == NULL) {
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    fake_capture_track(s, false);
    if (invalidated) {
        fake_op_list_free(graph->head);
        fake_user_refs_release(&graph->users);
        free(graph);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *graph_out = graph;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuGraphDestroy(CUgraph graph)
{
    fake_op_list_free(graph->head);
    fake_user_refs_release(&graph->users);
    free(graph);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuGraphInstantiateWithFlags(CUgraphExec *exec_out, CUgraph graph, unsigned long long flags)
{
    struct CUgraphExec_st *exec = calloc(1, sizeof(*exec));
    struct fake_op *tail = NULL;

    (void)flags;
    if (exec == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (const struct fake_op *op = graph->head; op != NULL; op = op->next) {
        struct fake_op *copy = fake_op_clone(op);
        if (copy == NULL) {
            fake_op_list_free(exec->head);
            free(exec);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        fake_op_append(&exec->head, &tail, copy);
    }
    exec->users = graph->users;
    fake_user_refs_retain(&exec->users);
    *exec_out = exec;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuGraphExecDestroy(CUgraphExec exec)
{
    fake_op_list_free(exec->head);
    fake_user_refs_release(&exec->users);
    free(exec);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    for (const struct fake_op *op = exec->head; op != NULL; op = op->next) {
        struct fake_op *copy = fake_op_clone(op);
        if (copy == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        CUresult cu = fake_enqueue(stream, copy);
        if (cu != CUDA_SUCCESS) {
            return cu;
        }
    }
    if (exec->users.n == 0) {
        return CUDA_SUCCESS;
    }
    /* The launch holds the graph's user objects until its work is done. */
    struct fake_user_refs *held = malloc(sizeof(*held));
    struct fake_op *op = fake_op_new(FAKE_OP_HOST);
    if (held == NULL || op == NULL) {
        free(held);
        free(op);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *held = exec->users;
    fake_user_refs_retain(held);
    op->host_fn = fake_user_refs_launch_done;
    op->host_data = held;
    return fake_enqueue(stream, op);
}
