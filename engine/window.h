/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Windows (ncclCommWindowRegister) and the one-sided operations on them: ncclPutSignal,
 * ncclSignal, ncclWaitSignal, as the ABI's entry points hand them over (window.c), carried
 * out by the row of the window table (window_row.h) that serves the communicator's windows:
 * host memory, device memory of ranks that share a host, or of ranks that do not. A
 * communicator's windows are all of one row, which its first window decides: the signals,
 * which name no window, follow it. A window is collective: every rank registers its part in
 * the same order, so the n-th window of a communicator is the same window on every rank, and
 * its number is all a rank needs to name a peer's part.
 */
#ifndef SHIM_WINDOW_H
#define SHIM_WINDOW_H

#include <nccl.h>
#include <stddef.h>

struct ncclComm;

/* Registers buff (size bytes) as this rank's part of the communicator's next window. */
ncclResult_t shim_window_register(struct ncclComm *comm, void *buff, size_t size,
                                  ncclWindow_t *win_out);
ncclResult_t shim_window_deregister(struct ncclComm *comm, ncclWindow_t win);
/* This rank's part: where it was registered. */
ncclResult_t shim_window_user_ptr(struct ncclComm *comm, ncclWindow_t win, void **ptr_out);

/* Writes bytes of src into peer's part of win at offset (bytes 0: none), then raises peer's
 * signal (sig_idx, ctx) from this rank by one. Host windows: returns once src may be reused,
 * and peer sees the data once its ncclWaitSignal has counted the signal. Device windows: the
 * same, in stream order on stream. */
ncclResult_t shim_put_signal(struct ncclComm *comm, const void *src, size_t bytes, int peer,
                             ncclWindow_t win, size_t offset, int sig_idx, int ctx,
                             cudaStream_t stream);
/* Once every descriptor's peer raised its signal opCnt more times than the waits before
 * counted, and their data is in this rank's windows: host windows return then, device
 * windows hold stream until then. */
ncclResult_t shim_wait_signal(struct ncclComm *comm, const ncclWaitSignalDesc_t *descs,
                              int ndescs, cudaStream_t stream);

/* Peer's part of a device window at offset, as this process's device reaches it: a real
 * pointer (NCCL's device pointer queries). ncclInvalidUsage with a WARN naming api for a host
 * window, ncclInvalidArgument for a bad window, peer or offset. */
ncclResult_t shim_window_device_ptr(ncclWindow_t win, size_t offset, int peer, void **ptr_out,
                                    const char *api);

/* At teardown, after the transport's worker is gone: frees the windows and what sends
 * were still holding. */
void shim_windows_free(struct ncclComm *comm);

#endif
