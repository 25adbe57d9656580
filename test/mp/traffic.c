/* SPDX-License-Identifier: Apache-2.0 */
/*
 * traffic: how many bytes one collective on device memory moves through each device's links,
 * as the driver's test double counts them (FAKE_CUDA_DEVICES devices, one rank on each:
 * link_in and link_out per device in fake_cuda_get_stats, this process's kernels and copies),
 * summed over every rank's process. S is the collective's size (the all-reduce's buffer, the
 * all-gather's whole output, the reduce-scatter's whole input, the broadcast's buffer); a
 * device's traffic is the larger of what came in and what went out. Rank 0 prints
 *
 *   device traffic: <collective> <n> ranks <size>: max <x> S through one device (bound <y> S)
 *
 * where the bound is what the textbook algorithm moves through each device: 2(n-1)/n S for a
 * ring all-reduce, (n-1)/n S for all-gather, reduce-scatter and all-to-all (S: a rank's whole
 * buffer), S for a pipelined broadcast and reduce (a chain), times 1.1; with NCCL_ALGO=Tree,
 * the binary tree's: 3 S for all-reduce, 2 S for broadcast. The result is checked
 * on every rank (reduce: on the root). With -b the bound is enforced too (a failed check past
 * it): test/mp/run.sh does so where the devices have peer access.
 *
 * Usage: traffic -c allreduce|allgather|reducescatter|broadcast|reduce|alltoall [-m MIB] [-b]
 */
#include "common.h"

#include <getopt.h>
#include <strings.h>

#include "device.h"

#define TR_MAX_DEVICES MP_FAKE_MAX_DEVICES

static struct mp_cuda tr_cu;

static void
tr_stats(struct mp_fake_stats *out)
{
    MP_ASSERT(tr_cu.fake_stats != NULL,
              "traffic needs the driver's test double (fake_cuda_get_stats)");
    tr_cu.fake_stats(out);
}

/* A device buffer of count floats, element i = value + i (exact in float up to 2^24). */
static float *
tr_buffer(size_t count, float value, CUstream s)
{
    float *host = malloc(count * sizeof(float));
    MP_ASSERT(host != NULL, "out of memory");
    for (size_t i = 0; i < count; i++) {
        host[i] = value + (float)(i % 4096);
    }
    float *dev = mp_cuda_alloc(&tr_cu, MP_MEM_DEVICE, count * sizeof(float));
    mp_cuda_copy(&tr_cu, dev, host, count * sizeof(float), s);
    free(host);
    return dev;
}

/* Elements of dev (count floats) that differ from want(i). */
static long
tr_wrong(const float *dev, size_t count, float (*want)(size_t, const void *), const void *arg,
         CUstream s)
{
    float *host = malloc(count * sizeof(float));
    long wrong = 0;

    MP_ASSERT(host != NULL, "out of memory");
    mp_cuda_copy(&tr_cu, host, dev, count * sizeof(float), s);
    for (size_t i = 0; i < count; i++) {
        wrong += host[i] != want(i, arg);
    }
    if (wrong && getenv("TRAFFIC_VERBOSE") != NULL) {
        size_t first = count, last = 0;
        for (size_t i = 0; i < count; i++) {
            if (host[i] != want(i, arg)) {
                first = i < first ? i : first;
                last = i;
            }
        }
        fprintf(stderr, "%ld wrong, elements %zu .. %zu\n", wrong, first, last);
    }
    free(host);
    return wrong;
}

struct tr_expect {
    int n;          /* ranks */
    size_t block;   /* elements per rank's block */
    int rank;
};

/* Rank r's input element i is r * 8192 + i % 4096: sums stay exact. */
static float
tr_sum(size_t i, const void *arg)
{
    const struct tr_expect *e = arg;
    float sum = 0;
    for (int r = 0; r < e->n; r++) {
        sum += (float)(r * 8192) + (float)(i % 4096);
    }
    return sum;
}

static float
tr_gathered(size_t i, const void *arg)
{
    const struct tr_expect *e = arg;
    return (float)((int)(i / e->block) * 8192) + (float)(i % e->block % 4096);
}

static float
tr_scattered_sum(size_t i, const void *arg)
{
    const struct tr_expect *e = arg;
    return tr_sum((size_t)e->rank * e->block + i, arg);
}

