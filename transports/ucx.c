/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The UCX implementation of transport.h, and the only file that includes ucp.h. The executor
 * (engine/exec.c) posts tagged sends and receives here and tests them; comm.c creates,
 * connects and destroys one worker per communicator. All workers of the process share one
 * ucp_context, created with the first worker and released with the last. Nothing here blocks
 * except tp_worker_wait, which sleeps on the workers' event file descriptors; teardown and
 * cancellation progress UCX for a bounded time only, so they return even if a peer is gone.
 *
 * tp_request_test learns that a request finished from ucp_request_check_status: UCX keeps a
 * request's status until we free it. What we need to know about a request UCX still holds
 * (tag, length, direction, the received length, and the worker's list of such requests, so
 * that destroy can reclaim them) lives in the private area UCX reserves for us in every
 * request (ucp_params_t.request_size); nothing in UCX points into the caller's struct
 * tp_request, which may therefore be copied or moved. Receives need a completion callback all
 * the same, only to record the received length: UCX 1.13 fills neither recv_info on an
 * immediate completion nor, for requests without a callback, what ucp_tag_recv_request_test
 * reports (it returns a previous message's length). So every receive gets a request
 * (UCP_OP_ATTR_FLAG_NO_IMM_CMPL) and a callback; sends may complete at once.
 *
 * Failure notices (tp_worker_notice_send) are UCX active messages, a namespace of their own,
 * so the executor's tags stay its own and no receive has to wait for them: each worker's
 * handler records the sender. Their requests are freed at once (UCX lets go of them when
 * sent, or when the endpoint closes); header and text live in the worker.
 */
#include "transport.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/debug.h"

/* Teardown never waits longer than this for UCX to finish closing endpoints (force-closing
 * needs no reply from the peer, so it normally takes microseconds). */
#define TP_CLOSE_BUDGET_MS 500
/* How long tp_request_cancel lets a receive already streaming in finish. */
#define TP_CANCEL_BUDGET_MS 100
/* Workers tp_worker_wait polls without allocating. */
#define TP_WAIT_STACK_FDS 16
/* After this many wakeups in a row that gave progress nothing to do, tp_worker_wait stops
 * trusting the worker's fd and polls it on a timer, 1, 2, 4, ... up to TP_BACKOFF_MAX_MS. */
#define TP_IDLE_WAKES 4
#define TP_BACKOFF_MAX_MS 10
/* After this many BUSY arms in a row that gave progress nothing to do, tp_worker_wait sleeps
 * TP_BUSY_SLEEP_US, doubling up to TP_BUSY_MAX_US (see tp_worker_busy_sleep). */
#define TP_BUSY_ARMS 4
#define TP_BUSY_SLEEP_US 16
#define TP_BUSY_MAX_US 1000
/* The active message that carries a failure notice (tp_worker_notice_send), and how much of
 * its text travels. */
#define TP_AM_NOTICE 0x4e
#define TP_NOTICE_TEXT 256

/* A UCX call that returns ucs_status_t: WARN with its name and UCX's text, then jump. */
#define TP_UCS_CHECK_GOTO(call, what, res, label)                                            \
    do {                                                                                     \
        ucs_status_t tp_st_ = (call);                                                        \
        if (tp_st_ != UCS_OK) {                                                              \
            WARN("%s failed: %s", (what), ucs_status_string(tp_st_));                        \
            (res) = ncclSystemError;                                                         \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

/* Our private area in front of every UCX request (UCX hands us a pointer to it). It is only
 * valid between the post that returned it and the ucp_request_free that gives it back. */
struct tp_ucx_req {
    struct tp_ucx_req *prev; /* the worker's list of requests not yet freed */
    struct tp_ucx_req *next;
    uint64_t tag;
    size_t len;
    size_t got;   /* receives: the message's length, set by tp_recv_done */
    bool is_recv;
};

/* One remote rank. The endpoint's error callback gets a pointer to this as its argument. */
struct tp_peer {
    struct tp_worker *worker;
    int rank;
    ucp_ep_h ep;          /* NULL for self, and once closed */
    void *close_req;      /* in-flight ucp_ep_close_nbx request during teardown */
    _Atomic int status;   /* ucs_status_t the endpoint failed with; UCS_OK while healthy */
    _Atomic bool noticed; /* the peer sent its failure notice */
};

/* A link of the worker's lists of registrations and keys, which teardown empties. */
struct tp_node {
    struct tp_node *prev, *next;
};

static void
tp_list_push(struct tp_node **head, struct tp_node *node)
{
    node->prev = NULL;
    node->next = *head;
    if (node->next != NULL) {
        node->next->prev = node;
    }
    *head = node;
}

static void
tp_list_remove(struct tp_node **head, struct tp_node *node)
{
    if (node->prev != NULL) {
        node->prev->next = node->next;
    } else {
        *head = node->next;
    }
    if (node->next != NULL) {
        node->next->prev = node->prev;
    }
}

struct tp_worker {
    ucp_worker_h ucp;
    ucp_address_t *addr;
    size_t addr_len;
    int efd;                     /* readable when the armed worker has events */
    int nranks;
    int self;                    /* our rank; -1 before tp_worker_connect */
    struct tp_peer *peers;       /* nranks entries, NULL before tp_worker_connect */
    struct tp_ucx_req inflight;  /* list head of requests UCX still holds for us */
    _Atomic int failed_peer;     /* first peer whose endpoint failed, -1 if none */
    _Atomic int notice_from;     /* first peer whose failure notice came, -1 if none */
    char notice_text[TP_NOTICE_TEXT]; /* its text, written once before notice_from */
    int32_t notice_rank;         /* what our own notice carries (once sent, never rewritten) */
    char notice_out[TP_NOTICE_TEXT];
    bool notice_sent;
    bool progressed;             /* tp_worker_progress did something since the last wait */
    bool woke;                   /* the last wait returned for this worker (or timed it) */
    int idle_wakes;              /* wakeups in a row after which progress found nothing */
    int busy_arms;               /* BUSY arms in a row after which progress found nothing */
    struct tp_node *mems;        /* registered memory, unmapped at the latest with the worker */
    struct tp_node *rkeys;       /* peers' keys, destroyed before their endpoints close */
};

/* Memory this rank registered for peers to reach; on the worker's list. */
struct tp_mem {
    struct tp_node node;         /* first: the list holds the struct by it */
    ucp_mem_h memh;
    void *base;
    size_t len;
    void *packed;                /* its remote key, packed for the peers */
    size_t packed_len;
};

/* A peer's registered memory as this rank reaches it; on the worker's list. */
struct tp_rkey {
    struct tp_node node;         /* first */
    ucp_rkey_h rkey;
    int peer;
};

/* The process-wide context. ncclCommInitAll creates several communicators, and so several
 * workers, in one process; they share one context. */
static pthread_mutex_t tp_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static ucp_context_h tp_ctx;
static int tp_ctx_refs;
static char tp_ctx_resources[256]; /* transports UCX found, for the INFO line */
static bool tp_ctx_cuda;            /* UCX moves CUDA device memory itself */

/* Which ncclResult_t a failed UCX operation becomes. A peer that died or closed its endpoint
 * shows up as one of the connection errors, or as CANCELED for our own sends UCX purged when
 * the endpoint failed; a message longer than the receive means the ranks disagree on the
 * operation, which is the caller's error. */
static ncclResult_t
tp_result(ucs_status_t status)
{
    switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_CANCELED:
        return ncclRemoteError;
    case UCS_ERR_MESSAGE_TRUNCATED:
        return ncclInvalidUsage;
    default:
        return ncclSystemError;
    }
}

/* "posix/memory tcp/lo ...": the transports and devices UCX can use, from the resource
 * lines of ucp_context_print_info. Only for the log, so an unexpected format yields "?". */
static void
tp_context_describe(ucp_context_h ctx, char *buf, size_t size)
{
    char *text = NULL;
    size_t text_len = 0;
    size_t used = 0;
    FILE *stream = open_memstream(&text, &text_len);

    snprintf(buf, size, "?");
    if (stream == NULL) {
        return;
    }
    ucp_context_print_info(ctx, stream);
    fclose(stream);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *tl = strstr(line, "flags -- ");
        if (strstr(line, "resource") == NULL || tl == NULL || used + 2 >= size) {
            continue;
        }
        used += (size_t)snprintf(buf + used, size - used, "%s%s", used > 0 ? " " : "", tl + 9);
    }
    free(text);
}

/* Adds the transports of ep's lanes ("sysv/memory.0") that buf does not list yet, from
 * ucp_ep_print_info. Only for the log; an unexpected format adds nothing. */
static void
tp_ep_describe(ucp_ep_h ep, char *buf, size_t size)
{
    char *text = NULL;
    size_t text_len = 0;
    FILE *stream = open_memstream(&text, &text_len);

    if (stream == NULL) {
        return;
    }
    ucp_ep_print_info(ep, stream);
    fclose(stream);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *p = strstr(line, "lane[");
        if (p == NULL || (p = strstr(p, "]:")) == NULL) {
            continue;
        }
        p += 2;
        p += strspn(p, " ");
        p += strspn(p, "0123456789:"); /* the resource index */
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)strcspn(p, " "), p);
        size_t used = strlen(buf);
        if (name[0] != '\0' && strstr(buf, name) == NULL && used + strlen(name) + 2 < size) {
            snprintf(buf + used, size - used, "%s%s", used > 0 ? " " : "", name);
        }
    }
    free(text);
}

