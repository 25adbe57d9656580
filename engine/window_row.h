/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Who carries a communicator's windows and one-sided signals: one row of this table per kind
 * of memory and reach (window.c registers, checks the calls' arguments and hands them to the
 * row; the communicator's teardown asks it to stop and go):
 *
 *   host    host memory: UCX's remote memory access and atomics (window_host.c)
 *   device  device memory of ranks that share a host: every part mapped in every rank's
 *           process, puts and signals on the caller's stream (window_device.c)
 *   remote  device memory of ranks that do not: pinned mirrors, logs and a proxy thread
 *           (window_remote.c)
 *
 * A communicator's windows are all of one row, which its first window decides by asking each
 * row in order whether it serves that window's memory: the signals, which name no window,
 * follow it. A row keeps what the communicator's windows share (its signal words, a proxy) in
 * a state of its own, made by its first prepare and kept by window.c until teardown, and each
 * window's parts in win->part; nothing else touches either.
 */
#ifndef SHIM_WINDOW_ROW_H
#define SHIM_WINDOW_ROW_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/memory.h"

struct ncclComm;
struct shim_blobs;
struct shim_window_row;

/* ncclWindow_t points at one of these: this rank's part of a window. */
struct ncclWindow_vidmem {
    uint64_t magic;
    struct ncclComm *comm;
    uint32_t id;              /* the communicator's n-th window, equal on every rank */
    void *buff;
    size_t size;
    const struct shim_window_row *row; /* the row that prepared its part */
    void *part;               /* the row's: every rank's part, as this rank reaches it */
    struct ncclWindow_vidmem *next;
};

struct shim_window_row {
    const char *name;         /* what its windows are, for messages */
    /* Whether it serves comm's windows, the first of which has a part here of memory of
     * `kind` (GPU_MEM_HOST or GPU_MEM_DEVICE). A question only. */
    bool (*serves)(const struct ncclComm *comm, enum gpu_mem_kind kind);
    /* This rank's part of a new window (win: buff, size, id): checks it and makes it
     * reachable (win->part), makes the row's state in *state if it is NULL, and returns what
     * the peers must learn of it in *blob_out (freed by the caller; NULL with *len_out 0 for
     * nothing). A WARN and an error for a part it refuses; whatever it left in win->part,
     * release gives back. */
    ncclResult_t (*prepare)(struct ncclComm *comm, void **state, struct ncclWindow_vidmem *win,
                            void **blob_out, size_t *len_out);
    /* With every rank's blob (blobs: rank r's at data + offsets[r] + skip, its lens[r] less
     * skip), every rank having prepared with this row: the peers' parts reached, and the
     * signals traded the first time. */
    ncclResult_t (*attach)(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win,
                           const struct shim_blobs *blobs, size_t skip);
    /* Deregistering, before the exchange that tells the peers: this rank's operations into
     * the window are done, so no peer's part is still written when it goes. */
    ncclResult_t (*drain)(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win);
    /* Gives back what win->part holds (NULL: nothing): the peers were told, or never learned
     * of it; after stop, what went with the communicator's worker is not given back twice. */
    void (*release)(struct ncclComm *comm, void *state, struct ncclWindow_vidmem *win);
    /* The size of peer's part. */
    size_t (*part_size)(const struct ncclWindow_vidmem *win, int peer);
    /* Peer's part as this process's device reaches it; NULL where the row has no such
     * pointers (NCCL's device pointer queries are refused then). */
    void *(*peer_ptr)(const struct ncclWindow_vidmem *win, int peer);
    /* ncclPutSignal, its arguments checked (bytes past 0 only with a window, within peer's
     * part): bytes of src into peer's part at offset, then peer's signal (this rank, sig, ctx)
     * raised by one; ncclSignal is the same with no window and no bytes. */
    ncclResult_t (*put_signal)(struct ncclComm *comm, void *state,
                               struct ncclWindow_vidmem *win, const void *src, size_t bytes,
                               int peer, size_t offset, int sig, int ctx, cudaStream_t stream);
    /* One descriptor of ncclWaitSignal, checked (window.c calls it for each, in order): count
     * more signals from (peer, sig, ctx) than the waits before counted. */
    ncclResult_t (*wait_signal)(struct ncclComm *comm, void *state, int peer, int sig, int ctx,
                                uint32_t count, cudaStream_t stream);
    /* After the last descriptor of an ncclWaitSignal; NULL where nothing is left to do. */
    ncclResult_t (*wait_done)(struct ncclComm *comm, void *state);
    /* Teardown, once the communicator's worker went: stop ends whatever of the row still
     * runs (its windows are released after it), destroy frees the state. */
    void (*stop)(void *state);
    void (*destroy)(void *state);
};

extern const struct shim_window_row shim_window_host;
extern const struct shim_window_row shim_window_device;
extern const struct shim_window_row shim_window_remote;

#endif
