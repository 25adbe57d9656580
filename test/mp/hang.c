/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hang: what a silent hang becomes. Three parts (-p), run by test/mp/run.sh under the
 * launcher, at 2 or more ranks:
 *   timeout   the last rank skips an all-reduce; with NCCLSHIM_TIMEOUT=2 every other rank
 *             gets an error within a few seconds, and stderr holds a report naming the
 *             operation and the rank it waits for. The skipper then aborts too.
 *   report    rank 0 sends itself SIGUSR1 while it waits for a late rank; the report comes,
 *             the call still completes correctly.
 *   mismatch  with NCCLSHIM_CHECK=1, the last rank calls with another count (then another
 *             collective, then another root): every rank gets ncclInvalidUsage with a message
 *             naming both calls, and the communicator still works afterwards.
 *   idle      the last rank comes 1.5 s late to an all-reduce: the ranks that wait for it
 *             sleep, so the waiting thread's CPU time is under a quarter of the wait, and the
 *             result is right.
 *   shrink    rank 1 alone calls an all-reduce, which fails at its own NCCLSHIM_TIMEOUT=1
 *             (the others have none); then every rank but the last shrinks the world without
 *             the last, rank 1's failed world included, and the shrunk communicator works,
 *             though rank 1's world counted one operation more than the others' (as when
 *             ranks give up in different operations after a rank died).
 * and on device buffers (a CUDA driver, or its test double, needed):
 *   devtimeout   timeout, for a stream-ordered all-reduce: the call returns at once (but
 *                where it may wait for the other ranks: mp_device_call_may_wait); with
 *                NCCLSHIM_TIMEOUT=2 ncclCommGetAsyncError turns ncclRemoteError within a few
 *                seconds, with the report and the last-error text; abort releases the stream.
 *   devreport    a report on SIGUSR1 while a device all-reduce waits for a late rank.
 *   devmismatch  the last rank's device all-reduce has another count: every rank's
 *                communicator fails with ncclInvalidUsage, each with a message.
 *   devalgomismatch  the last rank alone sets NCCL_ALGO=Ring, with a GPU per rank: its
 *                all-reduce chooses a ring between the GPUs, the others direct parts; the
 *                same failure, no hang, and abort releases every stream.
 * Each part reads its own stderr back (redirected to a file) to check what was printed.
 */
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include "common.h"
#include "device.h"

/* Runs from here on with stderr in a file, so the part can read what the library printed. */
static char hang_log[64];
static int hang_saved_stderr = -1;