/* Whether the comma-separated list of transports names `name`. */
static bool
tp_tls_names(const char *list, const char *name)
{
    size_t len = strlen(name);

    for (const char *t = list;; t++) {
        if (strncmp(t, name, len) == 0 && (t[len] == ',' || t[len] == '\0')) {
            return true;
        }
        t = strchr(t, ',');
        if (t == NULL) {
            return false;
        }
    }
}

bool
tp_tls_has_shm(const char *tls)
{
    if (tls == NULL || tls[0] == '\0') {
        return true;
    }
    bool negated = tls[0] == '^';
    const char *list = tls + (negated ? 1 : 0);
    bool group = tp_tls_names(list, "sm") || tp_tls_names(list, "shm") ||
                 tp_tls_names(list, "mm");
    bool posix = group || tp_tls_names(list, "posix");
    bool sysv = group || tp_tls_names(list, "sysv");

    return negated ? !(posix && sysv) : (posix || sysv || tp_tls_names(list, "all"));
}

bool
tp_tls_has_tcp(const char *tls)
{
    if (tls == NULL || tls[0] == '\0') {
        return true;
    }
    if (tls[0] == '^') {
        return !tp_tls_names(tls + 1, "tcp");
    }
    return tp_tls_names(tls, "tcp") || tp_tls_names(tls, "all");
}

/* UCX's TCP transport, for bulk transfer: it cuts every message into segments of
 * UCX_TCP_TX_SEG_SIZE (8 KiB by default) and receives into RX_SEG_SIZE ones (64 KiB), each a
 * system call and a header, while ncclshim's messages are chunks of 128 KiB and more. Larger
 * segments carry them in a few calls: the 2-host all-reduce's bus bandwidth from 256 KiB up
 * about 1.5 times (docs/performance.md). UCX 1.13 reads a transport's settings from the
 * environment when a worker opens it (ucp_config_modify takes only its own layer's), so they
 * are set there, for this process, where the user set none (setenv without overwrite), and
 * only where UCX_TLS lets TCP in (UCX warns of variables nothing read). */
static void
tp_config_tcp(void)
{
    if (!tp_tls_has_tcp(getenv("UCX_TLS"))) {
        return;
    }
    setenv("UCX_TCP_TX_SEG_SIZE", "64k", 0);
    setenv("UCX_TCP_RX_SEG_SIZE", "256k", 0);
}

/* UCX's shared-memory transports, likewise. Under peer error handling UCX 1.13 leaves out its
 * zero-copy transport (cma has no peer-failure support), so the messages between two ranks
 * of one host that travel through UCX (communicators spanning hosts) go through the receiver's
 * FIFO in segments of UCX_MM_SEG_SIZE, 8 KiB by default: 16 FIFO slots per 128 KiB chunk, and
 * a sender whose receiver's FIFO is full cannot sleep (ucp_worker_arm is busy). Segments of
 * 60 KiB took a 2 x 2 chain broadcast of 4-64 MiB from 0.34-0.40 to 0.65-0.77 GB/s
 * (docs/performance.md). A FIFO element records a segment's length in 16 bits, so 64 KiB
 * itself fails inside UCX (an assertion in its rendezvous); 48 KiB did as well as 60 across
 * hosts and, unlike 60, kept 256 KiB messages between two ranks of one host at their pace.
 * Receive buffers come 128 at a time (UCX: 512, which at 48 KiB would be 24 MiB of shared
 * memory per worker and transport; a container's /dev/shm is often 64 MiB). The FIFO has 16
 * elements (UCX: 64): each element holds a segment of its own, so a FIFO of 64 spreads the
 * messages over 3 MiB, every page of it faulted in on first use by both ends and cold in the
 * cache on each turn. 2 x 2, 64 KiB, three interleaved rounds: with 64 the first 20 timed
 * calls ran at half the pace of later ones (800 more page faults a rank than 8 B calls),
 * all-gather and broadcast 0.22 and 0.25 GB/s over 100 calls; with 16, 0.37 and 0.37, and
 * the 2 x 2 all-reduce at 1-64 MiB 0.86 against 0.60-0.73. The user's UCX_MM_*, UCX_POSIX_*,
 * UCX_SYSV_* win; without shared memory in UCX_TLS nothing is set. */
