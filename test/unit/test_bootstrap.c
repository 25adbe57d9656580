/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the bootstrap (bootstrap/: bootstrap.c, root.c, wire.c, socket.c): the pure
 * parts exhaustively (NCCL_SOCKET_IFNAME matching, interface choice, host:port splitting, the
 * id, hello and reply parsers), then real rendezvous over 127.0.0.1 with threads acting as
 * ranks: 1, 2, 3 and 8 ranks with blobs of many sizes, NCCL_COMM_ID with a late rank 0, ids
 * that are garbage or name nobody, strangers and broken clients beside the real ranks, and a
 * duplicate rank. Criterion runs each test in its own process, so a test may setenv before its
 * first library call (env.c reads each variable once). Every test that starts a root ends by
 * checking that the root thread exited and no file descriptor is left open.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/debug.h"
#include "bootstrap/bootstrap.h"
#include "bootstrap/root.h"
#include "bootstrap/socket.h"
#include "bootstrap/wire.h"

/* ---- helpers ------------------------------------------------------------------------- */

static int
open_fds(void)
{
    int n = 0;
    DIR *dir = opendir("/proc/self/fd");
    cr_assert_not_null(dir);
    while (readdir(dir) != NULL) {
        n++;
    }
    closedir(dir);
    return n;
}

static double
now_s(void)
{
    return (double)shim_clock_ns() / 1e9;
}

/* Waits, loosely, for every root thread of this process to finish. */
static void
assert_roots_gone(void)
{
    double until = now_s() + 20;
    while (shim_root_count() > 0 && now_s() < until) {
        usleep(10 * 1000);
    }
    cr_assert_eq(shim_root_count(), 0, "a bootstrap root thread is still running");
}

static uint8_t
blob_byte(int rank, size_t i)
{
    return (uint8_t)(rank * 31 + i * 7 + 1);
}

struct rank_job {
    const ncclUniqueId *id;
    int rank, nranks, timeout_ms, delay_ms;
    size_t len;
    ncclResult_t res;
    struct shim_bootstrap_table *table;
    char err[1024];
};

static void *
rank_main(void *arg)
{
    struct rank_job *job = arg;
    uint8_t *blob = malloc(job->len ? job->len : 1);

    for (size_t i = 0; i < job->len; i++) {
        blob[i] = blob_byte(job->rank, i);
    }
    if (job->delay_ms > 0) {
        usleep((useconds_t)job->delay_ms * 1000);
    }
    shim_error_clear();
    job->res = shim_bootstrap_exchange(job->id, job->rank, job->nranks, blob, job->len,
                                       job->timeout_ms, &job->table);
    snprintf(job->err, sizeof(job->err), "%s", shim_error_last(NULL));
    free(blob);
    return NULL;
}

/* Runs nranks threads through one rendezvous; ranks[r] is claimed rank and nranks. */
static void
run_ranks(struct rank_job *jobs, int n)
{
    pthread_t *threads = calloc((size_t)n, sizeof(*threads));
    for (int i = 0; i < n; i++) {
        cr_assert_eq(pthread_create(&threads[i], NULL, rank_main, &jobs[i]), 0);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(threads[i], NULL);
    }
    free(threads);
}

static size_t
blob_len_for(int rank, int nranks)
{
    /* Zero, tiny, UCX-address-like and the maximum, spread over the ranks. */
    static const size_t sizes[] = {0, 1, 317, 1024, 4093, SHIM_WIRE_MAX_BLOB, 77, 2500};
    return sizes[(size_t)(rank * 3 + nranks) % (sizeof(sizes) / sizeof(sizes[0]))];
}

static void
check_tables(struct rank_job *jobs, int nranks)
{
    for (int i = 0; i < nranks; i++) {
        cr_assert_eq(jobs[i].res, ncclSuccess, "rank %d: %d (%s)", i, jobs[i].res, jobs[i].err);
        const struct shim_bootstrap_table *t = jobs[i].table;
        cr_assert_eq(t->nranks, nranks);
        cr_assert_eq(t->session, jobs[0].table->session, "ranks disagree on the session");
        for (int r = 0; r < nranks; r++) {
            cr_assert_eq(t->lens[r], jobs[r].len, "rank %d sees blob %d of %zu bytes, not %zu",
                         i, r, t->lens[r], jobs[r].len);
            const uint8_t *b = t->data + t->offsets[r];
            for (size_t k = 0; k < t->lens[r]; k++) {
                cr_assert_eq(b[k], blob_byte(r, k), "rank %d: blob %d byte %zu", i, r, k);
            }
        }
    }
    for (int i = 0; i < nranks; i++) {
        shim_bootstrap_table_free(jobs[i].table);
    }
}

