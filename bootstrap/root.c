/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap root: a detached thread serving one rendezvous from one poll() loop.
 * bootstrap.c starts one for each unique id this process makes, and on rank 0 for an id from
 * NCCL_COMM_ID. Every socket is non-blocking and each connection keeps its own partial hello,
 * so a client that is slow, silent or hostile delays nobody else. A hello with the wrong
 * secret, malformed or oversized bytes, or a connection closed halfway is dropped and the
 * root goes on waiting for the real ranks. A duplicate rank or a disagreement on nranks is the
 * ranks' mistake: the root answers every rank that joins with a refusal, so they fail with a
 * clear message instead of waiting. Once all nranks hellos are in, the root stops listening,
 * sends every rank the table, and frees everything; it also gives up at its deadline, so an
 * id nobody uses does not keep a thread forever. Any number of roots may run at once.
 * test/fuzz/fuzz_bootstrap_root.c includes this file to drive the state machine without its
 * thread.
 */
#include "root.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/debug.h"
#include "base/random.h"
#include "socket.h"
#include "wire.h"

/* Connections still owing their hello that the root keeps; past it, or when accept runs out
 * of file descriptors, the oldest that has not shown the secret is dropped, so a flood of
 * idle strangers cannot starve the real ranks of descriptors. */
#define SHIM_ROOT_MAX_PENDING 1024

enum shim_conn_state {
    SHIM_CONN_HELLO,  /* reading the hello */
    SHIM_CONN_JOINED, /* a rank: waiting for the others */
    SHIM_CONN_REPLY,  /* sending the table or the refusal */
    SHIM_CONN_CLOSED, /* to be removed */
};

struct shim_root_conn {
    int fd;
    enum shim_conn_state state;
    bool secret_ok;
    union shim_sockaddr peer;
    uint8_t *buf; /* the hello so far; handed to the root once the rank joins */
    size_t len, need;
    const uint8_t *out; /* the reply: the root's table or refusal, not owned */
    size_t out_len, out_off;
};

struct shim_root {
    int listen_fd;
    uint64_t secret;
    uint64_t session;
    int64_t deadline_ns;
    int64_t timeout_ms;
    char addr[SHIM_SOCKET_ADDR_STRLEN];
    struct shim_root_conn **conns; /* in accept order */
    int nconns, conns_cap;
    struct pollfd *pfds;
    int pfds_cap;
    uint32_t nranks;  /* from the first valid hello; 0 before */
    uint32_t joined;
    uint8_t **hellos; /* per rank: its hello buffer, the blob at SHIM_WIRE_HELLO_BYTES */
    uint32_t *blob_lens;
    uint64_t total;
    uint8_t *table; /* the OK reply, once every rank joined */
    size_t table_len;
    bool refused;
    uint8_t refusal[SHIM_WIRE_REPLY_BYTES];
    uint32_t answered;   /* hellos given the refusal */
    uint32_t max_nranks; /* the largest nranks any hello claimed */
};

static int shim_root_live; /* atomic: root threads running */

int
shim_root_count(void)
{
    return __atomic_load_n(&shim_root_live, __ATOMIC_ACQUIRE);
}

static void
shim_root_conn_close(struct shim_root_conn *conn)
{
    if (conn->fd >= 0) {
        close(conn->fd);
        conn->fd = -1;
    }
    free(conn->buf);
    conn->buf = NULL;
    conn->state = SHIM_CONN_CLOSED;
}

static void
shim_root_conn_reject(struct shim_root *root, struct shim_root_conn *conn, const char *why)
{
    char peer[SHIM_SOCKET_ADDR_STRLEN];

    shim_socket_addr_str(&conn->peer, peer, sizeof(peer));
    INFO(SHIM_BOOTSTRAP, "bootstrap root %s: dropped the connection from %s: %s", root->addr,
         peer, why);
    shim_root_conn_close(conn);
}

static void
shim_root_conn_reply(struct shim_root_conn *conn, const uint8_t *out, size_t len)
{
    conn->state = SHIM_CONN_REPLY;
    conn->out = out;
    conn->out_len = len;
    conn->out_off = 0;
}

