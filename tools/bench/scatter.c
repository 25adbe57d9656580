/* SPDX-License-Identifier: Apache-2.0 */
/*
 * scatter_perf: the scatter row of the benchmark, as nccl-tests' scatter.cu. A size is the
 * bytes the root sends: n blocks of `count` elements (the count argument), block i to rank i.
 * In place, recvbuf == sendbuf + rank * count, as NCCL defines it at the root. The root's
 * block i holds data.c's values for (i, e), so rank i must end with exactly those. algbw
 * counts the root's buffer, of which all but its own block crosses the wire: busbw =
 * algbw * (n - 1) / n.
 */

#include "bench.h"

static void
scatter_fill(const struct bench_ctx *ctx, void *input)
{
    size_t block = ctx->counts.param * ctx->data->size;

    if (ctx->rank != ctx->root)
        return;
    for (int r = 0; r < ctx->nranks; r++)
        bench_data_fill(ctx->data, (char *)input + (size_t)r * block, ctx->counts.param, r, 0);
}

static size_t
scatter_expect(const struct bench_ctx *ctx, void *expected)
{
    bench_data_fill(ctx->data, expected, ctx->counts.recv, ctx->rank, 0);
    return ctx->counts.recv;
}

static ncclResult_t
scatter_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    return ncclScatter(send, recv, ctx->counts.param, ctx->type, ctx->root, ctx->comm,
                       ctx->stream);
}

const struct bench_coll bench_scatter = {
    .name = "scatter",
    .reduces = false,
    .rooted = true,
    .counts = bench_counts_scattered,
    .alg_bytes = bench_alg_bytes_per_rank,
    .bus_factor = bench_bus_factor_ring,
    .fill = scatter_fill,
    .expect = scatter_expect,
    .run = scatter_run,
};