static void
rendezvous(int nranks)
{
    ncclUniqueId id;
    int fds = open_fds();
    struct rank_job *jobs = calloc((size_t)nranks, sizeof(*jobs));

    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclSuccess);
    cr_assert_eq(shim_root_count(), 1);
    for (int r = 0; r < nranks; r++) {
        /* Reverse order and a stagger: the root must not care who comes first. */
        jobs[r] = (struct rank_job){.id = &id, .rank = nranks - 1 - r, .nranks = nranks,
                                    .timeout_ms = 20000, .delay_ms = (r % 3) * 20};
        jobs[r].len = blob_len_for(jobs[r].rank, nranks);
    }
    run_ranks(jobs, nranks);
    /* check_tables wants jobs in rank order. */
    struct rank_job *by_rank = calloc((size_t)nranks, sizeof(*by_rank));
    for (int r = 0; r < nranks; r++) {
        by_rank[jobs[r].rank] = jobs[r];
    }
    check_tables(by_rank, nranks);
    free(by_rank);
    free(jobs);
    assert_roots_gone();
    cr_assert_eq(open_fds(), fds, "file descriptors left open");
}

/* A port with nobody listening: bound, noted and released. */
static uint16_t
free_port(void)
{
    union shim_sockaddr addr = {.in4 = {.sin_family = AF_INET,
                                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)}};
    union shim_sockaddr bound;
    int fd;
    cr_assert_eq(shim_socket_listen(&addr, false, &fd, &bound), 0);
    close(fd);
    return ntohs(bound.in4.sin_port);
}

static struct shim_wire_id
decode(const ncclUniqueId *id)
{
    struct shim_wire_id wid;
    char why[SHIM_WIRE_WHY_LEN];
    cr_assert(shim_wire_id_decode(id, &wid, why, sizeof(why)), "%s", why);
    return wid;
}

/* ---- NCCL_SOCKET_IFNAME and the interface choice ------------------------------------- */

Test(ifname, prefixes)
{
    cr_assert(shim_socket_ifname_match("eth", "eth0"));
    cr_assert(shim_socket_ifname_match("eth", "eth"));
    cr_assert(shim_socket_ifname_match("ib,eth", "eth1"));
    cr_assert(shim_socket_ifname_match("ib,eth", "ib0"));
    cr_assert_not(shim_socket_ifname_match("ib,eth", "enp3s0"));
    cr_assert_not(shim_socket_ifname_match("eth0", "eth"));
    cr_assert(shim_socket_ifname_match("eth0", "eth01"));
    cr_assert(shim_socket_ifname_match(",,eth,", "eth0"), "empty entries are skipped");
    cr_assert_not(shim_socket_ifname_match(",", "eth0"), "no entry matches nothing");
    cr_assert_not(shim_socket_ifname_match("", "eth0"));
}

Test(ifname, exclude)
{
    cr_assert_not(shim_socket_ifname_match("^docker,lo", "lo"));
    cr_assert_not(shim_socket_ifname_match("^docker,lo", "docker0"));
    cr_assert(shim_socket_ifname_match("^docker,lo", "eth0"));
    cr_assert(shim_socket_ifname_match("^", "anything"), "excluding nothing keeps all");
}

Test(ifname, exact)
{
    cr_assert(shim_socket_ifname_match("=eth0", "eth0"));
    cr_assert_not(shim_socket_ifname_match("=eth0", "eth01"));
    cr_assert_not(shim_socket_ifname_match("=eth", "eth0"));
    cr_assert(shim_socket_ifname_match("=ib0,eth0", "eth0"));
    cr_assert_not(shim_socket_ifname_match("^=eth0", "eth0"));
    cr_assert(shim_socket_ifname_match("^=eth0", "eth01"));
}

static struct shim_ifaddr
ifa4(const char *name, const char *ip)
{
    struct shim_ifaddr a;
    memset(&a, 0, sizeof(a));
    snprintf(a.name, sizeof(a.name), "%s", name);
    a.addr.in4.sin_family = AF_INET;
    inet_pton(AF_INET, ip, &a.addr.in4.sin_addr);
    return a;
}

static struct shim_ifaddr
ifa6(const char *name, const char *ip)
{
    struct shim_ifaddr a;
    memset(&a, 0, sizeof(a));
    snprintf(a.name, sizeof(a.name), "%s", name);
    a.addr.in6.sin6_family = AF_INET6;
    inet_pton(AF_INET6, ip, &a.addr.in6.sin6_addr);
    return a;
}

Test(ifname, default_choice)
{
    struct shim_ifaddr c[] = {ifa4("lo", "127.0.0.1"), ifa4("docker0", "172.17.0.1"),
                              ifa6("eth0", "fe80::1"), ifa6("eth0", "2001:db8::5"),
                              ifa4("eth1", "10.0.0.7")};
    /* Not lo or docker, IPv4 first. */
    cr_assert_eq(shim_socket_ifaddr_choose(c, 5, NULL), 4);
    cr_assert_eq(shim_socket_ifaddr_choose(c, 5, ""), 4);
    /* Without eth1: eth0's global IPv6, never its link-local address. */
    cr_assert_eq(shim_socket_ifaddr_choose(c, 4, NULL), 3);
    /* Only lo and docker: lo. */
    cr_assert_eq(shim_socket_ifaddr_choose(c, 2, NULL), 0);
    /* Only docker: docker, as a last resort. */
    cr_assert_eq(shim_socket_ifaddr_choose(c + 1, 1, NULL), 0);
    /* Only a link-local address: nothing. */
    cr_assert_eq(shim_socket_ifaddr_choose(c + 2, 1, NULL), -1);
    cr_assert_eq(shim_socket_ifaddr_choose(c, 0, NULL), -1);
}

