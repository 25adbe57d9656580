/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device row of the window table (window_row.h): windows on device memory, for
 * communicators whose ranks share a host (or of one rank).
 *
 * Every rank's part is mapped in every rank's process, so a put is a copy on the caller's
 * stream straight into the peer's memory, and a signal is a write on that stream into the
 * peer's signal words; a wait is a wait on the waiter's stream. Nothing of ours runs on the
 * host once a call returned, and the calls are stream ordered as NCCL's.
 *
 *   ncclPutSignal(stream):  copy src -> peer's part | write peer's word (this rank, sig, ctx)
 *                           = the number of signals this rank sent on it
 *   ncclSignal(stream):     the write alone
 *   ncclWaitSignal(stream): wait until each own word reaches the waits' count
 *
 * Each word has one writer (its source rank's streams), and the values it writes only grow,
 * so a stream wait for "at least" needs no atomics. Parts must be cuMem allocations that
 * export as file descriptors (ncclMemAlloc's, as NCCL requires of windows): registration
 * sends each peer the part's descriptor over a Unix socket, and the peer imports and maps it
 * for its own device (an imported handle keeps the memory alive, so a peer that frees its
 * part early does no harm). The signal words live in a shared memory segment of each rank,
 * mapped and registered with the driver by every rank at the communicator's first device
 * window.
 */
#include "window_row.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "comm.h"
#include "cudaipc/channel.h"
#include "exchange.h"
#include "gpu/driver.h"
#include "gpu/memory.h"
#include "gpu/stream.h"
#include "signal.h"

/* How long teardown waits for the streams that used a window's memory. */
#define SHIM_DWIN_TEARDOWN_MS 5000

/* The row's state: the communicator's signal words. */
struct shim_dsignals {
    const struct gpu_device *gpu;
    int nranks, rank;
    bool traded;                     /* every rank mapped every rank's words */
    size_t bytes;                    /* of each rank's segment */
    int fd;                          /* this rank's segment, a memory file */
    struct gpu_host_import *words;   /* every rank's segment as this process reaches it */
    uint32_t *sent;                  /* [peer][sigIdx][ctx]: signals this rank sent there */
    uint32_t *counted;               /* [source][sigIdx][ctx]: what waits here counted */
    struct gpu_stream_marks posted;  /* streams that wrote peers' words, after their puts */
    struct gpu_stream_marks waited;  /* streams that wait on this rank's words */
};

/* What a rank tells the others of its part of a new device window. */
struct shim_dwin_hello {
    uint64_t map_size;    /* the cuMem mapping the part lies in */
    uint64_t offset;      /* the part's first byte within it */
    uint64_t size;        /* the part's bytes (0: an empty part, nothing to map) */
    uint32_t brings_signals; /* its signal segment's descriptor follows the part's */
    uint32_t pad;
    char socket[CIPC_CHANNEL_NAME_MAX]; /* where it takes the peers' descriptors */
};

/* A window's parts: every rank's, mapped. */
struct shim_dwin {
    const struct gpu_device *gpu;
    int nranks, rank;
    void *buff;
    size_t size;
    int fd;                          /* this rank's part, exported; -1 for an empty part */
    int listen_fd;
    char socket[CIPC_CHANNEL_NAME_MAX];
    bool brings_signals;
    struct gpu_mem_import *parts;    /* every peer's mapping (this rank's stays empty) */
    void **ptrs;                     /* every rank's part as this process reaches it */
    size_t *sizes;
};

static void shim_dsignals_free(struct shim_dsignals *s);
static void shim_dwin_free(struct shim_dwin *dw, const struct shim_dsignals *signals);

/* --- signal words ------------------------------------------------------------------------- */

static ncclResult_t
shim_dsignals_create(struct ncclComm *comm, const struct gpu_device *gpu,
                     struct shim_dsignals **out)
{
    struct shim_dsignals *s;
    ncclResult_t res;
    size_t words = shim_signal_words(comm->nranks);

    SHIM_CHECK(shim_calloc(&s, 1));
    s->gpu = gpu;
    s->nranks = comm->nranks;
    s->rank = comm->rank;
    s->bytes = words * sizeof(uint32_t);
    s->fd = -1;
    SHIM_CHECK_GOTO(shim_calloc(&s->words, (size_t)comm->nranks), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&s->sent, words), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&s->counted, words), res, err);
    SHIM_CHECK_GOTO(gpu_host_segment("ncclshim-signals", s->bytes, &s->fd,
                                     &s->words[comm->rank]),
                    res, err);
    *out = s;
    return ncclSuccess;

err:
    shim_dsignals_free(s);
    return res;
}

