/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclAllReduce through the real libnccl.so.2, on N ranks started by tools/launcher: every
 * datatype x every reduction (sum, prod, max, min, avg, and a PreMulSum made per call with
 * ncclRedOpCreatePreMulSum from a host-immediate scalar, then ncclRedOpDestroy) x counts
 * {0, 1, n-1, n+1, 1000, 65537, 2^20+3} x in place and out of place, each element checked
 * against a reference computed here.
 *
 * The data make every expected value exact whatever order the library reduces in, so the
 * check compares bytes. Element i of a case uses pattern hash(i) mod 251: rank r's input is
 * in[r][pattern], and the expected output ref[pattern], computed once per (type, op) from all
 * ranks' inputs. Hashing (not i mod 251) makes a block written at the wrong offset show.
 *   - sum, avg, PreMulSum on floating types: every rank's term (its input, or its input
 *     multiplied by its scalar and rounded to the type, as NCCL's pre-multiply does) is j/4
 *     for a small integer j chosen so that any partial sum over the ranks is representable
 *     (|j| <= 2^(p)/n with p the type's precision), so no sum ever rounds. For a pre-multiply
 *     the input is searched among the type's values near term/scalar. avg's scalar is NCCL's:
 *     1.0/n for double, else 1.0/n rounded to float and then to the type. Each rank's PreMulSum
 *     scalar differs: NCCL applies a rank's scalar to that rank's input only.
 *   - prod: +-1, +-2^(+-1) (floating) or +-1..3 (integers; +-1..2 in 8 bits) on the first six
 *     ranks, +-1 on the others, and now and then one 0: products are exact, never overflow.
 *   - max, min: any finite values of the whole type range (no NaN, no -0).
 *   - integers: sums bounded by the type's range; avg is the sum divided by n, truncated
 *     toward zero, as NCCL's integer average is.
 * Out of place, the send buffer must come back unchanged and the receive buffer is poisoned
 * first; in both, 64 bytes past the last element must stay untouched. Buffers start 0, 1 or 2
 * elements past an aligned address, so vector code meets unaligned data.
 *
 * Usage: allreduce [-q] [-m MAXCOUNT] [-u] [-v]. -q is the quick subset run under
 * AddressSanitizer (counts up to 65537, still several pipeline chunks); -m drops larger
 * counts; -u gives every rank the same PreMulSum scalar (to tell a scalar applied on the wrong
 * rank from other faults); -v prints every case. Rank 0 prints one summary line; the exit
 * status is 1 on this rank if any of its checks failed.
 */
#include "common.h"

#include <unistd.h>

#include "reduce_data.h"

#define AR_GUARD 64      /* bytes past the last element that must stay untouched */
#define AR_MAX_OFFSET 2  /* buffers start 0..2 elements past malloc's alignment */
#define AR_SHOW 3        /* wrong elements printed per case */

struct ar_run {
    struct mp_world world;
    bool quick;
    bool verbose;
    bool same_scalar; /* -u: every rank's PreMulSum scalar is rank 0's */
    size_t max_count;
    uint8_t *send_base;
    uint8_t *recv_base;
    int cases;
    int failed_cases;
};

/* --- the cases ---------------------------------------------------------------------------- */

static inline int
ar_pattern(size_t i, uint64_t salt)
{
    return (int)(mp_hash(i ^ salt) % AR_NPAT);
}

static void
ar_fill(uint8_t *buf, size_t count, const struct ar_tables *tb, uint64_t salt)
{
    for (size_t i = 0; i < count; i++) {
        memcpy(buf + i * tb->size, tb->in + ar_pattern(i, salt) * tb->size, tb->size);
    }
}

/* Elements of buf[0..count) that differ from table[pattern]; the first few are printed. */
static long
ar_compare(const uint8_t *buf, size_t count, const uint8_t *table, const struct ar_tables *tb,
           uint64_t salt, const char *what, const char *name)
{
    long wrong = 0;

    for (size_t i = 0; i < count; i++) {
        const uint8_t *want = table + ar_pattern(i, salt) * tb->size;
        if (memcmp(buf + i * tb->size, want, tb->size) != 0 && wrong++ < AR_SHOW) {
            mp_report(__FILE__, __LINE__, "%s: %s element %zu: got %.9g, expected %.9g",
                      name, what, i, mp_load(tb->type, buf + i * tb->size),
                      mp_load(tb->type, want));
        }
    }
    return wrong;
}

static long
ar_guard_check(const uint8_t *guard, const char *what, const char *name)
{
    for (int i = 0; i < AR_GUARD; i++) {
        if (guard[i] != 0xee) {
            mp_report(__FILE__, __LINE__, "%s: %s written past its end (byte %d is 0x%02x)",
                      name, what, i, guard[i]);
            return 1;
        }
    }
    return 0;
}

/* One ncclAllReduce; returns true if every check passed. */
static bool
ar_case_run(struct ar_run *run, const struct ar_tables *tb, size_t count, bool in_place)
{
    ncclComm_t comm = run->world.comm;
    size_t size = tb->size;
    size_t bytes = count * size;
    uint64_t salt = mp_hash4(tb->type, tb->op, count, in_place);
    uint8_t *send = run->send_base + (size_t)(run->cases % (AR_MAX_OFFSET + 1)) * size;
    uint8_t *recv = in_place ? send
                             : run->recv_base + (size_t)((run->cases + 1) % (AR_MAX_OFFSET + 1))
                                                    * size;
    ncclRedOp_t op = ar_builtin_ops[tb->op];
    char name[96];
    long wrong = 0;

    snprintf(name, sizeof(name), "%s %s count %zu %s", mp_type_name(tb->type),
             ar_op_names[tb->op], count, in_place ? "in place" : "out of place");
    ar_fill(send, count, tb, salt);
    memset(send + bytes, 0xee, AR_GUARD);
    if (!in_place) {
        memset(recv, 0xcd, bytes);
        memset(recv + bytes, 0xee, AR_GUARD);
    }
    if (tb->op == AR_PREMULSUM) {
        /* Host-immediate: the library must have read the scalar before create returns. */
        uint8_t scalar[8];
        memcpy(scalar, tb->scalar, sizeof(scalar));
        MP_CHECK_COMM(comm, ncclRedOpCreatePreMulSum(&op, scalar, tb->type,
                                                     ncclScalarHostImmediate, comm));
        memset(scalar, 0x5a, sizeof(scalar));
        MP_EXPECT(op >= ncclNumOps, "%s: ncclRedOpCreatePreMulSum gave op %d, a built-in",
                  name, (int)op);
    }
    MP_CHECK_COMM(comm, ncclAllReduce(send, recv, count, tb->type, op, comm, NULL));
    if (tb->op == AR_PREMULSUM) {
        MP_CHECK_COMM(comm, ncclRedOpDestroy(op, comm));
    }

    wrong += ar_compare(recv, count, tb->ref, tb, salt, "result", name);
    wrong += ar_guard_check(recv + bytes, "receive buffer", name);
    if (!in_place) {
        wrong += ar_compare(send, count, tb->in, tb, salt, "send buffer changed:", name);
        wrong += ar_guard_check(send + bytes, "send buffer", name);
    }
    run->cases++;
    if (wrong > 0) {
        mp_report(__FILE__, __LINE__, "FAIL %s: %ld wrong", name, wrong);
        run->failed_cases++;
    } else if (run->verbose && run->world.rank == 0) {
        printf("ok %s\n", name);
    }
    return wrong == 0;
}

/* The counts of a run, without repeats, in increasing order; returns how many. */
static int
ar_counts(const struct ar_run *run, size_t *counts)
{
    size_t n = (size_t)run->world.nranks;
    size_t all[] = {0, 1, n - 1, n + 1, 1000, 65537, (1u << 20) + 3};
    int ncounts = 0;

    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) {
        bool seen = false;
        for (int m = 0; m < ncounts; m++) {
            seen = seen || counts[m] == all[k];
        }
        if (!seen && all[k] <= run->max_count) {
            counts[ncounts++] = all[k];
        }
    }
    return ncounts;
}

