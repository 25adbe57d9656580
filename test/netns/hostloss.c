/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hostloss: one rank of test/netns/run.sh's "host goes away" cases. Every rank (RANK,
 * WORLD_SIZE, NCCL_COMM_ID in the environment, one process per rank, placed in a network
 * namespace by run.sh) makes the world communicator and then runs checked all-reduces of
 * HL_COUNT floats for up to -d seconds. When it has finished -r rounds it creates the file
 * -f (if given), which tells run.sh the ranks are in the middle of the loop; run.sh then
 * takes one host away (SIGKILL of its ranks, or its veth deleted) and the others must notice.
 *
 * With NETNS_HOST set (run.sh sets the host's number), the ranks first split off one
 * communicator per host (ncclCommSplit, color NETNS_HOST): on a host with several ranks it
 * runs through shared memory. It runs one checked all-reduce before the loop.
 *
 * A rank that gets a non-success return, or a non-success ncclCommGetAsyncError, prints
 * "hostloss: rank R: error after N rounds, S s after the last good one: ..." and aborts the
 * world communicator; then, with -k, its host communicator, which lost no rank unless this
 * host was the one taken away, must still give a right all-reduce (run.sh asks only when the
 * loss is a kill, which every survivor sees at once: a host partner still waiting out
 * NCCLSHIM_TIMEOUT in the world communicator would not join it); it is then destroyed. The
 * rank exits 3 if the error came at most -b seconds after its last completed round, and 1
 * otherwise. A rank whose loop runs out its -d seconds without an error exits 0 (which run.sh
 * counts as a failure for a survivor: the host went away and nothing said so); a wrong sum
 * exits 1.
 *
 *   hostloss [-d SECONDS] [-r ROUNDS] [-f FILE] [-b SECONDS] [-k]
 */
#include <fcntl.h>
#include <getopt.h>

#include "mp/common.h"

#define HL_COUNT 65536 /* floats: several pipeline chunks over TCP */
#define HL_EXIT_ERROR_SEEN 3

/* The communicator of this rank's host, or NULL without NETNS_HOST. */
static ncclComm_t hl_host_comm;
static int hl_host_nranks;

struct hl_opts {
    double duration;
    long ready_rounds;
    const char *ready_file;
    double bound;
    bool host_after; /* -k: the host communicator must work after the loss */
};

static void
hl_usage(void)
{
    fprintf(stderr, "usage: hostloss [-d SECONDS] [-r ROUNDS] [-f FILE] [-b SECONDS] [-k]\n");
    exit(2);
}

static void
hl_parse(int argc, char **argv, struct hl_opts *opts)
{
    int opt;

    *opts = (struct hl_opts){.duration = 90, .ready_rounds = 20, .bound = 30};
    while ((opt = getopt(argc, argv, "d:r:f:b:k")) != -1) {
        switch (opt) {
        case 'd':
            opts->duration = atof(optarg);
            break;
        case 'r':
            opts->ready_rounds = atol(optarg);
            break;
        case 'f':
            opts->ready_file = optarg;
            break;
        case 'b':
            opts->bound = atof(optarg);
            break;
        case 'k':
            opts->host_after = true;
            break;
        default:
            hl_usage();
        }
    }
    if (optind != argc || opts->duration <= 0 || opts->bound <= 0) {
        hl_usage();
    }
}

/* A checked all-reduce of HL_COUNT floats on comm (nranks ranks, this one is rank), round
 * `round`'s data; false (after a message) on an error or a wrong sum. */
static bool
hl_allreduce(ncclComm_t comm, int rank, int nranks, long round, float *send, float *recv,
             ncclResult_t *res_out)
{
    /* Small integers in floats: every sum is exact, whatever the order. */
    float base = (float)(round % 7);
    ncclResult_t state = ncclSuccess;

    for (int i = 0; i < HL_COUNT; i++) {
        send[i] = base + (float)((rank + i) % 5);
    }
    *res_out = ncclAllReduce(send, recv, HL_COUNT, ncclFloat32, ncclSum, comm, NULL);
    if (*res_out != ncclSuccess) {
        return false;
    }
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state != ncclSuccess) {
        *res_out = state;
        return false;
    }
    for (int i = 0; i < HL_COUNT; i++) {
        float want = base * (float)nranks;

        for (int r = 0; r < nranks; r++) {
            want += (float)((r + i) % 5);
        }
        if (recv[i] != want) {
            printf("hostloss: rank %d of %d: round %ld element %d is %g, expected %g\n", rank,
                   nranks, round, i, (double)recv[i], (double)want);
            *res_out = ncclSuccess;
            return false;
        }
    }
    return true;
}

