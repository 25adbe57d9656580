/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nccl_perf: the harness of the nccl-tests compatible benchmark. It takes nccl-tests'
 * options and prints its output, so that scripts written for all_reduce_perf and friends
 * read ours unchanged; the collective comes from the program's name (all_reduce_perf ->
 * all_reduce) or from --coll. Ranks are processes: RANK and WORLD_SIZE come from the
 * environment (ncclshim-launch, torchrun or mpirun set them; one rank when unset), and
 * every rank gets the same id from ncclGetUniqueId because NCCL_COMM_ID is set.
 *
 * Buffers are host memory and the stream is NULL, so every call is complete when it
 * returns. Data is filled and checked outside the timed loop; nothing is allocated per
 * iteration. Every rank makes the same NCCL calls in the same order: options are compared
 * across ranks first, and each time, error count and the rank lines are agreed through
 * ncclAllReduce, the one collective the harness itself relies on.
 *
 * The algorithm is the library's to choose, as in NCCL; the environment forces it:
 * NCCLSHIM_ALGO=ring|chain|tree|dbtree|recdbl|rabenseifner|bruck|pairwise|direct, or
 * NCCL_ALGO in NCCL's syntax (Ring, Tree, ^Tree, allreduce:tree;broadcast:ring). The header
 * names the forcing in effect ("# Algorithm: NCCLSHIM_ALGO=tree"), so that a saved output
 * says what it measured.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

/* Every collective the binary knows; a new collective file adds its row. */
static const struct bench_coll *const bench_colls[] = {
    &bench_all_reduce,
    &bench_all_gather,
    &bench_reduce_scatter,
    &bench_broadcast,
    &bench_reduce,
    &bench_alltoall,
    &bench_gather,
    &bench_scatter,
    &bench_sendrecv,
};

static const char *const bench_op_names[BENCH_OP_COUNT + 1] = {
    "sum", "prod", "max", "min", "avg", "mulsum", "none",
};

static const ncclRedOp_t bench_op_nccl[BENCH_OP_COUNT] = {
    ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, ncclSum, /* mulsum: replaced per test */
};

#define BENCH_NAME "nccl_perf"
#define BENCH_LINE 256     /* bytes of one rank's "#  Rank ..." line, gathered to rank 0 */
#define BENCH_POISON 0xA5  /* receive buffers are set to this before a checked run */
#define BENCH_ALL (-1)     /* -d all, -o all, -r all */

struct bench_opts {
    size_t min_bytes, max_bytes, step_bytes, step_factor;
    int iters, warmup, agg_iters, check, cycles;
    int type;     /* index into bench_types, or BENCH_ALL */
    int op;       /* enum bench_op, or BENCH_ALL */
    int root;     /* a rank, or BENCH_ALL */
    int blocking, parallel_init, stream_null, graph, cputime, average, timeout;
    const struct bench_coll *coll;
};

struct bench_run {
    struct bench_opts opt;
    int rank, nranks;
    ncclComm_t comm;
    char *send, *recv, *expected; /* host buffers of alloc bytes each, freed by main */
    size_t alloc;
    size_t expected_count;        /* elements of expected, once computed for this size */
    bool expected_ready;
    struct bench_data data;
    double bw_sum;
    int bw_count;
    int errors;                   /* tests with at least one wrong element */
};

static void
bench_report(const struct bench_run *run, const char *call, int line, ncclResult_t res)
{
    const char *last = run->comm ? ncclGetLastError(run->comm) : ncclGetLastError(NULL);

    fprintf(stderr, BENCH_NAME ": rank %d: harness.c:%d: %s failed: %s%s%s\n", run->rank,
            line, call, ncclGetErrorString(res), last && *last ? ": " : "", last ? last : "");
}

