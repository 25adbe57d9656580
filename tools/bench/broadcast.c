/* SPDX-License-Identifier: Apache-2.0 */
/*
 * broadcast_perf: the broadcast row of the benchmark, as nccl-tests' broadcast.cu. The root
 * sends `count` elements and every rank receives them; in place, sendbuf == recvbuf (at the
 * root; other ranks only receive). The root puts in data.c's values for (root, i), which every
 * rank must end with. algbw counts the buffer once, and a pipelined chain or tree moves it
 * once through every rank, so busbw = algbw.
 */

#include "bench.h"

static void
broadcast_fill(const struct bench_ctx *ctx, void *input)
{
    if (ctx->rank == ctx->root)
        bench_data_fill(ctx->data, input, ctx->counts.send, ctx->root, 0);
}

static size_t
broadcast_expect(const struct bench_ctx *ctx, void *expected)
{
    bench_data_fill(ctx->data, expected, ctx->counts.recv, ctx->root, 0);
    return ctx->counts.recv;
}

static ncclResult_t
broadcast_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    return ncclBroadcast(send, recv, ctx->counts.param, ctx->type, ctx->root, ctx->comm,
                         ctx->stream);
}

const struct bench_coll bench_broadcast = {
    .name = "broadcast",
    .reduces = false,
    .rooted = true,
    .counts = bench_counts_one_buffer,
    .alg_bytes = bench_alg_bytes_one_buffer,
    .bus_factor = bench_bus_factor_one,
    .fill = broadcast_fill,
    .expect = broadcast_expect,
    .run = broadcast_run,
};