static void
tp_config_shm(void)
{
    if (!tp_tls_has_shm(getenv("UCX_TLS"))) {
        return;
    }
    setenv("UCX_MM_SEG_SIZE", "48k", 0);
    setenv("UCX_MM_RX_BUFS_GROW", "128", 0);
    setenv("UCX_MM_FIFO_SIZE", "16", 0);
}

/* UCX 1.13's shared-memory transports (posix, sysv) do not advertise peer-failure handling,
 * so with UCP_ERR_HANDLING_MODE_PEER UCX would carry same-host traffic over TCP loopback
 * (16 MiB messages between two workers: 1.6 GB/s, against 3.8 GB/s over sysv, when this was
 * written). MM_ERROR_HANDLING=y exposes it, and a dead peer process is then found by UCX's
 * keepalive (UCX_KEEPALIVE_INTERVAL). The user's own setting wins; a UCX without the knob
 * refuses it, which costs nothing. */
static void
tp_config_defaults(ucp_config_t *config)
{
    if (getenv("UCX_MM_ERROR_HANDLING") != NULL || getenv("UCX_POSIX_ERROR_HANDLING") != NULL ||
        getenv("UCX_SYSV_ERROR_HANDLING") != NULL || !tp_tls_has_shm(getenv("UCX_TLS"))) {
        return;
    }
    ucs_status_t status = ucp_config_modify(config, "MM_ERROR_HANDLING", "y");
    if (status != UCS_OK) {
        INFO(SHIM_NET, "UCX refused MM_ERROR_HANDLING=y (%s): same-host peers may use TCP",
             ucs_status_string(status));
    }
}

/* Creates tp_ctx; called with tp_ctx_lock held. */
static ncclResult_t
tp_context_create(void)
{
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE |
                      UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        /* RMA and 64-bit atomics: windows and one-sided signals (tp_put_post, tp_atomic_add_post).
         * Where no transport does them in hardware, UCX emulates them with active messages,
         * which the target's worker serves whenever it progresses. Active messages: failure
         * notices (tp_worker_notice_send), outside the tags the executor owns. */
        .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP | UCP_FEATURE_RMA | UCP_FEATURE_AMO64 |
                    UCP_FEATURE_AM,
        .request_size = sizeof(struct tp_ucx_req),
        /* Workers of different communicators run on different threads at the same time
         * and share this context's state (memory registrations, resources), so the
         * context must be thread safe even though each worker is not (see below). */
        .mt_workers_shared = 1,
    };
    ucp_config_t *config;
    ucs_status_t status;

    /* NULL prefix: UCX's own UCX_* variables (UCX_TLS, UCX_NET_DEVICES, ...) apply. */
    tp_config_tcp();
    tp_config_shm();
    status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        WARN("ucp_config_read failed: %s (check the UCX_* variables)", ucs_status_string(status));
        return ncclSystemError;
    }
    tp_config_defaults(config);
    status = ucp_init(&params, config, &tp_ctx);
    ucp_config_release(config);
    if (status != UCS_OK) {
        WARN("ucp_init failed: %s (check UCX_TLS and UCX_NET_DEVICES)", ucs_status_string(status));
        return ncclSystemError;
    }
    if (shim_log_enabled(SHIM_LOG_INFO, SHIM_NET)) {
        tp_context_describe(tp_ctx, tp_ctx_resources, sizeof(tp_ctx_resources));
    }
    /* A UCX built with CUDA (its cuda_copy or cuda_ipc transports loaded) says so here;
     * Debian's does not. */
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    tp_ctx_cuda = ucp_context_query(tp_ctx, &attr) == UCS_OK &&
                  (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    return ncclSuccess;
}

bool
tp_cuda_memory(void)
{
    pthread_mutex_lock(&tp_ctx_lock);
    bool cuda = tp_ctx != NULL && tp_ctx_cuda;
    pthread_mutex_unlock(&tp_ctx_lock);
    return cuda;
}

static ncclResult_t
tp_context_acquire(ucp_context_h *ctx_out)
{
    ncclResult_t res = ncclSuccess;

    pthread_mutex_lock(&tp_ctx_lock);
    if (tp_ctx_refs == 0) {
        res = tp_context_create();
    }
    if (res == ncclSuccess) {
        tp_ctx_refs++;
        *ctx_out = tp_ctx;
    }
    pthread_mutex_unlock(&tp_ctx_lock);
    return res;
}

static void
tp_context_release(void)
{
    pthread_mutex_lock(&tp_ctx_lock);
    if (--tp_ctx_refs == 0) {
        ucp_cleanup(tp_ctx);
        tp_ctx = NULL;
    }
    pthread_mutex_unlock(&tp_ctx_lock);
}

/* --- requests UCX holds for us ------------------------------------------------------------ */

static void
tp_req_track(struct tp_worker *w, struct tp_ucx_req *u, uint64_t tag, size_t len, bool is_recv)
{
    u->tag = tag;
    u->len = len;
    u->is_recv = is_recv;
    u->prev = &w->inflight;
    u->next = w->inflight.next;
    u->next->prev = u;
    w->inflight.next = u;
}

/* Gives the request back to UCX; if it is still in flight, UCX frees it when it completes. */
static void
tp_req_release(struct tp_ucx_req *u)
{
    u->prev->next = u->next;
    u->next->prev = u->prev;
    ucp_request_free(u);
}

/* Withdraws a request and frees it once UCX has let go of it. A receive not yet matched is
 * withdrawn at once; one already matched to a rendezvous gets TP_CANCEL_BUDGET_MS to finish.
 * UCX 1.13 ignores the cancel of a send, so waiting for one would be waiting on the peer: it
 * gets one progress round. What is still running then (its buffer still in use) stays on the
 * worker's list until it ends or tp_worker_destroy reclaims it. */
