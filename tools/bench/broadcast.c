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
broadcast_counts(size_t count, int nranks, struct bench_counts *out)
{
    (void)nranks;
    out->send = count;
    out->recv = count;
    out->param = count;
    out->send_inplace = 0;
    out->recv_inplace = 0;
}

static double
broadcast_alg_bytes(size_t count, size_t elt_size, int nranks)
{
    (void)nranks;
    return (double)count * (double)elt_size;
}

static double
broadcast_bus_factor(int nranks)
{
    (void)nranks;
    return 1.0;
}

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
    .counts = broadcast_counts,
    .alg_bytes = broadcast_alg_bytes,
    .bus_factor = broadcast_bus_factor,
    .fill = broadcast_fill,
    .expect = broadcast_expect,
    .run = broadcast_run,
};
