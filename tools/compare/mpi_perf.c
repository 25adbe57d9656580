/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mpi_perf: the MPI side of `make compare`, built once per MPI (Open MPI, MPICH) from this
 * one file. It times all_reduce, all_gather, reduce_scatter, broadcast and alltoall on float32
 * with sum, over the same sizes as tools/bench (-b -e -f), with the same warm-up and
 * iteration counts (-w -n), and prints nccl-tests' rows: size, count, type, redop, root,
 * time, algbw, busbw, #wrong (out of place only). A size means what it means in
 * tools/bench: the larger of a rank's send and receive buffer, count the per-rank argument.
 *
 * As tools/bench, -w warm-up calls at the largest and at the smallest size first. Per size:
 * one checked call (like -c 1, but before timing), one untimed call, a barrier,
 * then the timed loop, each iteration at another offset as tools/bench does; the time
 * reported is the slowest rank's (MPI_MAX), as our bench with -a 3. algbw = bytes / time and
 * busbw = algbw * factor, the factors of nccl-tests: all-reduce 2(n-1)/n, all-gather,
 * reduce-scatter and all-to-all (n-1)/n, broadcast 1.
 *
 * Usage: mpirun -n N mpi_perf COLL [-b BYTES] [-e BYTES] [-f FACTOR] [-w WARMUP] [-n ITERS]
 */

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum coll { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, ALLTOALL, NCOLLS };

static const char *const coll_names[NCOLLS] = {
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall",
};

struct run {
    enum coll coll;
    int rank, nranks;
    size_t param;       /* count argument of the call */
    size_t send, recv;  /* elements of each buffer */
    float *sbuf, *rbuf; /* max_bytes each, freed by main */
    size_t alloc;       /* bytes of each buffer */
};

/* Rank r's input element i: small integers, so float sums are exact in any order. */
static float
value(int rank, size_t i)
{
    return (float)(rank + 1 + (int)(i % 7));
}

/* Sets param, send and recv for `bytes`, as tools/bench's counts functions. */
static void
shape(struct run *run, size_t bytes)
{
    size_t count = bytes / sizeof(float), n = (size_t)run->nranks;

    switch (run->coll) {
    case ALL_REDUCE:
    case BROADCAST:
        run->param = run->send = run->recv = count;
        break;
    case ALL_GATHER:
        run->param = count / n;
        run->send = run->param;
        run->recv = run->param * n;
        break;
    case REDUCE_SCATTER:
        run->param = count / n;
        run->send = run->param * n;
        run->recv = run->param;
        break;
    default: /* ALLTOALL */
        run->param = count / n;
        run->send = run->recv = run->param * n;
        break;
    }
}