static void
tp_req_cancel(struct tp_worker *w, struct tp_ucx_req *u)
{
    int64_t deadline = shim_clock_ms() + (u->is_recv ? TP_CANCEL_BUDGET_MS : 0);

    ucp_request_cancel(w->ucp, u);
    do {
        ucp_worker_progress(w->ucp);
    } while (ucp_request_check_status(u) == UCS_INPROGRESS && shim_clock_ms() < deadline);
    if (ucp_request_check_status(u) != UCS_INPROGRESS) {
        tp_req_release(u);
    } else {
        INFO(SHIM_NET, "rank %d: %s of tag 0x%" PRIx64 " (%zu bytes) could not be cancelled "
             "yet; it is reclaimed when the worker is destroyed", w->self,
             u->is_recv ? "receive" : "send", u->tag, u->len);
    }
}

/* UCX calls this when a receive completes, possibly from inside ucp_tag_recv_nbx, before the
 * poster has seen the request; so it writes only `got`, which tp_req_track leaves alone. */
static void
tp_recv_done(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
             void *user_data)
{
    struct tp_ucx_req *u = request;

    (void)user_data;
    u->got = status == UCS_OK ? info->length : 0;
}

/* req now stands for sp (NULL: done at once), of len bytes with peer. */
static void
tp_request_set(struct tp_request *req, ucs_status_ptr_t sp, size_t len, int peer)
{
    req->handle = sp;
    req->expected_len = len;
    req->peer = peer;
    req->active = true;
}

static ncclResult_t
tp_request_check_idle(const struct tp_worker *w, const struct tp_request *req, const char *op,
                      uint64_t tag)
{
    if (req->active) {
        WARN("rank %d: %s of tag 0x%" PRIx64 " posted on a request still in use (peer %d)",
             w->self, op, tag, req->peer);
        return ncclInternalError;
    }
    return ncclSuccess;
}

/* --- the worker --------------------------------------------------------------------------- */

/* UCX calls this from ucp_worker_progress when a peer's failure notice arrives: the header is
 * its rank, the data its text. Kept: which peers sent one, and the first one's text. */
static ucs_status_t
tp_notice_arrived(void *arg, const void *header, size_t header_length, void *data,
                  size_t length, const ucp_am_recv_param_t *param)
{
    struct tp_worker *w = arg;
    int32_t rank;

    if (header_length != sizeof(rank)) {
        return UCS_OK;
    }
    memcpy(&rank, header, sizeof(rank));
    if (w->peers == NULL || rank < 0 || rank >= w->nranks || rank == w->self ||
        atomic_exchange(&w->peers[rank].noticed, true)) {
        return UCS_OK; /* a second one; or not connected yet, which a sender never sees */
    }
    if (atomic_load(&w->notice_from) < 0) {
        /* An eager message's data is here; a rendezvous one (never, at this size) is not. */
        bool here = !(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV);
        snprintf(w->notice_text, sizeof(w->notice_text), "%.*s",
                 here ? (int)(length < TP_NOTICE_TEXT ? length : TP_NOTICE_TEXT - 1) : 0,
                 here ? (const char *)data : "");
        atomic_store(&w->notice_from, rank);
    }
    INFO(SHIM_NET, "rank %d: peer %d's failure notice came", w->self, rank);
    return UCS_OK;
}

ncclResult_t
tp_worker_create(struct tp_worker **worker_out)
{
    /* A worker is driven by one thread at a time, but not always by the same thread: the
     * non-blocking init thread connects it, the user's threads run collectives on it, a
     * progress thread may serve device memory later. SERIALIZED is exactly that promise and
     * costs no locking; MULTI would lock every call for concurrency we never have. */
    ucp_worker_params_t params = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
    };
    ucp_worker_attr_t attr = {.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE};
    struct tp_worker *w = NULL;
    ucp_context_h ctx;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&w, 1));
    w->self = -1;
    w->inflight.prev = w->inflight.next = &w->inflight;
    atomic_init(&w->failed_peer, -1);
    atomic_init(&w->notice_from, -1);
    SHIM_CHECK_GOTO(tp_context_acquire(&ctx), res, err_free);

    TP_UCS_CHECK_GOTO(ucp_worker_create(ctx, &params, &w->ucp), "ucp_worker_create", res,
                      err_release_ctx);
    TP_UCS_CHECK_GOTO(ucp_worker_query(w->ucp, &attr), "ucp_worker_query", res,
                      err_destroy_worker);
    if (attr.thread_mode < UCS_THREAD_MODE_SERIALIZED) {
        WARN("UCX gives workers thread mode %d, serialized (%d) is needed: this UCX was built "
             "without thread support", (int)attr.thread_mode, (int)UCS_THREAD_MODE_SERIALIZED);
        res = ncclSystemError;
        goto err_destroy_worker;
    }
    ucp_am_handler_param_t notice = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = TP_AM_NOTICE,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = tp_notice_arrived,
        .arg = w,
    };
    TP_UCS_CHECK_GOTO(ucp_worker_set_am_recv_handler(w->ucp, &notice),
                      "ucp_worker_set_am_recv_handler", res, err_destroy_worker);
    TP_UCS_CHECK_GOTO(ucp_worker_get_efd(w->ucp, &w->efd), "ucp_worker_get_efd", res,
                      err_destroy_worker);
    TP_UCS_CHECK_GOTO(ucp_worker_get_address(w->ucp, &w->addr, &w->addr_len),
                      "ucp_worker_get_address", res, err_destroy_worker);
    INFO(SHIM_NET, "UCX %s worker %p: address %zu bytes, transports %s", ucp_get_version_string(),
         (void *)w, w->addr_len, tp_ctx_resources[0] != '\0' ? tp_ctx_resources : "?");
    *worker_out = w;
    return ncclSuccess;

err_destroy_worker:
    ucp_worker_destroy(w->ucp);
err_release_ctx:
    tp_context_release();
err_free:
    free(w);
    return res;
}

ncclResult_t
tp_worker_address(struct tp_worker *worker, const void **addr_out, size_t *len_out)
{
    *addr_out = worker->addr;
    *len_out = worker->addr_len;
    return ncclSuccess;
}

/* UCX calls this from ucp_worker_progress when an endpoint fails (the peer died, closed its
 * worker, or the network broke). Posts and tests on that peer report it with a WARN; here
 * we only record it, because a peer that tears down normally ends up here too. */
static void
tp_ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    struct tp_peer *peer = arg;
    int none = -1;

    (void)ep;
    atomic_store(&peer->status, (int)status);
    atomic_compare_exchange_strong(&peer->worker->failed_peer, &none, peer->rank);
    INFO(SHIM_NET, "rank %d: endpoint to peer %d failed: %s", peer->worker->self, peer->rank,
         ucs_status_string(status));
}

