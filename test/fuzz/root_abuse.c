/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Strangers at a live bootstrap root, through the real libnccl.so.2. Rank 0 calls
 * ncclGetUniqueId, starts this program again as rank 1 (the id on its command line), and
 * waits in ncclCommInitRank(nranks = 2). While it waits, rank 1 first plays strangers at the
 * root's port, taken from the id (layout in bootstrap/wire.h):
 *   garbage      an HTTP request;
 *   bad magic    32 bytes that are not a hello;
 *   wrong secret a complete, well-formed hello for rank 1 with the secret flipped;
 *   truncated    the right secret and a header announcing 100 bytes of blob, then 10 of them;
 *   half header  the first 16 bytes of a hello, then nothing;
 *   half close   5 bytes, then shutdown(SHUT_WR);
 *   slow loris   connects and sends nothing;
 *   flood        with -f N, N more silent connections (try N above rank 0's `ulimit -n`).
 * Garbage, bad magic, wrong secret and half close must be dropped at once (EOF, no byte of
 * reply). Then the real rank 1 joins: the communicator must form with 2 ranks, an all-reduce
 * must give the right sums on both ranks, and afterwards the root must have dropped the
 * truncated, half-header and slow-loris connections it was still holding. A root that hangs
 * shows as a timeout: run it under `timeout` (make test-root-abuse does). Exit 0 on success.
 *
 * Usage: root_abuse [-f N]           (rank 0; starts rank 1 itself)
 *        root_abuse -r ID_HEX [-f N] (rank 1)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <nccl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap/wire.h"

#define ABUSE_COUNT 1000 /* floats in the all-reduce */
#define ABUSE_WAIT_MS 10000

static const char *abuse_who = "rank 0";
static int abuse_failed;

#define ABUSE_FAIL(...)                                                                    \
    do {                                                                                   \
        fprintf(stderr, "root_abuse %s: ", abuse_who);                                     \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
        abuse_failed = 1;                                                                  \
    } while (0)

static int
abuse_connect(const union shim_sockaddr *root)
{
    int fd = socket(root->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = root->sa.sa_family == AF_INET6 ? sizeof(root->in6) : sizeof(root->in4);

    if (fd < 0 || connect(fd, &root->sa, len) != 0) {
        ABUSE_FAIL("connect to the root: %s", strerror(errno));
        exit(1);
    }
    return fd;
}

static int
abuse_stranger(const union shim_sockaddr *root, const void *bytes, size_t len)
{
    int fd = abuse_connect(root);
    if (len > 0 && send(fd, bytes, len, MSG_NOSIGNAL) != (ssize_t)len) {
        ABUSE_FAIL("send of %zu stranger bytes: %s", len, strerror(errno));
    }
    return fd;
}

/* The root must close the connection within ABUSE_WAIT_MS without sending anything. */
static void
abuse_expect_dropped(int fd, const char *what)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc = poll(&pfd, 1, ABUSE_WAIT_MS);
    if (rc == 0) {
        ABUSE_FAIL("%s: the root kept the connection open for %d ms", what, ABUSE_WAIT_MS);
    } else if (rc < 0) {
        ABUSE_FAIL("%s: poll: %s", what, strerror(errno));
    } else {
        uint8_t byte;
        ssize_t n = recv(fd, &byte, 1, 0);
        if (n > 0) {
            ABUSE_FAIL("%s: the root answered a stranger (first byte 0x%02x)", what, byte);
        } else if (n < 0 && errno != ECONNRESET) {
            ABUSE_FAIL("%s: recv: %s", what, strerror(errno));
        } else {
            printf("root_abuse %s: %s: dropped by the root\n", abuse_who, what);
        }
    }
    close(fd);
}

/* The root must still hold the connection: nothing to read, no EOF. */
static void
abuse_expect_held(int fd, const char *what)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 0) != 0) {
        ABUSE_FAIL("%s: the root closed or answered a connection that may still be a rank",
                   what);
    }
}