static void
call(const struct run *run, const float *send, float *recv)
{
    int c = (int)run->param;

    switch (run->coll) {
    case ALL_REDUCE:
        MPI_Allreduce(send, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALL_GATHER:
        MPI_Allgather(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case REDUCE_SCATTER:
        MPI_Reduce_scatter_block(send, recv, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case BROADCAST:
        /* As ncclBroadcast out of place: the root's send buffer lands in every recv. */
        if (run->rank == 0)
            memcpy(recv, send, run->param * sizeof(float));
        MPI_Bcast(recv, c, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    default:
        MPI_Alltoall(send, c, MPI_FLOAT, recv, c, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    }
}

/* The value rank `rank` must find at recv[i]. */
static float
expected(const struct run *run, size_t i)
{
    int n = run->nranks;
    size_t p = run->param;

    switch (run->coll) {
    case ALL_REDUCE:
        return (float)(n * (n + 1) / 2 + n * (int)(i % 7));
    case ALL_GATHER:
        return value((int)(i / p), i % p);
    case REDUCE_SCATTER:
        return (float)(n * (n + 1) / 2 + n * (int)((run->rank * p + i) % 7));
    case BROADCAST:
        return value(0, i);
    default: /* block i / p came from rank i / p, its elements rank * p ... */
        return value((int)(i / p), run->rank * p + i % p);
    }
}

/* One checked call; returns the wrong elements over all ranks. */
static long
check(const struct run *run)
{
    long wrong = 0, total = 0;

    for (size_t i = 0; i < run->send; i++)
        run->sbuf[i] = value(run->rank, i);
    memset(run->rbuf, 0xA5, run->recv * sizeof(float));
    call(run, run->sbuf, run->rbuf);
    for (size_t i = 0; i < run->recv; i++)
        wrong += run->rbuf[i] != expected(run, i);
    MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    return total;
}

static double
bus_factor(enum coll coll, int n)
{
    switch (coll) {
    case ALL_REDUCE: return 2.0 * (n - 1) / n;
    case BROADCAST: return 1.0;
    default: return (double)(n - 1) / n;
    }
}

/* Times one size and prints its row; returns the wrong elements. */
static long
time_size(struct run *run, size_t bytes, int iters)
{
    size_t total, steps;
    double t0, sec, slowest, algbw, alg_bytes;
    long wrong;

    shape(run, bytes);
    total = (run->send > run->recv ? run->send : run->recv) * sizeof(float);
    steps = total && run->alloc / total ? run->alloc / total : 1;
    wrong = check(run);
    call(run, run->sbuf, run->rbuf);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int it = 0; it < iters; it++) {
        size_t shift = total * ((size_t)it % steps) / sizeof(float);

        call(run, run->sbuf + shift, run->rbuf + shift);
    }
    sec = iters > 0 ? (MPI_Wtime() - t0) / iters : 0;
    MPI_Allreduce(&sec, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    /* nccl-tests' getBw: one buffer for all-reduce and broadcast, n blocks otherwise. */
    alg_bytes = (double)run->param * sizeof(float) *
                (run->coll == ALL_REDUCE || run->coll == BROADCAST ? 1 : run->nranks);
    algbw = slowest > 0 ? alg_bytes / 1e9 / slowest : 0;
    if (run->rank == 0)
        printf("%12zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6ld\n", total, run->param,
               "float", run->coll == ALL_REDUCE || run->coll == REDUCE_SCATTER ? "sum" : "none",
               run->coll == BROADCAST ? 0 : -1, slowest * 1e6, algbw,
               algbw * bus_factor(run->coll, run->nranks), wrong);
    return wrong;
}

static size_t
parse_size(const char *text)
{
    char *end;
    double v = strtod(text, &end);

    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    }
    return (size_t)v;
}

int
main(int argc, char **argv)
{
    struct run run = { .coll = NCOLLS };
    size_t min_bytes = 8, max_bytes = 32 << 20, factor = 2;
    int warmup = 5, iters = 20;
    long wrong = 0;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &run.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &run.nranks);
    for (int c = 0; argc > 1 && c < NCOLLS; c++) {
        if (strcmp(argv[1], coll_names[c]) == 0)
            run.coll = (enum coll)c;
    }
    for (int a = 2; a + 1 < argc; a += 2) {
        if (strcmp(argv[a], "-b") == 0) min_bytes = parse_size(argv[a + 1]);
        else if (strcmp(argv[a], "-e") == 0) max_bytes = parse_size(argv[a + 1]);
        else if (strcmp(argv[a], "-f") == 0) factor = parse_size(argv[a + 1]);
        else if (strcmp(argv[a], "-w") == 0) warmup = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "-n") == 0) iters = atoi(argv[a + 1]);
        else run.coll = NCOLLS;
    }
    if (run.coll == NCOLLS || factor < 2 || (argc - 2) % 2 != 0) {
        if (run.rank == 0)
            fprintf(stderr, "usage: mpi_perf all_reduce|all_gather|reduce_scatter|broadcast|"
                    "alltoall [-b BYTES] [-e BYTES] [-f FACTOR] [-w WARMUP] [-n ITERS]\n");
        MPI_Finalize();
        return EXIT_FAILURE;
    }
    run.alloc = max_bytes > sizeof(float) ? max_bytes : sizeof(float);
    run.sbuf = malloc(run.alloc);
    run.rbuf = malloc(run.alloc);
    if (run.sbuf == NULL || run.rbuf == NULL) {
        fprintf(stderr, "mpi_perf: rank %d: cannot allocate 2 buffers of %zu bytes\n",
                run.rank, run.alloc);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(run.sbuf, 0, run.alloc); /* no page fault in a timed loop */
    memset(run.rbuf, 0, run.alloc);
    if (run.rank == 0) {
        int len;
        char version[MPI_MAX_LIBRARY_VERSION_STRING];

        MPI_Get_library_version(version, &len);
        printf("# mpi_perf %s, %d ranks, warmup iters: %d iters: %d (out of place only)\n"
               "# %s\n", coll_names[run.coll], run.nranks, warmup, iters,
               strtok(version, "\n"));
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type",
               "redop", "root", "time", "algbw", "busbw", "#wrong");
    }
    for (int w = 0; w < 2 * warmup; w++) {
        shape(&run, w < warmup ? max_bytes : min_bytes);
        call(&run, run.sbuf, run.rbuf);
    }
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor)
        wrong += time_size(&run, bytes, iters);
    if (run.rank == 0)
        printf("# Out of bounds values : %ld %s\n", wrong, wrong ? "FAILED" : "OK");
    free(run.sbuf);
    free(run.rbuf);
    MPI_Finalize();
    return wrong ? EXIT_FAILURE : EXIT_SUCCESS;
}
