/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reduce_scatter_perf: the reduce-scatter row of the benchmark, as nccl-tests'
 * reduce_scatter.cu. A size is the bytes every rank sends: n blocks of `count` elements (the
 * count argument), block i reduced over all ranks into rank i's receive buffer. In place, a
 * rank's output is its own block of the send buffer (recvbuf == sendbuf + rank * count).
 * Rank r puts in data.c's values for (r, i) over the whole buffer, so rank i must end with
 * the reduction of elements i * count .. (i + 1) * count - 1. algbw counts the send buffer;
 * each rank sends and receives (n - 1) / n of it, so busbw = algbw * (n - 1) / n.
 */

#include "bench.h"

static size_t
reduce_scatter_expect(const struct bench_ctx *ctx, void *expected)
{
    bench_data_reduce(ctx->data, expected, ctx->counts.recv,
                      ctx->counts.param * (size_t)ctx->rank);
    return ctx->counts.recv;
}

static ncclResult_t
reduce_scatter_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    return ncclReduceScatter(send, recv, ctx->counts.param, ctx->type, ctx->op, ctx->comm,
                             ctx->stream);
}

const struct bench_coll bench_reduce_scatter = {
    .name = "reduce_scatter",
    .reduces = true,
    .rooted = false,
    .counts = bench_counts_scattered,
    .alg_bytes = bench_alg_bytes_per_rank,
    .bus_factor = bench_bus_factor_ring,
    .fill = bench_fill_own,
    .expect = reduce_scatter_expect,
    .run = reduce_scatter_run,
};
