/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport contract: tagged point-to-point messages between the ranks of one
 * communicator, in which nothing blocks except tp_worker_wait. Each communicator owns one
 * worker. ucx.c is the only implementation and the only file that includes ucp.h.
 *
 * Posting returns at once; a request is then tested until done ("not yet" is an answer).
 * Tags are chosen by the executor and unique per message (see engine/tag.h), so receives
 * match exactly. A worker is driven by one thread at a time, not always the same one;
 * different workers may be driven by different threads at the same time.
 *
 * Connections are completed lazily, by the first messages, while both ranks progress. Until
 * then a waiting rank may wake more often than it needs to (see tp_worker_wait), so init
 * does well to end with one message each way between the ranks that will talk.
 *
 * Errors, each with a WARN naming our rank, the peer, the tag and the length:
 * ncclRemoteError when a peer failed or went away; ncclInvalidUsage when a message's length
 * differs from the receive's (the ranks disagree on the operation); ncclSystemError for any
 * other UCX failure; ncclInternalError when the caller breaks this contract (posting on a
 * request in use, a peer without an endpoint, connecting twice). A request fails only for its
 * own peer; that a peer gave up because of a third rank travels as a failure notice
 * (tp_worker_notice_send), which the caller weighs.
 */
#ifndef TP_TRANSPORT_H
#define TP_TRANSPORT_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tp_worker;

/* One outstanding send or receive. Owned by the caller, who may copy or move it (the
 * transport keeps no pointer to it); filled by post, released by test (once done, whether it
 * succeeded or failed) or by cancel. A zeroed request is idle, and test calls it done. */
struct tp_request {
    void *handle;        /* transport's in-flight request, NULL when complete or idle */
    size_t expected_len; /* the length posted; for receives, the length the schedule expects */
    int peer;            /* for error messages */
    bool active;         /* posted, and not yet reported done by test */
};

/* Creates a worker with its own address. Honours UCX's own environment (UCX_TLS, ...).
 * The process-wide UCX context is created on first use and released with the last worker. */
ncclResult_t tp_worker_create(struct tp_worker **worker_out);
/* Closes every endpoint without waiting on any peer and frees the worker. Always returns,
 * within about a second at worst. Requests still outstanding are withdrawn and reclaimed:
 * the caller's struct tp_request copies are stale afterwards, and their buffers free once
 * this returns. Nothing is flushed, and peers see this worker's endpoints fail (their
 * tp_worker_failed_peer names it): tear down after the last exchange finished on all ranks. */
void tp_worker_destroy(struct tp_worker *worker);

/* The worker's address blob, valid until the worker is destroyed; exchanged at bootstrap. */
ncclResult_t tp_worker_address(struct tp_worker *worker, const void **addr_out, size_t *len_out);
/* Creates an endpoint to every rank but `self` from the exchanged addresses (addrs[self] is
 * not read). Once per worker. A peer that dies then shows as an error, never as a hang. */
ncclResult_t tp_worker_connect(struct tp_worker *worker, int nranks, int self,
                               const void *const *addrs, const size_t *lens);

/* Sends len bytes (buf may be NULL when len is 0) to `peer`, which must not be `self`. buf
 * stays the caller's to keep intact until test says done; a send may be done at once. */
ncclResult_t tp_send_post(struct tp_worker *worker, int peer, const void *buf, size_t len,
                          uint64_t tag, struct tp_request *req);
/* Receives exactly `tag` (the source rank is part of the tag); `peer` names the sender, for
 * messages and to fail the receive if that peer fails. A message of another length than
 * `len` completes with an error. A receive is never done at post: test it. */
ncclResult_t tp_recv_post(struct tp_worker *worker, int peer, void *buf, size_t len,
                          uint64_t tag, struct tp_request *req);
/* *done_out = true once the request completed, and the request is idle again. An error if
 * it failed (peer gone, length mismatch), with a WARN that names the peer, tag and length;
 * the request is then idle too. */
ncclResult_t tp_request_test(struct tp_worker *worker, struct tp_request *req, bool *done_out);
/* Cancels an outstanding request and releases it; safe on an idle request. A receive not yet
 * matched is withdrawn at once. A send, or a receive whose message is already streaming in,
 * cannot be withdrawn by UCX 1.13: it runs on until it ends or tp_worker_destroy, and its
 * buffer must stay valid until then. */
void tp_request_cancel(struct tp_worker *worker, struct tp_request *req);

