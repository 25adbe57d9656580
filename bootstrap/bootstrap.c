/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The unique id and the rank side of the one exchange every communicator starts with.
 * api.c (ncclGetUniqueId) and comm.c (init) are the callers; the root that serves the
 * exchange is root.c.
 *
 * A rank connects (retrying refusals: with NCCL_COMM_ID the root may start last), sends
 * {secret, nranks, rank, blob}, and reads the table, all by one deadline.
 */
#include "bootstrap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/debug.h"
#include "base/env.h"
#include "base/random.h"
#include "root.h"
#include "socket.h"
#include "wire.h"

/* Seed for the secret of an NCCL_COMM_ID id, so it differs from a plain hash of the text. */
#define SHIM_COMM_ID_SEED 0x6e63636c5f636964ULL

/* ---- the unique id ------------------------------------------------------------------- */

static int64_t
shim_bootstrap_timeout_ms(void)
{
    int64_t seconds = shim_env_int(SHIM_ENV_BOOTSTRAP_TIMEOUT);
    return (seconds > 0 ? seconds : 1) * 1000;
}

/* Starts a root on listen_fd (bound to `bound`, on interface ifname) under a fresh secret,
 * and writes the id naming both. Takes listen_fd: on failure it is closed here. */
static ncclResult_t
shim_bootstrap_serve(int listen_fd, const union shim_sockaddr *bound, const char *ifname,
                     ncclUniqueId *id)
{
    struct shim_wire_id wid;
    char text[SHIM_SOCKET_ADDR_STRLEN];
    ncclResult_t res;

    memset(&wid, 0, sizeof(wid));
    wid.root = *bound;
    SHIM_CHECK_GOTO(shim_random_u64("the bootstrap secret", &wid.secret), res, err_close);
    SHIM_CHECK_GOTO(shim_root_start(listen_fd, bound, wid.secret, shim_bootstrap_timeout_ms()),
                    res, err_close);
    shim_wire_id_encode(&wid, id);
    shim_socket_addr_str(bound, text, sizeof(text));
    INFO(SHIM_BOOTSTRAP, "unique id created: bootstrap root %s on %s", text, ifname);
    return ncclSuccess;

err_close:
    close(listen_fd);
    return res;
}

/* Listens on an ephemeral port of the interface NCCL_SOCKET_IFNAME picks. */
static ncclResult_t
shim_bootstrap_serve_on_interface(ncclUniqueId *id)
{
    union shim_sockaddr addr, bound;
    char ifname[IF_NAMESIZE], text[SHIM_SOCKET_ADDR_STRLEN];
    int fd;

    SHIM_CHECK(shim_socket_pick_addr(shim_env_str(SHIM_ENV_NCCL_SOCKET_IFNAME), &addr, ifname));
    if (addr.sa.sa_family == AF_INET) {
        addr.in4.sin_port = 0;
    } else {
        addr.in6.sin6_port = 0;
    }
    int err = shim_socket_listen(&addr, false, &fd, &bound);
    if (err != 0) {
        shim_socket_addr_str(&addr, text, sizeof(text));
        WARN("cannot listen on %s (%s) for the bootstrap root: %s", text, ifname,
             strerror(err));
        return ncclSystemError;
    }
    return shim_bootstrap_serve(fd, &bound, ifname, id);
}

