/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernel_perf: GB/s of the host kernels alone (kernels/kernels.h), one thread, no
 * communicator: kr_copy_host, kr_copy_host_stream and kr_reduce_host's sum on float, half and
 * bfloat16, at sizes from 4 KiB to 256 MiB (x4 steps). GB/s is the bytes written (the
 * destination's size) per second, as nccl-tests' algbw counts one buffer; each figure is the
 * median of several samples, and a sample repeats the call until it lasts a few milliseconds.
 *
 * Two tables. "hot": the same buffers every call, so a size that fits in the caches stays
 * there. "cold": each call moves on to the next slice of 256 MiB pools, so every call starts
 * with source and destination out of cache (above 256 MiB / size, at least), which is what a
 * collective's final output sees. Built by the Makefile against the kernel objects alone
 * (kr_copy_host_stream is hidden in the library); usage: kernel_perf [-s samples] [-m maxMiB].
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels.h"

#define KP_POOL_BYTES ((size_t)256 << 20)
#define KP_SAMPLE_NS 4000000.0 /* a sample lasts at least 4 ms */

enum kp_kernel { KP_COPY, KP_STREAM, KP_F32, KP_F16, KP_BF16, KP_NKERNELS };

static const char *const kp_names[KP_NKERNELS] = {"copy", "copy_stream", "float_sum",
                                                  "half_sum", "bf16_sum"};

struct kp_pools {
    uint8_t *dst, *a, *b;
};

static double
kp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void
kp_run(enum kp_kernel k, void *dst, const void *a, const void *b, size_t bytes)
{
    struct kr_redop op = {.kind = KR_SUM, .divisor = 1};

    switch (k) {
    case KP_COPY:
        kr_copy_host(dst, a, bytes);
        return;
    case KP_STREAM:
        kr_copy_host_stream(dst, a, bytes);
        return;
    case KP_F32:
        op.type = ncclFloat32;
        break;
    case KP_F16:
        op.type = ncclFloat16;
        break;
    case KP_BF16:
        op.type = ncclBfloat16;
        break;
    case KP_NKERNELS:
        return;
    }
    kr_reduce_host(dst, a, b, bytes / kr_type_size(op.type), &op, 0);
}

static int
kp_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Median GB/s over `samples` samples; cold moves through the pools' slices call by call. */
static double
kp_measure(enum kp_kernel k, const struct kp_pools *p, size_t bytes, bool cold, int samples)
{
    size_t slices = cold && bytes < KP_POOL_BYTES ? KP_POOL_BYTES / bytes : 1;
    size_t next = 0;
    double gbs[64];

    /* Calibrate: how many calls make a sample of KP_SAMPLE_NS. */
    long reps = 1;
    for (;;) {
        double t0 = kp_now_ns();
        for (long r = 0; r < reps; r++, next = (next + 1) % slices) {
            size_t off = next * bytes;
            kp_run(k, p->dst + off, p->a + off, p->b + off, bytes);
        }
        double dt = kp_now_ns() - t0;
        if (dt >= KP_SAMPLE_NS / 4 || reps >= (1L << 24)) {
            reps = (long)((double)reps * KP_SAMPLE_NS / (dt > 1 ? dt : 1)) + 1;
            break;
        }
        reps *= 4;
    }
    for (int s = 0; s < samples; s++) {
        double t0 = kp_now_ns();
        for (long r = 0; r < reps; r++, next = (next + 1) % slices) {
            size_t off = next * bytes;
            kp_run(k, p->dst + off, p->a + off, p->b + off, bytes);
        }
        gbs[s] = (double)bytes * (double)reps / (kp_now_ns() - t0);
    }
    qsort(gbs, (size_t)samples, sizeof(gbs[0]), kp_cmp_double);
    return gbs[samples / 2];
}

/* Finite values of moderate size in every format, so no lane runs into an overflow. */
static void
kp_fill(struct kp_pools *p)
{
    uint16_t *h = (uint16_t *)p->a, *g = (uint16_t *)p->b;
    uint32_t x = 12345;

    for (size_t i = 0; i < KP_POOL_BYTES / 2; i++) {
        x = x * 1664525u + 1013904223u;
        /* Exponents 0x30..0x4f in the high byte: |v| in [2^-31, 2^32) as bf16 and the float
         * whose top half it is, in [2^-3, 2^5) as a half. */
        h[i] = (uint16_t)(((x >> 16) & 0x80ffu) | (0x3000u + ((x >> 4) & 0x0f00u)));
        g[i] = (uint16_t)(h[i] ^ 0x0055u);
    }
    memset(p->dst, 1, KP_POOL_BYTES);
}

int
main(int argc, char **argv)
{
    int samples = 7;
    size_t max_bytes = KP_POOL_BYTES;
    int c;

    while ((c = getopt(argc, argv, "s:m:")) != -1) {
        switch (c) {
        case 's':
            samples = atoi(optarg);
            break;
        case 'm':
            max_bytes = (size_t)atol(optarg) << 20;
            break;
        default:
            fprintf(stderr, "usage: %s [-s samples (1..63)] [-m max MiB (<= 256)]\n", argv[0]);
            return 2;
        }
    }
    if (samples < 1 || samples > 63 || max_bytes < 4096 || max_bytes > KP_POOL_BYTES) {
        fprintf(stderr, "%s: samples must be 1..63, max 1..256 MiB\n", argv[0]);
        return 2;
    }

    struct kp_pools p;
    if (posix_memalign((void **)&p.dst, 4096, KP_POOL_BYTES) != 0 ||
        posix_memalign((void **)&p.a, 4096, KP_POOL_BYTES) != 0 ||
        posix_memalign((void **)&p.b, 4096, KP_POOL_BYTES) != 0) {
        fprintf(stderr, "%s: cannot allocate 3 x %zu bytes\n", argv[0], KP_POOL_BYTES);
        return 1;
    }
    kp_fill(&p);

    for (int cold = 0; cold <= 1; cold++) {
        printf("# %s buffers, GB/s (bytes written / s), median of %d\n",
               cold ? "cold" : "hot", samples);
        printf("%10s", "bytes");
        for (int k = 0; k < KP_NKERNELS; k++) {
            printf(" %12s", kp_names[k]);
        }
        printf("\n");
        for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
            printf("%10zu", bytes);
            for (int k = 0; k < KP_NKERNELS; k++) {
                printf(" %12.2f", kp_measure((enum kp_kernel)k, &p, bytes, cold, samples));
            }
            printf("\n");
            fflush(stdout);
        }
    }
    free(p.dst);
    free(p.a);
    free(p.b);
    return 0;
}
