/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gather_perf: the gather row of the benchmark, as nccl-tests' gather.cu. A size is the bytes
 * the root receives; each rank sends one n-th of it (the count argument), and rank i's block
 * lands at recvbuf + i * count on the root (other ranks' receive buffers are not written, and
 * not checked). In place, sendbuf == recvbuf + rank * count, as NCCL defines it at the root.
 * Rank r's block holds data.c's values for (r, i). algbw counts the root's buffer, of which
 * all but its own block crosses the wire: busbw = algbw * (n - 1) / n.
 */

#include "bench.h"

static size_t
gather_expect(const struct bench_ctx *ctx, void *expected)
{
    size_t block = ctx->counts.param * ctx->data->size;

    if (ctx->rank != ctx->root)
        return 0;
    for (int r = 0; r < ctx->nranks; r++)
        bench_data_fill(ctx->data, (char *)expected + (size_t)r * block, ctx->counts.param, r, 0);
    return ctx->counts.recv;
}

static ncclResult_t
gather_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    return ncclGather(send, recv, ctx->counts.param, ctx->type, ctx->root, ctx->comm,
                      ctx->stream);
}

const struct bench_coll bench_gather = {
    .name = "gather",
    .reduces = false,
    .rooted = true,
    .counts = bench_counts_gathered,
    .alg_bytes = bench_alg_bytes_per_rank,
    .bus_factor = bench_bus_factor_ring,
    .fill = bench_fill_own,
    .expect = gather_expect,
    .run = gather_run,
};