Test(ifname, spec_choice)
{
    struct shim_ifaddr c[] = {ifa4("lo", "127.0.0.1"), ifa4("docker0", "172.17.0.1"),
                              ifa6("eth0", "2001:db8::5"), ifa4("eth1", "10.0.0.7")};
    cr_assert_eq(shim_socket_ifaddr_choose(c, 4, "lo"), 0);
    cr_assert_eq(shim_socket_ifaddr_choose(c, 4, "docker"), 1);
    cr_assert_eq(shim_socket_ifaddr_choose(c, 4, "=eth0"), 2);
    cr_assert_eq(shim_socket_ifaddr_choose(c, 4, "eth"), 3, "IPv4 before IPv6");
    cr_assert_eq(shim_socket_ifaddr_choose(c, 4, "^eth,lo"), 1);
    cr_assert_eq(shim_socket_ifaddr_choose(c, 4, "=eth"), -1);
    cr_assert_eq(shim_socket_ifaddr_choose(c, 4, "ib"), -1);
}

Test(ifname, no_match_is_invalid_usage)
{
    setenv("NCCL_SOCKET_IFNAME", "=nosuchif9", 1);
    ncclUniqueId id;
    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclInvalidUsage);
    cr_assert(strstr(shim_error_last(NULL), "nosuchif9") != NULL, "%s", shim_error_last(NULL));
    cr_assert_eq(shim_root_count(), 0);
}

Test(ifname, lo_is_used, .timeout = 30)
{
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    ncclUniqueId id;
    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclSuccess);
    struct shim_wire_id wid = decode(&id);
    char text[SHIM_SOCKET_ADDR_STRLEN];
    shim_socket_addr_str(&wid.root, text, sizeof(text));
    cr_assert(strncmp(text, "127.", 4) == 0 || strncmp(text, "[::1]", 5) == 0, "%s", text);
    struct rank_job job = {.id = &id, .rank = 0, .nranks = 1, .timeout_ms = 20000, .len = 9};
    run_ranks(&job, 1);
    check_tables(&job, 1);
    assert_roots_gone();
}

/* ---- host:port ----------------------------------------------------------------------- */

Test(hostport, split)
{
    char host[64];
    uint16_t port;
    const char *why;

    cr_assert(shim_socket_hostport_split("10.1.2.3:4567", host, sizeof(host), &port, &why));
    cr_assert_str_eq(host, "10.1.2.3");
    cr_assert_eq(port, 4567);
    cr_assert(shim_socket_hostport_split("[fe80::1%eth0]:1", host, sizeof(host), &port, &why));
    cr_assert_str_eq(host, "fe80::1%eth0");
    cr_assert_eq(port, 1);
    cr_assert(shim_socket_hostport_split("node-7.example:65535", host, sizeof(host), &port,
                                         &why));
    cr_assert_str_eq(host, "node-7.example");
    cr_assert_eq(port, 65535);

    static const char *const bad[] = {
        "", "host", "host:", ":80", "host:0", "host:65536", "host:8x", "host:-1", "host: 80",
        "::1:80", "[::1]", "[::1]80", "[::1:80", "[]:80", "host:99999999999999999999",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why = NULL;
        cr_assert_not(shim_socket_hostport_split(bad[i], host, sizeof(host), &port, &why),
                      "accepted \"%s\"", bad[i]);
        cr_assert_not_null(why);
    }
    cr_assert_not(shim_socket_hostport_split("abcdefgh:1", host, 8, &port, &why), "too long");
    cr_assert_not(shim_socket_hostport_split(NULL, host, sizeof(host), &port, &why));
}

Test(hostport, resolve)
{
    union shim_sockaddr a;
    char text[SHIM_SOCKET_ADDR_STRLEN];

    cr_assert_eq(shim_socket_addr_parse("127.0.0.1:29500", "TEST", &a), ncclSuccess);
    shim_socket_addr_str(&a, text, sizeof(text));
    cr_assert_str_eq(text, "127.0.0.1:29500");
    cr_assert_eq(shim_socket_addr_parse("[::1]:7", "TEST", &a), ncclSuccess);
    shim_socket_addr_str(&a, text, sizeof(text));
    cr_assert_str_eq(text, "[::1]:7");
    cr_assert_eq(shim_socket_addr_parse("localhost:80", "TEST", &a), ncclSuccess);
    cr_assert(a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6);
    cr_assert_eq(shim_socket_addr_parse("localhost", "TEST", &a), ncclInvalidUsage);
    cr_assert(strstr(shim_error_last(NULL), "TEST") != NULL, "%s", shim_error_last(NULL));
}

/* ---- the wire ------------------------------------------------------------------------ */

