/* SPDX-License-Identifier: Apache-2.0 */
/*
 * all_reduce_perf: the all-reduce row of the benchmark, as nccl-tests' all_reduce.cu.
 * Every rank sends and receives `count` elements, in place at the same address. Rank r puts
 * in data.c's values for (r, i); every rank must end with their reduction over all ranks.
 * algbw counts the buffer once; a ring moves 2 (n - 1) / n of it through each rank, so
 * busbw = algbw * 2 (n - 1) / n, which makes rank counts comparable.
 */

#include "bench.h"

static double
all_reduce_bus_factor(int nranks)
{
    return 2.0 * (nranks - 1) / nranks;
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
    .counts = bench_counts_one_buffer,
    .alg_bytes = bench_alg_bytes_one_buffer,
    .bus_factor = all_reduce_bus_factor,
    .fill = bench_fill_own,
    .expect = all_reduce_expect,
    .run = all_reduce_run,
};