static void
abuse_allreduce(ncclComm_t comm, int rank)
{
    float *send = malloc(ABUSE_COUNT * sizeof(float));
    float *recv = malloc(ABUSE_COUNT * sizeof(float));
    int nranks = -1;

    if (send == NULL || recv == NULL) {
        ABUSE_FAIL("out of memory");
        exit(1);
    }
    if (ncclCommCount(comm, &nranks) != ncclSuccess || nranks != 2) {
        ABUSE_FAIL("the communicator has %d ranks, expected 2", nranks);
    }
    for (int i = 0; i < ABUSE_COUNT; i++) {
        send[i] = (float)(i + 1000 * rank);
        recv[i] = -1;
    }
    ncclResult_t res = ncclAllReduce(send, recv, ABUSE_COUNT, ncclFloat, ncclSum, comm, NULL);
    if (res != ncclSuccess) {
        ABUSE_FAIL("ncclAllReduce: %s: %s", ncclGetErrorString(res), ncclGetLastError(comm));
    } else {
        int wrong = 0;
        for (int i = 0; i < ABUSE_COUNT; i++) {
            wrong += recv[i] != (float)(2 * i + 1000);
        }
        if (wrong > 0) {
            ABUSE_FAIL("ncclAllReduce: %d of %d elements wrong", wrong, ABUSE_COUNT);
        } else {
            printf("root_abuse %s: all-reduce of %d floats over 2 ranks correct\n", abuse_who,
                   ABUSE_COUNT);
        }
    }
    free(send);
    free(recv);
}

static ncclComm_t
abuse_init(const ncclUniqueId *id, int rank)
{
    ncclComm_t comm = NULL;
    ncclResult_t res = ncclCommInitRank(&comm, 2, *id, rank);
    if (res != ncclSuccess) {
        ABUSE_FAIL("ncclCommInitRank: %s: %s", ncclGetErrorString(res),
                   ncclGetLastError(NULL));
        exit(1);
    }
    return comm;
}

/* n silent connections, left open until exit; connect does not wait for the root to
 * accept, so a root that cannot accept does not stall the flood. */
static void
abuse_flood(const union shim_sockaddr *root, int n)
{
    struct rlimit lim;

    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
        lim.rlim_cur = lim.rlim_max;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
    socklen_t len = root->sa.sa_family == AF_INET6 ? sizeof(root->in6) : sizeof(root->in4);
    if (n == 0) {
        return;
    }
    for (int i = 0; i < n; i++) {
        int fd = socket(root->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            ABUSE_FAIL("flood: socket %d of %d: %s", i, n, strerror(errno));
            return;
        }
        if (connect(fd, &root->sa, len) != 0 && errno != EINPROGRESS) {
            ABUSE_FAIL("flood: connect %d of %d: %s", i, n, strerror(errno));
            close(fd);
            return;
        }
    }
    printf("root_abuse %s: %d silent connections opened\n", abuse_who, n);
}

