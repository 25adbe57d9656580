/* SPDX-License-Identifier: Apache-2.0 */
/*
 * alltoall_perf: the all-to-all row of the benchmark, as nccl-tests' alltoall.cu. A size is
 * the bytes each rank sends: n blocks of `count` elements (the count argument), block j for
 * rank j; rank i's block lands at recvbuf + i * count. In place, sendbuf == recvbuf, as
 * nccl-tests runs it. Rank r's send buffer holds data.c's values for (r, i) over the whole
 * buffer, so rank r must receive from rank i its elements r * count .. (r + 1) * count - 1.
 * algbw counts the send buffer; all but a rank's own block cross the wire, so busbw =
 * algbw * (n - 1) / n.
 */

#include "bench.h"

static void
alltoall_counts(size_t count, int nranks, struct bench_counts *out)
{
    out->param = count / (size_t)nranks;
    out->send = out->param * (size_t)nranks;
    out->recv = out->param * (size_t)nranks;
    out->send_inplace = 0;
    out->recv_inplace = 0;
}

static size_t
alltoall_expect(const struct bench_ctx *ctx, void *expected)
{
    size_t block = ctx->counts.param;

    for (int i = 0; i < ctx->nranks; i++)
        bench_data_fill(ctx->data, (char *)expected + (size_t)i * block * ctx->data->size,
                        block, i, block * (size_t)ctx->rank);
    return ctx->counts.recv;
}

static ncclResult_t
alltoall_run(const struct bench_ctx *ctx, const void *send, void *recv)
{
    return ncclAlltoAll(send, recv, ctx->counts.param, ctx->type, ctx->comm, ctx->stream);
}

const struct bench_coll bench_alltoall = {
    .name = "alltoall",
    .reduces = false,
    .rooted = false,
    .counts = alltoall_counts,
    .alg_bytes = bench_alg_bytes_per_rank,
    .bus_factor = bench_bus_factor_ring,
    .fill = bench_fill_own,
    .expect = alltoall_expect,
    .run = alltoall_run,
};