Test(wire, id_round_trip)
{
    struct shim_wire_id in, out;
    ncclUniqueId id;
    char why[SHIM_WIRE_WHY_LEN];

    memset(&in, 0, sizeof(in));
    cr_assert_eq(shim_socket_addr_parse("10.20.30.40:1234", "TEST", &in.root), ncclSuccess);
    in.secret = 0x0123456789abcdefULL;
    in.flags = SHIM_WIRE_ID_FROM_ENV;
    shim_wire_id_encode(&in, &id);
    cr_assert_eq(sizeof(id.internal), 128);
    cr_assert(shim_wire_id_decode(&id, &out, why, sizeof(why)), "%s", why);
    cr_assert_eq(out.secret, in.secret);
    cr_assert_eq(out.flags, in.flags);
    cr_assert_eq(memcmp(&out.root.in4, &in.root.in4, sizeof(in.root.in4)), 0);

    memset(&in.root, 0, sizeof(in.root));
    cr_assert_eq(shim_socket_addr_parse("[2001:db8::1]:99", "TEST", &in.root), ncclSuccess);
    in.root.in6.sin6_scope_id = 3;
    shim_wire_id_encode(&in, &id);
    cr_assert(shim_wire_id_decode(&id, &out, why, sizeof(why)), "%s", why);
    cr_assert_eq(memcmp(&out.root.in6, &in.root.in6, sizeof(in.root.in6)), 0);
}

Test(wire, id_rejects_damage)
{
    struct shim_wire_id wid;
    ncclUniqueId id, bad;
    char why[SHIM_WIRE_WHY_LEN];

    memset(&wid, 0, sizeof(wid));
    cr_assert_eq(shim_socket_addr_parse("10.0.0.1:5", "TEST", &wid.root), ncclSuccess);
    wid.secret = 42;
    shim_wire_id_encode(&wid, &id);
    /* Any single flipped bit in the meaningful bytes is caught. */
    for (int byte = 0; byte < 48; byte++) {
        for (int bit = 0; bit < 8; bit++) {
            bad = id;
            bad.internal[byte] ^= (char)(1 << bit);
            cr_assert_not(shim_wire_id_decode(&bad, &wid, why, sizeof(why)),
                          "byte %d bit %d", byte, bit);
        }
    }
    memset(&bad, 0, sizeof(bad));
    cr_assert_not(shim_wire_id_decode(&bad, &wid, why, sizeof(why)));
    cr_assert(strstr(why, "magic") != NULL, "%s", why);
}

Test(wire, id_hash)
{
    struct shim_wire_id wid;
    ncclUniqueId a, b;

    memset(&wid, 0, sizeof(wid));
    cr_assert_eq(shim_socket_addr_parse("10.0.0.1:5", "TEST", &wid.root), ncclSuccess);
    wid.secret = 7;
    shim_wire_id_encode(&wid, &a);
    wid.secret = 8;
    shim_wire_id_encode(&wid, &b);
    cr_assert_neq(shim_wire_id_hash(&a), shim_wire_id_hash(&b));

    /* From NCCL_COMM_ID: two hosts resolving the name differently still agree. */
    wid.flags = SHIM_WIRE_ID_FROM_ENV;
    shim_wire_id_encode(&wid, &a);
    cr_assert_eq(shim_socket_addr_parse("10.0.0.2:5", "TEST", &wid.root), ncclSuccess);
    shim_wire_id_encode(&wid, &b);
    cr_assert_eq(shim_wire_id_hash(&a), shim_wire_id_hash(&b));

    uint64_t h1, h2;
    cr_assert_eq(shim_bootstrap_id_hash(&a, &h1), ncclSuccess);
    cr_assert_eq(shim_bootstrap_id_hash(&a, &h2), ncclSuccess);
    cr_assert_eq(h1, h2);
    memset(&a, 0x5a, sizeof(a));
    cr_assert_eq(shim_bootstrap_id_hash(&a, &h1), ncclInvalidArgument);
}