/* At teardown: unmaps the peers' signal words and frees this rank's. NULL is ignored. */
static void
shim_dsignals_free(struct shim_dsignals *s)
{
    if (s == NULL) {
        return;
    }
    if (s->words != NULL && gpu_ctx_push(s->gpu->ctx) == ncclSuccess) {
        /* Waits still queued for signals that will never come go on (teardown, abort). */
        shim_signal_release_waits(s->words[s->rank].host, s->counted,
                                  shim_signal_words(s->nranks));
        bool posted = gpu_stream_marks_wait(&s->posted, SHIM_DWIN_TEARDOWN_MS);
        bool waited = gpu_stream_marks_wait(&s->waited, SHIM_DWIN_TEARDOWN_MS);
        gpu_stream_marks_free(&s->posted);
        gpu_stream_marks_free(&s->waited);
        /* Memory a stream may still touch stays mapped and registered: a fault is worse. */
        for (int r = 0; r < s->nranks && posted && waited; r++) {
            gpu_host_unimport(&s->words[r]);
        }
        gpu_ctx_pop();
    }
    if (s->fd >= 0) {
        close(s->fd);
    }
    free(s->words);
    free(s->sent);
    free(s->counted);
    free(s);
}

/* --- registering -------------------------------------------------------------------------- */

/* Checks this rank's part (non-empty) and exports it as a file descriptor (dw->fd); where it
 * lies in its mapping, for the peers. The device's context is current. */
static ncclResult_t
shim_dwin_export(struct shim_dwin *dw, uintptr_t *base_out, size_t *map_size_out)
{
    struct gpu_mem_info info;
    CUmemGenericAllocationHandle handle;
    uint64_t id;

    gpu_mem_query(dw->buff, &info);
    if (info.kind != GPU_MEM_DEVICE || !info.fd_ipc || info.device != dw->gpu->ordinal) {
        WARN("ncclCommWindowRegister: %p is %s%s: a device window's part must be memory of the "
             "communicator's device %d from ncclMemAlloc (a cuMem allocation that exports as "
             "a file descriptor), as NCCL's windows are", dw->buff,
             gpu_mem_kind_name(info.kind),
             info.kind == GPU_MEM_DEVICE && !info.fd_ipc ? " (cudaMalloc memory)" : "",
             dw->gpu->ordinal);
        return ncclInvalidUsage;
    }
    SHIM_CHECK(gpu_mem_mapping(dw->buff, base_out, map_size_out, &id));
    if (gpu_cu.cuMemRetainAllocationHandle(&handle, dw->buff) != CUDA_SUCCESS) {
        WARN("ncclCommWindowRegister: the driver has no cuMem handle for %p", dw->buff);
        return ncclUnhandledCudaError;
    }
    CUresult cu = gpu_cu.cuMemExportToShareableHandle(
        &dw->fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    gpu_cu.cuMemRelease(handle); /* the retain's reference */
    if (cu != CUDA_SUCCESS) {
        return gpu_cu_fail(cu, "cuMemExportToShareableHandle(window)", __FILE__, __LINE__);
    }
    return ncclSuccess;
}

/* Checks this rank's part (cuMem memory of the communicator's device, exportable as a file
 * descriptor), exports it and starts listening for the peers' descriptors; makes the
 * communicator's signal words if *signals is NULL (kept by the caller), and with
 * bring_signals (until a registration traded them) sends them with the part. A WARN and an
 * error if the part cannot be a device window part. */
static ncclResult_t
shim_dwin_prepare(struct ncclComm *comm, struct shim_dsignals **signals, bool bring_signals,
                  void *buff, size_t size, struct shim_dwin **dwin_out,
                  struct shim_dwin_hello *hello_out)
{
    const struct gpu_device *gpu;
    struct shim_dwin *dw;
    ncclResult_t res;
    uintptr_t base = 0;
    size_t map_size = 0;

    SHIM_CHECK(gpu_device_get(comm->cuda_dev >= 0 ? comm->cuda_dev : 0, &gpu));
    SHIM_CHECK(shim_calloc(&dw, 1));
    dw->gpu = gpu;
    dw->nranks = comm->nranks;
    dw->rank = comm->rank;
    dw->buff = buff;
    dw->size = size;
    dw->fd = dw->listen_fd = -1;
    dw->brings_signals = bring_signals;
    SHIM_CHECK_GOTO(shim_calloc(&dw->parts, (size_t)comm->nranks), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&dw->ptrs, (size_t)comm->nranks), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&dw->sizes, (size_t)comm->nranks), res, err);
    /* Every driver call from here in the device's context, the first (cuMemGetAddressRange)
     * too: inside a group this runs on a thread of its own, where none is current. */
    SHIM_CHECK_GOTO(gpu_ctx_push(gpu->ctx), res, err);
    res = size > 0 ? shim_dwin_export(dw, &base, &map_size) : ncclSuccess;
    if (res == ncclSuccess && *signals == NULL) {
        res = shim_dsignals_create(comm, gpu, signals);
    }
    gpu_ctx_pop();
    SHIM_CHECK_GOTO(res, res, err);
    SHIM_CHECK_GOTO(cipc_channel_listen(dw->socket, &dw->listen_fd), res, err);
    *hello_out = (struct shim_dwin_hello){.map_size = map_size,
                                          .offset = (uintptr_t)buff - base,
                                          .size = size,
                                          .brings_signals = dw->brings_signals};
    memcpy(hello_out->socket, dw->socket, sizeof(hello_out->socket));
    *dwin_out = dw;
    return ncclSuccess;

