/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Windows and one-sided operations (window.h): what every kind shares, in front of the table
 * of rows that carry them (window_row.h).
 *
 * Registering a window is collective: every rank prepares its part with its row and the ranks
 * trade what the row says of it (with whether the rank took the part, and which row) in one
 * management exchange (exchange.h); if every rank took its part with the same row, each row
 * attaches the peers' parts. A rank that refused its part still takes part in the exchange,
 * so that every rank learns of it and none waits. The first window decides the
 * communicator's row; an empty part cannot tell host memory from device memory, and takes
 * the communicator's row, or, at its first window, the host row, which the other ranks' parts
 * must then agree with. Deregistering is collective too: each rank's row first drains its own
 * operations into the window, so no peer's put is still on its way into a part that goes.
 */
#include "window.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "comm.h"
#include "exchange.h"
#include "gpu/memory.h"
#include "signal.h"
#include "window_row.h"

#define SHIM_WINDOW_MAGIC 0x77696e646f77ull /* "window" */

/* In the order they are asked: a window's memory picks the first row that serves it. */
static const struct shim_window_row *const shim_window_rows[] = {
    &shim_window_host,
    &shim_window_device,
    &shim_window_remote,
};

#define SHIM_WINDOW_ROWS (sizeof(shim_window_rows) / sizeof(shim_window_rows[0]))

struct shim_windows {
    const struct shim_window_row *row; /* NULL until a window was registered: its row */
    void *states[SHIM_WINDOW_ROWS];    /* each row's, made by its first prepare (a refused
                                          registration may leave another row's behind) */
    struct ncclWindow_vidmem *list;
    uint32_t next_id;
};

/* What a rank tells the others of its part of a new window; its row's blob follows. */
struct shim_window_hello {
    uint32_t ok;              /* 0: this rank refused its part (its WARN says why) */
    uint32_t row;             /* its row's place in the table */
    uint32_t told;            /* its part's memory, or the communicator's row, chose the row */
    uint32_t pad;
};

static size_t
shim_window_row_index(const struct shim_window_row *row)
{
    size_t i = 0;

    while (shim_window_rows[i] != row) {
        i++;
    }
    return i;
}

static void **
shim_window_state(struct shim_windows *ws, const struct shim_window_row *row)
{
    return &ws->states[shim_window_row_index(row)];
}

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

/* The row for this rank's part: the first that serves its memory, or, for an empty one, the
 * communicator's (*told_out false where it has none yet: the host row, until the peers'
 * parts say otherwise). */
static ncclResult_t
shim_window_part_row(const struct ncclComm *comm, const struct shim_windows *ws, void *buff,
                     size_t size, const struct shim_window_row **row_out, bool *told_out)
{
    const struct shim_window_row *row = ws->row;
    const char *kind_name = NULL;

    if (size > 0) {
        struct gpu_mem_info info;
        gpu_mem_query(buff, &info);
        if (info.kind != GPU_MEM_HOST && info.kind != GPU_MEM_DEVICE) {
            WARN("ncclCommWindowRegister: %p is %s memory: a window is host memory or device "
                 "memory from ncclMemAlloc", buff, gpu_mem_kind_name(info.kind));
            return ncclInvalidUsage;
        }
        kind_name = gpu_mem_kind_name(info.kind);
        row = NULL;
        for (size_t i = 0; i < SHIM_WINDOW_ROWS && row == NULL; i++) {
            row = shim_window_rows[i]->serves(comm, info.kind) ? shim_window_rows[i] : NULL;
        }
        if (row == NULL) {
            WARN("ncclCommWindowRegister: no kind of window serves %s memory", kind_name);
            return ncclInternalError;
        }
    }
    if (ws->row != NULL && row != ws->row) {
        WARN("ncclCommWindowRegister: %p is %s memory, and this communicator's windows are %s "
             "(its signals follow its windows, so they are all of one kind)", buff, kind_name,
             ws->row->name);
        return ncclInvalidUsage;
    }
    *told_out = row != NULL;
    *row_out = row != NULL ? row : &shim_window_host;
    return ncclSuccess;
}

/* Every rank's hello agrees: all took their parts, all with one row, which *row_out gets; an
 * error otherwise (every rank reaches the same verdict from the same hellos). */