static float
tr_root0(size_t i, const void *arg)
{
    (void)arg;
    return (float)(i % 4096);
}

/* All-to-all: block p of rank q's output is block q of rank p's input. */
static float
tr_exchanged(size_t i, const void *arg)
{
    const struct tr_expect *e = arg;
    size_t p = i / e->block, j = i % e->block;
    return (float)((int)p * 8192) + (float)(((size_t)e->rank * e->block + j) % 4096);
}

int
main(int argc, char **argv)
{
    const char *coll = "allreduce";
    long mib = 64;
    bool enforce = false;
    int opt;

    while ((opt = getopt(argc, argv, "c:m:b")) != -1) {
        switch (opt) {
        case 'c':
            coll = optarg;
            break;
        case 'm':
            mib = strtol(optarg, NULL, 10);
            break;
        case 'b':
            enforce = true;
            break;
        default:
            fprintf(stderr, "usage: traffic -c allreduce|allgather|reducescatter|broadcast|"
                            "reduce|alltoall [-m MIB] [-b]\n");
            return 2;
        }
    }
    struct mp_world w;
    mp_cuda_init(&tr_cu);
    mp_world_init(&w);
    const int n = w.nranks;
    MP_ASSERT(n <= TR_MAX_DEVICES, "at most %d ranks", TR_MAX_DEVICES);
    const size_t total = (size_t)mib << 20, count = total / sizeof(float);
    const size_t block = count / (size_t)n;
    struct tr_expect e = {.n = n, .block = block, .rank = w.rank};
    CUstream s;
    MP_CU(&tr_cu, stream_create(&s, CU_STREAM_NON_BLOCKING));
    float *send = NULL, *recv = NULL;
    double bound;
    float (*want)(size_t, const void *) = NULL;
    size_t check_count;

    /* Inputs first (their copies count as traffic of their own), then the measured call. */
    /* NCCL_ALGO=Tree: the binary tree's bound, where the GPUs have one (all-reduce: each
     * node takes in two children's partials and its parent's result, and gives as much out;
     * broadcast: two children). */
    const char *algo = getenv("NCCL_ALGO");
    const bool tree = algo != NULL && strcasecmp(algo, "tree") == 0;
    if (strcmp(coll, "allreduce") == 0) {
        send = tr_buffer(count, (float)(w.rank * 8192), s);
        recv = mp_cuda_alloc(&tr_cu, MP_MEM_DEVICE, total);
        bound = tree ? 3.0 : 2.0 * (n - 1) / n;
        want = tr_sum;
        check_count = count;
    } else if (strcmp(coll, "allgather") == 0) {
        send = tr_buffer(block, (float)(w.rank * 8192), s);
        recv = mp_cuda_alloc(&tr_cu, MP_MEM_DEVICE, block * n * sizeof(float));
        bound = (double)(n - 1) / n;
        want = tr_gathered;
        check_count = block * (size_t)n;
    } else if (strcmp(coll, "reducescatter") == 0) {
        send = tr_buffer(block * (size_t)n, (float)(w.rank * 8192), s);
        recv = mp_cuda_alloc(&tr_cu, MP_MEM_DEVICE, block * sizeof(float));
        bound = (double)(n - 1) / n;
        want = tr_scattered_sum;
        check_count = block;
    } else if (strcmp(coll, "broadcast") == 0) {
        send = tr_buffer(count, 0, s);
        recv = mp_cuda_alloc(&tr_cu, MP_MEM_DEVICE, total);
        bound = tree ? 2.0 : 1.0;
        want = tr_root0;
        check_count = count;
    } else if (strcmp(coll, "reduce") == 0) {
        send = tr_buffer(count, (float)(w.rank * 8192), s);
        recv = mp_cuda_alloc(&tr_cu, MP_MEM_DEVICE, total);
        bound = 1.0;
        want = w.rank == 0 ? tr_sum : NULL;
        check_count = count;
    } else if (strcmp(coll, "alltoall") == 0) {
        send = tr_buffer(block * (size_t)n, (float)(w.rank * 8192), s);
        recv = mp_cuda_alloc(&tr_cu, MP_MEM_DEVICE, block * n * sizeof(float));
        bound = (double)(n - 1) / n;
        want = tr_exchanged;
        check_count = block * (size_t)n;
    } else {
        fprintf(stderr, "traffic: unknown collective %s\n", coll);
        return 2;
    }
    MP_CU(&tr_cu, stream_synchronize(s));
    mp_barrier(w.comm, n);
    struct mp_fake_stats before, after;
    tr_stats(&before);
    if (strcmp(coll, "allreduce") == 0) {
        MP_CHECK_COMM(w.comm, ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, w.comm, s));
    } else if (strcmp(coll, "allgather") == 0) {
        MP_CHECK_COMM(w.comm, ncclAllGather(send, recv, block, ncclFloat32, w.comm, s));
    } else if (strcmp(coll, "reducescatter") == 0) {
        MP_CHECK_COMM(w.comm, ncclReduceScatter(send, recv, block, ncclFloat32, ncclSum, w.comm,
                                                s));
    } else if (strcmp(coll, "broadcast") == 0) {
        MP_CHECK_COMM(w.comm, ncclBroadcast(send, recv, count, ncclFloat32, 0, w.comm, s));
    } else if (strcmp(coll, "reduce") == 0) {
        MP_CHECK_COMM(w.comm, ncclReduce(send, recv, count, ncclFloat32, ncclSum, 0, w.comm, s));
    } else {
        MP_CHECK_COMM(w.comm, ncclAlltoAll(send, recv, block, ncclFloat32, w.comm, s));
    }
    MP_EXPECT(mp_cuda_wait(&tr_cu, s, w.comm, 120) == ncclSuccess, "the %s did not finish",
              coll);
    /* Every rank's process launched what it launched by now: the leader's stream is done too
     * once every rank's stream passed its gate. */
    mp_barrier(w.comm, n);
    tr_stats(&after);
    if (getenv("TRAFFIC_VERBOSE") != NULL) { /* every process's own counts */
        for (int d = 0; d < n; d++) {
            fprintf(stderr, "rank %d: device %d in %llu out %llu (kernels %ld)\n", w.rank, d,
                    after.link_in[d] - before.link_in[d], after.link_out[d] - before.link_out[d],
                    after.kernels_launched - before.kernels_launched);
        }
    }
    MP_EXPECT(want == NULL || tr_wrong(recv, check_count, want, &e, s) == 0, "wrong %s result",
              coll);

    /* Every process's counts, summed on the host (host memory: no device traffic). */
    unsigned long long moved[2 * TR_MAX_DEVICES];
    for (int d = 0; d < TR_MAX_DEVICES; d++) {
        moved[d] = after.link_in[d] - before.link_in[d];
        moved[TR_MAX_DEVICES + d] = after.link_out[d] - before.link_out[d];
    }
    MP_CHECK_COMM(w.comm, ncclAllReduce(moved, moved, 2 * TR_MAX_DEVICES, ncclUint64, ncclSum,
                                        w.comm, NULL));
    double most = 0;
    int busiest = 0;
    for (int d = 0; d < n; d++) {
        unsigned long long through = moved[d] > moved[TR_MAX_DEVICES + d]
                                         ? moved[d]
                                         : moved[TR_MAX_DEVICES + d];
        if ((double)through > most) {
            most = (double)through;
            busiest = d;
        }
    }
    /* The all-reduce's, broadcast's and reduce's buffer; the whole of the others' larger one. */
    const bool blocks = strcmp(coll, "allgather") == 0 || strcmp(coll, "reducescatter") == 0 ||
                        strcmp(coll, "alltoall") == 0;
    const double size = blocks ? (double)(block * n * sizeof(float)) : (double)total;
    if (w.rank == 0) {
        printf("device traffic: %s %d ranks %ld MiB: max %.2f S through one device (bound "
               "%.2f S); device %d: %.2f S in, %.2f S out\n",
               coll, n, mib, most / size, 1.1 * bound, busiest,
               (double)moved[busiest] / size, (double)moved[TR_MAX_DEVICES + busiest] / size);
    }
    if (enforce) {
        MP_EXPECT(most <= 1.1 * bound * size, "%.2f S through device %d, past the bound %.2f S",
                  most / size, busiest, 1.1 * bound);
    }
    mp_cuda_free(&tr_cu, MP_MEM_DEVICE, send);
    mp_cuda_free(&tr_cu, MP_MEM_DEVICE, recv);
    MP_CHECK(ncclCommDestroy(w.comm));
    return mp_failures == 0 ? 0 : 1;
}