err:
    shim_dwin_free(dw, NULL); /* nothing was put yet */
    return res;
}

/* Sends this rank's descriptors to peer: its part's, and its signal segment's the first time. */
static ncclResult_t
shim_dwin_send(struct shim_dwin *dw, const struct shim_dsignals *signals, int peer,
               const struct shim_dwin_hello *hello)
{
    int conn = -1;
    int err = cipc_channel_connect(hello->socket, &conn);
    ncclResult_t res = ncclSuccess;

    if (err != 0) {
        WARN("rank %d: cannot reach rank %d's socket for its window: %s", dw->rank, peer,
             strerror(err));
        return ncclRemoteError;
    }
    struct cipc_channel_msg msg = {.kind = CIPC_FD_CUMEM, .rank = dw->rank, .size = dw->size};
    res = cipc_channel_send(conn, &msg, dw->fd); /* an empty part sends no descriptor */
    if (res == ncclSuccess && dw->brings_signals) {
        msg = (struct cipc_channel_msg){.kind = CIPC_FD_STAGING, .rank = dw->rank,
                                        .size = signals->bytes};
        res = cipc_channel_send(conn, &msg, signals->fd);
    }
    close(conn);
    return res;
}

/* One message from a peer: its part, or its signal words, mapped here. */
static ncclResult_t
shim_dwin_take(struct shim_dwin *dw, struct shim_dsignals *signals,
               const struct shim_dwin_hello *hellos, const struct cipc_channel_msg *msg, int fd,
               int *expected)
{
    int r = msg->rank;
    ncclResult_t res = ncclSuccess;

    if (r < 0 || r >= dw->nranks || r == dw->rank || expected[r] == 0) {
        WARN("rank %d: an unexpected message on the window's socket (from rank %d)", dw->rank,
             r);
        if (fd >= 0) {
            close(fd);
        }
        return ncclRemoteError;
    }
    if (msg->kind == CIPC_FD_CUMEM && hellos[r].size > 0) {
        res = fd < 0 ? ncclRemoteError
                     : gpu_mem_import(fd, hellos[r].map_size, dw->gpu->ordinal, &dw->parts[r]);
        dw->ptrs[r] = (void *)(uintptr_t)(dw->parts[r].base + hellos[r].offset);
    } else if (msg->kind == CIPC_FD_STAGING && hellos[r].brings_signals && fd >= 0) {
        res = gpu_host_import(fd, signals->bytes, &signals->words[r]);
    } else if (msg->kind != CIPC_FD_CUMEM) {
        WARN("rank %d: rank %d sent message kind %u on the window's socket", dw->rank, r,
             msg->kind);
        res = ncclRemoteError;
    }
    if (fd >= 0) {
        close(fd);
    }
    expected[r]--;
    return res;
}

