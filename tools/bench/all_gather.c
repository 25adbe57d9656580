/* SPDX-License-Identifier: Apache-2.0 */
/*
 * all_gather_perf: the all-gather row of the benchmark, as nccl-tests' all_gather.cu. A size
 * is the bytes every rank receives; each rank sends one n-th of it (the count argument), and
 * rank i's block lands at recvbuf + i * count on every rank. In place, a rank's input is its
 * own block of the receive buffer (sendbuf == recvbuf + rank * count). Rank r's block holds
 * data.c's values for (r, i). algbw counts the received buffer; a rank receives all blocks
 * but its own, so busbw = algbw * (n - 1) / n.
 */

#include "bench.h"

static size_t
all_gather_expect(const struct bench_ctx *ctx, void *expected)
{
    size_t block = ctx->counts.param * ctx->data->size;

    for (int r = 0; r < ctx->nranks; r++)
        bench_data_fill(ctx->data, (char *)expected + (size_t)r * block, ctx->counts.param, r, 0);
    return ctx->counts.recv;
}

static ncclResult_t
all_gather_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    return ncclAllGather(send, recv, ctx->counts.param, ctx->type, ctx->comm, ctx->stream);
}

const struct bench_coll bench_all_gather = {
    .name = "all_gather",
    .reduces = false,
    .rooted = false,
    .counts = bench_counts_gathered,
    .alg_bytes = bench_alg_bytes_per_rank,
    .bus_factor = bench_bus_factor_ring,
    .fill = bench_fill_own,
    .expect = all_gather_expect,
    .run = all_gather_run,
};