/* Answers every rank that joined, and every later one, with the refusal. */
static void
shim_root_refuse(struct shim_root *root, struct shim_root_conn *conn, uint16_t status,
                 uint32_t a0, uint32_t a1, uint32_t a2)
{
    struct shim_wire_reply reply = {.status = status, .nranks = root->nranks,
                                    .arg = {a0, a1, a2}, .session = root->session};
    char text[SHIM_WIRE_WHY_LEN];

    shim_wire_reply_encode(&reply, root->refusal);
    shim_wire_status_str(&reply, text, sizeof(text));
    INFO(SHIM_BOOTSTRAP, "bootstrap root %s: refusing the rendezvous: %s", root->addr, text);
    root->refused = true;
    root->answered = root->joined;
    for (int i = 0; i < root->nconns; i++) {
        if (root->conns[i]->state == SHIM_CONN_JOINED) {
            shim_root_conn_reply(root->conns[i], root->refusal, sizeof(root->refusal));
        }
    }
    root->answered++;
    shim_root_conn_reply(conn, root->refusal, sizeof(root->refusal));
}

/* Every rank is in: stop listening, drop whoever is not a rank, and send the table. */
static void
shim_root_publish(struct shim_root *root)
{
    struct shim_wire_reply reply = {.status = SHIM_WIRE_STATUS_OK, .nranks = root->nranks,
                                    .session = root->session, .data_len = root->total};
    size_t len = SHIM_WIRE_REPLY_BYTES + 4 * (size_t)root->nranks + root->total;

    close(root->listen_fd);
    root->listen_fd = -1;
    for (int i = 0; i < root->nconns; i++) {
        if (root->conns[i]->state == SHIM_CONN_HELLO) {
            shim_root_conn_reject(root, root->conns[i], "every rank already joined");
        }
    }
    uint8_t *table = malloc(len);
    if (table == NULL) {
        /* The ranks see the connection close and report it; nothing else to tell them. */
        WARN("bootstrap root %s: out of memory for the table of %u ranks (%zu bytes)",
             root->addr, root->nranks, len);
        for (int i = 0; i < root->nconns; i++) {
            shim_root_conn_close(root->conns[i]);
        }
        return;
    }
    shim_wire_reply_encode(&reply, table);
    uint8_t *lens = table + SHIM_WIRE_REPLY_BYTES;
    uint8_t *data = lens + 4 * (size_t)root->nranks;
    for (uint32_t r = 0; r < root->nranks; r++) {
        shim_wire_put_u32(lens + 4 * (size_t)r, root->blob_lens[r]);
        memcpy(data, root->hellos[r] + SHIM_WIRE_HELLO_BYTES, root->blob_lens[r]);
        data += root->blob_lens[r];
    }
    root->table = table;
    root->table_len = len;
    for (int i = 0; i < root->nconns; i++) {
        if (root->conns[i]->state == SHIM_CONN_JOINED) {
            shim_root_conn_reply(root->conns[i], table, len);
        }
    }
    INFO(SHIM_BOOTSTRAP, "bootstrap root %s: all %u ranks joined; sending the table (%zu bytes)",
         root->addr, root->nranks, len);
}

/* A complete hello with the right secret: the rank joins, or the rendezvous is refused. */
static void
shim_root_admit(struct shim_root *root, struct shim_root_conn *conn,
                const struct shim_wire_hello *hello)
{
    char peer[SHIM_SOCKET_ADDR_STRLEN];

    if (hello->nranks > root->max_nranks) {
        root->max_nranks = hello->nranks;
    }
    if (root->refused) {
        root->answered++;
        shim_root_conn_reply(conn, root->refusal, sizeof(root->refusal));
        return;
    }
    if (root->nranks == 0) {
        root->hellos = calloc(hello->nranks, sizeof(*root->hellos));
        root->blob_lens = calloc(hello->nranks, sizeof(*root->blob_lens));
        if (root->hellos == NULL || root->blob_lens == NULL) {
            WARN("bootstrap root %s: out of memory for %u ranks", root->addr, hello->nranks);
            free(root->hellos);
            free(root->blob_lens);
            root->hellos = NULL;
            root->blob_lens = NULL;
            shim_root_conn_close(conn);
            return;
        }
        root->nranks = hello->nranks;
    }
    if (hello->nranks != root->nranks) {
        shim_root_refuse(root, conn, SHIM_WIRE_STATUS_NRANKS, hello->rank, hello->nranks,
                         root->nranks);
        return;
    }
    if (root->hellos[hello->rank] != NULL) {
        shim_root_refuse(root, conn, SHIM_WIRE_STATUS_DUP_RANK, hello->rank, 0, 0);
        return;
    }
    if (root->total + hello->blob_len > SHIM_WIRE_MAX_TABLE) {
        shim_root_refuse(root, conn, SHIM_WIRE_STATUS_TOO_BIG, 0, 0, 0);
        return;
    }
    root->hellos[hello->rank] = conn->buf; /* the root owns the blob now */
    conn->buf = NULL;
    root->blob_lens[hello->rank] = hello->blob_len;
    root->total += hello->blob_len;
    root->joined++;
    conn->state = SHIM_CONN_JOINED;
    shim_socket_addr_str(&conn->peer, peer, sizeof(peer));
    INFO(SHIM_BOOTSTRAP, "bootstrap root %s: rank %u joined from %s with %u bytes (%u of %u)",
         root->addr, hello->rank, peer, hello->blob_len, root->joined, root->nranks);
    if (root->joined == root->nranks) {
        shim_root_publish(root);
    }
}

