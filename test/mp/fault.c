/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fault: one rank is killed (SIGKILL) in the middle of a loop of collectives, and the others
 * must cope as NCCL promises:
 *   - every survivor gets a non-success return or ncclCommGetAsyncError within -b seconds of
 *     its last completed call;
 *   - ncclCommAbort returns within 5 s, never waiting for the dead rank;
 *   - a communicator the dead rank was not in (split off at the start) still works;
 *   - with -s, ncclCommShrink(NCCL_SHRINK_ABORT) of the failed communicator gives the
 *     survivors a smaller one that works (checked all-reduce); with -r, ncclCommRevoke first
 *     and a plain shrink;
 *   - the survivors exit 0, and nothing of the library lingers (the process ends normally).
 *
 * With -g, the victim's communicator runs in one group with a communicator it is not in: rank
 * 0 and the victim share `pair`, on which they run COLL; rank 0 puts that call in a group with
 * an all-reduce on the survivors' communicator, which the other survivors call alone. In the
 * victim's last iteration they call it only a second after the victim died, so rank 0's group
 * sees the failure while its all-reduce still waits for them. That all-reduce must complete
 * (its peers would wait for it forever) with the right sums, the group must return the
 * failure, and only `pair` may carry an asynchronous error.
 *
 * With -D, the loop runs on device buffers and a stream, as a PyTorch program does: each call
 * returns at once, and a survivor waits for its stream while it polls
 * ncclCommGetAsyncError, as PyTorch's watchdog does. Then also: after ncclCommAbort the stream
 * stops waiting (the abort released it), and work enqueued after it runs. The victim may be
 * rank 0 there (the device team's leader).
 *
 * The program launches itself: it forks -n ranks with NCCL_COMM_ID on a free local port, and
 * checks that the victim died of SIGKILL and every survivor exited 0, all within -t seconds
 * (after which it kills them all). Run under ncclshim-launch -n 1 by test/mp/run.sh.
 *
 *   fault -n NRANKS -c COLL [-v VICTIM] [-k ITER] [-b SECONDS] [-t SECONDS] [-s] [-r] [-D] [-g]
 *   COLL: allreduce broadcast reduce allgather reducescatter alltoall gather scatter sendrecv
 */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "common.h"
#include "device.h"

#define FAULT_COUNT 65536 /* floats per block: several chunks of the shared-memory path */
#define FAULT_ABORT_LIMIT 5.0

struct fault_opts {
    int nranks;
    const char *coll;
    int victim;
    int kill_iter;
    double bound;
    double timeout;
    bool shrink;
    bool revoke;
    bool device;
    bool grouped;
};

/* Device mode: this rank's driver and stream (each forked rank opens its own). */
static struct mp_cuda fault_cu;
static CUstream fault_stream;

/* One collective of opts->coll on comm; blocks are FAULT_COUNT floats. */
static ncclResult_t
fault_call(ncclComm_t comm, const struct fault_opts *o, int rank, int nranks, float *send,
           float *recv)
{
    const size_t c = FAULT_COUNT;
    const char *coll = o->coll;

    CUstream s = o->device ? fault_stream : NULL;

    if (strcmp(coll, "allreduce") == 0) {
        return ncclAllReduce(send, recv, c, ncclFloat, ncclSum, comm, s);
    } else if (strcmp(coll, "broadcast") == 0) {
        return ncclBroadcast(send, recv, c, ncclFloat, 0, comm, s);
    } else if (strcmp(coll, "reduce") == 0) {
        return ncclReduce(send, recv, c, ncclFloat, ncclSum, 0, comm, s);
    } else if (strcmp(coll, "allgather") == 0) {
        return ncclAllGather(send, recv, c, ncclFloat, comm, s);
    } else if (strcmp(coll, "reducescatter") == 0) {
        return ncclReduceScatter(send, recv, c, ncclFloat, ncclSum, comm, s);
    } else if (strcmp(coll, "alltoall") == 0) {
        return ncclAlltoAll(send, recv, c, ncclFloat, comm, s);
    } else if (strcmp(coll, "gather") == 0) {
        return ncclGather(send, recv, c, ncclFloat, 0, comm, s);
    } else if (strcmp(coll, "scatter") == 0) {
        return ncclScatter(send, recv, c, ncclFloat, 0, comm, s);
    }
    /* sendrecv: a ring, in one group */
    ncclResult_t res = ncclGroupStart();
    if (res == ncclSuccess) {
        ncclResult_t a = ncclSend(send, c, ncclFloat, (rank + 1) % nranks, comm, s);
        ncclResult_t b = ncclRecv(recv, c, ncclFloat, (rank + nranks - 1) % nranks, comm, s);
        res = ncclGroupEnd();
        res = a != ncclSuccess ? a : b != ncclSuccess ? b : res;
    }
    return res;
}

/* The loop's buffers: host memory, or device memory in device mode. */
static float *
fault_buffer(const struct fault_opts *o)
{
    size_t bytes = (size_t)o->nranks * FAULT_COUNT * sizeof(float);
    float *buf = o->device ? mp_cuda_alloc(&fault_cu, MP_MEM_DEVICE, bytes) : calloc(1, bytes);
    MP_ASSERT(buf != NULL, "out of memory");
    return buf;
}

static void
fault_buffer_free(const struct fault_opts *o, float *buf)
{
    if (o->device) {
        mp_cuda_free(&fault_cu, MP_MEM_DEVICE, buf);
    } else {
        free(buf);
    }
}

/* Device mode, after the failure was seen and the communicator aborted: the stream must
 * not stay blocked, and work enqueued after it must run. */
static void
fault_stream_released(float *buf)
{
    float probe = -1;
    MP_EXPECT(mp_cuda_wait(&fault_cu, fault_stream, NULL, FAULT_ABORT_LIMIT) == ncclSuccess,
              "the stream still waits %.0f s after ncclCommAbort", FAULT_ABORT_LIMIT);
    mp_cuda_copy(&fault_cu, &probe, buf, sizeof(probe), fault_stream);
    MP_EXPECT(probe != -1, "work enqueued after the abort did not run");
}

/* A survivor: runs until the failure shows, then recovers. Returns the exit status. */
static int
fault_survivor(const struct fault_opts *o, int rank, ncclComm_t world, ncclComm_t others)
{
    const int n = o->nranks;
    float *send = fault_buffer(o), *recv = fault_buffer(o);
    ncclResult_t res = ncclSuccess, async = ncclSuccess;
    double last_ok = mp_now();
    long iter = 0;

    while (res == ncclSuccess && async == ncclSuccess) {
        res = fault_call(world, o, rank, n, send, recv);
        if (res == ncclSuccess && o->device) {
            /* A watchdog's wait: the stream, or an error, whichever comes first. */
            ncclResult_t waited = mp_cuda_wait(&fault_cu, fault_stream, world, o->timeout);
            async = waited == ncclInProgress ? ncclSuccess : waited;
        }
        if (async == ncclSuccess && ncclCommGetAsyncError(world, &async) != ncclSuccess) {
            async = ncclInternalError;
        }
        if (res == ncclSuccess && async == ncclSuccess) {
            last_ok = mp_now();
            iter++;
        }
        MP_ASSERT(mp_now() - last_ok < o->timeout, "no error after %.0f s: a hang",
                  mp_now() - last_ok);
    }
    double detect = mp_now() - last_ok;
    MP_EXPECT(detect <= o->bound, "the failure took %.2f s to show (bound %.0f s)", detect,
              o->bound);
    MP_EXPECT(res == ncclRemoteError || res == ncclSystemError || async == ncclRemoteError ||
                  async == ncclSystemError || res == ncclInvalidUsage,
              "the failure showed as return %s, async %s", ncclGetErrorString(res),
              ncclGetErrorString(async));

    double t0 = mp_now();
    if (o->shrink || o->revoke) {
        ncclComm_t small = NULL;
        int gone = o->victim;
        if (o->revoke) {
            MP_CHECK_COMM(world, ncclCommRevoke(world, NCCL_REVOKE_DEFAULT));
        }
        MP_CHECK_COMM(world, ncclCommShrink(world, &gone, 1, &small, NULL,
                                            o->revoke ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT));
        int srank, scount;
        MP_CHECK_COMM(small, ncclCommUserRank(small, &srank));
        MP_CHECK_COMM(small, ncclCommCount(small, &scount));
        MP_EXPECT(scount == n - 1 && srank == (rank < o->victim ? rank : rank - 1),
                  "shrunk communicator: rank %d of %d", srank, scount);
        MP_EXPECT(mp_allreduce_check(small, srank, scount, ncclFloat, 4099, false, 7) == 0,
                  "all-reduce on the shrunk communicator");
        MP_CHECK_COMM(small, ncclCommDestroy(small));
    }
    MP_CHECK_COMM(world, ncclCommAbort(world));
    double abort_s = mp_now() - t0;
    MP_EXPECT(abort_s <= FAULT_ABORT_LIMIT + (o->shrink || o->revoke ? o->bound : 0),
              "abort took %.2f s", abort_s);
    if (o->device) {
        fault_stream_released(recv);
    }

    int orank, ocount;
    MP_CHECK_COMM(others, ncclCommUserRank(others, &orank));
    MP_CHECK_COMM(others, ncclCommCount(others, &ocount));
    MP_EXPECT(mp_allreduce_check(others, orank, ocount, ncclFloat, 65537, false, 9) == 0,
              "all-reduce on a communicator without the dead rank");
    MP_CHECK_COMM(others, ncclCommDestroy(others));
    printf("fault: rank %d: %s failed after %ld calls as %s/%s, seen %.3f s after the last "
           "success; %s%.3f s\n", rank, o->coll, iter, ncclGetErrorString(res),
           ncclGetErrorString(async), detect,
           o->revoke ? "revoke, shrink and abort " : o->shrink ? "shrink and abort " : "abort ",
           abort_s);
    fault_buffer_free(o, send);
    fault_buffer_free(o, recv);
    return mp_failures == 0 ? 0 : 1;
}

/* -g: one all-reduce on the survivors' communicator, its sums checked. Element 0 adds up the
 * survivors' `stop`; the rest, their ranks in `others` plus one. Returns the call's result
 * (and leaves the sum of stops in *stops); within a group with a call on `pair` when given. */
static ncclResult_t
fault_grouped_call(const struct fault_opts *o, ncclComm_t pair, ncclComm_t others, int orank,
                   int ocount, float stop, float *stops, float *pair_buf)
{
    const size_t count = (size_t)o->nranks * FAULT_COUNT;
    float *send = malloc(count * sizeof(float)), *recv = malloc(count * sizeof(float));
    ncclResult_t res;

    MP_ASSERT(send != NULL && recv != NULL, "out of memory");
    for (size_t i = 0; i < count; i++) {
        send[i] = (float)(orank + 1);
        recv[i] = -1;
    }
    send[0] = stop;
    if (pair != NULL) {
        MP_CHECK(ncclGroupStart());
        ncclResult_t a = fault_call(pair, o, 0, 2, pair_buf, pair_buf + count);
        ncclResult_t b = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, others, NULL);
        res = ncclGroupEnd();
        res = a != ncclSuccess ? a : b != ncclSuccess ? b : res;
    } else {
        res = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, others, NULL);
    }
    const float sum = (float)ocount * (float)(ocount + 1) / 2;
    size_t wrong = 0;
    for (size_t i = 1; i < count; i++) {
        wrong += recv[i] != sum;
    }
    MP_EXPECT(wrong == 0, "the survivors' all-reduce (call %s): %zu of %zu sums wrong",
              ncclGetErrorString(res), wrong, count - 1);
    *stops = recv[0];
    free(send);
    free(recv);
    return res;
}