Test(wire, hello_parse)
{
    uint8_t buf[SHIM_WIRE_HELLO_BYTES + 8];
    struct shim_wire_hello h = {.secret = 9, .nranks = 4, .rank = 3, .blob_len = 5}, out;
    char why[SHIM_WIRE_WHY_LEN];
    size_t need;

    shim_wire_hello_encode(&h, buf);
    memcpy(buf + SHIM_WIRE_HELLO_BYTES, "hello", 5);
    for (size_t len = 0; len < SHIM_WIRE_HELLO_BYTES + 5; len++) {
        cr_assert_eq(shim_wire_hello_parse(buf, len, &out, &need, why, sizeof(why)),
                     SHIM_WIRE_SHORT, "len %zu", len);
        cr_assert_eq(need, len < SHIM_WIRE_HELLO_BYTES ? SHIM_WIRE_HELLO_BYTES
                                                       : SHIM_WIRE_HELLO_BYTES + 5);
    }
    cr_assert_eq(shim_wire_hello_parse(buf, SHIM_WIRE_HELLO_BYTES + 5, &out, &need, why,
                                       sizeof(why)), SHIM_WIRE_OK);
    cr_assert_eq(out.secret, 9);
    cr_assert_eq(out.rank, 3);
    cr_assert_eq(out.nranks, 4);
    cr_assert_eq(memcmp(out.blob, "hello", 5), 0);
    cr_assert_eq(shim_wire_hello_parse(buf, SHIM_WIRE_HELLO_BYTES + 6, &out, &need, why,
                                       sizeof(why)), SHIM_WIRE_BAD, "trailing bytes");

    struct shim_wire_hello bad[] = {
        {.nranks = 0, .rank = 0},
        {.nranks = 4, .rank = 4},
        {.nranks = SHIM_WIRE_MAX_NRANKS + 1, .rank = 0},
        {.nranks = 2, .rank = 1, .blob_len = SHIM_WIRE_MAX_BLOB + 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        shim_wire_hello_encode(&bad[i], buf);
        cr_assert_eq(shim_wire_hello_parse(buf, SHIM_WIRE_HELLO_BYTES, &out, &need, why,
                                           sizeof(why)), SHIM_WIRE_BAD, "case %zu", i);
    }
    memset(buf, 0xff, sizeof(buf));
    cr_assert_eq(shim_wire_hello_parse(buf, sizeof(buf), &out, &need, why, sizeof(why)),
                 SHIM_WIRE_BAD);
}

Test(wire, reply_parse)
{
    uint8_t buf[SHIM_WIRE_REPLY_BYTES + 8 + 5];
    struct shim_wire_reply r = {.nranks = 2, .session = 77, .data_len = 5}, out;
    char why[SHIM_WIRE_WHY_LEN];
    size_t need;

    shim_wire_reply_encode(&r, buf);
    shim_wire_put_u32(buf + SHIM_WIRE_REPLY_BYTES, 2);
    shim_wire_put_u32(buf + SHIM_WIRE_REPLY_BYTES + 4, 3);
    memcpy(buf + SHIM_WIRE_REPLY_BYTES + 8, "abcde", 5);
    for (size_t len = 0; len < sizeof(buf); len++) {
        cr_assert_eq(shim_wire_reply_parse(buf, len, 2, &out, &need, why, sizeof(why)),
                     SHIM_WIRE_SHORT, "len %zu", len);
    }
    cr_assert_eq(shim_wire_reply_parse(buf, sizeof(buf), 2, &out, &need, why, sizeof(why)),
                 SHIM_WIRE_OK, "%s", why);
    cr_assert_eq(out.session, 77);
    cr_assert_eq(shim_wire_get_u32(out.lens + 4), 3);
    cr_assert_eq(memcmp(out.data, "abcde", 5), 0);
    cr_assert_eq(shim_wire_reply_parse(buf, sizeof(buf), 3, &out, &need, why, sizeof(why)),
                 SHIM_WIRE_BAD, "wrong nranks");

    /* Lengths that do not add up to the header's total. */
    shim_wire_put_u32(buf + SHIM_WIRE_REPLY_BYTES + 4, 4);
    cr_assert_eq(shim_wire_reply_parse(buf, sizeof(buf), 2, &out, &need, why, sizeof(why)),
                 SHIM_WIRE_BAD);
    /* A forged total beyond what nranks blobs can hold. */
    r.data_len = 2ull * SHIM_WIRE_MAX_BLOB + 1;
    shim_wire_reply_encode(&r, buf);
    cr_assert_eq(shim_wire_reply_parse(buf, SHIM_WIRE_REPLY_BYTES, 2, &out, &need, why,
                                       sizeof(why)), SHIM_WIRE_BAD);

    /* A refusal: no table, and it reads as words. */
    struct shim_wire_reply no = {.status = SHIM_WIRE_STATUS_DUP_RANK, .arg = {5}};
    shim_wire_reply_encode(&no, buf);
    cr_assert_eq(shim_wire_reply_parse(buf, SHIM_WIRE_REPLY_BYTES, 9, &out, &need, why,
                                       sizeof(why)), SHIM_WIRE_OK);
    shim_wire_status_str(&out, why, sizeof(why));
    cr_assert(strstr(why, "rank 5 joined twice") != NULL, "%s", why);
    no.status = 99;
    shim_wire_reply_encode(&no, buf);
    cr_assert_eq(shim_wire_reply_parse(buf, SHIM_WIRE_REPLY_BYTES, 9, &out, &need, why,
                                       sizeof(why)), SHIM_WIRE_BAD);
}

/* Random bytes never crash the parsers and are never taken for a valid id. */
Test(wire, random_bytes)
{
    uint8_t buf[256];
    struct shim_wire_hello h;
    struct shim_wire_reply r;
    struct shim_wire_id wid;
    ncclUniqueId id;
    char why[SHIM_WIRE_WHY_LEN];
    size_t need;
    unsigned seed = 12345;

    for (int iter = 0; iter < 20000; iter++) {
        size_t len = (size_t)rand_r(&seed) % sizeof(buf);
        for (size_t i = 0; i < sizeof(buf); i++) {
            buf[i] = (uint8_t)rand_r(&seed);
        }
        if (iter % 2) { /* sometimes a valid magic, to get past the first check */
            shim_wire_put_u32(buf, iter % 4 == 1 ? SHIM_WIRE_HELLO_MAGIC : SHIM_WIRE_REPLY_MAGIC);
            buf[4] = 0;
            buf[5] = SHIM_WIRE_VERSION;
        }
        shim_wire_hello_parse(buf, len, &h, &need, why, sizeof(why));
        shim_wire_reply_parse(buf, len, (uint32_t)(iter % 5) + 1, &r, &need, why, sizeof(why));
        memcpy(id.internal, buf, sizeof(id.internal));
        cr_assert_not(shim_wire_id_decode(&id, &wid, why, sizeof(why)));
    }
}

/* ---- rendezvous ---------------------------------------------------------------------- */

Test(exchange, one_rank, .timeout = 60)
{
    rendezvous(1);
}

Test(exchange, two_ranks, .timeout = 60)
{
    rendezvous(2);
}

Test(exchange, three_ranks, .timeout = 60)
{
    rendezvous(3);
}

Test(exchange, eight_ranks, .timeout = 60)
{
    rendezvous(8);
}

/* Two rendezvous at once in one process, each with its own root and session. */
Test(exchange, concurrent_roots, .timeout = 60)
{
    ncclUniqueId a, b;
    struct rank_job jobs[6];
    int fds = open_fds();

    cr_assert_eq(shim_bootstrap_get_unique_id(&a), ncclSuccess);
    cr_assert_eq(shim_bootstrap_private_id(&b), ncclSuccess);
    cr_assert_eq(shim_root_count(), 2);
    for (int i = 0; i < 6; i++) {
        jobs[i] = (struct rank_job){.id = i < 3 ? &a : &b, .rank = i % 3, .nranks = 3,
                                    .timeout_ms = 20000, .len = 100 + (size_t)i};
    }
    run_ranks(jobs, 6);
    uint64_t session_a = jobs[0].table != NULL ? jobs[0].table->session : 0;
    check_tables(jobs, 3);
    cr_assert_neq(jobs[3].table->session, session_a, "two rendezvous share a session");
    check_tables(jobs + 3, 3);
    assert_roots_gone();
    cr_assert_eq(open_fds(), fds);
}

Test(exchange, private_id_ignores_comm_id, .timeout = 60)
{
    char spec[32];
    snprintf(spec, sizeof(spec), "127.0.0.1:%u", free_port());
    setenv("NCCL_COMM_ID", spec, 1);
    ncclUniqueId id;
    cr_assert_eq(shim_bootstrap_private_id(&id), ncclSuccess);
    cr_assert_eq(decode(&id).flags & SHIM_WIRE_ID_FROM_ENV, 0);
    cr_assert_eq(shim_root_count(), 1);
    struct rank_job jobs[2] = {{.id = &id, .rank = 0, .nranks = 2, .timeout_ms = 20000},
                               {.id = &id, .rank = 1, .nranks = 2, .timeout_ms = 20000}};
    run_ranks(jobs, 2);
    check_tables(jobs, 2);
    assert_roots_gone();
}

/* NCCL_COMM_ID: every rank computes the id, rank 0 hosts the root and comes last. */
Test(exchange, comm_id, .timeout = 60)
{
    char spec[32];
    ncclUniqueId a, b;
    int fds = open_fds();

    snprintf(spec, sizeof(spec), "127.0.0.1:%u", free_port());
    setenv("NCCL_COMM_ID", spec, 1);
    cr_assert_eq(shim_bootstrap_get_unique_id(&a), ncclSuccess);
    cr_assert_eq(shim_bootstrap_get_unique_id(&b), ncclSuccess);
    cr_assert_eq(memcmp(&a, &b, sizeof(a)), 0, "ranks must compute the same id");
    cr_assert_eq(shim_root_count(), 0, "no root before rank 0 joins");
    cr_assert(decode(&a).flags & SHIM_WIRE_ID_FROM_ENV);

    struct rank_job jobs[4];
    for (int r = 0; r < 4; r++) {
        jobs[r] = (struct rank_job){.id = r % 2 ? &a : &b, .rank = r, .nranks = 4,
                                    .timeout_ms = 20000, .len = blob_len_for(r, 4),
                                    .delay_ms = r == 0 ? 300 : 0};
    }
    run_ranks(jobs, 4);
    uint64_t first_session = jobs[0].table != NULL ? jobs[0].table->session : 0;
    check_tables(jobs, 4);
    assert_roots_gone();

    /* The same NCCL_COMM_ID again: a second communicator, told apart by its session. */
    for (int r = 0; r < 4; r++) {
        jobs[r].table = NULL;
    }
    run_ranks(jobs, 4);
    cr_assert_eq(jobs[0].res, ncclSuccess, "%s", jobs[0].err);
    cr_assert_neq(jobs[0].table->session, first_session);
    check_tables(jobs, 4);
    assert_roots_gone();
    cr_assert_eq(open_fds(), fds);
}

Test(exchange, comm_id_malformed)
{
    setenv("NCCL_COMM_ID", "nonsense", 1);
    ncclUniqueId id;
    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclInvalidUsage);
    cr_assert(strstr(shim_error_last(NULL), "NCCL_COMM_ID") != NULL, "%s",
              shim_error_last(NULL));
}