/* Reads what the connection has, never past the end of its hello. */
static void
shim_root_conn_read(struct shim_root *root, struct shim_root_conn *conn)
{
    struct shim_wire_hello hello;
    char why[SHIM_WIRE_WHY_LEN];

    for (;;) {
        ssize_t n = recv(conn->fd, conn->buf + conn->len, conn->need - conn->len, 0);
        if (n == 0) {
            snprintf(why, sizeof(why), "closed after %zu of %zu hello bytes", conn->len,
                     conn->need);
            shim_root_conn_reject(root, conn, why);
            return;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                snprintf(why, sizeof(why), "recv failed: %s", strerror(errno));
                shim_root_conn_reject(root, conn, why);
            }
            return;
        }
        conn->len += (size_t)n;
        size_t need;
        enum shim_wire_parse res = shim_wire_hello_parse(conn->buf, conn->len, &hello, &need,
                                                         why, sizeof(why));
        if (res == SHIM_WIRE_BAD) {
            shim_root_conn_reject(root, conn, why);
            return;
        }
        if (conn->len >= SHIM_WIRE_HELLO_BYTES && !conn->secret_ok) {
            /* Check the secret before taking in a blob from someone who may not be a rank. */
            if (hello.secret != root->secret) {
                shim_root_conn_reject(root, conn, "wrong secret");
                return;
            }
            conn->secret_ok = true;
            uint8_t *grown = realloc(conn->buf, need);
            if (grown == NULL) {
                shim_root_conn_reject(root, conn, "out of memory for the blob");
                return;
            }
            conn->buf = grown;
            conn->need = need;
        }
        if (res == SHIM_WIRE_OK) {
            shim_root_admit(root, conn, &hello);
            return;
        }
    }
}

static void
shim_root_conn_write(struct shim_root *root, struct shim_root_conn *conn)
{
    char why[SHIM_WIRE_WHY_LEN];

    while (conn->out_off < conn->out_len) {
        ssize_t n = send(conn->fd, conn->out + conn->out_off, conn->out_len - conn->out_off,
                         MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                snprintf(why, sizeof(why), "send of the reply failed: %s", strerror(errno));
                shim_root_conn_reject(root, conn, why);
            }
            return;
        }
        conn->out_off += (size_t)n;
    }
    shim_root_conn_close(conn);
}

/* Counts the connections still owing their hello; returns the oldest of them that has not
 * shown the secret (the one to drop when the root runs short of room), or -1. */
static int
shim_root_oldest_stranger(const struct shim_root *root, int *pending_out)
{
    int pending = 0, oldest = -1;

    for (int i = 0; i < root->nconns; i++) {
        const struct shim_root_conn *conn = root->conns[i];
        if (conn->state == SHIM_CONN_HELLO) {
            pending++;
            if (oldest < 0 && !conn->secret_ok) {
                oldest = i;
            }
        }
    }
    *pending_out = pending;
    return oldest;
}