/* -g: a survivor. Rank 0 groups COLL on `pair` with the survivors' all-reduce until its group
 * fails, then says stop in the next all-reduce; the others wait for the victim's death in its
 * last iteration (death_fd reads end-of-file then) and one second more. */
static int
fault_grouped(const struct fault_opts *o, int rank, ncclComm_t world, ncclComm_t pair,
              ncclComm_t others, int death_fd)
{
    int orank, ocount;
    float stops = 0, *pair_buf = calloc(2 * (size_t)o->nranks * FAULT_COUNT, sizeof(float));
    ncclResult_t failure = ncclSuccess;
    double seen = 0;

    MP_ASSERT(pair_buf != NULL, "out of memory");
    MP_CHECK_COMM(others, ncclCommUserRank(others, &orank));
    MP_CHECK_COMM(others, ncclCommCount(others, &ocount));
    for (int iter = 0; stops == 0; iter++) {
        if (rank != 0 && iter == o->kill_iter) {
            char byte;
            MP_ASSERT(read(death_fd, &byte, 1) == 0, "the victim's pipe did not close");
            struct timespec second = {1, 0};
            nanosleep(&second, NULL);
        }
        bool grouped = rank == 0 && failure == ncclSuccess;
        double t0 = mp_now();
        ncclResult_t res = fault_grouped_call(o, grouped ? pair : NULL, others, orank, ocount,
                                              grouped ? 0.0f : rank == 0 ? 1.0f : 0.0f, &stops,
                                              pair_buf);
        if (grouped && res != ncclSuccess) {
            failure = res;
            seen = mp_now() - t0;
            ncclResult_t pair_async = ncclSuccess, others_async = ncclSuccess;
            MP_CHECK(ncclCommGetAsyncError(pair, &pair_async));
            MP_CHECK(ncclCommGetAsyncError(others, &others_async));
            MP_EXPECT(pair_async != ncclSuccess && others_async == ncclSuccess,
                      "after the group failed as %s: the victim's communicator %s, the "
                      "survivors' %s", ncclGetErrorString(res), ncclGetErrorString(pair_async),
                      ncclGetErrorString(others_async));
        } else {
            MP_EXPECT(res == ncclSuccess, "the survivors' all-reduce failed: %s",
                      ncclGetErrorString(res));
        }
        MP_ASSERT(iter < o->kill_iter + 1000, "no stop after %d calls", iter);
    }
    if (rank == 0) {
        MP_EXPECT(failure != ncclSuccess, "rank 0 stopped without a failure");
        MP_CHECK_COMM(pair, ncclCommAbort(pair));
    }
    MP_EXPECT(mp_allreduce_check(others, orank, ocount, ncclFloat, 65537, false, 9) == 0,
              "all-reduce on the survivors' communicator after the failure");
    MP_CHECK_COMM(others, ncclCommDestroy(others));
    MP_CHECK_COMM(world, ncclCommAbort(world));
    if (rank == 0) {
        printf("fault: rank 0: the group of %s and the survivors' all-reduce failed as %s "
               "after %.3f s; the all-reduce completed\n", o->coll,
               ncclGetErrorString(failure), seen);
    } else {
        printf("fault: rank %d: the survivors' all-reduce went on through rank 0's failure\n",
               rank);
    }
    free(pair_buf);
    return mp_failures == 0 ? 0 : 1;
}