/* The error path: say what was seen, abort (local, must not wait for anyone), pick the code. */
static int
hl_fail(const struct mp_world *world, const struct hl_opts *opts, const char *what,
        ncclResult_t res, long rounds, double last_good)
{
    double waited = mp_now() - last_good;
    double abort_start;

    printf("hostloss: rank %d: error after %ld rounds, %.1f s after the last good one: %s "
           "returned %s (%d); last error: \"%s\"\n",
           world->rank, rounds, waited, what, ncclGetErrorString(res), (int)res,
           mp_last_error(world->comm));
    abort_start = mp_now();
    if (ncclCommAbort(world->comm) != ncclSuccess) {
        printf("hostloss: rank %d: ncclCommAbort failed\n", world->rank);
        return 1;
    }
    printf("hostloss: rank %d: ncclCommAbort took %.2f s\n", world->rank,
           mp_now() - abort_start);
    fflush(stdout);
    if (hl_host_comm != NULL && !opts->host_after) {
        MP_CHECK_COMM(hl_host_comm, ncclCommDestroy(hl_host_comm));
    } else if (hl_host_comm != NULL) {
        int host_rank = -1;
        ncclResult_t res2;
        float *send = malloc(HL_COUNT * sizeof(float));
        float *recv = malloc(HL_COUNT * sizeof(float));

        MP_ASSERT(send != NULL && recv != NULL, "out of memory");
        MP_CHECK_COMM(hl_host_comm, ncclCommUserRank(hl_host_comm, &host_rank));
        /* Round 0's data: the host's ranks may have seen the loss in different rounds. */
        if (!hl_allreduce(hl_host_comm, host_rank, hl_host_nranks, 0, send, recv, &res2)) {
            printf("hostloss: rank %d: the host communicator (%d ranks) failed after the loss: "
                   "%s\n", world->rank, hl_host_nranks, ncclGetErrorString(res2));
            return 1;
        }
        printf("hostloss: rank %d: the host communicator (%d ranks) still works\n",
               world->rank, hl_host_nranks);
        MP_CHECK_COMM(hl_host_comm, ncclCommDestroy(hl_host_comm));
        free(send);
        free(recv);
    }
    if (waited > opts->bound) {
        printf("hostloss: rank %d: the error came %.1f s after the last good round, more "
               "than -b %.1f s\n", world->rank, waited, opts->bound);
        return 1;
    }
    return HL_EXIT_ERROR_SEEN;
}

int
main(int argc, char **argv)
{
    struct hl_opts opts;
    struct mp_world world;
    float *send;
    float *recv;
    long rounds = 0;
    double start;
    double last_good;

    setvbuf(stdout, NULL, _IOLBF, 0);
    hl_parse(argc, argv, &opts);
    mp_world_init(&world);
    send = malloc(HL_COUNT * sizeof(float));
    recv = malloc(HL_COUNT * sizeof(float));
    MP_ASSERT(send != NULL && recv != NULL, "out of memory");

    if (getenv("NETNS_HOST") != NULL) {
        int color = (int)mp_env_long("NETNS_HOST", 0);
        int host_rank;
        ncclResult_t res;

        MP_CHECK_COMM(world.comm, ncclCommSplit(world.comm, color, world.rank, &hl_host_comm,
                                                NULL));
        MP_CHECK_COMM(hl_host_comm, ncclCommCount(hl_host_comm, &hl_host_nranks));
        MP_CHECK_COMM(hl_host_comm, ncclCommUserRank(hl_host_comm, &host_rank));
        if (!hl_allreduce(hl_host_comm, host_rank, hl_host_nranks, 0, send, recv, &res)) {
            printf("hostloss: rank %d: host communicator all-reduce failed: %s\n", world.rank,
                   ncclGetErrorString(res));
            return 1;
        }
    }
    start = mp_now();
    last_good = start;
    while (mp_now() - start < opts.duration) {
        ncclResult_t res;

        if (!hl_allreduce(world.comm, world.rank, world.nranks, rounds, send, recv, &res)) {
            if (res == ncclSuccess) {
                return 1; /* a wrong sum */
            }
            return hl_fail(&world, &opts, "ncclAllReduce", res, rounds, last_good);
        }
        rounds++;
        last_good = mp_now();
        if (rounds == opts.ready_rounds && opts.ready_file != NULL) {
            int fd = open(opts.ready_file, O_WRONLY | O_CREAT, 0644);

            if (fd >= 0) {
                close(fd);
            }
        }
    }
    printf("hostloss: rank %d: %ld rounds in %.1f s and no error\n", world.rank, rounds,
           opts.duration);
    if (hl_host_comm != NULL) {
        MP_CHECK_COMM(hl_host_comm, ncclCommDestroy(hl_host_comm));
    }
    MP_CHECK_COMM(world.comm, ncclCommDestroy(world.comm));
    free(send);
    free(recv);
    return mp_failures == 0 ? 0 : 1;
}