static int
abuse_rank1(const char *hex, int flood)
{
    ncclUniqueId id;
    struct shim_wire_id wid;
    char why[SHIM_WIRE_WHY_LEN];
    uint8_t *p = (uint8_t *)id.internal;

    abuse_who = "rank 1";
    if (strlen(hex) != 2 * sizeof(id)) {
        ABUSE_FAIL("the id on the command line has %zu hex digits", strlen(hex));
        return 1;
    }
    for (size_t i = 0; i < sizeof(id); i++) {
        unsigned byte;
        sscanf(hex + 2 * i, "%2x", &byte);
        p[i] = (uint8_t)byte;
    }
    if (!shim_wire_id_decode(&id, &wid, why, sizeof(why))) {
        ABUSE_FAIL("cannot decode the id: %s", why);
        return 1;
    }
    /* Let rank 0 join first, so the strangers meet a root that already holds a rank. */
    struct timespec pause = {.tv_nsec = 300 * 1000 * 1000};
    nanosleep(&pause, NULL);

    static const char junk[] = "GET / HTTP/1.1\r\nHost: bootstrap\r\n\r\n";
    int garbage = abuse_stranger(&wid.root, junk, sizeof(junk) - 1);
    uint8_t not_hello[SHIM_WIRE_HELLO_BYTES];
    memset(not_hello, 0x41, sizeof(not_hello));
    int bad_magic = abuse_stranger(&wid.root, not_hello, sizeof(not_hello));

    uint8_t hello[SHIM_WIRE_HELLO_BYTES + 100];
    memset(hello, 0x77, sizeof(hello));
    struct shim_wire_hello h = {.secret = wid.secret ^ 1, .nranks = 2, .rank = 1,
                                .blob_len = 100};
    shim_wire_hello_encode(&h, hello);
    int wrong_secret = abuse_stranger(&wid.root, hello, sizeof(hello));
    h.secret = wid.secret;
    shim_wire_hello_encode(&h, hello);
    int truncated = abuse_stranger(&wid.root, hello, SHIM_WIRE_HELLO_BYTES + 10);
    int half_header = abuse_stranger(&wid.root, hello, SHIM_WIRE_HELLO_BYTES / 2);
    int half_close = abuse_stranger(&wid.root, hello, 5);
    shutdown(half_close, SHUT_WR);
    int loris = abuse_stranger(&wid.root, NULL, 0);

    abuse_expect_dropped(garbage, "garbage");
    abuse_expect_dropped(bad_magic, "bad magic");
    abuse_expect_dropped(wrong_secret, "wrong secret");
    abuse_expect_dropped(half_close, "half close");
    abuse_expect_held(truncated, "truncated hello");
    abuse_expect_held(half_header, "half header");
    abuse_expect_held(loris, "slow loris");
    abuse_flood(&wid.root, flood);

    ncclComm_t comm = abuse_init(&id, 1);
    printf("root_abuse rank 1: joined the communicator past the strangers\n");
    abuse_allreduce(comm, 1);
    ncclCommDestroy(comm);

    /* Every rank is in: the root drops whoever still owes a hello. */
    abuse_expect_dropped(truncated, "truncated hello");
    abuse_expect_dropped(half_header, "half header");
    abuse_expect_dropped(loris, "slow loris");
    return abuse_failed;
}

static int
abuse_rank0(const char *self, const char *flood)
{
    ncclUniqueId id;
    char hex[2 * sizeof(id) + 1];
    const uint8_t *p = (const uint8_t *)id.internal;

    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) {
        ABUSE_FAIL("ncclGetUniqueId: %s", ncclGetErrorString(res));
        return 1;
    }
    for (size_t i = 0; i < sizeof(id); i++) {
        snprintf(hex + 2 * i, 3, "%02x", p[i]);
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        ABUSE_FAIL("fork: %s", strerror(errno));
        return 1;
    }
    if (child == 0) {
        execl(self, self, "-r", hex, "-f", flood, (char *)NULL);
        fprintf(stderr, "root_abuse: exec %s: %s\n", self, strerror(errno));
        _exit(127);
    }

    ncclComm_t comm = abuse_init(&id, 0);
    abuse_allreduce(comm, 0);
    ncclCommDestroy(comm);

    int status;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ABUSE_FAIL("rank 1 failed (wait status 0x%x)", status);
    }
    if (!abuse_failed) {
        printf("root_abuse: passed\n");
    }
    return abuse_failed;
}

int
main(int argc, char **argv)
{
    const char *hex = NULL, *flood = "0";
    int opt;

    setvbuf(stdout, NULL, _IOLBF, 0);
    while ((opt = getopt(argc, argv, "r:f:")) != -1) {
        switch (opt) {
        case 'r':
            hex = optarg;
            break;
        case 'f':
            flood = optarg;
            break;
        default:
            fprintf(stderr, "usage: %s [-r ID_HEX] [-f N]\n", argv[0]);
            return 2;
        }
    }
    if (optind != argc || atoi(flood) < 0) {
        fprintf(stderr, "usage: %s [-r ID_HEX] [-f N]\n", argv[0]);
        return 2;
    }
    return hex != NULL ? abuse_rank1(hex, atoi(flood)) : abuse_rank0("/proc/self/exe", flood);
}