/* With every rank's hello (each rank called prepare): sends this rank's descriptors to every
 * peer, takes theirs, and maps every peer's part (and, the first time, signal words). */
static ncclResult_t
shim_dwin_attach(struct ncclComm *comm, struct shim_dsignals *signals, struct shim_dwin *dw,
                 const struct shim_dwin_hello *hellos)
{
    const int n = dw->nranks;
    int *expected = NULL, *conns = NULL, nconns = 0, owed = 0;
    int64_t until = shim_clock_ms() + 60000;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&expected, (size_t)n));
    SHIM_CHECK_GOTO(shim_calloc(&conns, (size_t)n), res, out);
    for (int r = 0; r < n; r++) {
        dw->sizes[r] = hellos[r].size;
        if (r != dw->rank) {
            expected[r] = 1 + (hellos[r].brings_signals != 0);
            owed += expected[r];
        }
    }
    dw->ptrs[dw->rank] = dw->buff;
    SHIM_CHECK_GOTO(gpu_ctx_push(dw->gpu->ctx), res, out);
    /* Everyone listens since prepare: send first (the kernel buffers it), then take. */
    res = ncclSuccess;
    for (int r = 0; r < n && res == ncclSuccess; r++) {
        if (r != dw->rank) {
            res = shim_dwin_send(dw, signals, r, &hellos[r]);
        }
    }
    while (res == ncclSuccess && owed > 0) {
        int conn;
        if (nconns < n && cipc_channel_accept(dw->listen_fd, &conn) == 0) {
            conns[nconns++] = conn;
            continue;
        }
        bool moved = false;
        for (int c = 0; c < nconns && res == ncclSuccess; c++) {
            struct cipc_channel_msg msg;
            int fd = -1;
            int err = conns[c] < 0 ? EAGAIN : cipc_channel_recv(conns[c], &msg, &fd);
            if (err == 0) {
                res = shim_dwin_take(dw, signals, hellos, &msg, fd, expected);
                owed--;
                moved = true;
            } else if (err != EAGAIN) {
                close(conns[c]); /* the sender closed after its last message */
                conns[c] = -1;
            }
        }
        if (!moved && res == ncclSuccess) {
            if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE) ||
                shim_clock_ms() > until) {
                WARN("rank %d: %d of the peers' window descriptors did not come%s", dw->rank,
                     owed, comm->abort_flag ? " (aborted)" : " in 60 s");
                res = ncclRemoteError;
            } else {
                struct pollfd p = {.fd = dw->listen_fd, .events = POLLIN};
                poll(&p, 1, 1);
            }
        }
    }
    gpu_ctx_pop();
out:
    for (int c = 0; c < nconns; c++) {
        if (conns[c] >= 0) {
            close(conns[c]);
        }
    }
    if (dw->listen_fd >= 0) {
        close(dw->listen_fd);
        dw->listen_fd = -1;
    }
    free(conns);
    free(expected);
    return res;
}

/* Waits for this rank's puts (every stream that signalled through signals, which follow the
 * puts; NULL: none were made), then unmaps the peers' parts (the caller then tells the
 * peers). NULL dwin is ignored. */
