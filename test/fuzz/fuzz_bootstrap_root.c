/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer harness for the bootstrap root's state machine (bootstrap/root.c), driven
 * without its thread: the harness includes root.c for its static functions, makes a root
 * by hand, gives it up to 8 connections over AF_UNIX socket pairs, and runs shim_root_poll
 * only when one of the root's sockets is ready, so every run is single-threaded and
 * repeatable. Built by `make fuzz` with wire.c, socket.c, debug.c and env.c.
 *
 * The input is a list of records {op, len, len bytes}: the bytes are sent on connection
 * op & 7, then the root runs until nothing is ready and every client drains what it was sent.
 * Op bits: 0x08 writes the root's secret over bytes 8..15 of that connection's stream, 0x10
 * our magic and version over bytes 0..5 (so the fuzzer reaches the paths behind them), 0x20
 * shuts the client's sending side after the bytes, 0x40 closes the client.
 *
 * Invariants, checked after every record and at the end (abort on violation):
 *   - a rank slot holds a hello with the root's secret, its own rank, the root's nranks and
 *     the blob length recorded for it; joined never exceeds nranks;
 *   - only a client whose first 32 bytes carry the secret ever receives a byte;
 *   - what a client receives is a reply: complete, or a prefix of one if the root gave up on
 *     it, and an OK table lists nranks blobs, this client's own among them;
 *   - the root never loops: it goes quiet within a bounded number of poll rounds.
 * ASan and LeakSanitizer check the root frees everything it allocated (shim_root_free).
 */
#include "bootstrap/root.c"

#include <fcntl.h>

/* ---- the harness ------------------------------------------------------------------------ */

#include "fuzz_check.h"

#define FUZZ_CONNS 8
#define FUZZ_SECRET 0x5ec2e75ec2e75ec2ULL
#define FUZZ_MAX_ROUNDS 10000
#define FUZZ_RECV_MAX (SHIM_WIRE_REPLY_BYTES + 4 * FUZZ_CONNS + FUZZ_CONNS * SHIM_WIRE_MAX_BLOB)

struct fuzz_client {
    int fd;             /* the client's end; -1 when never opened or closed */
    bool opened;
    uint8_t head[SHIM_WIRE_HELLO_BYTES]; /* the first bytes it sent */
    size_t sent;
    uint8_t *blob;      /* what it sent after the header, up to the announced blob length */
    size_t blob_len;
    uint8_t *recv;      /* what it received */
    size_t recv_len;
};

static struct fuzz_client fuzz_clients[FUZZ_CONNS];

static bool
fuzz_client_has_secret(const struct fuzz_client *c)
{
    return c->sent >= SHIM_WIRE_HELLO_BYTES &&
           shim_wire_get_u32(c->head + 8) == (uint32_t)(FUZZ_SECRET >> 32) &&
           shim_wire_get_u32(c->head + 12) == (uint32_t)FUZZ_SECRET;
}

static void
fuzz_client_open(struct shim_root *root, struct fuzz_client *c)
{
    int sv[2];

    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    struct shim_root_conn *conn = calloc(1, sizeof(*conn));
    uint8_t *buf = malloc(SHIM_WIRE_HELLO_BYTES);
    FUZZ_CHECK(conn != NULL && buf != NULL);
    /* As shim_root_accept makes one. */
    if (root->nconns == root->conns_cap) {
        int cap = root->conns_cap ? 2 * root->conns_cap : 16;
        root->conns = realloc(root->conns, (size_t)cap * sizeof(*root->conns));
        FUZZ_CHECK(root->conns != NULL);
        root->conns_cap = cap;
    }
    conn->fd = sv[0];
    conn->state = SHIM_CONN_HELLO;
    conn->peer.sa.sa_family = AF_UNSPEC;
    conn->buf = buf;
    conn->need = SHIM_WIRE_HELLO_BYTES;
    root->conns[root->nconns++] = conn;
    memset(c, 0, sizeof(*c));
    c->fd = sv[1];
    c->opened = true;
}

