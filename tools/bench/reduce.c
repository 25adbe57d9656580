/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reduce_perf: the reduce row of the benchmark, as nccl-tests' reduce.cu. Every rank sends
 * `count` elements; the root receives their reduction (other ranks' receive buffers are not
 * written, and not checked). In place, sendbuf == recvbuf. Rank r puts in data.c's values for
 * (r, i). algbw counts the buffer once, which a chain or tree moves once through every rank,
 * so busbw = algbw.
 */

#include "bench.h"

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
    .counts = bench_counts_one_buffer,
    .alg_bytes = bench_alg_bytes_one_buffer,
    .bus_factor = bench_bus_factor_one,
    .fill = bench_fill_own,
    .expect = reduce_expect,
    .run = reduce_run,
};