/* Completes at the peers what this worker already sent, including UCX's own protocol
 * messages (a rendezvous receiver's acknowledgement, which the sender's request waits for),
 * so that closing right after our last operation cannot leave a peer's send unfinished. Gives
 * up at the deadline: a dead peer cannot hold it. */
static void
tp_worker_flush(struct tp_worker *w, int64_t deadline)
{
    ucp_request_param_t param = {.op_attr_mask = 0};
    ucs_status_ptr_t sp = ucp_worker_flush_nbx(w->ucp, &param);

    if (!UCS_PTR_IS_PTR(sp)) {
        return;
    }
    while (ucp_request_check_status(sp) == UCS_INPROGRESS && shim_clock_ms() < deadline) {
        ucp_worker_progress(w->ucp);
    }
    if (ucp_request_check_status(sp) == UCS_INPROGRESS) {
        INFO(SHIM_NET, "rank %d: worker flush did not finish by the deadline", w->self);
        ucp_request_cancel(w->ucp, sp);
    }
    ucp_request_free(sp);
}

/* Force-closes every endpoint in peers[0..n) and progresses until UCX released them all or
 * TP_CLOSE_BUDGET_MS passed. Force needs no answer from the peer; UCX completes what was
 * still queued on the endpoint with an error. */
static void
tp_peers_close(struct tp_worker *w, struct tp_peer *peers, int n)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
    };
    int64_t deadline = shim_clock_ms() + TP_CLOSE_BUDGET_MS;
    bool busy = true;

    if (w->inflight.next == &w->inflight) {
        tp_worker_flush(w, deadline); /* an orderly teardown: nothing of ours is pending */
    }
    for (int r = 0; r < n; r++) {
        if (peers[r].ep == NULL) {
            continue;
        }
        ucs_status_ptr_t sp = ucp_ep_close_nbx(peers[r].ep, &param);
        peers[r].ep = NULL;
        peers[r].close_req = UCS_PTR_IS_PTR(sp) ? sp : NULL;
    }
    while (busy && shim_clock_ms() < deadline) {
        busy = false;
        for (int r = 0; r < n; r++) {
            busy |= peers[r].close_req != NULL &&
                    ucp_request_check_status(peers[r].close_req) == UCS_INPROGRESS;
        }
        for (struct tp_ucx_req *u = w->inflight.next; u != &w->inflight; u = u->next) {
            busy |= ucp_request_check_status(u) == UCS_INPROGRESS;
        }
        if (busy) {
            ucp_worker_progress(w->ucp);
        }
    }
    if (busy) {
        INFO(SHIM_NET, "rank %d: closing endpoints did not finish within %d ms; "
             "destroying the worker anyway", w->self, TP_CLOSE_BUDGET_MS);
    }
    for (int r = 0; r < n; r++) {
        if (peers[r].close_req != NULL) {
            ucp_request_free(peers[r].close_req);
            peers[r].close_req = NULL;
        }
    }
}

ncclResult_t
tp_worker_connect(struct tp_worker *worker, int nranks, int self, const void *const *addrs,
                  const size_t *lens)
{
    struct tp_peer *peers = NULL;
    ncclResult_t res;

    if (worker->peers != NULL || nranks < 1 || self < 0 || self >= nranks) {
        WARN("rank %d: tp_worker_connect called with nranks %d%s", self, nranks,
             worker->peers != NULL ? " on a worker already connected" : "");
        return ncclInternalError;
    }
    SHIM_CHECK(shim_calloc(&peers, (size_t)nranks));
    for (int r = 0; r < nranks; r++) {
        peers[r].worker = worker;
        peers[r].rank = r;
        atomic_init(&peers[r].status, (int)UCS_OK);
        atomic_init(&peers[r].noticed, false);
    }
    /* Our own rank gets an endpoint too (UCX's loopback): NCCL allows ncclSend/ncclRecv to
     * oneself inside a group, and it then travels like any other message. */
    for (int r = 0; r < nranks; r++) {
        if (addrs[r] == NULL || lens[r] == 0) {
            WARN("rank %d: no UCX address for peer %d", self, r);
            res = ncclInternalError;
            goto err_close;
        }
        /* PEER error mode: a dead peer fails the endpoint (tp_ep_failed) and its requests
         * instead of leaving them pending forever. */
        ucp_ep_params_t params = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                          UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
            .address = addrs[r],
            .err_mode = UCP_ERR_HANDLING_MODE_PEER,
            .err_handler = {.cb = tp_ep_failed, .arg = &peers[r]},
        };
        ucs_status_t status = ucp_ep_create(worker->ucp, &params, &peers[r].ep);
        if (status != UCS_OK) {
            WARN("rank %d: connecting to peer %d (address of %zu bytes) failed: %s", self, r,
                 lens[r], ucs_status_string(status));
            peers[r].ep = NULL;
            res = ncclSystemError;
            goto err_close;
        }
    }
    worker->nranks = nranks;
    worker->self = self;
    worker->peers = peers;
    if (shim_log_enabled(SHIM_LOG_INFO, SHIM_NET)) {
        char lanes[256] = "";
        for (int r = 0; r < nranks; r++) {
            if (peers[r].ep != NULL) {
                tp_ep_describe(peers[r].ep, lanes, sizeof(lanes));
            }
        }
        INFO(SHIM_NET, "rank %d: UCX endpoints to %d peer%s over %s", self, nranks - 1,
             nranks == 2 ? "" : "s", lanes[0] != '\0' ? lanes : "(none)");
    }
    return ncclSuccess;

err_close:
    tp_peers_close(worker, peers, nranks);
    free(peers);
    return res;
}

void
tp_worker_destroy(struct tp_worker *worker)
{
    if (worker == NULL) {
        return;
    }
    /* Withdraw receives first; sends end when their endpoint is force-closed below. */
    for (struct tp_ucx_req *u = worker->inflight.next; u != &worker->inflight; u = u->next) {
        ucp_request_cancel(worker->ucp, u);
    }
    if (worker->rkeys != NULL) {
        /* UCX: a key goes after the operations using it were flushed, before its endpoint. */
        tp_worker_flush(worker, shim_clock_ms() + TP_CLOSE_BUDGET_MS);
        while (worker->rkeys != NULL) {
            tp_rkey_release(worker, (struct tp_rkey *)worker->rkeys);
        }
    }
    if (worker->peers != NULL) {
        tp_peers_close(worker, worker->peers, worker->nranks);
    }
    /* Whatever is still in flight after the budget is given back anyway: UCX reclaims it
     * with the worker. The caller's struct tp_request copies are stale from here on. */
    while (worker->inflight.next != &worker->inflight) {
        tp_req_release(worker->inflight.next);
    }
    while (worker->mems != NULL) {
        tp_mem_deregister(worker, (struct tp_mem *)worker->mems);
    }
    ucp_worker_release_address(worker->ucp, worker->addr);
    ucp_worker_destroy(worker->ucp);
    tp_context_release();
    INFO(SHIM_NET, "rank %d: UCX worker %p destroyed", worker->self, (void *)worker);
    free(worker->peers);
    free(worker);
}