static void
shim_root_accept(struct shim_root *root)
{
    int pending, oldest;

    /* A hello read below may complete the rendezvous, which closes the listening socket. A
     * flood of connections is taken a bounded batch at a time, so the ranks' sockets are
     * still served between batches. */
    for (int round = 0; root->listen_fd >= 0 && round < SHIM_ROOT_MAX_PENDING; round++) {
        union shim_sockaddr peer;
        socklen_t peer_len = sizeof(peer);
        int fd = accept4(root->listen_fd, &peer.sa, &peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED) {
                continue;
            }
            /* Out of descriptors, most likely held by idle strangers: a real rank may be
             * waiting behind them in the backlog, so make room rather than wait for them. */
            if ((err == EMFILE || err == ENFILE) &&
                (oldest = shim_root_oldest_stranger(root, &pending)) >= 0) {
                shim_root_conn_reject(root, root->conns[oldest], "out of file descriptors; "
                                      "dropping the oldest connection still owing its hello");
                continue;
            }
            if (err != EAGAIN && err != EWOULDBLOCK) {
                /* Out of memory, or of descriptors with no stranger left to drop: pause
                 * rather than spin on a readable socket. */
                INFO(SHIM_BOOTSTRAP, "bootstrap root %s: accept failed: %s", root->addr,
                     strerror(err));
                struct timespec pause = {.tv_nsec = 10 * 1000 * 1000};
                nanosleep(&pause, NULL);
            }
            return;
        }

        oldest = shim_root_oldest_stranger(root, &pending);
        if (pending >= SHIM_ROOT_MAX_PENDING && oldest >= 0) {
            shim_root_conn_reject(root, root->conns[oldest], "too many connections still "
                                  "owing their hello; dropping the oldest");
        }
        struct shim_root_conn *conn = calloc(1, sizeof(*conn));
        uint8_t *buf = malloc(SHIM_WIRE_HELLO_BYTES);
        if (root->nconns == root->conns_cap) {
            int cap = root->conns_cap ? 2 * root->conns_cap : 16;
            struct shim_root_conn **grown = realloc(root->conns, (size_t)cap * sizeof(*grown));
            if (grown != NULL) {
                root->conns = grown;
                root->conns_cap = cap;
            }
        }
        if (conn == NULL || buf == NULL || root->nconns == root->conns_cap) {
            INFO(SHIM_BOOTSTRAP, "bootstrap root %s: out of memory for a connection",
                 root->addr);
            free(conn);
            free(buf);
            close(fd);
            return;
        }
        conn->fd = fd;
        conn->state = SHIM_CONN_HELLO;
        conn->peer = peer;
        conn->buf = buf;
        conn->need = SHIM_WIRE_HELLO_BYTES;
        root->conns[root->nconns++] = conn;
        /* A rank sends its hello as soon as it connects: read it now, so that once its
         * secret checks out it is no longer a stranger the loop above may drop. */
        shim_root_conn_read(root, conn);
    }
}

/* Removes closed connections, keeping the accept order. */
static void
shim_root_compact(struct shim_root *root)
{
    int kept = 0;

    for (int i = 0; i < root->nconns; i++) {
        if (root->conns[i]->state == SHIM_CONN_CLOSED) {
            free(root->conns[i]);
        } else {
            root->conns[kept++] = root->conns[i];
        }
    }
    root->nconns = kept;
}

/* Done when every reply went out: the table to all ranks, or the refusal to as many ranks as
 * any hello announced. */
static bool
shim_root_done(const struct shim_root *root)
{
    if (root->table == NULL && !(root->refused && root->answered >= root->max_nranks)) {
        return root->nranks > 0 && root->listen_fd < 0; /* publish failed: nothing to send */
    }
    for (int i = 0; i < root->nconns; i++) {
        if (root->conns[i]->state == SHIM_CONN_REPLY) {
            return false;
        }
    }
    return true;
}

static void
shim_root_free(struct shim_root *root)
{
    if (root->listen_fd >= 0) {
        close(root->listen_fd);
    }
    for (int i = 0; i < root->nconns; i++) {
        shim_root_conn_close(root->conns[i]);
        free(root->conns[i]);
    }
    for (uint32_t r = 0; root->hellos != NULL && r < root->nranks; r++) {
        free(root->hellos[r]);
    }
    free(root->hellos);
    free(root->blob_lens);
    free(root->table);
    free(root->conns);
    free(root->pfds);
    free(root);
}

