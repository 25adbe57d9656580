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
 *   fault -n NRANKS -c COLL [-v VICTIM] [-k ITER] [-b SECONDS] [-t SECONDS] [-s] [-r] [-D]
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

static int
fault_rank(const struct fault_opts *o, int rank)
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

    while ((opt = getopt(argc, argv, "n:c:v:k:b:t:srD")) != -1) {
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
        default:
            fprintf(stderr, "usage: fault -n N -c COLL [-v VICTIM] [-k ITER] [-b S] [-t S] "
                            "[-s] [-r] [-D]\n");
            return 2;
        }
    }
    if (o.victim < 0) {
        o.victim = o.nranks - 1;
    }
    MP_ASSERT(o.nranks >= 3 && (o.victim > 0 || (o.device && o.victim == 0)) &&
                  o.victim < o.nranks,
              "need 3+ ranks and a victim other than rank 0 (the root), but in device mode");

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
            exit(fault_rank(&o, r));
        }
    }

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