static void
fuzz_client_send(struct fuzz_client *c, const uint8_t *data, size_t len, uint8_t op)
{
    uint8_t chunk[256];

    memcpy(chunk, data, len);
    for (size_t i = 0; i < len; i++) {
        size_t at = c->sent + i;
        if ((op & 0x08) && at >= 8 && at < 16) {
            chunk[i] = (uint8_t)(FUZZ_SECRET >> (8 * (15 - at)));
        }
        if ((op & 0x10) && at < 6) {
            static const uint8_t magic[6] = {'N', 'C', 'S', 'H', 0, SHIM_WIRE_VERSION};
            chunk[i] = magic[at];
        }
    }
    if (c->fd < 0) {
        return;
    }
    ssize_t n = send(c->fd, chunk, len, MSG_NOSIGNAL);
    if (n <= 0) {
        return;
    }
    for (size_t i = 0; i < (size_t)n; i++, c->sent++) {
        if (c->sent < SHIM_WIRE_HELLO_BYTES) {
            c->head[c->sent] = chunk[i];
            continue;
        }
        uint32_t announced = shim_wire_get_u32(c->head + 24);
        if (announced > SHIM_WIRE_MAX_BLOB) {
            continue;
        }
        if (c->blob == NULL) {
            c->blob = malloc(announced + 1);
            FUZZ_CHECK(c->blob != NULL);
        }
        if (c->blob_len < announced) {
            c->blob[c->blob_len++] = chunk[i];
        }
    }
}

/* Reads whatever the root sent the client. */
static void
fuzz_client_drain(struct fuzz_client *c)
{
    while (c->fd >= 0) {
        if (c->recv == NULL) {
            c->recv = malloc(FUZZ_RECV_MAX + 1);
            FUZZ_CHECK(c->recv != NULL);
        }
        ssize_t n = recv(c->fd, c->recv + c->recv_len, FUZZ_RECV_MAX + 1 - c->recv_len, 0);
        if (n <= 0) {
            return;
        }
        c->recv_len += (size_t)n;
        FUZZ_CHECK(c->recv_len <= FUZZ_RECV_MAX); /* never more than the largest table */
        FUZZ_CHECK(fuzz_client_has_secret(c));  /* a stranger never hears back */
    }
}

/* The root's poll set, polled without waiting: is anything ready for shim_root_poll? */
static bool
fuzz_root_ready(const struct shim_root *root)
{
    struct pollfd pfds[64];
    int n = 0;

    for (int i = 0; i < root->nconns && n < 64; i++) {
        const struct shim_root_conn *conn = root->conns[i];
        if (conn->state == SHIM_CONN_CLOSED) {
            continue;
        }
        short events = conn->state == SHIM_CONN_HELLO   ? POLLIN
                       : conn->state == SHIM_CONN_REPLY ? POLLOUT
                                                        : 0;
        pfds[n++] = (struct pollfd){.fd = conn->fd, .events = events};
    }
    return n > 0 && poll(pfds, (nfds_t)n, 0) > 0;
}

static void
fuzz_root_check(const struct shim_root *root)
{
    uint32_t filled = 0;

    FUZZ_CHECK(root->nranks <= SHIM_WIRE_MAX_NRANKS);
    FUZZ_CHECK(root->joined <= root->nranks);
    for (uint32_t r = 0; root->hellos != NULL && r < root->nranks; r++) {
        const uint8_t *h = root->hellos[r];
        if (h == NULL) {
            continue;
        }
        filled++;
        FUZZ_CHECK(shim_wire_get_u32(h + 8) == (uint32_t)(FUZZ_SECRET >> 32));
        FUZZ_CHECK(shim_wire_get_u32(h + 12) == (uint32_t)FUZZ_SECRET);
        FUZZ_CHECK(shim_wire_get_u32(h + 16) == root->nranks);
        FUZZ_CHECK(shim_wire_get_u32(h + 20) == r);
        FUZZ_CHECK(shim_wire_get_u32(h + 24) == root->blob_lens[r]);
    }
    FUZZ_CHECK(filled == root->joined);
}

