/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport contract: tagged point-to-point messages between the ranks of one
 * communicator, in which nothing blocks except tp_worker_wait. Each communicator owns one
 * worker. ucx.c is the only implementation and the only file that includes ucp.h.
 *
 * Posting returns at once; a request is then tested until done ("not yet" is an answer).
 * Tags are chosen by the executor and unique per message (see nccl_shim/tag.h), so receives
 * match exactly. A worker is driven by one thread at a time.
 */
#ifndef TP_TRANSPORT_H
#define TP_TRANSPORT_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tp_worker;

/* One outstanding send or receive. Owned by the caller, filled by post, released by test
 * (when done) or cancel. A zeroed request is idle. */
struct tp_request {
    void *handle;        /* transport's in-flight request, NULL when complete or idle */
    size_t expected_len; /* receives: the length the schedule expects */
    int peer;            /* for error messages */
    bool active;
};

/* Creates a worker with its own address. Honours UCX's own environment (UCX_TLS, ...).
 * The process-wide UCX context is created on first use and released with the last worker. */
ncclResult_t tp_worker_create(struct tp_worker **worker_out);
/* Closes every endpoint without waiting on any peer and frees the worker. Always returns. */
void tp_worker_destroy(struct tp_worker *worker);

/* The worker's address blob, valid until the worker is destroyed; exchanged at bootstrap. */
ncclResult_t tp_worker_address(struct tp_worker *worker, const void **addr_out, size_t *len_out);
/* Creates an endpoint to every rank but `self` from the exchanged addresses. */
ncclResult_t tp_worker_connect(struct tp_worker *worker, int nranks, int self,
                               const void *const *addrs, const size_t *lens);

ncclResult_t tp_send_post(struct tp_worker *worker, int peer, const void *buf, size_t len,
                          uint64_t tag, struct tp_request *req);
/* Receives exactly `tag` (the source rank is part of the tag); a message of another length
 * than `len` completes with an error. */
ncclResult_t tp_recv_post(struct tp_worker *worker, int peer, void *buf, size_t len,
                          uint64_t tag, struct tp_request *req);
/* *done_out = true once the request completed; an error if it failed (peer gone, length
 * mismatch), with a WARN that names the peer. */
ncclResult_t tp_request_test(struct tp_worker *worker, struct tp_request *req, bool *done_out);
/* Cancels an outstanding request and releases it; safe on an idle request. */
void tp_request_cancel(struct tp_worker *worker, struct tp_request *req);

/* Drives the transport; returns true if anything happened. Never blocks. */
bool tp_worker_progress(struct tp_worker *worker);
/* Sleeps until any of the workers has an event or timeout_ms passes (spurious wakeups are
 * fine). This is how waiting ranks give the CPU to the ranks doing work. */
ncclResult_t tp_worker_wait(struct tp_worker *const *workers, int nworkers, int timeout_ms);

/* A peer whose endpoint reported an error; -1 if none. Set from UCX's error callback. */
int tp_worker_failed_peer(const struct tp_worker *worker);

#endif
