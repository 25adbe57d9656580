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
    .counts = bench_counts_one_buffer,
    .alg_bytes = bench_alg_bytes_one_buffer,
    .bus_factor = bench_bus_factor_one,
    .fill = bench_fill_own,
    .expect = sendrecv_expect,
    .run = sendrecv_run,
};
