/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor: runs an op's schedule on the transport and the kernels as a non-blocking state
 * machine. shim_exec_progress advances one op as far as it can without waiting and never
 * blocks inside a step; shim_exec_run drives a set of ops (a group) to completion on the
 * calling thread, sleeping on transport events while nothing moves. A progress thread can
 * drive the same state machines later (device memory, stream ordered).
 */
#ifndef SHIM_EXEC_H
#define SHIM_EXEC_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "op.h"

struct shim_exec;

/* Chooses the algorithm, builds the schedule, allocates scratch and takes the communicator's
 * next sequence number (so ops must be created in the same order on every rank). */
ncclResult_t shim_exec_create(const struct shim_op *op, struct shim_exec **exec_out);
/* As shim_exec_create, for an op on device memory whose communicator has no device team: it
 * keeps the number it was issued with (op->seq), always runs a schedule, and runs on device
 * memory through a staging (gpu/staging.h), bound before it runs. direct: UCX takes device
 * memory as it is (tp_cuda_memory), and only scratch is staged. */
ncclResult_t shim_exec_create_staged(const struct shim_op *op, bool direct,
                                     struct shim_exec **exec_out);
/* The staging's pinned bytes a staged exec needs ... */
size_t shim_exec_staged_needs(const struct shim_exec *exec);
/* ... and its share of them, from this offset on; phases, when not NULL, adds up where its
 * steps' time goes (NCCLSHIM_STAGED_PHASES). */
struct gpu_staging;
struct shim_staged_phases;
ncclResult_t shim_exec_staged_bind(struct shim_exec *exec, struct gpu_staging *staging,
                                   size_t host_off, struct shim_staged_phases *phases);

/* Cancels whatever is still in flight and frees the op (keeping one spare per
 * communicator, which shim_exec_free_spare releases when the communicator goes). */
void shim_exec_destroy(struct shim_exec *exec);
void shim_exec_free_spare(struct ncclComm *comm);

/* Posts every step whose dependencies are done and tests what is in flight.
 * *progressed_out is set when anything changed. Errors are final for the op. */
ncclResult_t shim_exec_progress(struct shim_exec *exec, bool *progressed_out);
bool shim_exec_done(const struct shim_exec *exec);

/* Runs ops to completion together: the calling thread polls for NCCLSHIM_SPIN_US after the
 * last progress, then sleeps on the transports' events. An op's failure (or its
 * communicator's abort or revocation) stops the ops of that communicator, which keeps the
 * error for ncclCommGetAsyncError; the ops of the others run on to completion, so that their
 * peers are not left waiting. Returns the first failure. */
ncclResult_t shim_exec_run(struct shim_exec *const *execs, int nexecs);

/* Runs a schedule built by the caller (communicator management: split, shrink) to completion
 * on comm, with send/recv as its SEND and RECV buffers; takes the steps over. Its messages are
 * numbered per pair of ranks, so ranks that take no part stay in step with the others. */
ncclResult_t shim_exec_run_schedule(struct ncclComm *comm, struct alg_sched *sched,
                                    const void *send, void *recv);

/* Creates and runs one op, as a call outside a group does (and faster than create, run,
 * destroy on one host: no allocation, a few polls before the run loop). */
ncclResult_t shim_exec_run_one(const struct shim_op *op);

/* As shim_exec_run_schedule, without running it: for running several together. */
ncclResult_t shim_exec_create_schedule(struct ncclComm *comm, struct alg_sched *sched,
                                       const void *send, void *recv,
                                       struct shim_exec **exec_out);

/* The call an exec carries out, and its sequence number. */
const struct shim_op *shim_exec_op(const struct shim_exec *exec);
uint32_t shim_exec_seq(const struct shim_exec *exec);

/* One line on where an exec stands: what it is, how far it got, what and whom it waits for. */
int shim_exec_describe(const struct shim_exec *exec, char *buf, size_t len);

/* Runs one reduce or copy step on host buffers (bufs indexed by enum alg_buf). Shared with
 * the in-memory schedule tests so they compute exactly what the library does. */
void shim_exec_compute(uint8_t *const bufs[ALG_BUF_COUNT], const struct alg_step *step,
                       const struct kr_redop *redop);

#endif
