/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Descriptor pieces that several collectives share: the "one buffer of count elements" shape
 * (all-reduce, broadcast, reduce, sendrecv: send and receive count elements, in place at the
 * same address, algbw counting the buffer once) and each rank filling its own input.
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