/* Returns the error of an NCCL call after saying, once, which call on which rank failed. */
#define BENCH_CHECK(run, call)                                 \
    do {                                                       \
        ncclResult_t bench_res_ = (call);                      \
        if (bench_res_ != ncclSuccess) {                       \
            bench_report((run), #call, __LINE__, bench_res_);  \
            return bench_res_;                                 \
        }                                                      \
    } while (0)

/* Returns the error of a harness function, which has already reported it. */
#define BENCH_TRY(call)                                        \
    do {                                                       \
        ncclResult_t bench_res_ = (call);                      \
        if (bench_res_ != ncclSuccess)                         \
            return bench_res_;                                 \
    } while (0)

static double
bench_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "8", "1.5K", "64M", "1G" (binary units), as nccl-tests parses -b and -e; -1 if invalid. */
static double
bench_parse_size(const char *text)
{
    char unit[2] = "";
    double size;
    int n = sscanf(text, "%lf %1s", &size, unit);

    if (n < 1 || size < 0)
        return -1;
    switch (n == 2 ? unit[0] : 0) {
    case 0: return size;
    case 'K': case 'k': return size * 1024;
    case 'M': case 'm': return size * 1024 * 1024;
    case 'G': case 'g': return size * 1024 * 1024 * 1024;
    default: return -1;
    }
}

static bool
bench_parse_int(const char *text, int *value_out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(text, &end, 0);
    if (errno != 0 || end == text || *end != '\0' || v < INT32_MIN || v > INT32_MAX)
        return false;
    *value_out = (int)v;
    return true;
}

/* Copies name without its underscores and without a "_perf" ending; false if too long. */
static bool
bench_coll_key(const char *name, char *key, size_t size)
{
    size_t len = strlen(name), k = 0;

    if (len > 5 && strcmp(name + len - 5, "_perf") == 0)
        len -= 5;
    for (size_t i = 0; i < len; i++) {
        if (name[i] == '_')
            continue;
        if (k + 1 >= size)
            return false;
        key[k++] = name[i];
    }
    key[k] = '\0';
    return true;
}

/* "all_reduce", "all_reduce_perf" and "allreduce" all name the same collective. */
static const struct bench_coll *
bench_coll_find(const char *name)
{
    char want[64], have[64];

    if (!bench_coll_key(name, want, sizeof(want)))
        return NULL;
    for (size_t i = 0; i < sizeof(bench_colls) / sizeof(bench_colls[0]); i++) {
        if (bench_coll_key(bench_colls[i]->name, have, sizeof(have)) &&
            strcmp(want, have) == 0)
            return bench_colls[i];
    }
    return NULL;
}

static void
bench_usage(FILE *out, const char *prog)
{
    fprintf(out, "USAGE: %s \n\t"
        "[-t,--nthreads <num threads>] (1 only: one rank per process)\n\t"
        "[-g,--ngpus <gpus per thread>] (1 only)\n\t"
        "[-b,--minbytes <min size in bytes>] \n\t"
        "[-e,--maxbytes <max size in bytes>] \n\t"
        "[-i,--stepbytes <increment size>] \n\t"
        "[-f,--stepfactor <increment factor>] \n\t"
        "[-n,--iters <iteration count>] \n\t"
        "[-m,--agg_iters <aggregated iteration count>] \n\t"
        "[-w,--warmup_iters <warmup iteration count>] \n\t"
        "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t"
        "[-p,--parallel_init <0/1>] \n\t"
        "[-c,--check <check iteration count>] \n\t"
        "[-o,--op <sum/prod/min/max/avg/mulsum/all>] \n\t"
        "[-d,--datatype <nccltype/all>] \n\t"
        "[-r,--root <root/all>] \n\t"
        "[-z,--blocking <0/1>] \n\t"
        "[-y,--stream_null <0/1>] \n\t"
        "[-T,--timeout <time in seconds>] (accepted, not used)\n\t"
        "[-G,--cudagraph <num graph launches>] (0 only)\n\t"
        "[-C,--report_cputime <0/1>] \n\t"
        "[-a,--average <0/1/2/3> report average iteration time "
        "<0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t"
        "[-C,--coll <all_reduce/...>] collective to run when not named by the program\n\t"
        "[-h,--help]\n", prog);
    fprintf(out, "Algorithm: the library's choice, unless the environment forces one:\n\t"
            "NCCLSHIM_ALGO=ring|chain|tree|dbtree|recdbl|rabenseifner|bruck|pairwise|direct"
            "\n\t(a name that does not serve the collective is ignored), or NCCL_ALGO as "
            "NCCL reads it\n\t(Ring, Tree, ^Tree, allreduce:tree;broadcast:ring)\n");
    fprintf(out, "Types:");
    for (int i = 0; i < bench_ntypes; i++)
        fprintf(out, " %s", bench_types[i].name);
    fprintf(out, "\nCollectives:");
    for (size_t i = 0; i < sizeof(bench_colls) / sizeof(bench_colls[0]); i++)
        fprintf(out, " %s", bench_colls[i]->name);
    fprintf(out, "\nRanks: RANK and WORLD_SIZE (or OMPI_COMM_WORLD_*, PMI_*) from the "
            "environment, with NCCL_COMM_ID; e.g. ncclshim-launch -n 4 %s\n", prog);
}

/* Parses the command line into opt; returns 0 to run, 1 to exit 0 (help), -1 on error. */
static int
bench_parse_args(int argc, char **argv, struct bench_opts *opt)
{
    static const struct option longopts[] = {
        { "nthreads", required_argument, NULL, 't' },
        { "ngpus", required_argument, NULL, 'g' },
        { "minbytes", required_argument, NULL, 'b' },
        { "maxbytes", required_argument, NULL, 'e' },
        { "stepbytes", required_argument, NULL, 'i' },
        { "stepfactor", required_argument, NULL, 'f' },
        { "iters", required_argument, NULL, 'n' },
        { "agg_iters", required_argument, NULL, 'm' },
        { "warmup_iters", required_argument, NULL, 'w' },
        { "run_cycles", required_argument, NULL, 'N' },
        { "parallel_init", required_argument, NULL, 'p' },
        { "check", required_argument, NULL, 'c' },
        { "op", required_argument, NULL, 'o' },
        { "datatype", required_argument, NULL, 'd' },
        { "root", required_argument, NULL, 'r' },
        { "blocking", required_argument, NULL, 'z' },
        { "stream_null", required_argument, NULL, 'y' },
        { "timeout", required_argument, NULL, 'T' },
        { "cudagraph", required_argument, NULL, 'G' },
        { "report_cputime", required_argument, NULL, 'C' },
        { "average", required_argument, NULL, 'a' },
        { "unalign", required_argument, NULL, 'u' },
        { "local_register", required_argument, NULL, 'R' },
        { "coll", required_argument, NULL, 'K' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    int c, value, ignored;
    double size;

    while ((c = getopt_long(argc, argv, "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:u:R:h",
                            longopts, NULL)) != -1) {
        int *target = NULL;

        switch (c) {
        case 'b':
        case 'e':
        case 'i':
            size = bench_parse_size(optarg);
            if (size < 0) {
                fprintf(stderr, "invalid size specified for '%s'\n",
                        c == 'b' ? "minbytes" : c == 'e' ? "maxbytes" : "stepbytes");
                return -1;
            }
            *(c == 'b' ? &opt->min_bytes : c == 'e' ? &opt->max_bytes : &opt->step_bytes) =
                (size_t)size;
            continue;
        case 'o':
            opt->op = -2;
            for (int o = 0; o < BENCH_OP_COUNT; o++) {
                if (strcmp(optarg, bench_op_names[o]) == 0)
                    opt->op = o;
            }
            if (strcmp(optarg, "all") == 0)
                opt->op = BENCH_ALL;
            if (opt->op == -2) {
                fprintf(stderr, "invalid op %s: sum, prod, min, max, avg, mulsum or all\n",
                        optarg);
                return -1;
            }
            continue;
        case 'd':
            opt->type = strcmp(optarg, "all") == 0 ? BENCH_ALL : -2;
            if (bench_type_find(optarg) != NULL)
                opt->type = (int)(bench_type_find(optarg) - bench_types);
            if (opt->type == -2) {
                fprintf(stderr, "invalid type %s (see -h for the list)\n", optarg);
                return -1;
            }
            continue;
        case 'r':
            if (strcmp(optarg, "all") == 0) {
                opt->root = BENCH_ALL;
                continue;
            }
            target = &opt->root;
            break;
        case 'C':
            /* nccl-tests' -C is report_cputime 0/1; a name selects the collective. */
            if (bench_parse_int(optarg, &opt->cputime))
                continue;
            /* fall through */
        case 'K':
            opt->coll = bench_coll_find(optarg);
            if (opt->coll == NULL) {
                fprintf(stderr, "unknown collective %s (see -h for the list)\n", optarg);
                return -1;
            }
            continue;
        case 'h':
            bench_usage(stdout, prog);
            return 1;
        case 't': target = &value; break;
        case 'g': target = &value; break;
        case 'f': target = &value; break;
        case 'n': target = &opt->iters; break;
        case 'm': target = &opt->agg_iters; break;
        case 'w': target = &opt->warmup; break;
        case 'N': target = &opt->cycles; break;
        case 'p': target = &opt->parallel_init; break;
        case 'c': target = &opt->check; break;
        case 'z': target = &opt->blocking; break;
        case 'y': target = &opt->stream_null; break;
        case 'T': target = &opt->timeout; break;
        case 'G': target = &opt->graph; break;
        case 'a': target = &opt->average; break;
        case 'u': target = &ignored; break;
        case 'R': target = &ignored; break;
        default:
            bench_usage(stderr, prog);
            return -1;
        }
        if (!bench_parse_int(optarg, target) || *target < 0) {
            fprintf(stderr, "invalid value '%s' for -%c\n", optarg, c);
            return -1;
        }
        if ((c == 't' || c == 'g') && value != 1) {
            fprintf(stderr, "-%c %d: ncclshim runs one rank per process; start ranks with "
                    "ncclshim-launch -n N instead\n", c, value);
            return -1;
        }
        if (c == 'f')
            opt->step_factor = (size_t)value;
    }
    if (optind < argc) {
        fprintf(stderr, "unexpected argument '%s'\n", argv[optind]);
        bench_usage(stderr, prog);
        return -1;
    }
    if (opt->coll == NULL)
        opt->coll = bench_coll_find(prog);
    if (opt->coll == NULL) {
        fprintf(stderr, "%s: which collective? Run as all_reduce_perf (and so on) or pass "
                "--coll NAME\n", prog);
        return -1;
    }
    if (opt->min_bytes > opt->max_bytes) {
        fprintf(stderr, "invalid sizes for 'minbytes' and 'maxbytes': %zu > %zu\n",
                opt->min_bytes, opt->max_bytes);
        return -1;
    }
    if (opt->graph > 0) {
        fprintf(stderr, "-G %d: CUDA graphs need device buffers; the benchmark uses host "
                "memory, so graphs are off\n", opt->graph);
        opt->graph = 0;
    }
    if (opt->average > 3) {
        fprintf(stderr, "-a %d: 0 (rank 0), 1 (average), 2 (min) or 3 (max)\n", opt->average);
        return -1;
    }
    return 0;
}

/* The first of the variables in names that is set, as an int; fallback if none is. */
static int
bench_env_int(const char *const *names, int fallback)
{
    for (; *names != NULL; names++) {
        const char *text = getenv(*names);
        int value;

        if (text != NULL && bench_parse_int(text, &value))
            return value;
    }
    return fallback;
}

static ncclResult_t
bench_barrier(struct bench_run *run)
{
    int32_t token = 0;

    BENCH_CHECK(run, ncclAllReduce(&token, &token, 1, ncclInt32, ncclSum, run->comm, NULL));
    return ncclSuccess;
}

/*
 * Fails on every rank if the ranks were not started with the same options: their NCCL call
 * sequences would differ and some rank would wait forever. One ncclMin over (h, ~h) gives
 * the smallest and, negated, the largest fingerprint.
 */
static ncclResult_t
bench_agree_options(struct bench_run *run)
{
    const struct bench_opts *o = &run->opt;
    uint64_t fields[] = {
        o->min_bytes, o->max_bytes, o->step_bytes, o->step_factor, (uint64_t)o->iters,
        (uint64_t)o->warmup, (uint64_t)o->agg_iters, (uint64_t)o->check,
        (uint64_t)o->cycles, (uint64_t)o->type, (uint64_t)o->op, (uint64_t)o->root,
        (uint64_t)o->blocking, (uint64_t)o->average,
    };
    uint64_t h = 0xcbf29ce484222325ull, pair[2];

    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        h = (h ^ fields[i]) * 0x100000001b3ull;
    for (const char *c = o->coll->name; *c != '\0'; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    /* Ranks forcing different algorithms would build schedules that never match. */
    for (const char *const *var = (const char *const[]){ "NCCLSHIM_ALGO", "NCCL_ALGO", NULL };
         *var != NULL; var++) {
        for (const char *c = getenv(*var) ? getenv(*var) : ""; *c != '\0'; c++)
            h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
        h = (h ^ 0xff) * 0x100000001b3ull;
    }
    pair[0] = h;
    pair[1] = ~h;
    BENCH_CHECK(run, ncclAllReduce(pair, pair, 2, ncclUint64, ncclMin, run->comm, NULL));
    if (pair[0] != ~pair[1]) {
        if (run->rank == 0)
            fprintf(stderr, BENCH_NAME ": the ranks were started with different options (or "
                    "NCCLSHIM_ALGO / NCCL_ALGO)\n");
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* Prints every rank's "#  Rank" line on rank 0, gathered by a sum over zeroed slots. */
static ncclResult_t
bench_print_ranks(struct bench_run *run)
{
    char host[64] = "localhost";
    char *lines = calloc((size_t)run->nranks, BENCH_LINE);
    ncclResult_t res;

    if (lines == NULL) {
        fprintf(stderr, BENCH_NAME ": rank %d: out of memory for %d rank lines\n", run->rank,
                run->nranks);
        return ncclSystemError;
    }
    gethostname(host, sizeof(host) - 1);
    snprintf(lines + (size_t)run->rank * BENCH_LINE, BENCH_LINE,
             "#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n", run->rank, 0,
             (int)getpid(), host, -1, "host", "host memory");
    res = ncclAllReduce(lines, lines, (size_t)run->nranks * BENCH_LINE, ncclUint8, ncclSum,
                        run->comm, NULL);
    if (res != ncclSuccess) {
        bench_report(run, "ncclAllReduce(rank lines)", __LINE__, res);
        free(lines);
        return res;
    }
    if (run->rank == 0) {
        for (int r = 0; r < run->nranks; r++) {
            lines[(size_t)(r + 1) * BENCH_LINE - 1] = '\0';
            printf("%s", lines + (size_t)r * BENCH_LINE);
        }
    }
    free(lines);
    return ncclSuccess;
}

/*
 * Keeps send, receive and expected buffers of every local rank within three quarters of
 * the machine's memory, as nccl-tests keeps them within the GPU's; all ranks take the
 * smallest limit.
 */
static ncclResult_t
bench_limit_memory(struct bench_run *run)
{
    static const char *const local_names[] = { "LOCAL_WORLD_SIZE",
                                               "OMPI_COMM_WORLD_LOCAL_SIZE", NULL };
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    int local = bench_env_int(local_names, run->nranks);
    uint64_t limit = (uint64_t)(phys * 0.75 / (local > 0 ? local : 1) /
                                (run->opt.check ? 3 : 2));
    uint64_t max_bytes = run->opt.max_bytes < limit ? run->opt.max_bytes : limit;

    BENCH_CHECK(run, ncclAllReduce(&max_bytes, &max_bytes, 1, ncclUint64, ncclMin,
                                   run->comm, NULL));
    if (max_bytes < run->opt.max_bytes) {
        run->opt.max_bytes = max_bytes;
        if (run->opt.min_bytes > max_bytes)
            run->opt.min_bytes = max_bytes;
        if (run->rank == 0)
            printf("#\n# Reducing maxBytes to %zu due to memory limitation\n", (size_t)max_bytes);
    }
    return ncclSuccess;
}

/* Allocates the three buffers, large enough for the largest size of every type tested. */
static ncclResult_t
bench_alloc(struct bench_run *run)
{
    size_t alloc = run->opt.max_bytes;
    struct bench_counts counts;

    for (int t = 0; t < bench_ntypes; t++) {
        size_t elt = bench_types[t].size;

        if (run->opt.type != BENCH_ALL && run->opt.type != t)
            continue;
        run->opt.coll->counts(run->opt.max_bytes / elt, run->nranks, &counts);
        if (counts.send * elt > alloc)
            alloc = counts.send * elt;
        if (counts.recv * elt > alloc)
            alloc = counts.recv * elt;
    }
    alloc = alloc ? alloc : 1;
    run->send = malloc(alloc);
    run->recv = malloc(alloc);
    run->expected = malloc(alloc);
    if (run->send == NULL || run->recv == NULL || run->expected == NULL) {
        fprintf(stderr, BENCH_NAME ": rank %d: cannot allocate 3 buffers of %zu bytes\n",
                run->rank, alloc);
        return ncclSystemError;
    }
    /* Touch every page now, so that no page fault lands in a timed loop. */
    memset(run->send, 0, alloc);
    memset(run->recv, 0, alloc);
    memset(run->expected, 0, alloc);
    run->alloc = alloc;
    return ncclSuccess;
}

/* nccl-tests' number format: as many decimals as width allows, then an exponent. */
static void
bench_format(char *buf, size_t size, int width, double value)
{
    int digits = 0;

    for (double p = 1; value >= p && digits < 400; p *= 10)
        digits++;
    if (digits < width - 2)
        snprintf(buf, size, "%*.2f", width, value);
    else if (digits < width - 1)
        snprintf(buf, size, "%*.1f", width, value);
    else if (digits < width + 1)
        snprintf(buf, size, "%*.0f", width, value);
    else
        snprintf(buf, size, "%*.1e", width, value);
}

/* Runs the collective once; says which collective failed, with its size. */
static ncclResult_t
bench_call(struct bench_run *run, const struct bench_ctx *ctx, const void *send, void *recv)
{
    ncclResult_t res = run->opt.coll->run(ctx, send, recv);
    char what[128];

    if (res != ncclSuccess) {
        snprintf(what, sizeof(what), "%s of %zu elements", run->opt.coll->name,
                 ctx->counts.param);
        bench_report(run, what, __LINE__, res);
    }
    return res;
}

/* Puts inputs in place and poisons the receive buffer before a checked run: all of the
 * span a size uses, since in place an output may lie past counts.recv (scatter's block). */
static void
bench_prepare(struct bench_run *run, const struct bench_ctx *ctx, char *input)
{
    size_t elems = ctx->counts.send > ctx->counts.recv ? ctx->counts.send : ctx->counts.recv;

    memset(run->recv, BENCH_POISON, elems * run->data.size);
    run->opt.coll->fill(ctx, input);
}

/* One timed measurement, out of place or in place, and its check; prints its columns. */
static ncclResult_t
bench_time(struct bench_run *run, const struct bench_ctx *ctx, bool in_place)
{
    const struct bench_opts *o = &run->opt;
    size_t elt = run->data.size;
    size_t send_bytes = ctx->counts.send * elt, recv_bytes = ctx->counts.recv * elt;
    size_t total = send_bytes > recv_bytes ? send_bytes : recv_bytes;
    /* As nccl-tests: each iteration at another offset, so that caches do not flatter. */
    size_t steps = total && run->alloc / total ? run->alloc / total : 1;
    char *in_base = in_place ? run->recv : run->send;
    size_t in_off = in_place ? ctx->counts.send_inplace * elt * (size_t)run->rank : 0;
    size_t out_off = in_place ? ctx->counts.recv_inplace * elt * (size_t)run->rank : 0;
    double sec, algbw = 0, busbw = 0, calls = (double)o->iters * o->agg_iters;
    int64_t wrong = 0;
    char time_str[32], alg_str[32], bus_str[32];
    double t0;

    /* Unlike nccl-tests, no fill before timing: on the host, values do not change the time
     * (none here are subnormal), and the checked run below fills its own. */
    BENCH_TRY(bench_call(run, ctx, in_base + in_off, run->recv + out_off));
    BENCH_TRY(bench_barrier(run));

    t0 = bench_now();
    for (int iter = 0; iter < o->iters; iter++) {
        if (o->agg_iters > 1)
            BENCH_CHECK(run, ncclGroupStart());
        for (int a = 0; a < o->agg_iters; a++) {
            size_t shift = total * ((size_t)(iter * o->agg_iters + a) % steps);

            BENCH_TRY(bench_call(run, ctx, in_base + shift + in_off,
                                 run->recv + shift + out_off));
            if (o->blocking && o->agg_iters == 1)
                BENCH_TRY(bench_barrier(run));
        }
        if (o->agg_iters > 1)
            BENCH_CHECK(run, ncclGroupEnd());
    }
    sec = calls > 0 ? (bench_now() - t0) / calls : 0;

    /* One time for all ranks: rank 0's, the average, the minimum or the maximum (-a). */
    if (o->average == 0 && run->rank != 0)
        sec = 0;
    BENCH_CHECK(run, ncclAllReduce(&sec, &sec, 1, ncclFloat64,
                                   o->average == 2 ? ncclMin : o->average == 3 ? ncclMax
                                                                               : ncclSum,
                                   run->comm, NULL));
    if (o->average == 1)
        sec /= run->nranks;
    if (sec > 0) {
        algbw = o->coll->alg_bytes(ctx->counts.param, elt, run->nranks) / 1e9 / sec;
        busbw = algbw * o->coll->bus_factor(run->nranks);
    }

    for (int c = 0; c < (in_place && o->coll->in_place_unchecked ? 0 : o->check); c++) {
        bench_prepare(run, ctx, in_base + in_off);
        BENCH_TRY(bench_call(run, ctx, in_base + in_off, run->recv + out_off));
        if (!run->expected_ready) {
            run->expected_count = o->coll->expect(ctx, run->expected);
            run->expected_ready = true;
        }
        wrong = bench_data_check(&run->data, run->recv + out_off, run->expected,
                                 run->expected_count);
        BENCH_CHECK(run, ncclAllReduce(&wrong, &wrong, 1, ncclInt64, ncclSum, run->comm,
                                       NULL));
        if (wrong)
            break;
    }
    if (wrong)
        run->errors++;
    run->bw_sum += busbw;
    run->bw_count++;

    if (run->rank == 0) {
        bench_format(time_str, sizeof(time_str), 7, sec * 1e6);
        bench_format(alg_str, sizeof(alg_str), 6, algbw);
        bench_format(bus_str, sizeof(bus_str), 6, busbw);
        if (o->check && !(in_place && o->coll->in_place_unchecked))
            printf("  %7s  %6s  %6s  %6g", time_str, alg_str, bus_str, (double)wrong);
        else
            printf("  %7s  %6s  %6s    N/A", time_str, alg_str, bus_str);
        fflush(stdout);
    }
    return ncclSuccess;
}

/* Warm-up calls at one size, out of place; no data, no check. */
static ncclResult_t
bench_warmup(struct bench_run *run, struct bench_ctx *ctx, size_t bytes)
{
    size_t elt = run->data.size, total;

    run->opt.coll->counts(bytes / elt, run->nranks, &ctx->counts);
    total = (ctx->counts.send > ctx->counts.recv ? ctx->counts.send : ctx->counts.recv) * elt;
    for (int iter = 0; iter < run->opt.warmup; iter++) {
        size_t steps = total && run->alloc / total ? run->alloc / total : 1;
        size_t shift = total * ((size_t)iter % steps);

        BENCH_TRY(bench_call(run, ctx, run->send + shift, run->recv + shift));
    }
    return ncclSuccess;
}

static size_t
bench_next_size(const struct bench_opts *o, size_t size)
{
    if (o->step_factor > 1)
        return size ? size * o->step_factor : 1;
    return size + (o->step_bytes ? o->step_bytes : 1);
}

/* Every size of one (type, op, root), as nccl-tests' TimeTest; one output row per size. */
static ncclResult_t
bench_test(struct bench_run *run, const struct bench_type *type, int op, int root)
{
    const struct bench_coll *coll = run->opt.coll;
    struct bench_ctx ctx = {
        .rank = run->rank,
        .nranks = run->nranks,
        .root = coll->rooted ? root : -1,
        .comm = run->comm,
        .stream = NULL,
        .type = type->type,
        .op = op < BENCH_OP_COUNT ? bench_op_nccl[op] : ncclSum,
        .data = &run->data,
    };
    ncclResult_t res = ncclSuccess;
    uint64_t scalar;

    bench_data_init(&run->data, type->type, (enum bench_op)op, run->nranks);
    if (op == BENCH_OP_MULSUM) {
        /* Made once per test rather than per call: its cost is not the collective's. */
        bench_data_scalar(&run->data, run->rank, &scalar);
        BENCH_CHECK(run, ncclRedOpCreatePreMulSum(&ctx.op, &scalar, type->type,
                                                  ncclScalarHostImmediate, run->comm));
    }
    res = bench_barrier(run);
    if (res == ncclSuccess)
        res = bench_warmup(run, &ctx, run->opt.max_bytes);
    if (res == ncclSuccess)
        res = bench_warmup(run, &ctx, run->opt.min_bytes);

    for (size_t size = run->opt.min_bytes; res == ncclSuccess && size <= run->opt.max_bytes;
         size = bench_next_size(&run->opt, size)) {
        coll->counts(size / type->size, run->nranks, &ctx.counts);
        run->expected_ready = false;
        if (run->rank == 0) {
            size_t send = ctx.counts.send * type->size, recv = ctx.counts.recv * type->size;

            printf("%12zu  %12zu  %8s  %6s  %6d", send > recv ? send : recv, ctx.counts.param,
                   type->name, bench_op_names[op], ctx.root);
        }
        res = bench_time(run, &ctx, false);
        if (res == ncclSuccess)
            res = bench_time(run, &ctx, true);
        if (run->rank == 0)
            printf("\n");
    }
    if (op == BENCH_OP_MULSUM && ncclRedOpDestroy(ctx.op, run->comm) != ncclSuccess &&
        res == ncclSuccess) {
        bench_report(run, "ncclRedOpDestroy", __LINE__, ncclInvalidUsage);
        res = ncclInvalidUsage;
    }
    return res;
}

/* The algorithm forcing in the environment, read by the library (base/env.c). */
static void
bench_print_algorithm(void)
{
    static const char *const names[] = { "NCCLSHIM_ALGO", "NCCL_ALGO" };
    bool forced = false;

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *value = getenv(names[i]);

        if (value != NULL && *value != '\0') {
            printf("# Algorithm: %s=%s\n", names[i], value);
            forced = true;
        }
    }
    if (!forced)
        printf("# Algorithm: library's choice (set NCCLSHIM_ALGO or NCCL_ALGO to force one)\n");
}

static void
bench_print_header(const struct bench_run *run)
{
    const struct bench_opts *o = &run->opt;
    int version = 0;

    ncclGetVersion(&version);
    printf("# nccl-tests version ncclshim nccl-headers=%d nccl-library=%d\n",
           NCCL_VERSION_CODE, version);
    printf("# Collective test starting: %s_perf\n", o->coll->name);
    printf("# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
           "iters: %d agg iters: %d validation: %d graph: %d\n",
           1, 1, o->min_bytes, o->max_bytes,
           o->step_factor > 1 ? o->step_factor : o->step_bytes,
           o->step_factor > 1 ? "factor" : "bytes", o->warmup, o->iters, o->agg_iters,
           o->check, o->graph);
    if (o->blocking)
        printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
    if (o->parallel_init)
        printf("# Parallel Init Enabled: threads call into NcclInitRank concurrently \n");
    bench_print_algorithm();
    printf("#\n# Using devices\n");
}

static void
bench_print_columns(const struct bench_run *run)
{
    const char *t = run->opt.cputime ? "cputime" : "time";

    printf("#\n");
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
           "          \n", "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size",
           "count", "type", "redop", "root", t, "algbw", "busbw", "#wrong", t, "algbw",
           "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
           "(GB/s)", "");
}

/* Everything between communicator creation and destruction. */
static ncclResult_t
bench_main(struct bench_run *run)
{
    const struct bench_opts *o = &run->opt;
    int op_first = o->op == BENCH_ALL ? 0 : o->op, op_last = o->op == BENCH_ALL ? 5 : o->op;
    int root_first = o->root == BENCH_ALL ? 0 : o->root;
    int root_last = o->root == BENCH_ALL ? run->nranks - 1 : o->root;
    const char *min_bw = getenv("NCCL_TESTS_MIN_BW");
    double avg_bw;

    BENCH_TRY(bench_agree_options(run));
    BENCH_TRY(bench_print_ranks(run));
    if (o->coll->rooted && o->root >= run->nranks) {
        if (run->rank == 0)
            fprintf(stderr, BENCH_NAME ": root %d is not a rank (0..%d)\n", o->root,
                    run->nranks - 1);
        return ncclInvalidArgument;
    }
    if (!o->coll->reduces)
        op_first = op_last = BENCH_OP_NONE;
    if (!o->coll->rooted)
        root_first = root_last = 0;
    BENCH_TRY(bench_limit_memory(run));
    BENCH_TRY(bench_alloc(run));
    if (run->rank == 0)
        bench_print_columns(run);

    for (int cycle = 0; o->cycles == 0 || cycle < o->cycles; cycle++) {
        for (int t = 0; t < bench_ntypes; t++) {
            if (o->type != BENCH_ALL && o->type != t)
                continue;
            for (int op = op_first; op <= op_last; op++) {
                for (int root = root_first; root <= root_last; root++)
                    BENCH_TRY(bench_test(run, &bench_types[t], op, root));
            }
        }
    }

    avg_bw = run->bw_count ? run->bw_sum / run->bw_count : 0;
    if (run->rank == 0) {
        printf("# %-20s : %d %s\n", "Out of bounds values", run->errors,
               run->errors ? "FAILED" : "OK");
        printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg_bw,
               min_bw == NULL ? "" : avg_bw < atof(min_bw) * 0.9 ? "FAILED" : "OK");
        printf("#\n# Collective test concluded: %s_perf\n\n", o->coll->name);
    }
    if (min_bw != NULL && avg_bw < atof(min_bw) * 0.9)
        run->errors++;
    return ncclSuccess;
}

int
main(int argc, char **argv)
{
    static const char *const rank_names[] = { "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                              NULL };
    static const char *const size_names[] = { "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                                              "PMI_SIZE", NULL };
    static struct bench_run run = {
        .opt = {
            .min_bytes = 32 << 20, .max_bytes = 32 << 20, .step_bytes = 1 << 20,
            .step_factor = 1, .iters = 20, .warmup = 5, .agg_iters = 1, .check = 1,
            .cycles = 1, .type = 7 /* float */, .op = BENCH_OP_SUM, .root = 0,
            .average = 1,
        },
    };
    ncclUniqueId id;
    ncclResult_t res;
    int rc;

    setlinebuf(stdout);
    rc = bench_parse_args(argc, argv, &run.opt);
    if (rc != 0)
        return rc > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
    run.rank = bench_env_int(rank_names, 0);
    run.nranks = bench_env_int(size_names, 1);
    if (run.nranks < 1 || run.rank < 0 || run.rank >= run.nranks) {
        fprintf(stderr, BENCH_NAME ": rank %d of %d: RANK must be in 0..WORLD_SIZE-1\n",
                run.rank, run.nranks);
        return EXIT_FAILURE;
    }
    if (run.nranks > 1 && getenv("NCCL_COMM_ID") == NULL) {
        fprintf(stderr, BENCH_NAME ": rank %d of %d: NCCL_COMM_ID is not set, so the ranks "
                "cannot share a unique id; start them with ncclshim-launch -n %d\n",
                run.rank, run.nranks, run.nranks);
        return EXIT_FAILURE;
    }
    if (run.rank == 0)
        bench_print_header(&run);

    res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) {
        bench_report(&run, "ncclGetUniqueId", __LINE__, res);
        return EXIT_FAILURE;
    }
    res = ncclCommInitRank(&run.comm, run.nranks, id, run.rank);
    if (res != ncclSuccess) {
        bench_report(&run, "ncclCommInitRank", __LINE__, res);
        return EXIT_FAILURE;
    }
    res = bench_main(&run);
    if (res == ncclSuccess) {
        res = ncclCommDestroy(run.comm);
        if (res != ncclSuccess)
            bench_report(&run, "ncclCommDestroy", __LINE__, res);
    } else {
        /* Peers may be waiting in a collective this rank will not join: abort, not destroy. */
        ncclCommAbort(run.comm);
    }
    free(run.send);
    free(run.recv);
    free(run.expected);
    return res == ncclSuccess && run.errors == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