static ncclResult_t
shim_window_agree(const struct ncclComm *comm, const struct shim_blobs *blobs, uint32_t id,
                  const struct shim_window_row **row_out)
{
    const struct shim_window_row *row = NULL;
    bool untold = false;

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
        if (h.row >= SHIM_WINDOW_ROWS) {
            WARN("rank %d: rank %d's part of window %u names kind %u", comm->rank, r, id,
                 h.row);
            return ncclRemoteError;
        }
        const struct shim_window_row *theirs = shim_window_rows[h.row];
        if (!h.told) {
            untold = true;
        } else if (row != NULL && theirs != row) {
            WARN("ncclCommWindowRegister: window %u has parts of %s and of %s (rank %d's): all "
                 "must be of one", id, row->name, theirs->name, r);
            return ncclInvalidUsage;
        } else {
            row = theirs;
        }
    }
    if (row != NULL && row != &shim_window_host && untold) {
        WARN("ncclCommWindowRegister: the communicator's first device window has empty parts, "
             "which cannot tell that they are device memory: give every rank a part");
        return ncclInvalidUsage;
    }
    *row_out = row != NULL ? row : &shim_window_host;
    return ncclSuccess;
}

/* Gives back what win holds here (the peers were told, or never learned of it) and frees it. */
static void
shim_window_release(struct ncclComm *comm, struct shim_windows *ws,
                    struct ncclWindow_vidmem *win)
{
    if (win->row != NULL) {
        win->row->release(comm, *shim_window_state(ws, win->row), win);
    }
    win->magic = 0;
    free(win);
}

/* This rank's hello: whether it took its part (*mine, which its row's prepare may turn into
 * a refusal), with which row, and what the row says of it. */
static ncclResult_t
shim_window_hello(struct ncclComm *comm, struct shim_windows *ws,
                  struct ncclWindow_vidmem *win, bool told, ncclResult_t *mine,
                  uint8_t **hello_out, size_t *len_out)
{
    void *blob = NULL;
    size_t blob_len = 0;

    if (*mine == ncclSuccess) {
        *mine = win->row->prepare(comm, shim_window_state(ws, win->row), win, &blob, &blob_len);
    }
    struct shim_window_hello h = {.ok = *mine == ncclSuccess, .told = told};
    if (*mine == ncclSuccess) {
        h.row = (uint32_t)shim_window_row_index(win->row);
    } else {
        blob_len = 0;
    }
    ncclResult_t res = shim_calloc(hello_out, sizeof(h) + blob_len);
    if (res == ncclSuccess) {
        memcpy(*hello_out, &h, sizeof(h));
        memcpy(*hello_out + sizeof(h), blob, blob_len);
        *len_out = sizeof(h) + blob_len;
    }
    free(blob);
    return res;
}

ncclResult_t
shim_window_register(struct ncclComm *comm, void *buff, size_t size, ncclWindow_t *win_out)
{
    struct shim_windows *ws;
    struct ncclWindow_vidmem *win = NULL;
    struct shim_blobs blobs = {0};
    const struct shim_window_row *row = NULL;
    int *everyone = NULL;
    uint8_t *hello = NULL;
    size_t len = 0;
    bool told = false;
    ncclResult_t res, mine = ncclSuccess;

    if (win_out == NULL || (buff == NULL && size > 0)) {
        WARN("ncclCommWindowRegister: %s is NULL", win_out == NULL ? "win" : "buff");
        mine = ncclInvalidArgument;
    }
    SHIM_CHECK(shim_windows_of(comm, &ws));
    SHIM_CHECK(shim_calloc(&win, 1));
    *win = (struct ncclWindow_vidmem){.magic = SHIM_WINDOW_MAGIC, .comm = comm,
                                       .id = ws->next_id++, .buff = buff, .size = size};
    if (mine == ncclSuccess) {
        mine = shim_window_part_row(comm, ws, buff, size, &row, &told);
        win->row = row;
    }
    SHIM_CHECK_GOTO(shim_window_hello(comm, ws, win, told, &mine, &hello, &len), res, out);
    SHIM_CHECK_GOTO(shim_everyone(comm, &everyone), res, out);
    SHIM_CHECK_GOTO(shim_exchange_blobs(comm, everyone, comm->nranks, comm->rank, hello, len,
                                        &blobs),
                    res, out);
    res = mine != ncclSuccess ? mine : shim_window_agree(comm, &blobs, win->id, &row);
    if (res == ncclSuccess) {
        /* Every rank prepared its part with this row, this one too (an empty part that could
         * not tell took the host's, which the others then agreed with). */
        res = row->attach(comm, *shim_window_state(ws, row), win, &blobs,
                          sizeof(struct shim_window_hello));
    }
    if (res != ncclSuccess) {
        goto out;
    }
    ws->row = row; /* one kind per communicator: its signals are that row's */
    win->next = ws->list;
    ws->list = win;
    INFO(SHIM_INIT, "comm %p rank %d: window %u of %s at %p, %zu bytes", (void *)comm,
         comm->rank, win->id, row->name, buff, size);
    *win_out = win;
    win = NULL;

out:
    if (win != NULL) {
        shim_window_release(comm, ws, win);
    }
    shim_blobs_free(&blobs);
    free(everyone);
    free(hello);
    return res;
}

