/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Windows on device memory for communicators whose ranks span hosts (window_remote.c): no
 * process maps another's memory, so each part has a landing zone in pinned host memory (its
 * mirror), which peers write with UCX's remote memory access, and a proxy thread per
 * communicator, with a UCX worker of its own, moves the bytes on the host side:
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
#ifndef SHIM_WINDOW_REMOTE_H
#define SHIM_WINDOW_REMOTE_H

#include <cuda.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

struct ncclComm;
struct shim_blobs;
struct shim_rproxy; /* the communicator's proxy: its worker, logs, signal words, thread */
struct shim_rwin;   /* one window's mirror, staging ring and peers' mirrors */

/* This rank's part of a new window: its mirror registered, and (the communicator's first such
 * window) the proxy made; *blob_out (freed by the caller) describes them for the exchange. */
ncclResult_t shim_rwin_prepare(struct ncclComm *comm, struct shim_rproxy **proxy,
                               uint32_t id, void *buff, size_t size,
                               struct shim_rwin **rwin_out, void **blob_out, size_t *len_out);
/* With every rank's blob (blobs->data + offsets[r] + skip): the peers' keys taken, the proxy
 * connected and started the first time. */
ncclResult_t shim_rwin_attach(struct ncclComm *comm, struct shim_rproxy *proxy,
                              struct shim_rwin *rwin, const struct shim_blobs *blobs,
                              size_t skip);
/* Deregistering, before the exchange that tells the peers: waits until this rank's puts into
 * the window left (the proxy sent and flushed them). */
void shim_rwin_drain(struct shim_rwin *rwin);
/* After that exchange: once the proxy read what the peers put (bounded), unregisters and frees
 * it. NULL ignored. */
void shim_rwin_free(struct shim_rwin *rwin);
size_t shim_rwin_peer_size(const struct shim_rwin *rwin, int peer);

/* As window_device.h's, on stream (not captured). */
ncclResult_t shim_rwin_put_signal(struct ncclComm *comm, struct shim_rproxy *proxy,
                                  struct shim_rwin *rwin, const void *src, size_t bytes,
                                  int peer, size_t offset, int sig, int ctx,
                                  cudaStream_t stream);
ncclResult_t shim_rwin_wait_signal(struct ncclComm *comm, struct shim_rproxy *proxy, int peer,
                                   int sig, int ctx, uint32_t count, cudaStream_t stream);
/* Teardown: stops the proxy's thread and its worker (puts not yet sent are dropped); windows
 * freed afterwards wait for nothing. Then free: streams waiting for signals are let go. NULL
 * ignored. */
void shim_rproxy_stop(struct shim_rproxy *proxy);
void shim_rproxy_free(struct shim_rproxy *proxy);

#endif
