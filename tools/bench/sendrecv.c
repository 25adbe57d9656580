/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sendrecv_perf: the point-to-point row of the benchmark, as nccl-tests' sendrecv.cu. Inside
 * one group, every rank sends `count` elements to rank r + 1 and receives as many from rank
 * r - 1 (modulo n: a ring; with one rank, a send to itself). In place, sendbuf == recvbuf,
 * which NCCL gives no order for, so in place is timed and not checked (#wrong N/A), as in
 * nccl-tests. Rank r sends data.c's values for (r, i) and must receive those of r - 1.
 * algbw counts one buffer, and every byte crosses one link, so busbw = algbw.
 */

#include "bench.h"

static void
sendrecv_counts(size_t count, int nranks, struct bench_counts *out)
{
    (void)nranks;
    out->send = count;
    out->recv = count;
    out->param = count;
    out->send_inplace = 0;
    out->recv_inplace = 0;
}

static double
sendrecv_alg_bytes(size_t count, size_t elt_size, int nranks)
{
    (void)nranks;
    return (double)count * (double)elt_size;
}

static double
sendrecv_bus_factor(int nranks)
{
    (void)nranks;
    return 1.0;
}

static void
sendrecv_fill(const struct bench_ctx *ctx, void *input)
{
    bench_data_fill(ctx->data, input, ctx->counts.send, ctx->rank, 0);
}

static size_t
sendrecv_expect(const struct bench_ctx *ctx, void *expected)
{
    int from = (ctx->rank + ctx->nranks - 1) % ctx->nranks;

    bench_data_fill(ctx->data, expected, ctx->counts.recv, from, 0);
    return ctx->counts.recv;
}

static ncclResult_t
sendrecv_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    int to = (ctx->rank + 1) % ctx->nranks, from = (ctx->rank + ctx->nranks - 1) % ctx->nranks;
    ncclResult_t res, end;

    res = ncclGroupStart();
    if (res != ncclSuccess)
        return res;
    res = ncclSend(send, ctx->counts.param, ctx->type, to, ctx->comm, ctx->stream);
    if (res == ncclSuccess)
        res = ncclRecv(recv, ctx->counts.param, ctx->type, from, ctx->comm, ctx->stream);
    /* The group is closed whatever happened, so that the next call does not land in it. */
    end = ncclGroupEnd();
    return res != ncclSuccess ? res : end;
}

const struct bench_coll bench_sendrecv = {
    .name = "sendrecv",
    .reduces = false,
    .rooted = false,
    .in_place_unchecked = true,
    .counts = sendrecv_counts,
    .alg_bytes = sendrecv_alg_bytes,
    .bus_factor = sendrecv_bus_factor,
    .fill = sendrecv_fill,
    .expect = sendrecv_expect,
    .run = sendrecv_run,
};