int
tp_worker_failed_peer(const struct tp_worker *worker)
{
    return atomic_load(&worker->failed_peer);
}

/* --- failure notices ---------------------------------------------------------------------- */

void
tp_worker_notice_send(struct tp_worker *worker, const char *why)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
    };
    int sent = 0;

    if (worker->notice_sent || worker->peers == NULL) {
        return;
    }
    /* Header and text live in the worker, which outlives every send of them. */
    worker->notice_sent = true;
    worker->notice_rank = worker->self;
    snprintf(worker->notice_out, sizeof(worker->notice_out), "%s", why != NULL ? why : "");
    for (int r = 0; r < worker->nranks; r++) {
        struct tp_peer *p = &worker->peers[r];
        if (r == worker->self || p->ep == NULL || atomic_load(&p->status) != UCS_OK) {
            continue;
        }
        ucs_status_ptr_t sp = ucp_am_send_nbx(p->ep, TP_AM_NOTICE, &worker->notice_rank,
                                              sizeof(worker->notice_rank), worker->notice_out,
                                              strlen(worker->notice_out), &param);
        if (UCS_PTR_IS_ERR(sp)) {
            INFO(SHIM_NET, "rank %d: failure notice to peer %d not sent: %s", worker->self, r,
                 ucs_status_string(UCS_PTR_STATUS(sp)));
            continue;
        }
        if (sp != NULL) {
            ucp_request_free(sp); /* UCX frees it once sent, or at the endpoint's close */
        }
        sent++;
    }
    INFO(SHIM_NET, "rank %d: failure notice to %d peers: %s", worker->self, sent,
         worker->notice_out);
}

bool
tp_worker_noticed(const struct tp_worker *worker, int peer)
{
    return worker->peers != NULL && peer >= 0 && peer < worker->nranks &&
           atomic_load(&worker->peers[peer].noticed);
}

int
tp_worker_notice_first(const struct tp_worker *worker, const char **why_out)
{
    int from = atomic_load(&worker->notice_from);
    *why_out = from >= 0 ? worker->notice_text : "";
    return from;
}

/* --- messages ----------------------------------------------------------------------------- */

/* The endpoint for a send to `peer`, or an error naming what is wrong with it. */
static ncclResult_t
tp_peer_ep(struct tp_worker *w, int peer, uint64_t tag, size_t len, ucp_ep_h *ep_out)
{
    if (w->peers == NULL || peer < 0 || peer >= w->nranks) {
        WARN("rank %d: send of tag 0x%" PRIx64 " (%zu bytes) to peer %d, which has no endpoint "
             "(%d ranks%s)", w->self, tag, len, peer, w->nranks,
             w->peers == NULL ? ", not connected" : "");
        return ncclInternalError;
    }
    ucs_status_t failed = (ucs_status_t)atomic_load(&w->peers[peer].status);
    if (failed != UCS_OK) {
        WARN("rank %d: cannot send tag 0x%" PRIx64 " (%zu bytes) to peer %d: its endpoint "
             "failed earlier: %s", w->self, tag, len, peer, ucs_status_string(failed));
        return tp_result(failed);
    }
    *ep_out = w->peers[peer].ep;
    return ncclSuccess;
}

ncclResult_t
tp_send_post(struct tp_worker *worker, int peer, const void *buf, size_t len, uint64_t tag,
             struct tp_request *req)
{
    ucp_request_param_t param = {.op_attr_mask = 0}; /* contiguous bytes, no callback */
    ucp_ep_h ep;

    SHIM_CHECK(tp_request_check_idle(worker, req, "send", tag));
    SHIM_CHECK(tp_peer_ep(worker, peer, tag, len, &ep));
    ucs_status_ptr_t sp = ucp_tag_send_nbx(ep, buf, len, tag, &param);
    if (UCS_PTR_IS_ERR(sp)) {
        WARN("rank %d: send of tag 0x%" PRIx64 " (%zu bytes) to peer %d failed: %s",
             worker->self, tag, len, peer, ucs_status_string(UCS_PTR_STATUS(sp)));
        return tp_result(UCS_PTR_STATUS(sp));
    }
    if (sp != NULL) {
        tp_req_track(worker, sp, tag, len, false);
    }
    tp_request_set(req, sp, len, peer); /* NULL: completed at once, the buffer may be reused */
    return ncclSuccess;
}

/* A receive ended with `status` after `got` bytes; the WARN and result for anything but a
 * complete message of exactly `want` bytes. */
static ncclResult_t
tp_recv_check(const struct tp_worker *w, int peer, uint64_t tag, size_t want, size_t got,
              ucs_status_t status)
{
    if (status == UCS_ERR_MESSAGE_TRUNCATED) {
        WARN("rank %d: message from peer %d tag 0x%" PRIx64 " is longer than the %zu bytes "
             "expected: the ranks disagree on the operation", w->self, peer, tag, want);
        return tp_result(status);
    }
    if (status != UCS_OK) {
        WARN("rank %d: receive of tag 0x%" PRIx64 " (%zu bytes) from peer %d failed: %s",
             w->self, tag, want, peer, ucs_status_string(status));
        return tp_result(status);
    }
    if (got != want) {
        WARN("rank %d: message from peer %d tag 0x%" PRIx64 " has %zu bytes, %zu expected: "
             "the ranks disagree on the operation", w->self, peer, tag, got, want);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

ncclResult_t
tp_recv_post(struct tp_worker *worker, int peer, void *buf, size_t len, uint64_t tag,
             struct tp_request *req)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = tp_recv_done,
    };

    SHIM_CHECK(tp_request_check_idle(worker, req, "receive", tag));
    /* Full mask: the tag alone names the message, sender included. */
    ucs_status_ptr_t sp = ucp_tag_recv_nbx(worker->ucp, buf, len, tag, (ucp_tag_t)-1, &param);
    if (UCS_PTR_IS_ERR(sp)) {
        return tp_recv_check(worker, peer, tag, len, 0, UCS_PTR_STATUS(sp));
    }
    if (sp != NULL) { /* always, with NO_IMM_CMPL */
        tp_req_track(worker, sp, tag, len, true);
    }
    tp_request_set(req, sp, len, peer);
    return ncclSuccess;
}

