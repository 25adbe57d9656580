/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every kind of window shares (signal.c): the numbering of the signal words, letting
 * their waits go at teardown, how a peer's registered memory is named, and the rule for the
 * streams of one-sided calls on device memory.
 */
#ifndef SHIM_SIGNAL_H
#define SHIM_SIGNAL_H

#include <cuda.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

/* Signal words, per source rank: sigIdx 0..15, ctx 0..7 (NCCL itself takes only 0 and 0). A
 * rank's words are numbered [source rank][sigIdx][ctx]. */
#define SHIM_SIGNAL_IDXS 16
#define SHIM_SIGNAL_CTXS 8
#define SHIM_SIGNAL_WORDS_PER_RANK (SHIM_SIGNAL_IDXS * SHIM_SIGNAL_CTXS)

static inline size_t
shim_signal_word(int rank, int sig, int ctx)
{
    return ((size_t)rank * SHIM_SIGNAL_IDXS + (size_t)sig) * SHIM_SIGNAL_CTXS + (size_t)ctx;
}

/* All of a rank's signal words: one per (source rank, sigIdx, ctx). */
static inline size_t
shim_signal_words(int nranks)
{
    return (size_t)nranks * SHIM_SIGNAL_WORDS_PER_RANK;
}

/* Teardown: every stream waiting on one of nwords words (host-visible 32-bit counts) for
 * the count in counted goes on: the word is written up to it from the host. */
void shim_signal_release_waits(volatile uint32_t *words, const uint32_t *counted,
                               size_t nwords);

/* A rank's memory registered with UCX, as another rank reaches it. */
struct tp_rkey;
struct shim_remote {
    uint64_t base;
    uint64_t size;
    struct tp_rkey *rkey;     /* NULL for this rank itself and for an empty part */
};

struct gpu_device;
/* Stream is one of gpu's (its primary context's) and not being captured (the one-sided
 * calls on device memory pick numbers when they are made, which a graph would replay);
 * ncclInvalidArgument or ncclInvalidUsage with a WARN naming api otherwise. */
ncclResult_t shim_signal_check_stream(const struct gpu_device *gpu, cudaStream_t stream,
                                      const char *api);

#endif