static int
fault_rank(const struct fault_opts *o, int rank, int death_fd)
{
    struct mp_world world = {.rank = rank, .nranks = o->nranks};
    ncclComm_t others = NULL;

    mp_rank_id = rank;
    if (o->device) {
        setenv("LOCAL_RANK", "0", 1); /* every forked rank on the first device */
        mp_cuda_init(&fault_cu);
        MP_CU(&fault_cu, stream_create(&fault_stream, CU_STREAM_NON_BLOCKING));
    }
    world.comm = mp_comm_create(&world);
    MP_CHECK_COMM(world.comm, ncclCommSplit(world.comm,
                                            rank == o->victim ? NCCL_SPLIT_NOCOLOR : 0, rank,
                                            &others, NULL));
    if (o->grouped) {
        ncclComm_t pair = NULL;
        bool in_pair = rank == 0 || rank == o->victim;
        MP_CHECK_COMM(world.comm, ncclCommSplit(world.comm, in_pair ? 0 : NCCL_SPLIT_NOCOLOR,
                                                rank, &pair, NULL));
        if (rank != o->victim) {
            return fault_grouped(o, rank, world.comm, pair, others, death_fd);
        }
        float *buf = fault_buffer(o);
        for (int iter = 0;; iter++) {
            if (iter == o->kill_iter) {
                raise(SIGKILL);
            }
            MP_CHECK_COMM(pair, fault_call(pair, o, 1, 2, buf, buf));
        }
    }
    if (rank != o->victim) {
        return fault_survivor(o, rank, world.comm, others);
    }
    float *send = fault_buffer(o), *recv = fault_buffer(o);
    for (int iter = 0;; iter++) {
        if (iter == o->kill_iter) {
            raise(SIGKILL);
        }
        MP_CHECK_COMM(world.comm, fault_call(world.comm, o, rank, o->nranks, send, recv));
        if (o->device) {
            MP_ASSERT(mp_cuda_wait(&fault_cu, fault_stream, world.comm, o->timeout) ==
                          ncclSuccess, "the victim's call %d did not finish", iter);
        }
    }
}

