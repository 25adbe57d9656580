/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Windows (ncclCommWindowRegister) and the one-sided operations on them: ncclPutSignal,
 * ncclSignal, ncclWaitSignal, on host memory. A window is collective: every rank registers
 * its part in the same order, so the n-th window of a communicator is the same window on
 * every rank, and its number is all a rank needs to name a peer's part.
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
 * signal (sig_idx, ctx) from this rank by one. Returns once src may be reused; peer sees the
 * data once its ncclWaitSignal has counted the signal. */
ncclResult_t shim_put_signal(struct ncclComm *comm, const void *src, size_t bytes, int peer,
                             ncclWindow_t win, size_t offset, int sig_idx, int ctx);
/* Returns once every descriptor's peer raised its signal opCnt more times than the waits
 * before counted, and their data is in this rank's windows. */
ncclResult_t shim_wait_signal(struct ncclComm *comm, const ncclWaitSignalDesc_t *descs,
                              int ndescs);

/* At teardown, after the transport's worker is gone: frees the windows and what sends
 * were still holding. */
void shim_windows_free(struct ncclComm *comm);

#endif
