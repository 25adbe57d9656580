/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Collectives and send/receive on device memory between the ranks of one host, through CUDA
 * IPC. A communicator whose ranks share a host (its shared-memory team, shm/) has one device
 * team. Each GPU the team's ranks use has a leader, the lowest rank on it, which carries out
 * that GPU's share of every operation with one kernel launch on a stream of its own (or, when
 * it is the GPU's only rank, on that rank's own stream: ownstream.c), reading and writing the
 * other ranks' buffers through IPC mappings of them (tasks.h: an all-reduce in parts, one per
 * GPU; the outputs of a GPU's own ranks; a send on the receiver's GPU). The other ranks'
 * streams only wait and signal.
 *
 * Why a leader per GPU: across GPUs, a single leader's GPU would carry every byte of every
 * rank over its own links (7 S in and out for an all-reduce of S at 8 GPUs, where a ring moves
 * 1.75 S through each). Why one leader for the ranks sharing a GPU: processes on one GPU have
 * one context each, and every hand-over of GPU work from one context to another costs about
 * 140 us (measured on an H100: docs/device.md, "Figures from a GPU"); one context per GPU runs
 * the kernels, and an operation reads each input once per GPU that needs it and writes each
 * output once.
 *
 * One operation, for rank r (post.c, leader.c):
 *
 *   r's host (the call)    describe the buffers (IPC handle, or a file descriptor sent over
 *                          each leader's Unix socket, or a staging copy), post a descriptor in
 *                          r's ring (shared memory), ring every leader's doorbell;
 *   r's stream (gated)     [copy staged inputs] write arrive_r = s | wait done_r[k] >= s for
 *                          every leader k | [copy staged outputs]
 *   leader k's thread      once every rank's descriptor of an operation is posted, map what is
 *                          not mapped yet (a cache), and enqueue on leader k's stream:
 *                          wait arrive_q >= s_q for every rank q taking part | kernel(s) of
 *                          its GPU's share | write done_q[k] for every rank q taking part
 *                          (alone on its GPU: build the same into a work area its rank's
 *                          stream already waits to run, and open it once they arrived)
 *
 * Waits between ranks are stream memory operations on flags in pinned shared memory, or the
 * host's; never a kernel spinning on another process's flag. A leader alone on its GPU (one
 * rank per GPU, as PyTorch runs) has no stream of its own: its call enqueues the GPU's share
 * on its own stream before anyone knows it, as a kernel reading its batch from a work area
 * the leader's thread fills once every rank posted, behind a word the thread opens once the
 * ranks taking part arrived (ownstream.c), so it returns at once and may be captured into a
 * CUDA graph with one hardware queue. Where a leader's stream and a rank's streams are of one
 * context (ranks sharing the leader's GPU, in its process: that context may have a single
 * hardware queue), a stream waits only for work already enqueued: the leader's stream waits
 * on an event of the leader rank's arrive, and a call there waits on the host until that
 * leader took its operations before its stream waits for done (an event, for the leader
 * rank), so such a call returns once the other ranks posted theirs. Other GPUs' leaders run
 * in contexts of their own. Buffers some leader cannot map (managed
 * or registered host memory, or device memory on a GPU a leader's cannot reach) are staged
 * through pinned shared host memory by their owner's stream, for every leader. cudaMalloc
 * memory that nobody registered is staged too, through a cuMem allocation of the owner's
 * device: its owner may free it at any time, and freeing memory another process maps through
 * a legacy IPC handle is undefined (cuIpcOpenMemHandle), while an imported cuMem handle keeps
 * memory alive.
 *
 * Once a stream of a rank is captured into a CUDA graph, that rank posts every operation from
 * its stream instead (hostpost.c): a host function numbers and posts when the stream gets
 * there, since a graph replays the values of its capture, and the stream then waits for a
 * release word of the group's that this rank's team thread opens once it is done (no host
 * function waits for GPU work).
 *
 * Every rank runs a thread per team: on a leader it schedules operations; on every rank it
 * watches them (a rank that died, NCCLSHIM_TIMEOUT) and keeps the team's error for
 * ncclCommGetAsyncError. Destroy and abort are local; abort releases every stream of this
 * rank that waits on the team, and a leader's own stream.
 */
#ifndef CIPC_CUDAIPC_H
#define CIPC_CUDAIPC_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "gpu/memory.h"
#include "gpu/pin.h"
#include "kernels/kernels.h"

struct shm_team;
struct cipc_team;
struct shim_log_scope;

/* The most ranks a device team serves: one kernel reduces all their inputs at once. */
#define CIPC_MAX_RANKS 64

struct cipc_team_args {
    struct shm_team *shm; /* every rank of the communicator, on this host */
    int device;           /* this rank's device ordinal; -1 if it has no device */
    /* reach[a * nranks + b]: rank a's process can map rank b's device memory (the same
     * device, or one with peer access), as every rank computed it at init. */
    const uint8_t *reach;
    /* Per rank: the lowest rank on the same GPU (by UUID), -1 without a device: the lowest
     * rank on each GPU leads it. */
    const int *first_on_device;
    /* Per rank: its device as this process numbers it; -1 where this process lacks it. */
    const int *device_here;
    uint64_t id;          /* the communicator's identity, for names and log lines */
    const struct alg_policy *policy; /* NCCL_ALGO and NCCLSHIM_ALGO, as the communicator parsed
                                        them (NULL: neither) */
    bool ready_now;       /* the program chose the device: register and make streams now
                             (else at the first device call: a program serving host memory
                             only makes no CUDA context) */
    struct shim_log_scope *log; /* the communicator's: the thread's WARNs land in its
                                   last-error text, its lines name its device */
};

/* Forms this rank's side of the team (collective only in that every rank of the shared-memory
 * team calls it during init: it talks to no one) and starts its thread. */
ncclResult_t cipc_team_create(const struct cipc_team_args *args, struct cipc_team **team_out);
/* Stops the thread and frees everything this rank holds: mappings, registrations, streams,
 * staging memory, sockets. Without abort it first waits, bounded by NCCLSHIM_TIMEOUT (or a
 * dead rank), for this rank's operations to finish. With abort it waits for nothing: every
 * stream that waits on this rank's operations is released, and on a leader its own
 * stream, whose pending kernels then run on whatever the buffers hold. */
void cipc_team_destroy(struct cipc_team *team, bool abort);

/* An operation of this rank, as the call made it (buffers classified by gpu_mem_query). */
struct cipc_op {
    enum alg_coll coll;       /* ALLREDUCE .. SCATTER, SEND, RECV */
    const void *send;         /* NULL where this rank does not use it */
    void *recv;
    struct gpu_mem_info send_mem, recv_mem;
    size_t count;             /* elements, as the NCCL call counts them */
    struct kr_redop redop;    /* resolved; the reducing collectives only */
    const void *scalar_dev;   /* PreMulSum, ncclScalarDevice: where this rank's scalar is */
    int root;                 /* root, or the peer of SEND and RECV */
    uint32_t match;           /* collectives: the communicator's collective number (the same on
                                 every rank); SEND/RECV: the k-th message of this pair */
};

/* Posts ops (a group's, in call order; one outside a group) and enqueues on stream (of ctx,
 * this rank's device's primary context) their staging copies in and the write of arrive; or,
 * posting from the stream (`capturing`: stream is being captured into a CUDA graph; or since
 * a capture), a host function that does it. Then cipc_post_launch enqueues the share that
 * runs on the stream, and cipc_post_wait the wait for done and the copies out. A caller with
 * several teams in one group arrives on all of them before it launches or waits on any: the
 * teams may be ranks of one clique. Outside the process of a GPU's leader that other ranks
 * share that GPU with, no call waits for another rank (the ring of descriptors is the one
 * bound: a rank CIPC_RING operations ahead of a leader waits for room); in it,
 * cipc_post_wait waits until that leader took the operations, and capturing is refused
 * (leaderstream.c). */
ncclResult_t cipc_post_arrive(struct cipc_team *team, const struct cipc_op *ops, int nops,
                              CUstream stream, bool capturing);
/* Between the two, once every team of the group arrived: enqueues on stream whatever of this
 * GPU's share runs there (a rank leading its own share: its work areas, which wait for the
 * other ranks' arrive; in one context, ranks of one process on one GPU, every arrive of the
 * group comes first on its streams, so none of those waits is ahead of it in a hardware
 * queue). A failure fails the team. */
ncclResult_t cipc_post_launch(struct cipc_team *team, CUstream stream);
ncclResult_t cipc_post_wait(struct cipc_team *team, CUstream stream);

/* A registered buffer's export (ncclCommRegister): pinned, the leaders keep their mappings.
 * The record is gpu/pin.h's, below the back-ends that hold it; this is the team's name for it
 * (its `how` an enum cipc_buf_how). */
#define cipc_pin gpu_pin

/* Exports the allocation bytes at ptr lie in now (device memory, mem as gpu_mem_query told)
 * and keeps it exported until cipc_team_unpin; pin->pinned is false where the leaders reach
 * the buffer without an export. */
ncclResult_t cipc_team_pin(struct cipc_team *team, const void *ptr, size_t bytes,
                           const struct gpu_mem_info *mem, struct cipc_pin *pin);
/* Ends one pin; the last lets the leaders unmap the allocation (at once if idle). */
ncclResult_t cipc_team_unpin(struct cipc_team *team, const struct cipc_pin *pin);

/* Makes a call of another thread waiting in this team (for a leader to take its operations,
 * or for room in the ring) give up within NCCLSHIM_WAIT_MS, and stops the team's thread:
 * the first step of abort. NULL: nothing. */
void cipc_team_interrupt(struct cipc_team *team);
/* Waits until every operation this rank posted is done (a host operation on the same
 * communicator comes after them). An error if the team failed or fails meanwhile. */
ncclResult_t cipc_team_drain(struct cipc_team *team);
/* After a drain: frees the staging areas (the leaders let their mappings go first); they are
 * made again when an operation needs them. */
ncclResult_t cipc_team_release_memory(struct cipc_team *team);
/* The device memory the team holds: its staging areas on the device. */
uint64_t cipc_team_device_bytes(const struct cipc_team *team);
/* The device memory it uses that suspension keeps: its device's pool of work areas, where
 * this rank is alone on its GPU (made with the team, shared by the process's teams there). */
uint64_t cipc_team_persistent_bytes(const struct cipc_team *team);
/* ncclSuccess, or the error that failed the team (a dead rank, a timeout, a CUDA error, an
 * operation the ranks disagree on). */
ncclResult_t cipc_team_error(const struct cipc_team *team);
/* Releases every stream waiting on this rank's operations now (ncclCommRevoke): those
 * operations' results are undefined. */
void cipc_team_release(struct cipc_team *team);
/* Whether this rank has operations posted and not done. */
bool cipc_team_busy(const struct cipc_team *team);
/* One line on where this rank's device operations stand, for hang reports. */
int cipc_team_describe(const struct cipc_team *team, char *buf, size_t len);

#endif
