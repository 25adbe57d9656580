/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reduce_perf: the reduce row of the benchmark, as nccl-tests' reduce.cu. Every rank sends
 * `count` elements; the root receives their reduction (other ranks' receive buffers are not
 * written, and not checked). In place, sendbuf == recvbuf. Rank r puts in data.c's values for
 * (r, i). algbw counts the buffer once, which a chain or tree moves once through every rank,
 * so busbw = algbw.
 */

#include "bench.h"

static void
reduce_counts(size_t count, int nranks, struct bench_counts *out)
{
    (void)nranks;
    out->send = count;
    out->recv = count;
    out->param = count;
    out->send_inplace = 0;
    out->recv_inplace = 0;
}

static double
reduce_alg_bytes(size_t count, size_t elt_size, int nranks)
{
    (void)nranks;
    return (double)count * (double)elt_size;
}

static double
reduce_bus_factor(int nranks)
{
    (void)nranks;
    return 1.0;
}

static void
reduce_fill(const struct bench_ctx *ctx, void *input)
{
    bench_data_fill(ctx->data, input, ctx->counts.send, ctx->rank, 0);
}

static size_t
reduce_expect(const struct bench_ctx *ctx, void *expected)
{
    if (ctx->rank != ctx->root)
        return 0;
    bench_data_reduce(ctx->data, expected, ctx->counts.recv, 0);
    return ctx->counts.recv;
}

static ncclResult_t
reduce_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    return ncclReduce(send, recv, ctx->counts.param, ctx->type, ctx->op, ctx->root, ctx->comm,
                      ctx->stream);
}

const struct bench_coll bench_reduce = {
    .name = "reduce",
    .reduces = true,
    .rooted = true,
    .counts = reduce_counts,
    .alg_bytes = reduce_alg_bytes,
    .bus_factor = reduce_bus_factor,
    .fill = reduce_fill,
    .expect = reduce_expect,
    .run = reduce_run,
};
