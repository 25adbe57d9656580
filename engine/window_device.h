/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Windows on device memory, for communicators whose ranks share a host (window_device.c).
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
#ifndef SHIM_WINDOW_DEVICE_H
#define SHIM_WINDOW_DEVICE_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cudaipc/channel.h"

struct ncclComm;
struct shim_dwin;     /* a device window's mappings */
struct shim_dsignals; /* the communicator's signal words for device windows */

/* What a rank tells the others of its part of a new device window. */
struct shim_dwin_hello {
    uint64_t map_size;    /* the cuMem mapping the part lies in */
    uint64_t offset;      /* the part's first byte within it */
    uint64_t size;        /* the part's bytes (0: an empty part, nothing to map) */
    uint32_t brings_signals; /* its signal segment's descriptor follows the part's */
    uint32_t pad;
    char socket[CIPC_CHANNEL_NAME_MAX]; /* where it takes the peers' descriptors */
};

/* Checks this rank's part (cuMem memory of the communicator's device, exportable as a file
 * descriptor), exports it and starts listening for the peers' descriptors; makes the
 * communicator's signal words if *signals is NULL (kept by the caller), and with
 * bring_signals (until a registration traded them) sends them with the part. A WARN and an
 * error if the part cannot be a device window part. */
ncclResult_t shim_dwin_prepare(struct ncclComm *comm, struct shim_dsignals **signals,
                               bool bring_signals, void *buff, size_t size,
                               struct shim_dwin **dwin_out, struct shim_dwin_hello *hello_out);
/* With every rank's hello (each rank called prepare): sends this rank's descriptors to every
 * peer, takes theirs, and maps every peer's part (and, the first time, signal words). */
ncclResult_t shim_dwin_attach(struct ncclComm *comm, struct shim_dsignals *signals,
                              struct shim_dwin *dwin, const struct shim_dwin_hello *hellos);
/* Waits for this rank's puts (every stream that signalled through signals, which follow the
 * puts; NULL: none were made), then unmaps the peers' parts (the caller then tells the
 * peers). NULL dwin is ignored. */
void shim_dwin_free(struct shim_dwin *dwin, const struct shim_dsignals *signals);
/* Peer's part as this process's device reaches it (peer may be this rank). */
void *shim_dwin_peer_ptr(const struct shim_dwin *dwin, int peer);
/* The size of peer's part. */
size_t shim_dwin_peer_size(const struct shim_dwin *dwin, int peer);

/* The one-sided operations, on stream (of the communicator's device, not being captured:
 * their numbers are picked now, and a graph would replay them). A put copies bytes of src to
 * peer's part at offset (dwin may be NULL when bytes is 0: a signal alone), then raises
 * peer's word for (this rank, sig, ctx); a wait holds the stream until this rank's word for
 * (peer, sig, ctx) counts `count` more signals than the waits before counted. */
ncclResult_t shim_dwin_put_signal(struct ncclComm *comm, struct shim_dsignals *signals,
                                  struct shim_dwin *dwin, const void *src, size_t bytes,
                                  int peer, size_t offset, int sig, int ctx,
                                  cudaStream_t stream);
ncclResult_t shim_dwin_wait_signal(struct ncclComm *comm, struct shim_dsignals *signals,
                                   int peer, int sig, int ctx, uint32_t count,
                                   cudaStream_t stream);
/* At teardown: unmaps the peers' signal words and frees this rank's. NULL is ignored. */
void shim_dsignals_free(struct shim_dsignals *signals);

#endif