/* ---- failures ------------------------------------------------------------------------ */

Test(failure, garbage_id_at_once, .timeout = 30)
{
    ncclUniqueId id;
    struct shim_bootstrap_table *table = NULL;
    int fds = open_fds();
    double start = now_s();

    memset(&id, 0xa5, sizeof(id));
    cr_assert_eq(shim_bootstrap_exchange(&id, 0, 2, "x", 1, 20000, &table), ncclInvalidArgument);
    cr_assert(strstr(shim_error_last(NULL), "invalid unique id") != NULL, "%s",
              shim_error_last(NULL));
    memset(&id, 0, sizeof(id));
    cr_assert_eq(shim_bootstrap_exchange(&id, 0, 2, "x", 1, 20000, &table), ncclInvalidArgument);
    cr_assert_null(table);
    /* Not a wait for the 20 s timeout: no network was touched. */
    cr_assert_lt(now_s() - start, 5.0);
    cr_assert_eq(open_fds(), fds);
}

Test(failure, bad_arguments_at_once, .timeout = 30)
{
    ncclUniqueId id;
    struct shim_bootstrap_table *table = NULL;
    static uint8_t big[SHIM_WIRE_MAX_BLOB + 1];

    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclSuccess);
    cr_assert_eq(shim_bootstrap_exchange(&id, 2, 2, "x", 1, 1000, &table), ncclInvalidArgument);
    cr_assert_eq(shim_bootstrap_exchange(&id, -1, 2, "x", 1, 1000, &table), ncclInvalidArgument);
    cr_assert_eq(shim_bootstrap_exchange(&id, 0, 0, "x", 1, 1000, &table), ncclInvalidArgument);
    cr_assert_eq(shim_bootstrap_exchange(&id, 0, 1, big, sizeof(big), 1000, &table),
                 ncclInvalidArgument);
    cr_assert_eq(shim_bootstrap_exchange(&id, 0, 1, NULL, 3, 1000, &table), ncclInvalidArgument);
    cr_assert_eq(shim_bootstrap_exchange(&id, 0, 1, "x", 1, 0, &table), ncclInvalidArgument);
    cr_assert_null(table);
    /* The root is still waiting for its rank: serve it, then nothing is left. */
    struct rank_job job = {.id = &id, .rank = 0, .nranks = 1, .timeout_ms = 20000, .len = 3};
    run_ranks(&job, 1);
    check_tables(&job, 1);
    assert_roots_gone();
}