/* One poll() round: build the set, wait, serve. False when the loop must end. */
static bool
shim_root_poll(struct shim_root *root)
{
    int n = root->nconns + 1;

    if (n > root->pfds_cap) {
        struct pollfd *grown = realloc(root->pfds, (size_t)n * 2 * sizeof(*grown));
        if (grown == NULL) {
            WARN("bootstrap root %s: out of memory for %d poll entries", root->addr, n);
            return false;
        }
        root->pfds = grown;
        root->pfds_cap = n * 2;
    }
    root->pfds[0] = (struct pollfd){.fd = root->listen_fd, .events = POLLIN};
    for (int i = 0; i < root->nconns; i++) {
        const struct shim_root_conn *conn = root->conns[i];
        short events = conn->state == SHIM_CONN_HELLO   ? POLLIN
                       : conn->state == SHIM_CONN_REPLY ? POLLOUT
                                                        : 0; /* joined: errors only */
        root->pfds[i + 1] = (struct pollfd){.fd = conn->fd, .events = events};
    }

    int ms = shim_socket_poll_ms(root->deadline_ns);
    if (ms == 0) {
        if (root->joined > 0 || root->refused) {
            WARN("bootstrap root %s: gave up after %lld ms with %u of %u ranks joined%s",
                 root->addr, (long long)root->timeout_ms, root->joined, root->nranks,
                 root->refused ? " and the rendezvous refused" : "");
        } else {
            INFO(SHIM_BOOTSTRAP, "bootstrap root %s: no rank came within %lld ms; exiting",
                 root->addr, (long long)root->timeout_ms);
        }
        return false;
    }
    int rc = poll(root->pfds, (nfds_t)n, ms);
    if (rc < 0) {
        if (errno == EINTR) {
            return true;
        }
        WARN("bootstrap root %s: poll failed: %s", root->addr, strerror(errno));
        return false;
    }

    /* Connections first: accepting may grow root->conns past what pfds describes. */
    for (int i = 0; i < n - 1; i++) {
        struct shim_root_conn *conn = root->conns[i];
        short revents = root->pfds[i + 1].revents;
        if (revents == 0 || conn->state == SHIM_CONN_CLOSED) {
            continue;
        }
        if (conn->state == SHIM_CONN_HELLO) {
            shim_root_conn_read(root, conn);
        } else if (conn->state == SHIM_CONN_REPLY) {
            shim_root_conn_write(root, conn);
        } else if (conn->state == SHIM_CONN_JOINED && (revents & (POLLERR | POLLHUP))) {
            /* Its blob stays in the table; the rank itself will not hear back. */
            shim_root_conn_reject(root, conn, "a joined rank's connection failed");
        }
    }
    if (root->listen_fd >= 0 && (root->pfds[0].revents & POLLIN)) {
        shim_root_accept(root);
    }
    shim_root_compact(root);
    return true;
}

static void *
shim_root_main(void *arg)
{
    struct shim_root *root = arg;

    pthread_setname_np(pthread_self(), "ncclshim-root");
    INFO(SHIM_BOOTSTRAP, "bootstrap root listening on %s for %lld ms", root->addr,
         (long long)root->timeout_ms);
    while (!shim_root_done(root) && shim_root_poll(root)) {
    }
    if (root->table != NULL && shim_root_done(root)) {
        INFO(SHIM_BOOTSTRAP, "bootstrap root %s: table sent to %u ranks; exiting", root->addr,
             root->nranks);
    }
    shim_root_free(root);
    __atomic_sub_fetch(&shim_root_live, 1, __ATOMIC_RELEASE);
    return NULL;
}

ncclResult_t
shim_root_start(int listen_fd, const union shim_sockaddr *addr, uint64_t secret,
                int64_t timeout_ms)
{
    struct shim_root *root = NULL;
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;

    SHIM_CHECK(shim_calloc(&root, 1));
    root->listen_fd = listen_fd;
    root->secret = secret;
    root->timeout_ms = timeout_ms;
    root->deadline_ns = shim_socket_deadline_ns(timeout_ms);
    shim_socket_addr_str(addr, root->addr, sizeof(root->addr));
    ncclResult_t res = shim_random_u64("the bootstrap session", &root->session);
    if (res != ncclSuccess) {
        free(root);
        return res;
    }

    /* Signals belong to the application's threads: the root starts with all of them blocked. */
    sigfillset(&all);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    __atomic_add_fetch(&shim_root_live, 1, __ATOMIC_RELEASE);
    int err = pthread_create(&thread, &attr, shim_root_main, root);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        __atomic_sub_fetch(&shim_root_live, 1, __ATOMIC_RELEASE);
        WARN("cannot start the bootstrap root thread for %s: %s", root->addr, strerror(err));
        free(root);
        return ncclSystemError;
    }
    return ncclSuccess;
}