/* Drives the transport; returns true if anything happened. Never blocks. */
bool tp_worker_progress(struct tp_worker *worker);
/* Sleeps until any of the workers has an event or timeout_ms passes (negative: no limit);
 * returns at once if one has events progress has not consumed. Spurious wakeups are fine:
 * callers progress, test, and wait again. Called by the thread driving all these workers.
 * This is how waiting ranks give the CPU to the ranks doing work. A worker whose wakeups
 * keep finding nothing to do (UCX's TCP while a connection is half open) is looked at on a
 * timer of at most 10 ms instead of its event fd, until progress finds work again. */
ncclResult_t tp_worker_wait(struct tp_worker *const *workers, int nworkers, int timeout_ms);

/* Remote memory access, for windows and one-sided signals. A rank registers memory (buf NULL:
 * the transport allocates len bytes, zeroed, in memory it can share between processes) and
 * hands the packed key to its peers, which unpack it against their endpoint to it. Puts and
 * atomic adds are posted and tested like messages (the request is done once the local buffer
 * may be reused; the target sees the bytes once a flush completed); tag only names the operation in messages. Where no transport does them in hardware
 * UCX emulates them with active messages, which the target's worker serves while it
 * progresses. Keys and registrations left at tp_worker_destroy go with the worker (keys after
 * a bounded flush, before the endpoints close, as UCX requires). */
struct tp_mem;
struct tp_rkey;
ncclResult_t tp_mem_register(struct tp_worker *worker, void *buf, size_t len,
                             struct tp_mem **mem_out);
void *tp_mem_base(const struct tp_mem *mem);
void tp_mem_packed(const struct tp_mem *mem, const void **packed_out, size_t *len_out);
/* Peers must have stopped reaching it (flushed their operations). NULL is ignored. */
void tp_mem_deregister(struct tp_worker *worker, struct tp_mem *mem);
ncclResult_t tp_rkey_unpack(struct tp_worker *worker, int peer, const void *packed,
                            struct tp_rkey **rkey_out);
/* After this rank flushed the operations that used it. NULL is ignored. */
void tp_rkey_release(struct tp_worker *worker, struct tp_rkey *rkey);
ncclResult_t tp_put_post(struct tp_worker *worker, int peer, const void *buf, size_t len,
                         uint64_t remote, const struct tp_rkey *rkey, uint64_t tag,
                         struct tp_request *req);
/* Adds *value (read before the request is done) to the 8 bytes at remote. */
ncclResult_t tp_atomic_add_post(struct tp_worker *worker, int peer, const uint64_t *value,
                                uint64_t remote, const struct tp_rkey *rkey, uint64_t tag,
                                struct tp_request *req);
/* Done once every put and atomic posted before it to peer (every peer: -1) reached its
 * target. (UCX 1.13's fence does not order operations that go over different transports, a
 * put over CMA and an atomic over shared memory, say: a flush does.) */
ncclResult_t tp_flush_post(struct tp_worker *worker, int peer, struct tp_request *req);

/* Whether a UCX_TLS value (NULL: unset) lets UCX use posix or sysv shared memory ("sm",
 * "shm" and "mm" name both), and whether it lets UCX use TCP; a leading '^' excludes. */
bool tp_tls_has_shm(const char *tls);
bool tp_tls_has_tcp(const char *tls);

/* Whether UCX moves CUDA device memory itself (the process's context reports the CUDA
 * memory type), so device buffers may go to tp_send_post and tp_recv_post as they are. */
bool tp_cuda_memory(void);

/* A peer whose endpoint reported an error; -1 if none. Set from UCX's error callback during
 * progress, also when the peer destroyed its worker in an orderly teardown. Over TCP a dead
 * peer shows at once; over shared memory, by UCX's keepalive within UCX_KEEPALIVE_INTERVAL
 * (20 s by default) once its process is gone (a zombie not yet reaped still looks alive). */
int tp_worker_failed_peer(const struct tp_worker *worker);

/* Failure notices: how a rank whose operations on this worker failed for good (its
 * communicator failed) tells the peers that wait on it, which no endpoint error would tell
 * while it stays up (to shrink, say). tp_worker_notice_send sends one small message with
 * `why` (its first 255 bytes) to every peer whose endpoint has not failed; once per worker,
 * later calls do nothing. Nothing blocks: the notices go out as the worker progresses (or
 * with tp_worker_destroy's bounded flush), outside the executor's tags, and a peer already
 * gone simply misses its own. A peer records them as its worker progresses: tp_worker_noticed
 * says whether `peer` sent one, tp_worker_notice_first names the first sender (-1 if none
 * came) and its text (valid until the worker is destroyed). An orderly teardown sends none. */
void tp_worker_notice_send(struct tp_worker *worker, const char *why);
bool tp_worker_noticed(const struct tp_worker *worker, int peer);
int tp_worker_notice_first(const struct tp_worker *worker, const char **why_out);

#endif