Test(failure, unreachable_root, .timeout = 30)
{
    struct shim_wire_id wid;
    ncclUniqueId id;
    struct shim_bootstrap_table *table = NULL;
    int fds = open_fds();

    memset(&wid, 0, sizeof(wid));
    wid.root.in4.sin_family = AF_INET;
    wid.root.in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    wid.root.in4.sin_port = htons(free_port());
    wid.secret = 1;
    shim_wire_id_encode(&wid, &id);
    double start = now_s();
    cr_assert_eq(shim_bootstrap_exchange(&id, 3, 4, "x", 1, 500, &table), ncclSystemError);
    double took = now_s() - start;
    cr_assert_null(table);
    cr_assert_lt(took, 10.0, "gave up after %.1f s with a 500 ms timeout", took);
    cr_assert_gt(took, 0.2, "gave up after %.3f s, before the 500 ms timeout", took);
    const char *err = shim_error_last(NULL);
    cr_assert(strstr(err, "rank 3 of 4") != NULL && strstr(err, "within 500 ms") != NULL &&
              strstr(err, "refused") != NULL, "%s", err);
    cr_assert_eq(open_fds(), fds);
}

/* The root is there but the other rank never comes. */
Test(failure, missing_rank, .timeout = 30)
{
    setenv("NCCLSHIM_BOOTSTRAP_TIMEOUT", "2", 1);
    ncclUniqueId id;
    int fds = open_fds();

    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclSuccess);
    struct rank_job job = {.id = &id, .rank = 0, .nranks = 2, .timeout_ms = 500, .len = 3};
    double start = now_s();
    run_ranks(&job, 1);
    cr_assert_eq(job.res, ncclSystemError);
    cr_assert_lt(now_s() - start, 10.0);
    cr_assert(strstr(job.err, "no reply from bootstrap root") != NULL &&
              strstr(job.err, "within 500 ms") != NULL, "%s", job.err);
    /* Its root gives up by itself: NCCLSHIM_BOOTSTRAP_TIMEOUT is 2 s here. */
    assert_roots_gone();
    cr_assert_eq(open_fds(), fds);
}

Test(failure, unused_id_root_exits, .timeout = 30)
{
    setenv("NCCLSHIM_BOOTSTRAP_TIMEOUT", "1", 1);
    ncclUniqueId id;
    int fds = open_fds();

    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclSuccess);
    cr_assert_eq(shim_root_count(), 1);
    assert_roots_gone();
    cr_assert_eq(open_fds(), fds);
}