/* Runs the root until it is quiet, the clients draining as it goes. */
static void
fuzz_root_run(struct shim_root *root)
{
    int rounds = 0;

    for (;;) {
        for (int i = 0; i < FUZZ_CONNS; i++) {
            fuzz_client_drain(&fuzz_clients[i]);
        }
        if (!fuzz_root_ready(root)) {
            break;
        }
        FUZZ_CHECK(shim_root_poll(root));
        fuzz_root_check(root);
        FUZZ_CHECK(++rounds < FUZZ_MAX_ROUNDS);
    }
}

/* What the client received is a reply, or the start of one. */
static void
fuzz_client_check_reply(const struct fuzz_client *c)
{
    struct shim_wire_reply reply;
    char why[SHIM_WIRE_WHY_LEN];
    size_t need;

    if (c->recv_len == 0) {
        return;
    }
    uint32_t nranks = shim_wire_get_u32(c->head + 16);
    enum shim_wire_parse res = shim_wire_reply_parse(c->recv, c->recv_len, nranks, &reply,
                                                     &need, why, sizeof(why));
    if (res == SHIM_WIRE_BAD) {
        fprintf(stderr, "client received a malformed reply: %s\n", why);
    }
    FUZZ_CHECK(res != SHIM_WIRE_BAD);
    if (res != SHIM_WIRE_OK || reply.status != SHIM_WIRE_STATUS_OK) {
        return;
    }
    /* Its own entry is what it sent. */
    uint32_t rank = shim_wire_get_u32(c->head + 20);
    size_t offset = 0;
    FUZZ_CHECK(rank < nranks);
    for (uint32_t r = 0; r < rank; r++) {
        offset += shim_wire_get_u32(reply.lens + 4 * (size_t)r);
    }
    FUZZ_CHECK(shim_wire_get_u32(reply.lens + 4 * (size_t)rank) == c->blob_len);
    FUZZ_CHECK(c->blob_len == 0 || memcmp(reply.data + offset, c->blob, c->blob_len) == 0);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct shim_root *root = calloc(1, sizeof(*root));

    FUZZ_CHECK(root != NULL);
    root->listen_fd = -1; /* no listening socket: poll skips it, publish has nothing to close */
    root->secret = FUZZ_SECRET;
    root->session = 0x5e55105e55105e55ULL;
    root->timeout_ms = 3600 * 1000;
    root->deadline_ns = shim_socket_deadline_ns(root->timeout_ms);
    snprintf(root->addr, sizeof(root->addr), "fuzz");
    memset(fuzz_clients, 0, sizeof(fuzz_clients));
    for (int i = 0; i < FUZZ_CONNS; i++) {
        fuzz_clients[i].fd = -1;
    }

    while (size >= 2) {
        uint8_t op = data[0];
        size_t len = data[1];
        data += 2;
        size -= 2;
        len = len < size ? len : size;
        struct fuzz_client *c = &fuzz_clients[op % FUZZ_CONNS];
        if (!c->opened) {
            fuzz_client_open(root, c);
        }
        fuzz_client_send(c, data, len, op);
        data += len;
        size -= len;
        if ((op & 0x20) && c->fd >= 0) {
            shutdown(c->fd, SHUT_WR);
        }
        if (op & 0x40) {
            fuzz_client_drain(c);
            if (c->fd >= 0) {
                close(c->fd);
            }
            c->fd = -1;
        }
        fuzz_root_run(root);
    }

    fuzz_root_run(root);
    bool verbose = getenv("FUZZ_VERBOSE") != NULL; /* to see what a reproducer does */
    if (verbose) {
        fprintf(stderr, "root: %u of %u ranks joined, table %zu bytes, refused %d\n",
                root->joined, root->nranks, root->table_len, (int)root->refused);
    }
    for (int i = 0; i < FUZZ_CONNS; i++) {
        struct fuzz_client *c = &fuzz_clients[i];
        if (verbose && c->opened) {
            fprintf(stderr, "client %d: sent %zu bytes, received %zu\n", i, c->sent,
                    c->recv_len);
        }
        fuzz_client_check_reply(c);
        if (c->fd >= 0) {
            close(c->fd);
        }
        free(c->blob);
        free(c->recv);
    }
    shim_root_free(root);
    return 0;
}