static void
hang_capture_start(int rank)
{
    snprintf(hang_log, sizeof(hang_log), "/tmp/ncclshim-hang-%d-%d.log", (int)getpid(), rank);
    int fd = open(hang_log, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    MP_ASSERT(fd >= 0, "cannot open %s", hang_log);
    fflush(stderr);
    hang_saved_stderr = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    close(fd);
}

/* Restores stderr and returns what was captured (echoed to stderr); a second call returns
 * the same text. */
static const char *
hang_capture_end(void)
{
    static char text[65536];
    if (hang_saved_stderr < 0) {
        return text;
    }
    fflush(stderr);
    dup2(hang_saved_stderr, STDERR_FILENO);
    close(hang_saved_stderr);
    int fd = open(hang_log, O_RDONLY);
    ssize_t n = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
    if (fd >= 0) {
        close(fd);
    }
    unlink(hang_log);
    hang_saved_stderr = -1;
    text[n > 0 ? n : 0] = '\0';
    fputs(text, stderr);
    return text;
}

/* Whether the captured text (hang_capture_end) contains needle. */
static bool
hang_capture_has(const char *needle)
{
    return strstr(hang_capture_end(), needle) != NULL;
}

static void
part_timeout(const struct mp_world *w)
{
    float x[1024] = {0};
    const int skipper = w->nranks - 1;

    if (w->rank == skipper) {
        /* Skips the call; waits until the others have given up, then leaves. */
        sleep(6);
        MP_CHECK(ncclCommAbort(w->comm));
        return;
    }
    hang_capture_start(w->rank);
    double t0 = mp_now();
    ncclResult_t res = ncclAllReduce(x, x, 1024, ncclFloat, ncclSum, w->comm, NULL);
    double took = mp_now() - t0;
    /* The rank whose clock runs out first reports and fails the team (over UCX it tells the
     * others that it gave up); a rank that learns of it before its own clock runs out reports
     * where its operation stood then, and its last error quotes the first rank's. */
    bool reported = hang_capture_has("ncclshim report (NCCLSHIM_TIMEOUT)") ||
                    hang_capture_has("ncclshim report (device team failed)") ||
                    hang_capture_has("ncclshim report (a peer gave up)");
    MP_EXPECT(res != ncclSuccess, "the all-reduce without rank %d succeeded", skipper);
    MP_EXPECT(took >= 1.5 && took < 9.0, "timed out after %.2f s (NCCLSHIM_TIMEOUT=2)", took);
    MP_EXPECT(reported, "no report on stderr");
    MP_EXPECT(strstr(mp_last_error(w->comm), "NCCLSHIM_TIMEOUT") != NULL,
              "ncclGetLastError: \"%s\"", mp_last_error(w->comm));
    /* Stay until every other waiting rank timed out too: a rank that exits earlier is a dead
     * peer to them, which they would report instead (rightly, but not what this tests). */
    sleep(2);
    MP_CHECK(ncclCommAbort(w->comm));
}

static void *
hang_signal_later(void *arg)
{
    (void)arg;
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    kill(getpid(), SIGUSR1);
    return NULL;
}

static void
part_report(const struct mp_world *w)
{
    pthread_t thread;

    if (w->rank == 0) {
        hang_capture_start(w->rank);
        pthread_create(&thread, NULL, hang_signal_later, NULL);
    } else {
        sleep(1); /* late, so rank 0 waits while it is asked for a report */
    }
    long wrong = mp_allreduce_check(w->comm, w->rank, w->nranks, ncclFloat, 1000, false, 3);
    if (w->rank == 0) {
        pthread_join(thread, NULL);
        MP_EXPECT(hang_capture_has("ncclshim report (on request)"), "no report on SIGUSR1");
    }
    MP_EXPECT(wrong == 0, "the all-reduce was wrong after the report");
    MP_CHECK(ncclCommDestroy(w->comm));
}

/* One collective call of the mismatch part; the last rank differs by `how`. */
static ncclResult_t
hang_mismatched_call(const struct mp_world *w, int how, float *send, float *recv)
{
    bool odd = w->rank == w->nranks - 1;
    switch (how) {
    case 0:
        return ncclAllReduce(send, recv, odd ? 100 : 200, ncclFloat, ncclSum, w->comm, NULL);
    case 1:
        return odd ? ncclBroadcast(send, recv, 200, ncclFloat, 0, w->comm, NULL)
                   : ncclAllReduce(send, recv, 200, ncclFloat, ncclSum, w->comm, NULL);
    default:
        return ncclReduce(send, recv, 200, ncclFloat, ncclSum, odd ? 1 : 0, w->comm, NULL);
    }
}

static void
part_mismatch(const struct mp_world *w)
{
    static const char *const what[] = {"count", "collective", "root"};
    float send[200] = {0}, recv[200];

    for (int how = 0; how < 3; how++) {
        ncclResult_t res = hang_mismatched_call(w, how, send, recv);
        const char *text = mp_last_error(w->comm);
        MP_EXPECT(res == ncclInvalidUsage, "mismatched %s: %s", what[how],
                  ncclGetErrorString(res));
        MP_EXPECT(strstr(text, "NCCLSHIM_CHECK") != NULL && strstr(text, what[how]) != NULL,
                  "mismatched %s: message \"%s\"", what[how], text);
        MP_EXPECT(mp_allreduce_check(w->comm, w->rank, w->nranks, ncclFloat, 4099, false,
                                     (uint64_t)how) == 0,
                  "the communicator after a mismatched %s", what[how]);
    }
    MP_CHECK(ncclCommDestroy(w->comm));
}

/* CPU seconds (user and system) this thread has used. */
static double
hang_thread_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static void
part_idle(const struct mp_world *w)
{
    const bool late = w->rank == w->nranks - 1;

    /* One call first, so the wait below is not the communicator's first use. */
    MP_EXPECT(mp_allreduce_check(w->comm, w->rank, w->nranks, ncclFloat, 64, false, 1) == 0,
              "the first all-reduce");
    if (late) {
        usleep(1500 * 1000);
    }
    double t0 = mp_now(), cpu0 = hang_thread_cpu();
    long wrong = mp_allreduce_check(w->comm, w->rank, w->nranks, ncclFloat, 64, false, 2);
    double waited = mp_now() - t0, cpu = hang_thread_cpu() - cpu0;
    MP_EXPECT(wrong == 0, "the late all-reduce was wrong");
    if (!late) {
        MP_EXPECT(waited > 1.0, "waited %.2f s for a rank 1.5 s late", waited);
        MP_EXPECT(cpu < 0.25 * waited, "used %.3f s of CPU while waiting %.2f s", cpu, waited);
        printf("hang: idle: rank %d waited %.2f s on %.3f s of CPU\n", w->rank, waited, cpu);
    }
    MP_CHECK(ncclCommDestroy(w->comm));
}

/* --- device buffers ----------------------------------------------------------------------- */

static struct mp_cuda hang_cu;
static CUstream hang_stream;

static void
part_devtimeout(const struct mp_world *w)
{
    const int skipper = w->nranks - 1;
    float *x = mp_cuda_alloc(&hang_cu, MP_MEM_DEVICE, 1024 * sizeof(float));

    if (w->rank == skipper) {
        sleep(6);
        MP_CHECK(ncclCommAbort(w->comm));
        return;
    }
    hang_capture_start(w->rank);
    double t0 = mp_now();
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, 1024, ncclFloat, ncclSum, w->comm, hang_stream));
    double call = mp_now() - t0;
    ncclResult_t seen = mp_cuda_wait(&hang_cu, hang_stream, w->comm, 10);
    double took = mp_now() - t0;
    /* The rank whose clock runs out first reports and fails the team (over UCX it tells the
     * others that it gave up); a rank that learns of it before its own clock runs out reports
     * where its operation stood then, and its last error quotes the first rank's. */
    bool reported = hang_capture_has("ncclshim report (NCCLSHIM_TIMEOUT)") ||
                    hang_capture_has("ncclshim report (device team failed)") ||
                    hang_capture_has("ncclshim report (a peer gave up)");
    MP_EXPECT(call < 0.5 || mp_device_call_may_wait(w->rank, w->nranks),
              "the call took %.2f s: it must return once enqueued", call);
    MP_EXPECT(seen == ncclRemoteError, "ncclCommGetAsyncError gave %s, not a remote error",
              ncclGetErrorString(seen));
    MP_EXPECT(took >= 1.5 && took < 9.0, "timed out after %.2f s (NCCLSHIM_TIMEOUT=2)", took);
    MP_EXPECT(reported, "no report on stderr");
    MP_EXPECT(strstr(mp_last_error(w->comm), "NCCLSHIM_TIMEOUT") != NULL ||
                  strstr(mp_last_error(w->comm), "device team failed") != NULL,
              "ncclGetLastError: \"%s\"", mp_last_error(w->comm));
    sleep(2);
    MP_CHECK(ncclCommAbort(w->comm));
    MP_EXPECT(mp_cuda_wait(&hang_cu, hang_stream, NULL, 5) == ncclSuccess,
              "the stream still waits after ncclCommAbort");
}