static void
ar_usage(const char *prog)
{
    fprintf(stderr, "usage: %s [-q] [-m MAXCOUNT] [-u] [-v]\n", prog);
    exit(2);
}

int
main(int argc, char **argv)
{
    struct ar_run run = {.max_count = (1u << 20) + 3};
    size_t counts[8];
    int ncounts, opt, total_failed;
    double start = mp_now();

    while ((opt = getopt(argc, argv, "qm:uv")) != -1) {
        switch (opt) {
        case 'q':
            run.quick = true;
            break;
        case 'm':
            run.max_count = strtoull(optarg, NULL, 10);
            break;
        case 'u':
            run.same_scalar = true;
            break;
        case 'v':
            run.verbose = true;
            break;
        default:
            ar_usage(argv[0]);
        }
    }
    if (optind != argc) {
        ar_usage(argv[0]);
    }
    if (run.quick && run.max_count > 65537) {
        run.max_count = 65537;
    }
    mp_world_init(&run.world);
    ncounts = ar_counts(&run, counts);

    size_t buf_bytes = (counts[ncounts - 1] + AR_MAX_OFFSET) * 8 + AR_GUARD;
    run.send_base = malloc(buf_bytes);
    run.recv_base = malloc(buf_bytes);
    MP_ASSERT(run.send_base != NULL && run.recv_base != NULL, "out of memory: 2 x %zu bytes",
              buf_bytes);

    for (int t = 0; t < MP_NTYPES; t++) {
        for (int op = 0; op < AR_NOPS; op++) {
            struct ar_tables tb;
            ar_tables_build(&tb, run.world.nranks, run.world.rank, mp_all_types[t], (enum ar_op)op,
                            run.same_scalar);
            for (int c = 0; c < ncounts; c++) {
                ar_case_run(&run, &tb, counts[c], false);
                ar_case_run(&run, &tb, counts[c], true);
            }
        }
    }

    /* Every rank's verdict, so that rank 0's line speaks for the whole run. */
    total_failed = run.failed_cases;
    MP_CHECK_COMM(run.world.comm, ncclAllReduce(&total_failed, &total_failed, 1, ncclInt32,
                                                ncclSum, run.world.comm, NULL));
    MP_CHECK_COMM(run.world.comm, ncclCommDestroy(run.world.comm));
    free(run.send_base);
    free(run.recv_base);
    if (run.world.rank == 0) {
        printf("allreduce: %d ranks, %d cases per rank (%d types x %d ops x %d counts x 2), "
               "%d failed on all ranks, %.1f s\n", run.world.nranks, run.cases, MP_NTYPES,
               AR_NOPS, ncounts, total_failed, mp_now() - start);
    }
    return run.failed_cases == 0 && total_failed == 0 ? 0 : 1;
}