static void
shim_dwin_free(struct shim_dwin *dw, const struct shim_dsignals *signals)
{
    if (dw == NULL) {
        return;
    }
    if (dw->parts != NULL && gpu_ctx_push(dw->gpu->ctx) == ncclSuccess) {
        /* Our puts into the peers' parts first; a mapping goes only once nothing uses it. A
         * stream held up for good (waiting for a signal that never comes) leaves the mappings
         * in place rather than hold the caller, who may be tearing down after a failure. */
        if (signals == NULL || gpu_stream_marks_wait(&signals->posted, SHIM_DWIN_TEARDOWN_MS)) {
            for (int r = 0; r < dw->nranks; r++) {
                gpu_mem_unimport(&dw->parts[r]);
            }
        } else {
            INFO(SHIM_INIT, "rank %d: streams that put into a device window did not finish in "
                 "%d ms: its peers' parts stay mapped", dw->rank, SHIM_DWIN_TEARDOWN_MS);
        }
        gpu_ctx_pop();
    }
    if (dw->listen_fd >= 0) {
        close(dw->listen_fd);
    }
    if (dw->fd >= 0) {
        close(dw->fd);
    }
    free(dw->parts);
    free(dw->ptrs);
    free(dw->sizes);
    free(dw);
}

/* Peer's part as this process's device reaches it (peer may be this rank). */
static void *
shim_dwin_peer_ptr(const struct shim_dwin *dw, int peer)
{
    return dw->ptrs[peer];
}

/* The size of peer's part. */
static size_t
shim_dwin_peer_size(const struct shim_dwin *dw, int peer)
{
    return dw->sizes[peer];
}

/* --- the operations ----------------------------------------------------------------------- */

static struct gpu_flag
shim_dsignal_flag(const struct shim_dsignals *s, int owner, size_t word)
{
    const struct gpu_host_import *seg = &s->words[owner];
    return (struct gpu_flag){.host = (volatile uint32_t *)seg->host + word,
                             .dev = seg->dev + word * sizeof(uint32_t)};
}

/* The one-sided operations, on stream (of the communicator's device, not being captured:
 * their numbers are picked now, and a graph would replay them). A put copies bytes of src to
 * peer's part at offset (dwin may be NULL when bytes is 0: a signal alone), then raises
 * peer's word for (this rank, sig, ctx); a wait holds the stream until this rank's word for
 * (peer, sig, ctx) counts `count` more signals than the waits before counted. */
static ncclResult_t
shim_dwin_put_signal(struct ncclComm *comm, struct shim_dsignals *s, struct shim_dwin *dw,
                     const void *src, size_t bytes, int peer, size_t offset, int sig, int ctx,
                     cudaStream_t stream)
{
    const char *api = dw != NULL && bytes > 0 ? "ncclPutSignal" : "ncclSignal";
    ncclResult_t res;

    SHIM_CHECK(shim_signal_check_stream(s->gpu, stream, api));
    SHIM_CHECK(gpu_ctx_push(s->gpu->ctx));
    if (bytes > 0) {
        CUdeviceptr dst = (CUdeviceptr)(uintptr_t)dw->ptrs[peer] + offset;
        GPU_CU_CHECK_GOTO(cuMemcpyAsync(dst, (CUdeviceptr)(uintptr_t)src, bytes,
                                        (CUstream)stream),
                          res, out);
    }
    /* The word peer keeps for this rank: one writer, growing values (stream.h's barrier
     * before the write makes the copy visible first). */
    uint32_t seq = ++s->sent[shim_signal_word(peer, sig, ctx)];
    struct gpu_flag word = shim_dsignal_flag(s, peer, shim_signal_word(comm->rank, sig, ctx));
    SHIM_CHECK_GOTO(gpu_stream_post_flag((CUstream)stream, &word, seq), res, out);
    res = gpu_stream_mark(&s->posted, (CUstream)stream);
out:
    gpu_ctx_pop();
    return res;
}

static ncclResult_t
shim_wdev_wait_signal(struct ncclComm *comm, void *state, int peer, int sig, int ctx,
                      uint32_t count, cudaStream_t stream)
{
    struct shim_dsignals *s = state;
    ncclResult_t res;
    size_t w = shim_signal_word(peer, sig, ctx);

    (void)comm;
    SHIM_CHECK(shim_signal_check_stream(s->gpu, stream, "ncclWaitSignal"));
    if (count == 0) {
        return ncclSuccess;
    }
    SHIM_CHECK(gpu_ctx_push(s->gpu->ctx));
    s->counted[w] += count;
    struct gpu_flag word = shim_dsignal_flag(s, s->rank, w);
    SHIM_CHECK_GOTO(gpu_stream_wait_flag((CUstream)stream, &word, s->counted[w]), res, out);
    res = gpu_stream_mark(&s->waited, (CUstream)stream);
out:
    gpu_ctx_pop();
    return res;
}