static void
part_devreport(const struct mp_world *w)
{
    float *x = mp_cuda_alloc(&hang_cu, MP_MEM_DEVICE, 1000 * sizeof(float));
    float host[1000];
    pthread_t thread;

    for (int i = 0; i < 1000; i++) {
        host[i] = (float)(w->rank + i);
    }
    mp_cuda_copy(&hang_cu, x, host, sizeof(host), hang_stream);
    if (w->rank == 0) {
        hang_capture_start(w->rank);
        pthread_create(&thread, NULL, hang_signal_later, NULL);
    } else {
        sleep(1); /* late, so rank 0's operation waits while it is asked for a report */
    }
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, 1000, ncclFloat, ncclSum, w->comm, hang_stream));
    mp_cuda_copy(&hang_cu, host, x, sizeof(host), hang_stream);
    if (w->rank == 0) {
        pthread_join(thread, NULL);
        MP_EXPECT(hang_capture_has("ncclshim report (on request)"), "no report on SIGUSR1");
    }
    for (int i = 0; i < 1000; i++) {
        float want = (float)(w->nranks * i + w->nranks * (w->nranks - 1) / 2);
        MP_EXPECT(host[i] == want, "element %d: %g, expected %g", i, host[i], want);
        if (host[i] != want) {
            break;
        }
    }
    MP_CHECK(ncclCommDestroy(w->comm));
}

static void
part_devmismatch(const struct mp_world *w)
{
    float *x = mp_cuda_alloc(&hang_cu, MP_MEM_DEVICE, 200 * sizeof(float));
    size_t count = w->rank == w->nranks - 1 ? 100 : 200;

    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, count, ncclFloat, ncclSum, w->comm, hang_stream));
    ncclResult_t seen = mp_cuda_wait(&hang_cu, hang_stream, w->comm, 10);
    MP_EXPECT(seen == ncclInvalidUsage, "mismatched counts gave %s, not invalid usage",
              ncclGetErrorString(seen));
    MP_EXPECT(mp_last_error(w->comm)[0] != '\0', "no message for the mismatch");
    MP_CHECK(ncclCommAbort(w->comm));
    MP_EXPECT(mp_cuda_wait(&hang_cu, hang_stream, NULL, 5) == ncclSuccess,
              "the stream still waits after ncclCommAbort");
}

