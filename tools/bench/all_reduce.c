/* SPDX-License-Identifier: Apache-2.0 */
/*
 * all_reduce_perf: the all-reduce row of the benchmark, as nccl-tests' all_reduce.cu.
 * Every rank sends and receives `count` elements, in place at the same address. Rank r puts
 * in data.c's values for (r, i); every rank must end with their reduction over all ranks.
 * algbw counts the buffer once; a ring moves 2 (n - 1) / n of it through each rank, so
 * busbw = algbw * 2 (n - 1) / n, which makes rank counts comparable.
 */

#include "bench.h"

static void
all_reduce_counts(size_t count, int nranks, struct bench_counts *out)
{
    (void)nranks;
    out->send = count;
    out->recv = count;
    out->param = count;
    out->send_inplace = 0;
    out->recv_inplace = 0;
}

static double
all_reduce_alg_bytes(size_t count, size_t elt_size, int nranks)
{
    (void)nranks;
    return (double)count * (double)elt_size;
}

static double
all_reduce_bus_factor(int nranks)
{
    return 2.0 * (nranks - 1) / nranks;
}

static void
all_reduce_fill(const struct bench_ctx *ctx, void *input)
{
    bench_data_fill(ctx->data, input, ctx->counts.send, ctx->rank, 0);
}

static size_t
all_reduce_expect(const struct bench_ctx *ctx, void *expected)
{
    bench_data_reduce(ctx->data, expected, ctx->counts.recv, 0);
    return ctx->counts.recv;
}

static ncclResult_t
all_reduce_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    return ncclAllReduce(send, recv, ctx->counts.param, ctx->type, ctx->op, ctx->comm,
                         ctx->stream);
}

const struct bench_coll bench_all_reduce = {
    .name = "all_reduce",
    .reduces = true,
    .rooted = false,
    .counts = all_reduce_counts,
    .alg_bytes = all_reduce_alg_bytes,
    .bus_factor = all_reduce_bus_factor,
    .fill = all_reduce_fill,
    .expect = all_reduce_expect,
    .run = all_reduce_run,
};