ncclResult_t
shim_bootstrap_get_unique_id(ncclUniqueId *id)
{
    const char *comm_id = shim_env_str(SHIM_ENV_NCCL_COMM_ID);

    if (id == NULL) {
        WARN("ncclGetUniqueId: uniqueId is NULL");
        return ncclInvalidArgument;
    }
    if (comm_id != NULL && comm_id[0] != '\0') {
        struct shim_wire_id wid;
        char text[SHIM_SOCKET_ADDR_STRLEN];
        memset(&wid, 0, sizeof(wid));
        SHIM_CHECK(shim_socket_addr_parse(comm_id, "NCCL_COMM_ID", &wid.root));
        wid.flags = SHIM_WIRE_ID_FROM_ENV;
        /* Every process derives the same secret from the same text: no one has to send it. */
        wid.secret = shim_wire_hash(comm_id, strlen(comm_id), SHIM_COMM_ID_SEED);
        shim_wire_id_encode(&wid, id);
        shim_socket_addr_str(&wid.root, text, sizeof(text));
        INFO(SHIM_BOOTSTRAP, "unique id from NCCL_COMM_ID=%s: bootstrap root %s, started by "
             "rank 0", comm_id, text);
        return ncclSuccess;
    }
    return shim_bootstrap_serve_on_interface(id);
}

ncclResult_t
shim_bootstrap_fresh_id(ncclUniqueId *id)
{
    return shim_bootstrap_serve_on_interface(id);
}

ncclResult_t
shim_bootstrap_private_id(ncclUniqueId *id)
{
    union shim_sockaddr addr, bound;
    int fd;

    if (id == NULL) {
        WARN("bootstrap: the private id pointer is NULL");
        return ncclInvalidArgument;
    }
    /* Every rank lives in this process: loopback serves them whatever the network is. */
    memset(&addr, 0, sizeof(addr));
    addr.in4.sin_family = AF_INET;
    addr.in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (shim_socket_listen(&addr, false, &fd, &bound) == 0) {
        return shim_bootstrap_serve(fd, &bound, "lo", id);
    }
    return shim_bootstrap_serve_on_interface(id);
}