ncclResult_t
tp_request_test(struct tp_worker *worker, struct tp_request *req, bool *done_out)
{
    struct tp_ucx_req *u = req->handle;
    ucs_status_t status;

    if (u == NULL) {
        /* Idle, or completed at post. */
        req->active = false;
        *done_out = true;
        return ncclSuccess;
    }
    status = ucp_request_check_status(u);
    if (status == UCS_INPROGRESS) {
        ucs_status_t failed = UCS_OK;
        if (worker->peers != NULL && req->peer >= 0 && req->peer < worker->nranks) {
            failed = (ucs_status_t)atomic_load(&worker->peers[req->peer].status);
        }
        if (failed == UCS_OK) {
            *done_out = false;
            return ncclSuccess;
        }
        /* A receive is not bound to an endpoint, so UCX would keep it pending forever. */
        WARN("rank %d: peer %d failed (%s) during the %s of tag 0x%" PRIx64 " (%zu bytes)",
             worker->self, req->peer, ucs_status_string(failed), u->is_recv ? "receive" : "send",
             u->tag, u->len);
        tp_req_cancel(worker, u);
        req->handle = NULL;
        req->active = false;
        *done_out = true;
        return tp_result(failed);
    }

    uint64_t tag = u->tag;
    size_t len = u->len;
    size_t got = u->got;
    bool is_recv = u->is_recv;
    ncclResult_t res = ncclSuccess;

    tp_req_release(u);
    req->handle = NULL;
    req->active = false;
    *done_out = true;
    if (is_recv) {
        res = tp_recv_check(worker, req->peer, tag, len, got, status);
    } else if (status != UCS_OK) {
        WARN("rank %d: send of tag 0x%" PRIx64 " (%zu bytes) to peer %d failed: %s",
             worker->self, tag, len, req->peer, ucs_status_string(status));
        res = tp_result(status);
    }
    return res;
}

void
tp_request_cancel(struct tp_worker *worker, struct tp_request *req)
{
    if (req->handle != NULL) {
        tp_req_cancel(worker, req->handle);
    }
    req->handle = NULL;
    req->active = false;
}

/* --- progress and sleep ------------------------------------------------------------------- */

bool
tp_worker_progress(struct tp_worker *worker)
{
    bool any = ucp_worker_progress(worker->ucp) != 0;

    worker->progressed |= any;
    return any;
}

/* How long a worker may go unpolled, or -1 to poll its fd. UCX 1.13's TCP transport keeps a
 * connection's socket registered for writing while the connection is half established (the
 * peer has not progressed since it connected, e.g. it is still computing): the worker's fd
 * then stays readable and progress finds nothing, so a waiting rank would spin. Counting such
 * empty wakeups and falling back to a timer for that worker bounds the waste to one wakeup per
 * TP_BACKOFF_MAX_MS and the added latency to as much; anything progress does puts the fd back
 * in use. */
static int
tp_worker_backoff_ms(struct tp_worker *w)
{
    if (w->progressed) {
        w->idle_wakes = 0;
        w->busy_arms = 0;
    } else if (w->woke) {
        w->idle_wakes++;
    }
    w->progressed = false;
    w->woke = false;
    if (w->idle_wakes < TP_IDLE_WAKES) {
        return -1;
    }
    w->woke = true; /* unpolled: the next empty progress counts as another empty wakeup */
    int shift = w->idle_wakes - TP_IDLE_WAKES;
    return shift < 4 && (1 << shift) < TP_BACKOFF_MAX_MS ? 1 << shift : TP_BACKOFF_MAX_MS;
}

/* Arming reported BUSY: events wait that progress has not consumed, or sends wait that UCX
 * cannot post yet because the receiver's shared-memory FIFO is full. No fd will tell us when
 * the receiver has drained it, and the timer of tp_worker_backoff_ms (milliseconds, for TCP's
 * half-open connections) would leave the link idle for most of that time, so return at once
 * the first times, then sleep microseconds, doubling while progress still finds nothing: the
 * receiver may need our CPU to drain. A peer that leaves its FIFO full (computing) costs us at
 * most one wakeup per TP_BUSY_MAX_US. */
static void
tp_worker_busy_sleep(struct tp_worker *w)
{
    if (w->busy_arms < TP_BUSY_ARMS) {
        w->busy_arms++;
        return;
    }
    long us = (long)TP_BUSY_SLEEP_US << (w->busy_arms - TP_BUSY_ARMS);
    if (us < TP_BUSY_MAX_US) {
        w->busy_arms++; /* the next sleep doubles; the count stops growing at the cap */
    } else {
        us = TP_BUSY_MAX_US;
    }
    struct timespec ts = {.tv_sec = 0, .tv_nsec = us * 1000};

    nanosleep(&ts, NULL);
}

ncclResult_t
tp_worker_wait(struct tp_worker *const *workers, int nworkers, int timeout_ms)
{
    struct pollfd stack_fds[TP_WAIT_STACK_FDS];
    struct pollfd *fds = stack_fds;
    ncclResult_t res = ncclSuccess;
    int timeout = timeout_ms;

    if (nworkers > TP_WAIT_STACK_FDS) {
        SHIM_CHECK(shim_calloc(&fds, (size_t)nworkers));
    }
    for (int i = 0; i < nworkers; i++) {
        struct tp_worker *w = workers[i];
        int backoff = tp_worker_backoff_ms(w);

        fds[i].fd = -1; /* poll skips negative fds */
        fds[i].events = POLLIN;
        fds[i].revents = 0;
        if (backoff >= 0) {
            timeout = timeout < 0 || backoff < timeout ? backoff : timeout;
            continue;
        }
        ucs_status_t status = ucp_worker_arm(w->ucp);
        if (status == UCS_ERR_BUSY) {
            tp_worker_busy_sleep(w);
            goto out;
        }
        if (status != UCS_OK) {
            WARN("rank %d: ucp_worker_arm failed: %s", w->self, ucs_status_string(status));
            res = ncclSystemError;
            goto out;
        }
        fds[i].fd = w->efd;
    }
    if (poll(fds, (nfds_t)nworkers, timeout) < 0 && errno != EINTR) {
        WARN("poll on %d UCX worker event fds failed: %s", nworkers, strerror(errno));
        res = ncclSystemError;
        goto out;
    }
    for (int i = 0; i < nworkers; i++) {
        workers[i]->woke |= fds[i].revents != 0;
    }
out:
    if (fds != stack_fds) {
        free(fds);
    }
    return res;
}

