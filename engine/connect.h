/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator's connections (connect.c): its transport worker and its endpoints to every
 * peer, then what its ranks share: a shared-memory team where they share a host, and the row
 * of the device back-end table (backend.h) that carries its operations on device memory. The
 * communicator's lifecycle (nccl_shim/comm.c, split.c) makes and ends them through these.
 */
#ifndef SHIM_CONNECT_H
#define SHIM_CONNECT_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>

#include "algorithms/alg.h"

struct ncclComm;

/* The cost model's parameters: the user's (NCCLSHIM_ALPHA_US, ...), else defaults for the
 * transports UCX_TLS lets UCX use (inside a host TCP's when it leaves shared memory out). */
struct alg_cost_params shim_connect_cost_params(void);

/* Opens comm's worker (comm->tp). */
ncclResult_t shim_connect_open(struct ncclComm *comm);
/* The worker's address, which the peers connect to: valid until shim_connect_close. */
ncclResult_t shim_connect_address(const struct ncclComm *comm, const void **addr_out,
                                  size_t *len_out);
/* Collective: connects to every rank's address (addrs[r], lens[r]; this rank's own is not
 * read), forms the shared-memory team if every rank runs on this host (going without one is
 * no error), then chooses the device back-end (comm->backend). */
ncclResult_t shim_connect_peers(struct ncclComm *comm, const void *const *addrs,
                                const size_t *lens);
/* Suspension: the shared-memory slots go, once the peers read this rank's last chunk. */
void shim_connect_suspend(struct ncclComm *comm);
/* Teardown: the device back-end's state (abort: streams waiting on this rank's operations are
 * released, not waited for), then the shared-memory team, then the worker (and with it every
 * registration and key of the windows on it). */
void shim_connect_close(struct ncclComm *comm, bool abort);

#endif
