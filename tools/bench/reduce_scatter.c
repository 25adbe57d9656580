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

static void
reduce_scatter_counts(size_t count, int nranks, struct bench_counts *out)
{
    out->param = count / (size_t)nranks;
    out->send = out->param * (size_t)nranks;
    out->recv = out->param;
    out->send_inplace = 0;
    out->recv_inplace = out->param;
}

static double
reduce_scatter_alg_bytes(size_t count, size_t elt_size, int nranks)
{
    return (double)count * (double)elt_size * nranks;
}

static double
reduce_scatter_bus_factor(int nranks)
{
    return (double)(nranks - 1) / nranks;
}

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
    .counts = reduce_scatter_counts,
    .alg_bytes = reduce_scatter_alg_bytes,
    .bus_factor = reduce_scatter_bus_factor,
    .fill = bench_fill_own,
    .expect = reduce_scatter_expect,
    .run = reduce_scatter_run,
};
