/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Descriptor pieces that several collectives share, as nccl-tests' getCollByteCount and getBw
 * define them: the "one buffer of count elements" shape (all-reduce, broadcast, reduce,
 * sendrecv: algbw counts the buffer once), the gathered and scattered shapes (a size is n
 * blocks of count/n elements, one per rank, algbw counting all of them), the (n-1)/n bus
 * factor, and each rank filling its own input.
 */
#include "bench.h"

void
bench_counts_one_buffer(size_t count, int nranks, struct bench_counts *out)
{
    (void)nranks;
    out->send = count;
    out->recv = count;
    out->param = count;
    out->send_inplace = 0;
    out->recv_inplace = 0;
}

double
bench_alg_bytes_one_buffer(size_t count, size_t elt_size, int nranks)
{
    (void)nranks;
    return (double)count * (double)elt_size;
}

double
bench_bus_factor_one(int nranks)
{
    (void)nranks;
    return 1.0;
}

void
bench_fill_own(const struct bench_ctx *ctx, void *input)
{
    bench_data_fill(ctx->data, input, ctx->counts.send, ctx->rank, 0);
}

void
bench_counts_gathered(size_t count, int nranks, struct bench_counts *out)
{
    out->param = count / (size_t)nranks;
    out->send = out->param;
    out->recv = out->param * (size_t)nranks;
    out->send_inplace = out->param;
    out->recv_inplace = 0;
}

void
bench_counts_scattered(size_t count, int nranks, struct bench_counts *out)
{
    out->param = count / (size_t)nranks;
    out->send = out->param * (size_t)nranks;
    out->recv = out->param;
    out->send_inplace = 0;
    out->recv_inplace = out->param;
}

double
bench_alg_bytes_per_rank(size_t count, size_t elt_size, int nranks)
{
    return (double)count * (double)elt_size * nranks;
}

double
bench_bus_factor_ring(int nranks)
{
    return (double)(nranks - 1) / nranks;
}