/* --- remote memory access ----------------------------------------------------------------- */

ncclResult_t
tp_mem_register(struct tp_worker *worker, void *buf, size_t len, struct tp_mem **mem_out)
{
    ucp_context_h ctx = tp_ctx; /* alive while this worker is */
    ucp_mem_map_params_t params = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = buf,
        .length = len,
        /* NULL: UCX allocates, in memory its shared-memory transports can share. */
        .flags = buf == NULL ? UCP_MEM_MAP_ALLOCATE : 0,
    };
    struct tp_mem *m;
    ncclResult_t res;

    if (len == 0) {
        WARN("rank %d: registering 0 bytes for remote access", worker->self);
        return ncclInternalError;
    }
    SHIM_CHECK(shim_calloc(&m, 1));
    TP_UCS_CHECK_GOTO(ucp_mem_map(ctx, &params, &m->memh), "ucp_mem_map", res, err_free);
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS |
                                         UCP_MEM_ATTR_FIELD_LENGTH};
    TP_UCS_CHECK_GOTO(ucp_mem_query(m->memh, &attr), "ucp_mem_query", res, err_unmap);
    m->base = attr.address;
    m->len = len;
    if (buf == NULL) {
        memset(m->base, 0, len);
    }
    TP_UCS_CHECK_GOTO(ucp_rkey_pack(ctx, m->memh, &m->packed, &m->packed_len),
                      "ucp_rkey_pack", res, err_unmap);
    tp_list_push(&worker->mems, &m->node);
    *mem_out = m;
    return ncclSuccess;

err_unmap:
    ucp_mem_unmap(ctx, m->memh);
err_free:
    free(m);
    return res;
}

void *
tp_mem_base(const struct tp_mem *mem)
{
    return mem->base;
}

void
tp_mem_packed(const struct tp_mem *mem, const void **packed_out, size_t *len_out)
{
    *packed_out = mem->packed;
    *len_out = mem->packed_len;
}

void
tp_mem_deregister(struct tp_worker *worker, struct tp_mem *mem)
{
    if (mem == NULL) {
        return;
    }
    tp_list_remove(&worker->mems, &mem->node);
    ucp_rkey_buffer_release(mem->packed);
    ucp_mem_unmap(tp_ctx, mem->memh);
    free(mem);
}

ncclResult_t
tp_rkey_unpack(struct tp_worker *worker, int peer, const void *packed, struct tp_rkey **rkey_out)
{
    struct tp_rkey *k;
    ucp_ep_h ep;
    ncclResult_t res;

    SHIM_CHECK(tp_peer_ep(worker, peer, 0, 0, &ep));
    SHIM_CHECK(shim_calloc(&k, 1));
    TP_UCS_CHECK_GOTO(ucp_ep_rkey_unpack(ep, packed, &k->rkey), "ucp_ep_rkey_unpack", res,
                      err_free);
    k->peer = peer;
    tp_list_push(&worker->rkeys, &k->node);
    *rkey_out = k;
    return ncclSuccess;

err_free:
    free(k);
    return res;
}

void
tp_rkey_release(struct tp_worker *worker, struct tp_rkey *rkey)
{
    if (rkey == NULL) {
        return;
    }
    tp_list_remove(&worker->rkeys, &rkey->node);
    ucp_rkey_destroy(rkey->rkey);
    free(rkey);
}

/* Tracks a posted RMA or atomic operation in req; tag only names it in messages. */
static ncclResult_t
tp_rma_posted(struct tp_worker *worker, ucs_status_ptr_t sp, const char *what, int peer,
              uint64_t tag, size_t len, struct tp_request *req)
{
    if (UCS_PTR_IS_ERR(sp)) {
        WARN("rank %d: %s of %zu bytes to peer %d (0x%" PRIx64 ") failed: %s", worker->self,
             what, len, peer, tag, ucs_status_string(UCS_PTR_STATUS(sp)));
        return tp_result(UCS_PTR_STATUS(sp));
    }
    if (sp != NULL) {
        tp_req_track(worker, sp, tag, len, false);
    }
    tp_request_set(req, sp, len, peer);
    return ncclSuccess;
}

ncclResult_t
tp_put_post(struct tp_worker *worker, int peer, const void *buf, size_t len, uint64_t remote,
            const struct tp_rkey *rkey, uint64_t tag, struct tp_request *req)
{
    ucp_request_param_t param = {.op_attr_mask = 0};
    ucp_ep_h ep;

    SHIM_CHECK(tp_request_check_idle(worker, req, "put", tag));
    SHIM_CHECK(tp_peer_ep(worker, peer, tag, len, &ep));
    return tp_rma_posted(worker, ucp_put_nbx(ep, buf, len, remote, rkey->rkey, &param), "put",
                         peer, tag, len, req);
}

ncclResult_t
tp_atomic_add_post(struct tp_worker *worker, int peer, const uint64_t *value, uint64_t remote,
                   const struct tp_rkey *rkey, uint64_t tag, struct tp_request *req)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE,
        .datatype = ucp_dt_make_contig(sizeof(uint64_t)),
    };
    ucp_ep_h ep;

    SHIM_CHECK(tp_request_check_idle(worker, req, "atomic add", tag));
    SHIM_CHECK(tp_peer_ep(worker, peer, tag, sizeof(*value), &ep));
    return tp_rma_posted(worker,
                         ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, value, 1, remote, rkey->rkey,
                                           &param),
                         "atomic add", peer, tag, sizeof(*value), req);
}

ncclResult_t
tp_flush_post(struct tp_worker *worker, int peer, struct tp_request *req)
{
    ucp_request_param_t param = {.op_attr_mask = 0};
    ucs_status_ptr_t sp;
    ucp_ep_h ep;

    SHIM_CHECK(tp_request_check_idle(worker, req, "flush", 0));
    if (peer < 0) {
        sp = ucp_worker_flush_nbx(worker->ucp, &param);
        peer = worker->self;
    } else {
        SHIM_CHECK(tp_peer_ep(worker, peer, 0, 0, &ep));
        sp = ucp_ep_flush_nbx(ep, &param);
    }
    return tp_rma_posted(worker, sp, "flush", peer, 0, 0, req);
}