/* A TCP port nothing listens on right now, for NCCL_COMM_ID. */
static int
fault_free_port(void)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    MP_ASSERT(fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
                  getsockname(fd, (struct sockaddr *)&addr, &len) == 0,
              "no free port");
    close(fd);
    return ntohs(addr.sin_port);
}

int
main(int argc, char **argv)
{
    struct fault_opts o = {.nranks = 3, .coll = "allreduce", .victim = -1, .kill_iter = 20,
                           .bound = 10, .timeout = 60};
    int opt;

    while ((opt = getopt(argc, argv, "n:c:v:k:b:t:srDg")) != -1) {
        switch (opt) {
        case 'n': o.nranks = atoi(optarg); break;
        case 'c': o.coll = optarg; break;
        case 'v': o.victim = atoi(optarg); break;
        case 'k': o.kill_iter = atoi(optarg); break;
        case 'b': o.bound = atof(optarg); break;
        case 't': o.timeout = atof(optarg); break;
        case 's': o.shrink = true; break;
        case 'r': o.revoke = true; break;
        case 'D': o.device = true; break;
        case 'g': o.grouped = true; break;
        default:
            fprintf(stderr, "usage: fault -n N -c COLL [-v VICTIM] [-k ITER] [-b S] [-t S] "
                            "[-s] [-r] [-D] [-g]\n");
            return 2;
        }
    }
    if (o.victim < 0) {
        o.victim = o.nranks - 1;
    }
    MP_ASSERT(o.nranks >= 3 && (o.victim > 0 || (o.device && o.victim == 0)) &&
                  o.victim < o.nranks,
              "need 3+ ranks and a victim other than rank 0 (the root), but in device mode");
    MP_ASSERT(!o.grouped || !(o.device || o.shrink || o.revoke),
              "-g runs on host memory, without -s or -r");
    /* Read end for the survivors: it reads end-of-file once the victim, the only holder of
     * the write end, is dead. */
    int death[2];
    MP_ASSERT(pipe(death) == 0, "pipe failed");

    char comm_id[64];
    snprintf(comm_id, sizeof(comm_id), "127.0.0.1:%d", fault_free_port());
    setenv("NCCL_COMM_ID", comm_id, 1);
    fflush(stdout);
    pid_t pids[64];
    MP_ASSERT(o.nranks <= 64, "at most 64 ranks");
    for (int r = 0; r < o.nranks; r++) {
        pids[r] = fork();
        MP_ASSERT(pids[r] >= 0, "fork failed");
        if (pids[r] == 0) {
            close(death[r == o.victim ? 0 : 1]);
            exit(fault_rank(&o, r, death[0]));
        }
    }
    close(death[0]);
    close(death[1]);

    int failed = 0, left = o.nranks;
    double deadline = mp_now() + o.timeout;
    bool done[64] = {false};
    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid == 0) {
            if (mp_now() > deadline) {
                fprintf(stderr, "fault: %d ranks still running after %.0f s: killing them\n",
                        left, o.timeout);
                for (int r = 0; r < o.nranks; r++) {
                    if (!done[r]) {
                        kill(pids[r], SIGKILL);
                    }
                }
                failed++;
                deadline = mp_now() + 3600;
            }
            struct timespec pause = {0, 10 * 1000 * 1000};
            nanosleep(&pause, NULL);
            continue;
        }
        MP_ASSERT(pid > 0, "waitpid failed");
        for (int r = 0; r < o.nranks; r++) {
            if (pids[r] != pid) {
                continue;
            }
            done[r] = true;
            left--;
            bool ok = r == o.victim ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                                    : WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!ok) {
                fprintf(stderr, "fault: rank %d ended with status 0x%x\n", r, status);
                failed++;
            }
        }
    }
    printf("fault: %s, %d ranks, rank %d killed: %s\n", o.coll, o.nranks, o.victim,
           failed ? "FAILED" : "passed");
    return failed ? 1 : 0;
}