Test(failure, duplicate_rank, .timeout = 30)
{
    setenv("NCCLSHIM_BOOTSTRAP_TIMEOUT", "20", 1);
    ncclUniqueId id;
    int fds = open_fds();

    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclSuccess);
    struct rank_job jobs[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (struct rank_job){.id = &id, .rank = i == 2 ? 1 : i, .nranks = 3,
                                    .timeout_ms = 15000, .len = 10};
    }
    double start = now_s();
    run_ranks(jobs, 3);
    cr_assert_lt(now_s() - start, 10.0, "the refusal must not wait for the timeout");
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(jobs[i].res, ncclInvalidUsage, "job %d: %d (%s)", i, jobs[i].res,
                     jobs[i].err);
        cr_assert(strstr(jobs[i].err, "rank 1 joined twice") != NULL, "%s", jobs[i].err);
        cr_assert_null(jobs[i].table);
    }
    assert_roots_gone();
    cr_assert_eq(open_fds(), fds);
}

Test(failure, nranks_disagree, .timeout = 30)
{
    ncclUniqueId id;

    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclSuccess);
    struct rank_job jobs[2] = {
        {.id = &id, .rank = 0, .nranks = 2, .timeout_ms = 15000, .len = 4},
        {.id = &id, .rank = 1, .nranks = 3, .timeout_ms = 15000, .len = 4, .delay_ms = 100},
    };
    run_ranks(jobs, 2);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(jobs[i].res, ncclInvalidUsage, "job %d: %d (%s)", i, jobs[i].res,
                     jobs[i].err);
        cr_assert(strstr(jobs[i].err, "rank 1 says there are 3 ranks") != NULL, "%s",
                  jobs[i].err);
    }
}

/* ---- strangers beside the real ranks -------------------------------------------------- */

static int
stranger(const union shim_sockaddr *root, const void *bytes, size_t len)
{
    int fd;
    cr_assert_eq(shim_socket_connect(root, shim_socket_deadline_ns(5000), &fd), 0);
    if (len > 0) {
        cr_assert_eq(shim_socket_send_all(fd, bytes, len, shim_socket_deadline_ns(5000)), 0);
    }
    return fd;
}

/* The root closes the stranger's connection: it reads EOF, not a reply, and not a timeout. */
static void
assert_dropped(int fd, const char *what)
{
    uint8_t byte;
    int err = shim_socket_recv_all(fd, &byte, 1, shim_socket_deadline_ns(10000));
    cr_assert_eq(err, EPIPE, "%s: expected the root to close it, got %s", what, strerror(err));
    close(fd);
}

Test(strangers, do_not_stop_the_ranks, .timeout = 60)
{
    ncclUniqueId id;
    uint8_t head[SHIM_WIRE_HELLO_BYTES + 16];
    int fds = open_fds();

    cr_assert_eq(shim_bootstrap_get_unique_id(&id), ncclSuccess);
    struct shim_wire_id wid = decode(&id);

    /* A silent client, and one that stops halfway through its header. */
    int silent = stranger(&wid.root, NULL, 0);
    struct shim_wire_hello h = {.secret = wid.secret, .nranks = 3, .rank = 0, .blob_len = 16};
    shim_wire_hello_encode(&h, head);
    int half_header = stranger(&wid.root, head, SHIM_WIRE_HELLO_BYTES / 2);
    /* The right secret and header, then only part of the blob. */
    int half_blob = stranger(&wid.root, head, SHIM_WIRE_HELLO_BYTES + 5);
    /* Wrong secret. */
    h.secret = wid.secret ^ 1;
    shim_wire_hello_encode(&h, head);
    memset(head + SHIM_WIRE_HELLO_BYTES, 0, 16);
    int wrong_secret = stranger(&wid.root, head, sizeof(head));
    /* Oversized blob with the right secret. */
    h = (struct shim_wire_hello){.secret = wid.secret, .nranks = 3, .rank = 2,
                                 .blob_len = SHIM_WIRE_MAX_BLOB + 1};
    shim_wire_hello_encode(&h, head);
    int oversized = stranger(&wid.root, head, SHIM_WIRE_HELLO_BYTES);
    /* Garbage. */
    static const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n0123456789abcdef";
    int garbage = stranger(&wid.root, junk, sizeof(junk));

    assert_dropped(wrong_secret, "wrong secret");
    assert_dropped(oversized, "oversized");
    assert_dropped(garbage, "garbage");

    struct rank_job jobs[3];
    for (int r = 0; r < 3; r++) {
        jobs[r] = (struct rank_job){.id = &id, .rank = r, .nranks = 3, .timeout_ms = 20000,
                                    .len = 200 + (size_t)r};
    }
    run_ranks(jobs, 3);
    check_tables(jobs, 3);
    /* Once every rank joined, whoever still owes a hello is dropped. */
    assert_dropped(silent, "silent");
    assert_dropped(half_header, "half header");
    assert_dropped(half_blob, "half blob");
    assert_roots_gone();
    cr_assert_eq(open_fds(), fds);
}