ncclResult_t
shim_window_deregister(struct ncclComm *comm, ncclWindow_t win)
{
    struct shim_windows *ws = comm->windows;
    struct shim_blobs blobs = {0};
    int *everyone = NULL;
    ncclResult_t res;

    SHIM_CHECK(shim_window_check(comm, win, "ncclCommWindowDeregister"));
    /* Collective: every rank is done with every part before any part goes. */
    SHIM_CHECK(win->row->drain(comm, *shim_window_state(ws, win->row), win));
    struct ncclWindow_vidmem **link = &ws->list;
    while (*link != win) {
        link = &(*link)->next;
    }
    *link = win->next;
    SHIM_CHECK_GOTO(shim_everyone(comm, &everyone), res, out);
    res = shim_exchange_blobs(comm, everyone, comm->nranks, comm->rank, NULL, 0, &blobs);
out:
    shim_window_release(comm, ws, win);
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
    if (win->row->peer_ptr == NULL) {
        WARN("%s: window %u is %s: only device windows of ranks on one host have device "
             "pointers", api, win->id, win->row->name);
        return ncclInvalidUsage;
    }
    if (peer < 0 || peer >= win->comm->nranks || offset > win->row->part_size(win, peer)) {
        WARN("%s: peer %d, offset %zu: outside window %u", api, peer, offset, win->id);
        return ncclInvalidArgument;
    }
    *ptr_out = (char *)win->row->peer_ptr(win, peer) + offset;
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
    if (ws == NULL || ws->row == NULL) {
        WARN("%s: no window was registered on communicator %p yet: ncclshim's ranks trade "
             "their signal words when the first window is registered", api, (void *)comm);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

ncclResult_t
shim_put_signal(struct ncclComm *comm, const void *src, size_t bytes, int peer,
                ncclWindow_t win, size_t offset, int sig_idx, int ctx, cudaStream_t stream)
{
    SHIM_CHECK(shim_signal_args(comm, peer, sig_idx, ctx, "ncclPutSignal"));
    if (win != NULL || bytes > 0) {
        SHIM_CHECK(shim_window_check(comm, win, "ncclPutSignal"));
    }
    if (bytes > 0 && src == NULL) {
        WARN("ncclPutSignal: the source is NULL");
        return ncclInvalidArgument;
    }
    if (bytes > 0) {
        size_t part = win->row->part_size(win, peer);
        if (offset > part || bytes > part - offset) {
            WARN("ncclPutSignal: %zu bytes at offset %zu overrun rank %d's part of window %u "
                 "(%zu bytes)", bytes, offset, peer, win->id, part);
            return ncclInvalidArgument;
        }
    }
    struct shim_windows *ws = comm->windows;
    return ws->row->put_signal(comm, *shim_window_state(ws, ws->row), win, src, bytes, peer,
                               offset, sig_idx, ctx, stream);
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
    if (ws == NULL || ws->row == NULL) {
        return ncclSuccess; /* no descriptor, and no signal of this rank's to see off */
    }
    void *state = *shim_window_state(ws, ws->row);
    for (int i = 0; i < ndescs; i++) {
        SHIM_CHECK(ws->row->wait_signal(comm, state, descs[i].peer, descs[i].sigIdx, descs[i].ctx,
                                        (uint32_t)descs[i].opCnt, stream));
    }
    return ws->row->wait_done != NULL ? ws->row->wait_done(comm, state) : ncclSuccess;
}

void
shim_windows_free(struct ncclComm *comm)
{
    struct shim_windows *ws = comm->windows;

    if (ws == NULL) {
        return;
    }
    /* The worker went, and with it every registration and key: the rows' records, mappings
     * and threads are left. The rows stop first: their windows then wait for nothing. */
    for (size_t i = 0; i < SHIM_WINDOW_ROWS; i++) {
        if (ws->states[i] != NULL) {
            shim_window_rows[i]->stop(ws->states[i]);
        }
    }
    while (ws->list != NULL) {
        struct ncclWindow_vidmem *w = ws->list;
        ws->list = w->next;
        shim_window_release(comm, ws, w);
    }
    for (size_t i = 0; i < SHIM_WINDOW_ROWS; i++) {
        if (ws->states[i] != NULL) {
            shim_window_rows[i]->destroy(ws->states[i]);
        }
    }
    free(ws);
    comm->windows = NULL;
}