/* Decodes the id; WARNs and returns ncclInvalidArgument if it is not ours. */
static ncclResult_t
shim_bootstrap_id_decode(const ncclUniqueId *id, const char *who, struct shim_wire_id *wid)
{
    char why[SHIM_WIRE_WHY_LEN];

    if (id == NULL) {
        WARN("%s: the unique id is NULL", who);
        return ncclInvalidArgument;
    }
    if (!shim_wire_id_decode(id, wid, why, sizeof(why))) {
        WARN("%s: invalid unique id: %s", who, why);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

ncclResult_t
shim_bootstrap_id_hash(const ncclUniqueId *id, uint64_t *hash_out)
{
    struct shim_wire_id wid;

    SHIM_CHECK(shim_bootstrap_id_decode(id, "bootstrap", &wid));
    *hash_out = shim_wire_id_hash(id);
    return ncclSuccess;
}

/* ---- a rank's side ------------------------------------------------------------------- */

/* With NCCL_COMM_ID rank 0 hosts the root, on the very address the id names. */
static ncclResult_t
shim_bootstrap_root_from_env(const struct shim_wire_id *wid, int nranks, int timeout_ms,
                             const char *root_text)
{
    union shim_sockaddr bound;
    int fd;
    ncclResult_t res;

    int err = shim_socket_listen(&wid->root, true, &fd, &bound);
    if (err != 0) {
        WARN("rank 0 of %d: cannot listen on NCCL_COMM_ID's %s for the bootstrap root: %s%s",
             nranks, root_text, strerror(err),
             err == EADDRNOTAVAIL ? " (the address is not one of this host's)" : "");
        return ncclSystemError;
    }
    SHIM_CHECK_GOTO(shim_root_start(fd, &bound, wid->secret, timeout_ms), res, err_close);
    return ncclSuccess;

err_close:
    close(fd);
    return res;
}

/* Builds the caller's table from a validated OK reply, in one allocation. */
static ncclResult_t
shim_bootstrap_table_make(const struct shim_wire_reply *reply,
                          struct shim_bootstrap_table **table_out)
{
    size_t n = reply->nranks;
    size_t bytes = sizeof(struct shim_bootstrap_table) + 2 * n * sizeof(size_t) +
                   (size_t)reply->data_len;
    uint8_t *block = NULL;

    SHIM_CHECK(shim_calloc(&block, bytes));
    struct shim_bootstrap_table *table = (struct shim_bootstrap_table *)block;
    table->nranks = (int)n;
    table->session = reply->session;
    table->offsets = (size_t *)(block + sizeof(*table));
    table->lens = table->offsets + n;
    table->data = (uint8_t *)(table->lens + n);
    size_t offset = 0;
    for (size_t r = 0; r < n; r++) {
        table->offsets[r] = offset;
        table->lens[r] = shim_wire_get_u32(reply->lens + 4 * r);
        offset += table->lens[r];
    }
    memcpy(table->data, reply->data, (size_t)reply->data_len);
    *table_out = table;
    return ncclSuccess;
}

/* Reads the root's reply and turns it into a table or an error. */
static ncclResult_t
shim_bootstrap_recv_reply(int fd, int rank, int nranks, const void *blob, size_t len,
                          int timeout_ms, int64_t deadline_ns, const char *root_text,
                          struct shim_bootstrap_table **table_out)
{
    uint8_t head[SHIM_WIRE_REPLY_BYTES];
    struct shim_wire_reply reply;
    char why[SHIM_WIRE_WHY_LEN];
    size_t need;
    ncclResult_t res = ncclSuccess;

    int err = shim_socket_recv_all(fd, head, sizeof(head), deadline_ns);
    if (err == ETIMEDOUT) {
        WARN("rank %d of %d: no reply from bootstrap root %s within %d ms (it answers once all "
             "%d ranks have joined)", rank, nranks, root_text, timeout_ms, nranks);
        return ncclSystemError;
    }
    if (err != 0) {
        WARN("rank %d of %d: bootstrap root %s %s before replying", rank, nranks, root_text,
             err == EPIPE ? "closed the connection" : strerror(err));
        return err == EPIPE ? ncclRemoteError : ncclSystemError;
    }
    enum shim_wire_parse parsed = shim_wire_reply_parse(head, sizeof(head), (uint32_t)nranks,
                                                        &reply, &need, why, sizeof(why));
    if (parsed == SHIM_WIRE_BAD) {
        WARN("rank %d of %d: bootstrap root %s sent a malformed reply: %s", rank, nranks,
             root_text, why);
        return ncclRemoteError;
    }
    if (reply.status != SHIM_WIRE_STATUS_OK) {
        shim_wire_status_str(&reply, why, sizeof(why));
        WARN("rank %d of %d: bootstrap root %s refused the rendezvous: %s", rank, nranks,
             root_text, why);
        return ncclInvalidUsage;
    }

    uint8_t *buf = NULL;
    SHIM_CHECK(shim_calloc(&buf, need));
    memcpy(buf, head, sizeof(head));
    err = shim_socket_recv_all(fd, buf + sizeof(head), need - sizeof(head), deadline_ns);
    if (err != 0) {
        WARN("rank %d of %d: bootstrap root %s: the table of %zu bytes did not arrive within "
             "%d ms: %s", rank, nranks, root_text, need, timeout_ms,
             err == EPIPE ? "the connection closed" : strerror(err));
        res = err == EPIPE ? ncclRemoteError : ncclSystemError;
        goto out;
    }
    if (shim_wire_reply_parse(buf, need, (uint32_t)nranks, &reply, &need, why, sizeof(why)) !=
        SHIM_WIRE_OK) {
        WARN("rank %d of %d: bootstrap root %s sent a malformed table: %s", rank, nranks,
             root_text, why);
        res = ncclRemoteError;
        goto out;
    }
    /* Our own entry must be what we sent: a cheap end-to-end check of the whole path. */
    size_t offset = 0;
    for (int r = 0; r < rank; r++) {
        offset += shim_wire_get_u32(reply.lens + 4 * (size_t)r);
    }
    if (shim_wire_get_u32(reply.lens + 4 * (size_t)rank) != len ||
        (len > 0 && memcmp(reply.data + offset, blob, len) != 0)) {
        WARN("rank %d of %d: bootstrap root %s returned a table whose entry for this rank "
             "differs from the %zu bytes it sent", rank, nranks, root_text, len);
        res = ncclRemoteError;
        goto out;
    }
    SHIM_CHECK_GOTO(shim_bootstrap_table_make(&reply, table_out), res, out);
    INFO(SHIM_BOOTSTRAP, "rank %d of %d: received the table from bootstrap root %s (%zu bytes)",
         rank, nranks, root_text, need);
out:
    free(buf);
    return res;
}

ncclResult_t
shim_bootstrap_exchange(const ncclUniqueId *id, int rank, int nranks, const void *blob,
                        size_t len, int timeout_ms, struct shim_bootstrap_table **table_out)
{
    struct shim_wire_id wid;
    struct shim_wire_hello hello;
    uint8_t head[SHIM_WIRE_HELLO_BYTES];
    char who[64], root_text[SHIM_SOCKET_ADDR_STRLEN];
    int fd;
    ncclResult_t res;

    snprintf(who, sizeof(who), "rank %d of %d", rank, nranks);
    if (nranks < 1 || (uint32_t)nranks > SHIM_WIRE_MAX_NRANKS || rank < 0 || rank >= nranks) {
        WARN("%s: the bootstrap needs 0 <= rank < nranks <= %u", who, SHIM_WIRE_MAX_NRANKS);
        return ncclInvalidArgument;
    }
    if (len > SHIM_WIRE_MAX_BLOB || (blob == NULL && len > 0) || table_out == NULL) {
        WARN("%s: bootstrap blob %p of %zu bytes (at most %u) or table_out %p is invalid", who,
             blob, len, SHIM_WIRE_MAX_BLOB, (void *)table_out);
        return ncclInvalidArgument;
    }
    if (timeout_ms <= 0) {
        WARN("%s: bootstrap timeout %d ms must be positive", who, timeout_ms);
        return ncclInvalidArgument;
    }
    SHIM_CHECK(shim_bootstrap_id_decode(id, who, &wid));

    int64_t deadline_ns = shim_socket_deadline_ns(timeout_ms);
    shim_socket_addr_str(&wid.root, root_text, sizeof(root_text));
    if ((wid.flags & SHIM_WIRE_ID_FROM_ENV) && rank == 0) {
        SHIM_CHECK(shim_bootstrap_root_from_env(&wid, nranks, timeout_ms, root_text));
    }

    int err = shim_socket_connect(&wid.root, deadline_ns, &fd);
    if (err != 0) {
        WARN("%s: could not connect to bootstrap root %s within %d ms: %s", who, root_text,
             timeout_ms, strerror(err));
        return ncclSystemError;
    }
    hello = (struct shim_wire_hello){.secret = wid.secret, .nranks = (uint32_t)nranks,
                                     .rank = (uint32_t)rank, .blob_len = (uint32_t)len};
    shim_wire_hello_encode(&hello, head);
    err = shim_socket_send_all(fd, head, sizeof(head), deadline_ns);
    if (err == 0 && len > 0) {
        err = shim_socket_send_all(fd, blob, len, deadline_ns);
    }
    if (err != 0) {
        WARN("%s: sending the hello to bootstrap root %s failed: %s", who, root_text,
             err == EPIPE ? "it closed the connection" : strerror(err));
        res = err == EPIPE ? ncclRemoteError : ncclSystemError;
        goto out;
    }
    SHIM_CHECK_GOTO(shim_bootstrap_recv_reply(fd, rank, nranks, blob, len, timeout_ms,
                                              deadline_ns, root_text, table_out),
                    res, out);
    res = ncclSuccess;
out:
    close(fd);
    return res;
}

void
shim_bootstrap_table_free(struct shim_bootstrap_table *table)
{
    free(table); /* the arrays live in the same block */
}