/* --- the row ------------------------------------------------------------------------------ */

/* Device memory of ranks whose processes map each other's: one host (its shared-memory team),
 * or one rank. */
static bool
shim_wdev_serves(const struct ncclComm *comm, enum gpu_mem_kind kind)
{
    return kind == GPU_MEM_DEVICE && (comm->nranks == 1 || comm->shm != NULL);
}

static ncclResult_t
shim_wdev_prepare(struct ncclComm *comm, void **state, struct ncclWindow_vidmem *win,
                  void **blob_out, size_t *len_out)
{
    struct shim_dsignals *signals = *state;
    struct shim_dwin_hello *hello;
    struct shim_dwin *dw;

    SHIM_CHECK(shim_calloc(&hello, 1));
    /* Until a registration traded them, every one brings the signal words. */
    ncclResult_t res = shim_dwin_prepare(comm, &signals, signals == NULL || !signals->traded,
                                         win->buff, win->size, &dw, hello);
    *state = signals; /* made even where the part was refused: the next window's */
    if (res != ncclSuccess) {
        free(hello);
        return res;
    }
    win->part = dw;
    *blob_out = hello;
    *len_out = sizeof(*hello);
    return ncclSuccess;
}

static ncclResult_t
shim_wdev_attach(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win,
                 const struct shim_blobs *blobs, size_t skip)
{
    struct shim_dsignals *signals = state;
    struct shim_dwin_hello *hellos;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&hellos, (size_t)comm->nranks));
    for (int r = 0; r < comm->nranks; r++) {
        if (blobs->lens[r] < skip + sizeof(hellos[r])) {
            WARN("rank %d: rank %d's part of window %u came in %zu bytes", comm->rank, r,
                 win->id, blobs->lens[r]);
            free(hellos);
            return ncclRemoteError;
        }
        memcpy(&hellos[r], blobs->data + blobs->offsets[r] + skip, sizeof(hellos[r]));
    }
    res = shim_dwin_attach(comm, signals, win->part, hellos);
    free(hellos);
    SHIM_CHECK(res);
    signals->traded = true;
    return ncclSuccess;
}

/* Waits for this rank's puts into the peers' parts, and unmaps them. */
static ncclResult_t
shim_wdev_drain(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win)
{
    (void)comm;
    shim_dwin_free(win->part, state);
    win->part = NULL;
    return ncclSuccess;
}

static void
shim_wdev_release(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win)
{
    (void)comm;
    shim_dwin_free(win->part, state);
    win->part = NULL;
}

static size_t
shim_wdev_part_size(const struct ncclWindow_vidmem *win, int peer)
{
    return shim_dwin_peer_size(win->part, peer);
}

static void *
shim_wdev_peer_ptr(const struct ncclWindow_vidmem *win, int peer)
{
    return shim_dwin_peer_ptr(win->part, peer);
}

static ncclResult_t
shim_wdev_put_signal(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win,
                     const void *src, size_t bytes, int peer, size_t offset, int sig, int ctx,
                     cudaStream_t stream)
{
    return shim_dwin_put_signal(comm, state, win != NULL ? win->part : NULL, src, bytes, peer,
                                offset, sig, ctx, stream);
}

static void
shim_wdev_stop(void *state)
{
    (void)state; /* nothing of ours runs: the streams' work is theirs */
}

static void
shim_wdev_destroy(void *state)
{
    shim_dsignals_free(state);
}

const struct shim_window_row shim_window_device = {
    .name = "device memory of one host",
    .serves = shim_wdev_serves,
    .prepare = shim_wdev_prepare,
    .attach = shim_wdev_attach,
    .drain = shim_wdev_drain,
    .release = shim_wdev_release,
    .part_size = shim_wdev_part_size,
    .peer_ptr = shim_wdev_peer_ptr,
    .put_signal = shim_wdev_put_signal,
    .wait_signal = shim_wdev_wait_signal,
    .stop = shim_wdev_stop,
    .destroy = shim_wdev_destroy,
};