static void
part_devalgomismatch(const struct mp_world *w)
{
    const size_t count = (size_t)1 << 20;
    float *x = mp_cuda_alloc(&hang_cu, MP_MEM_DEVICE, count * sizeof(float));

    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, count, ncclFloat, ncclSum, w->comm, hang_stream));
    ncclResult_t seen = mp_cuda_wait(&hang_cu, hang_stream, w->comm, 10);
    MP_EXPECT(seen == ncclInvalidUsage, "NCCL_ALGO on one rank alone gave %s, not invalid usage",
              ncclGetErrorString(seen));
    MP_EXPECT(strstr(mp_last_error(w->comm), "NCCL_ALGO") != NULL,
              "the message does not name NCCL_ALGO: \"%s\"", mp_last_error(w->comm));
    MP_CHECK(ncclCommAbort(w->comm));
    MP_EXPECT(mp_cuda_wait(&hang_cu, hang_stream, NULL, 5) == ncclSuccess,
              "the stream still waits after ncclCommAbort");
}

static void
part_shrink(const struct mp_world *w)
{
    const int stray = 1;
    int gone = w->nranks - 1;
    ncclComm_t side = NULL, small = NULL;
    float x[1024] = {0};

    MP_CHECK_COMM(w->comm, ncclCommSplit(w->comm, 0, w->rank, &side, NULL));
    if (w->rank == stray) {
        ncclResult_t res = ncclAllReduce(x, x, 1024, ncclFloat, ncclSum, w->comm, NULL);
        MP_EXPECT(res == ncclRemoteError, "the all-reduce of rank %d alone gave %s", stray,
                  ncclGetErrorString(res));
    }
    /* Everyone meets once the stray's all-reduce failed. */
    MP_CHECK_COMM(side, ncclAllReduce(x, x, 1024, ncclFloat, ncclSum, side, NULL));
    if (w->rank != gone) {
        MP_CHECK_COMM(w->comm, ncclCommShrink(w->comm, &gone, 1, &small, NULL,
                                              NCCL_SHRINK_ABORT));
        int srank, scount;
        MP_CHECK_COMM(small, ncclCommUserRank(small, &srank));
        MP_CHECK_COMM(small, ncclCommCount(small, &scount));
        MP_EXPECT(scount == w->nranks - 1 && srank == w->rank,
                  "shrunk communicator: rank %d of %d", srank, scount);
        MP_EXPECT(mp_allreduce_check(small, srank, scount, ncclFloat, 4099, false, 7) == 0,
                  "all-reduce on the shrunk communicator");
        MP_CHECK_COMM(small, ncclCommDestroy(small));
    }
    MP_CHECK_COMM(side, ncclAllReduce(x, x, 1024, ncclFloat, ncclSum, side, NULL));
    MP_CHECK_COMM(side, ncclCommDestroy(side));
    MP_CHECK(ncclCommAbort(w->comm));
}

int
main(int argc, char **argv)
{
    struct mp_world world;
    const char *part = "timeout";
    int opt;

    while ((opt = getopt(argc, argv, "p:")) != -1) {
        if (opt == 'p') {
            part = optarg;
        } else {
            fprintf(stderr, "usage: hang -p timeout|report|mismatch|idle|shrink|devtimeout|"
                            "devreport|devmismatch|devalgomismatch\n");
            return 2;
        }
    }
    if (strncmp(part, "dev", 3) == 0) {
        mp_cuda_init(&hang_cu); /* before the communicator: its device */
        MP_CU(&hang_cu, stream_create(&hang_stream, CU_STREAM_NON_BLOCKING));
    }
    mp_world_env(&world);
    if (strcmp(part, "devalgomismatch") == 0 && world.rank == world.nranks - 1) {
        setenv("NCCL_ALGO", "Ring", 1); /* read when the communicator is made */
    }
    if (strcmp(part, "shrink") == 0 && world.rank == 1) {
        setenv("NCCLSHIM_TIMEOUT", "1", 1); /* read at the first operation */
    }
    world.comm = mp_comm_create(&world);
    MP_ASSERT(world.nranks >= 2, "needs 2 or more ranks");
    MP_ASSERT(strcmp(part, "shrink") != 0 || world.nranks >= 3, "shrink needs 3 or more ranks");
    if (strcmp(part, "timeout") == 0) {
        part_timeout(&world);
    } else if (strcmp(part, "report") == 0) {
        part_report(&world);
    } else if (strcmp(part, "idle") == 0) {
        part_idle(&world);
    } else if (strcmp(part, "shrink") == 0) {
        part_shrink(&world);
    } else if (strcmp(part, "devtimeout") == 0) {
        part_devtimeout(&world);
    } else if (strcmp(part, "devreport") == 0) {
        part_devreport(&world);
    } else if (strcmp(part, "devmismatch") == 0) {
        part_devmismatch(&world);
    } else if (strcmp(part, "devalgomismatch") == 0) {
        part_devalgomismatch(&world);
    } else {
        part_mismatch(&world);
    }
    if (world.rank == 0) {
        printf("hang: %s, %d ranks, %d failed checks on rank 0\n", part, world.nranks,
               mp_failures);
    }
    return mp_failures == 0 ? 0 : 1;
}
