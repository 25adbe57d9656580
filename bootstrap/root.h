/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap root (root.c): a thread that collects one hello from each of nranks ranks,
 * all carrying the id's secret, and sends every rank the table of their blobs. bootstrap.c
 * starts one per unique id it makes, and on rank 0 for an id from NCCL_COMM_ID.
 */
#ifndef SHIM_ROOT_H
#define SHIM_ROOT_H

#include <nccl.h>
#include <stdint.h>

#include "socket.h"

/* Starts a detached root thread on listen_fd (bound to addr), which it then owns and closes;
 * it serves one rendezvous under `secret`, or gives up after timeout_ms. On failure the fd
 * stays the caller's: ncclSystemError (no thread, no random session) with a WARN. */
ncclResult_t shim_root_start(int listen_fd, const union shim_sockaddr *addr, uint64_t secret,
                             int64_t timeout_ms);

/* Root threads of this process still running, for tests and leak checks. */
int shim_root_count(void);

#endif
