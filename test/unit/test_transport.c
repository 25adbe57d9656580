/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tests of the transport contract (transports/transport.h) over real UCX: two or three workers
 * in one process play the ranks of a small communicator. Criterion runs each test in its own
 * process, so each starts without a UCX context, and the transport_tcp suite can set UCX_TLS
 * before its first worker exists. Message contents are random, the seed is in every failure
 * message, and receive buffers start as the complement of what is sent, so every byte is
 * checked. The wait tests drive the sending worker from a second thread, as another rank
 * would, and assert only loose bounds on time. Once the last worker is gone, the process
 * must have as many open file descriptors as before the first: UCX's context is released.
 * Tests that leave messages unreceived on purpose make UCX itself log that on stderr.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/debug.h"
#include "transports/transport.h"

#define MAX_RANKS 3
#define DEADLINE_MS 30000 /* a test still waiting after this is hung */
#define MIB ((size_t)1 << 20)

static uint64_t rng_seed;
static uint64_t rng_state;

static void
rng_init(void)
{
    rng_seed = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
    rng_state = rng_seed | 1;
}

/* xorshift64*: plenty for test data, and reproducible from the seed. */
static uint64_t
rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dULL;
}

static size_t
rng_below(size_t n)
{
    return (size_t)(rng_next() % n);
}

/* Open file descriptors of this process. */
static int
open_fds(void)
{
    DIR *dir = opendir("/proc/self/fd");
    int n = 0;

    cr_assert(dir != NULL, "cannot list /proc/self/fd");
    while (readdir(dir) != NULL) {
        n++;
    }
    closedir(dir);
    return n;
}

static void
use_tcp(void)
{
    setenv("UCX_TLS", "tcp", 1);
}

/* --- a communicator of workers ------------------------------------------------------------ */

struct rig {
    int n;
    struct tp_worker *w[MAX_RANKS];
    int fds_before; /* open file descriptors before the first worker */
};

static void
rig_up(struct rig *rig, int n)
{
    const void *addrs[MAX_RANKS];
    size_t lens[MAX_RANKS];

    rig->n = n;
    rig->fds_before = open_fds();
    for (int r = 0; r < n; r++) {
        cr_assert_eq(tp_worker_create(&rig->w[r]), ncclSuccess, "creating worker %d: %s", r,
                     shim_error_last(NULL));
        cr_assert_eq(tp_worker_address(rig->w[r], &addrs[r], &lens[r]), ncclSuccess);
        cr_assert(addrs[r] != NULL && lens[r] > 0, "worker %d has an empty address", r);
    }
    for (int r = 0; r < n; r++) {
        cr_assert_eq(tp_worker_connect(rig->w[r], n, r, addrs, lens), ncclSuccess,
                     "connecting rank %d: %s", r, shim_error_last(NULL));
        cr_assert_eq(tp_worker_failed_peer(rig->w[r]), -1);
    }
}

/* Destroys the workers, the last of them also the UCX context. */
static void
rig_down(struct rig *rig)
{
    for (int r = 0; r < rig->n; r++) {
        tp_worker_destroy(rig->w[r]);
        rig->w[r] = NULL;
    }
    cr_assert_eq(open_fds(), rig->fds_before, "file descriptors left open");
}

static bool
rig_progress(struct rig *rig)
{
    bool any = false;

    for (int r = 0; r < rig->n; r++) {
        any |= tp_worker_progress(rig->w[r]);
    }
    return any;
}

/* --- messages ----------------------------------------------------------------------------- */

struct msg {
    int src;
    int dst;
    size_t len;
    uint64_t tag;
    unsigned char *sbuf;
    unsigned char *rbuf;
    struct tp_request sreq;
    struct tp_request rreq;
    bool send_posted;
    bool recv_posted;
    bool send_done;
    bool recv_done;
};

/* The sender's rank is part of the tag, as the contract asks. */
static uint64_t
msg_tag(int src, int dst, int i)
{
    return (uint64_t)src << 56 | (uint64_t)dst << 48 | (uint64_t)i;
}

static void
msg_init(struct msg *m, int src, int dst, size_t len, uint64_t tag)
{
    memset(m, 0, sizeof(*m));
    m->src = src;
    m->dst = dst;
    m->len = len;
    m->tag = tag;
    m->sbuf = malloc(len > 0 ? len : 1);
    m->rbuf = malloc(len > 0 ? len : 1);
    cr_assert(m->sbuf != NULL && m->rbuf != NULL, "out of memory for %zu bytes", len);
    for (size_t i = 0; i < len; i++) {
        m->sbuf[i] = (unsigned char)rng_next();
        m->rbuf[i] = (unsigned char)~m->sbuf[i];
    }
}

static void
msg_free(struct msg *m)
{
    free(m->sbuf);
    free(m->rbuf);
}

static void
msg_post_send(struct rig *rig, struct msg *m)
{
    cr_assert_eq(tp_send_post(rig->w[m->src], m->dst, m->sbuf, m->len, m->tag, &m->sreq),
                 ncclSuccess, "send %d->%d tag 0x%" PRIx64 " len %zu: %s (seed %" PRIu64 ")",
                 m->src, m->dst, m->tag, m->len, shim_error_last(NULL), rng_seed);
    m->send_posted = true;
}

static void
msg_post_recv(struct rig *rig, struct msg *m)
{
    cr_assert_eq(tp_recv_post(rig->w[m->dst], m->src, m->rbuf, m->len, m->tag, &m->rreq),
                 ncclSuccess, "receive %d->%d tag 0x%" PRIx64 " len %zu: %s (seed %" PRIu64 ")",
                 m->src, m->dst, m->tag, m->len, shim_error_last(NULL), rng_seed);
    m->recv_posted = true;
}

/* Tests whichever of m's requests are posted and not done; true once both are done. */
static bool
msg_test(struct rig *rig, struct msg *m)
{
    if (m->send_posted && !m->send_done) {
        cr_assert_eq(tp_request_test(rig->w[m->src], &m->sreq, &m->send_done), ncclSuccess,
                     "send %d->%d tag 0x%" PRIx64 " len %zu: %s (seed %" PRIu64 ")", m->src,
                     m->dst, m->tag, m->len, shim_error_last(NULL), rng_seed);
    }
    if (m->recv_posted && !m->recv_done) {
        cr_assert_eq(tp_request_test(rig->w[m->dst], &m->rreq, &m->recv_done), ncclSuccess,
                     "receive %d->%d tag 0x%" PRIx64 " len %zu: %s (seed %" PRIu64 ")", m->src,
                     m->dst, m->tag, m->len, shim_error_last(NULL), rng_seed);
    }
    return m->send_done && m->recv_done;
}

static void
msg_check(const struct msg *m)
{
    cr_assert(!m->sreq.active && m->sreq.handle == NULL, "a finished send is not idle");
    cr_assert(!m->rreq.active && m->rreq.handle == NULL, "a finished receive is not idle");
    if (m->len > 0 && memcmp(m->sbuf, m->rbuf, m->len) != 0) {
        size_t i = 0;
        while (m->sbuf[i] == m->rbuf[i]) {
            i++;
        }
        cr_assert_fail("%d->%d tag 0x%" PRIx64 " len %zu: byte %zu is 0x%02x, sent 0x%02x "
                       "(seed %" PRIu64 ")", m->src, m->dst, m->tag, m->len, i, m->rbuf[i],
                       m->sbuf[i], rng_seed);
    }
}

/* Progresses every worker and tests every message until all are done, then checks them. */
static void
msgs_finish(struct rig *rig, struct msg *msgs, int n)
{
    int64_t deadline = shim_clock_ms() + DEADLINE_MS;
    bool all_done = false;

    while (!all_done) {
        cr_assert(shim_clock_ms() < deadline, "messages still pending after %d ms (seed %" PRIu64 ")",
                  DEADLINE_MS, rng_seed);
        rig_progress(rig);
        all_done = true;
        for (int i = 0; i < n; i++) {
            all_done &= msg_test(rig, &msgs[i]);
        }
    }
    for (int i = 0; i < n; i++) {
        msg_check(&msgs[i]);
    }
}

/* --- sizes and matching ------------------------------------------------------------------- */

static const size_t test_sizes[] = {0, 1, 8191, MIB, 16 * MIB};
#define NSIZES (int)(sizeof(test_sizes) / sizeof(test_sizes[0]))

/* Each size both ways: 0 -> 1 with the receive posted first, 1 -> 0 with the send posted
 * first and progressed until the receiver has had a chance to see it unexpected. */
static void
run_sizes(void)
{
    struct rig rig;
    struct msg msgs[2];

    rng_init();
    rig_up(&rig, 2);
    for (int s = 0; s < NSIZES; s++) {
        msg_init(&msgs[0], 0, 1, test_sizes[s], msg_tag(0, 1, s));
        msg_init(&msgs[1], 1, 0, test_sizes[s], msg_tag(1, 0, s));
        msg_post_recv(&rig, &msgs[0]);
        msg_post_send(&rig, &msgs[0]);
        msg_post_send(&rig, &msgs[1]);
        for (int i = 0; i < 100; i++) {
            rig_progress(&rig);
        }
        msg_post_recv(&rig, &msgs[1]);
        msgs_finish(&rig, msgs, 2);
        msg_free(&msgs[0]);
        msg_free(&msgs[1]);
    }
    rig_down(&rig);
}

Test(transport, sizes, .timeout = 120)
{
    run_sizes();
}

Test(transport_tcp, sizes, .init = use_tcp, .timeout = 120)
{
    run_sizes();
}

/* Zero bytes from and to NULL, which is what an empty rank block looks like. */
Test(transport, zero_length_null_buffers)
{
    struct rig rig;
    struct tp_request sreq = {0};
    struct tp_request rreq = {0};
    bool sdone = false;
    bool rdone = false;
    int64_t deadline = shim_clock_ms() + DEADLINE_MS;

    rig_up(&rig, 2);
    cr_assert_eq(tp_recv_post(rig.w[1], 0, NULL, 0, 7, &rreq), ncclSuccess);
    cr_assert_eq(tp_send_post(rig.w[0], 1, NULL, 0, 7, &sreq), ncclSuccess);
    while (!sdone || !rdone) {
        cr_assert(shim_clock_ms() < deadline, "zero-length message never completed");
        rig_progress(&rig);
        cr_assert_eq(tp_request_test(rig.w[0], &sreq, &sdone), ncclSuccess);
        cr_assert_eq(tp_request_test(rig.w[1], &rreq, &rdone), ncclSuccess);
    }
    rig_down(&rig);
}

/* Every ordered pair of three ranks, all receives first, then all sends. */
Test(transport, three_ranks, .timeout = 60)
{
    enum { NS = 4, NMSG = MAX_RANKS * (MAX_RANKS - 1) * NS };
    struct rig rig;
    struct msg msgs[NMSG];
    int n = 0;

    rng_init();
    rig_up(&rig, 3);
    for (int src = 0; src < 3; src++) {
        for (int dst = 0; dst < 3; dst++) {
            for (int s = 0; s < NS && src != dst; s++) {
                msg_init(&msgs[n], src, dst, test_sizes[s], msg_tag(src, dst, s));
                n++;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        msg_post_recv(&rig, &msgs[i]);
    }
    for (int i = 0; i < n; i++) {
        msg_post_send(&rig, &msgs[i]);
    }
    msgs_finish(&rig, msgs, n);
    for (int i = 0; i < n; i++) {
        msg_free(&msgs[i]);
    }
    rig_down(&rig);
}

/* Many messages between three ranks of assorted sizes (eager and rendezvous), their sends
 * and receives posted in one shuffled order with progress and tests sprinkled in between:
 * only the tags can put each message where it belongs. */
static void
run_scrambled(void)
{
    enum { PER_PAIR = 24, NMSG = MAX_RANKS * (MAX_RANKS - 1) * PER_PAIR };
    struct rig rig;
    struct msg msgs[NMSG];
    int ops[2 * NMSG]; /* message index * 2 + (1 for the receive) */
    int n = 0;

    rng_init();
    rig_up(&rig, 3);
    for (int src = 0; src < 3; src++) {
        for (int dst = 0; dst < 3; dst++) {
            for (int i = 0; i < PER_PAIR && src != dst; i++) {
                size_t kind = rng_below(20);
                size_t len = kind < 8 ? rng_below(65)
                           : kind < 16 ? 65 + rng_below(20000)
                           : kind < 19 ? 20065 + rng_below(300000)
                           : MIB + rng_below(4096);
                msg_init(&msgs[n], src, dst, len, msg_tag(src, dst, i));
                n++;
            }
        }
    }
    for (int i = 0; i < 2 * n; i++) {
        ops[i] = i;
    }
    for (int i = 2 * n - 1; i > 0; i--) {
        int j = (int)rng_below((size_t)i + 1);
        int t = ops[i];
        ops[i] = ops[j];
        ops[j] = t;
    }
    for (int i = 0; i < 2 * n; i++) {
        struct msg *m = &msgs[ops[i] / 2];
        if (ops[i] % 2 == 1) {
            msg_post_recv(&rig, m);
        } else {
            msg_post_send(&rig, m);
        }
        if (rng_below(4) == 0) {
            tp_worker_progress(rig.w[rng_below(3)]);
            msg_test(&rig, &msgs[rng_below((size_t)n)]);
        }
    }
    msgs_finish(&rig, msgs, n);
    for (int i = 0; i < n; i++) {
        msg_free(&msgs[i]);
    }
    rig_down(&rig);
}

Test(transport, scrambled, .timeout = 120)
{
    run_scrambled();
}

Test(transport_tcp, scrambled, .init = use_tcp, .timeout = 120)
{
    run_scrambled();
}

/* --- length mismatch ---------------------------------------------------------------------- */

/* Sends send_len bytes to a receive of recv_len bytes (the receive posted first or last) and
 * returns how the receive ended. The send must end too, either way, and the pair must still
 * carry a correct message afterwards. */
static ncclResult_t
mismatch(struct rig *rig, size_t send_len, size_t recv_len, bool recv_first, uint64_t tag)
{
    unsigned char *sbuf = calloc(1, send_len + 1);
    unsigned char *rbuf = calloc(1, recv_len + 1);
    struct tp_request sreq = {0};
    struct tp_request rreq = {0};
    ncclResult_t rres = ncclSuccess;
    bool sdone = false;
    bool rdone = false;
    int64_t deadline = shim_clock_ms() + DEADLINE_MS;

    cr_assert(sbuf != NULL && rbuf != NULL);
    if (recv_first) {
        rres = tp_recv_post(rig->w[1], 0, rbuf, recv_len, tag, &rreq);
        rdone = rres != ncclSuccess;
    }
    cr_assert_eq(tp_send_post(rig->w[0], 1, sbuf, send_len, tag, &sreq), ncclSuccess);
    if (!recv_first) {
        for (int i = 0; i < 100; i++) {
            rig_progress(rig);
        }
        rres = tp_recv_post(rig->w[1], 0, rbuf, recv_len, tag, &rreq);
        rdone = rres != ncclSuccess;
    }
    while (!rdone) {
        cr_assert(shim_clock_ms() < deadline, "mismatched receive never ended");
        rig_progress(rig);
        rres = tp_request_test(rig->w[1], &rreq, &rdone);
        rdone |= rres != ncclSuccess;
    }
    cr_assert(!rreq.active && rreq.handle == NULL, "a failed receive is not idle");
    /* UCX may or may not report the disagreement to the sender; it must not hang. */
    while (!sdone) {
        cr_assert(shim_clock_ms() < deadline, "send of a mismatched message never ended");
        rig_progress(rig);
        if (tp_request_test(rig->w[0], &sreq, &sdone) != ncclSuccess) {
            sdone = true;
        }
    }
    free(sbuf);
    free(rbuf);
    return rres;
}

static void
expect_mismatch_fails(size_t send_len, size_t recv_len)
{
    struct rig rig;
    struct msg after;
    char hex[32];

    rng_init();
    rig_up(&rig, 2);
    for (int recv_first = 0; recv_first < 2; recv_first++) {
        uint64_t tag = msg_tag(0, 1, 1000 + recv_first);
        shim_error_clear();
        ncclResult_t res = mismatch(&rig, send_len, recv_len, recv_first, tag);
        cr_assert_eq(res, ncclInvalidUsage, "%zu bytes into %zu (receive %s): result %d",
                     send_len, recv_len, recv_first ? "first" : "last", res);
        snprintf(hex, sizeof(hex), "0x%" PRIx64, tag);
        cr_assert(strstr(shim_error_last(NULL), hex) != NULL,
                  "the error text does not name tag %s: %s", hex, shim_error_last(NULL));
        msg_init(&after, 0, 1, 4096, msg_tag(0, 1, 2000 + recv_first));
        msg_post_recv(&rig, &after);
        msg_post_send(&rig, &after);
        msgs_finish(&rig, &after, 1);
        msg_free(&after);
    }
    rig_down(&rig);
}

Test(transport, longer_than_expected_fails)
{
    expect_mismatch_fails(100, 50);
    expect_mismatch_fails(1, 0);
}

Test(transport, shorter_than_expected_fails)
{
    expect_mismatch_fails(50, 100);
    expect_mismatch_fails(0, 1);
}

Test(transport, rendezvous_length_mismatch_fails, .timeout = 60)
{
    expect_mismatch_fails(MIB, MIB - 1);
    expect_mismatch_fails(MIB - 1, MIB);
}

Test(transport_tcp, length_mismatch_fails, .init = use_tcp, .timeout = 60)
{
    expect_mismatch_fails(100, 50);
    expect_mismatch_fails(50, 100);
    expect_mismatch_fails(MIB, MIB - 1);
}

/* --- waiting ------------------------------------------------------------------------------ */

struct sender {
    struct tp_worker *w;
    const void *buf;
    size_t len;
    uint64_t tag;
    int delay_ms;
    atomic_bool posting; /* set just before the send is posted */
    ncclResult_t res;
    bool done;
};

/* The other rank: sleeps, sends to rank 1, and drives its own worker until the send is done. */
static void *
sender_main(void *arg)
{
    struct sender *s = arg;
    struct tp_request req = {0};
    int64_t deadline;

    usleep((useconds_t)s->delay_ms * 1000);
    deadline = shim_clock_ms() + DEADLINE_MS;
    atomic_store(&s->posting, true);
    s->res = tp_send_post(s->w, 1, s->buf, s->len, s->tag, &req);
    while (s->res == ncclSuccess && shim_clock_ms() < deadline) {
        s->res = tp_request_test(s->w, &req, &s->done);
        if (s->done || s->res != ncclSuccess) {
            break;
        }
        if (!tp_worker_progress(s->w)) {
            s->res = tp_worker_wait(&s->w, 1, 100);
        }
    }
    tp_request_cancel(s->w, &req);
    return NULL;
}

/* Connections are set up lazily; one message each way, with both ranks progressing, makes
 * them complete, as the end of communicator init does. */
static void
warm_up(struct rig *rig)
{
    struct msg m[2];

    msg_init(&m[0], 0, 1, 1, msg_tag(0, 1, 100));
    msg_init(&m[1], 1, 0, 1, msg_tag(1, 0, 100));
    for (int i = 0; i < 2; i++) {
        msg_post_recv(rig, &m[i]);
        msg_post_send(rig, &m[i]);
    }
    msgs_finish(rig, m, 2);
    msg_free(&m[0]);
    msg_free(&m[1]);
}

/* Rank 1 posts a receive and sleeps in tp_worker_wait with a 10 s timeout; rank 0 sends
 * 300 ms later from another thread. The receive must finish well before one timeout (so the
 * message woke the receiver), after few wakeups before the send (so it slept rather than
 * spun; wakeups while a large message streams in are work). Without the warm-up the
 * connection is still half open while the receiver waits, which UCX's TCP transport turns
 * into a readable fd; tp_worker_wait then falls back to a timer of a few milliseconds. */
static void
run_wait_wakes(size_t len, bool warm)
{
    struct rig rig;
    struct msg m;
    struct sender s;
    pthread_t thread;
    int idle_wakeups = 0;
    int wakeups = 0;

    rng_init();
    rig_up(&rig, 2);
    if (warm) {
        warm_up(&rig);
    }
    msg_init(&m, 0, 1, len, msg_tag(0, 1, 1));
    s = (struct sender){.w = rig.w[0], .buf = m.sbuf, .len = len, .tag = m.tag, .delay_ms = 300};
    msg_post_recv(&rig, &m);
    int64_t start = shim_clock_ms();
    cr_assert_eq(pthread_create(&thread, NULL, sender_main, &s), 0);
    while (!m.recv_done) {
        cr_assert(shim_clock_ms() - start < DEADLINE_MS, "the receive never completed");
        cr_assert_eq(tp_request_test(rig.w[1], &m.rreq, &m.recv_done), ncclSuccess, "%s",
                     shim_error_last(NULL));
        if (!m.recv_done && !tp_worker_progress(rig.w[1])) {
            cr_assert_eq(tp_worker_wait(&rig.w[1], 1, 10000), ncclSuccess);
            wakeups++;
            idle_wakeups += !atomic_load(&s.posting);
        }
    }
    int64_t elapsed = shim_clock_ms() - start;
    pthread_join(thread, NULL);
    cr_assert_eq(s.res, ncclSuccess, "the sender failed: %s", shim_error_last(NULL));
    cr_assert(s.done, "the send did not complete");
    cr_assert_lt(elapsed, 8000, "%zu bytes: the receiver slept %" PRId64 " ms: the message "
                 "did not wake it", len, elapsed);
    cr_assert_leq(idle_wakeups, warm ? 10 : 100, "%zu bytes%s: %d wakeups in the %d ms before "
                  "the send (%d in all): spinning", len, warm ? "" : ", cold", idle_wakeups,
                  s.delay_ms, wakeups);
    m.send_done = true;
    msg_check(&m);
    msg_free(&m);
    rig_down(&rig);
}

static void
run_wait_wakes_all(void)
{
    run_wait_wakes(64, true);
    run_wait_wakes(4 * MIB, true);
    run_wait_wakes(64, false);
    run_wait_wakes(4 * MIB, false);
}

Test(transport, wait_woken_by_message, .timeout = 60)
{
    run_wait_wakes_all();
}

Test(transport_tcp, wait_woken_by_message, .init = use_tcp, .timeout = 60)
{
    run_wait_wakes_all();
}

/* Nothing arrives: one second of wait calls with a 250 ms timeout returns a handful of
 * times, and at least once only after a good part of the timeout. */
static void
run_wait_times_out(void)
{
    struct rig rig;
    int calls = 0;
    int64_t longest = 0;

    rig_up(&rig, 2);
    int64_t start = shim_clock_ms();
    while (shim_clock_ms() - start < 1000) {
        int64_t t = shim_clock_ms();
        rig_progress(&rig);
        cr_assert_eq(tp_worker_wait(rig.w, 2, 250), ncclSuccess);
        longest = shim_clock_ms() - t > longest ? shim_clock_ms() - t : longest;
        calls++;
    }
    cr_assert_leq(calls, 40, "%d returns from tp_worker_wait in one second: spinning", calls);
    cr_assert_geq(longest, 125, "no wait lasted half its timeout (longest %" PRId64 " ms)",
                  longest);
    cr_assert_lt(longest, 5250, "a 250 ms wait took %" PRId64 " ms", longest);
    cr_assert_eq(tp_worker_wait(NULL, 0, 10), ncclSuccess);
    rig_down(&rig);
}

Test(transport, wait_times_out, .timeout = 30)
{
    run_wait_times_out();
}

Test(transport_tcp, wait_times_out, .init = use_tcp, .timeout = 30)
{
    run_wait_times_out();
}

/* Rank 0 posts more messages than rank 1's shared-memory FIFO holds, and rank 1 does not
 * progress for 300 ms: UCX keeps the rest of rank 0's sends pending, no fd will say when the
 * FIFO drains, and arming rank 0's worker reports BUSY. Rank 0's waits must sleep meanwhile
 * (microseconds each, so as not to leave the link idle long once rank 1 drains) rather than
 * return at once; then every message arrives intact. */
Test(transport, wait_sleeps_while_peer_fifo_full, .timeout = 60)
{
    enum { NMSGS = 512, LEN = 4096, IDLE_MS = 300 };
    static struct msg m[NMSGS];
    struct rig rig;
    int calls = 0;

    rng_init();
    rig_up(&rig, 2);
    warm_up(&rig);
    for (int i = 0; i < NMSGS; i++) {
        msg_init(&m[i], 0, 1, LEN, msg_tag(0, 1, 100 + i));
        msg_post_send(&rig, &m[i]);
    }
    int64_t start = shim_clock_ms();
    while (shim_clock_ms() - start < IDLE_MS) {
        if (!tp_worker_progress(rig.w[0])) {
            cr_assert_eq(tp_worker_wait(&rig.w[0], 1, 100), ncclSuccess);
            calls++;
        }
    }
    cr_assert_leq(calls, IDLE_MS * 3, "%d returns from tp_worker_wait in %d ms while the "
                  "peer's FIFO was full: spinning", calls, IDLE_MS);
    for (int i = 0; i < NMSGS; i++) {
        msg_post_recv(&rig, &m[i]);
    }
    msgs_finish(&rig, m, NMSGS);
    for (int i = 0; i < NMSGS; i++) {
        msg_free(&m[i]);
    }
    rig_down(&rig);
}

/* --- cancellation, teardown, failure ------------------------------------------------------ */

/* A cancelled receive is withdrawn: the message it would have matched goes to the next
 * receive of that tag. Cancel is also safe on an idle request, and test calls it done. */
Test(transport, cancel_receive)
{
    struct rig rig;
    struct msg m;
    struct tp_request idle = {0};
    bool done = false;

    rng_init();
    rig_up(&rig, 2);
    msg_init(&m, 0, 1, 1000, msg_tag(0, 1, 3));
    msg_post_recv(&rig, &m);
    rig_progress(&rig);
    tp_request_cancel(rig.w[1], &m.rreq);
    cr_assert(!m.rreq.active && m.rreq.handle == NULL, "a cancelled request is not idle");
    tp_request_cancel(rig.w[1], &m.rreq);
    tp_request_cancel(rig.w[1], &idle);
    cr_assert_eq(tp_request_test(rig.w[1], &idle, &done), ncclSuccess);
    cr_assert(done, "an idle request is not done");
    m.recv_posted = false;
    msg_post_send(&rig, &m);
    for (int i = 0; i < 100; i++) {
        rig_progress(&rig);
    }
    msg_post_recv(&rig, &m);
    msgs_finish(&rig, &m, 1);
    msg_free(&m);
    rig_down(&rig);
}

/* A send nobody receives cannot be withdrawn from UCX 1.13, yet cancel returns and leaves
 * the request idle; the worker reclaims the send when it is destroyed. */
Test(transport, cancel_send)
{
    struct rig rig;
    size_t len = 4 * MIB;
    unsigned char *buf = calloc(1, len);
    struct tp_request req = {0};

    cr_assert(buf != NULL);
    rig_up(&rig, 2);
    cr_assert_eq(tp_send_post(rig.w[0], 1, buf, len, msg_tag(0, 1, 5), &req), ncclSuccess);
    for (int i = 0; i < 100; i++) {
        rig_progress(&rig);
    }
    tp_request_cancel(rig.w[0], &req);
    cr_assert(!req.active && req.handle == NULL, "a cancelled send is not idle");
    rig_down(&rig);
    free(buf); /* only now: the send may read it until its worker is gone */
}

/* A rank may message itself (ncclSend/ncclRecv to self in a group): loopback endpoint. */
Test(transport, message_to_self)
{
    struct rig rig;
    struct tp_request sreq = {0}, rreq = {0};
    char out[64] = "to myself", in[64] = "";
    bool sent = false, received = false;

    rig_up(&rig, 2);
    cr_assert_eq(tp_recv_post(rig.w[1], 1, in, sizeof(in), 77, &rreq), ncclSuccess);
    cr_assert_eq(tp_send_post(rig.w[1], 1, out, sizeof(out), 77, &sreq), ncclSuccess);
    for (int i = 0; i < 1000000 && !(sent && received); i++) {
        tp_worker_progress(rig.w[1]);
        if (!sent) {
            cr_assert_eq(tp_request_test(rig.w[1], &sreq, &sent), ncclSuccess);
        }
        if (!received) {
            cr_assert_eq(tp_request_test(rig.w[1], &rreq, &received), ncclSuccess);
        }
    }
    cr_assert(sent && received, "a message to self did not complete");
    cr_assert_str_eq(in, "to myself");
    rig_down(&rig);
}

/* UCX_TLS as UCX reads it: a comma-separated list of names, each whole, or '^' and the names
 * to leave out. The cost model's "TCP inside a host" and the UCX defaults follow these. */
Test(transport_tls, reads_ucx_tls_as_ucx_does)
{
    const struct {
        const char *tls;
        bool shm, tcp;
    } cases[] = {
        {NULL, true, true},         {"", true, true},          {"all", true, true},
        {"tcp", false, true},       {"tcp,cma", false, true},  {"^tcp", true, false},
        {"sm,self", true, false},   {"shm,tcp", true, true},   {"posix", true, false},
        {"^sm", false, true},       {"^posix", true, true},    {"^posix,sysv", false, true},
        {"tcpx,smx", false, false},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *tls = cases[i].tls != NULL ? cases[i].tls : "(unset)";
        cr_expect_eq(tp_tls_has_shm(cases[i].tls), cases[i].shm, "UCX_TLS=%s: shared memory %s",
                     tls, cases[i].shm ? "allowed" : "left out");
        cr_expect_eq(tp_tls_has_tcp(cases[i].tls), cases[i].tcp, "UCX_TLS=%s: TCP %s", tls,
                     cases[i].tcp ? "allowed" : "left out");
    }
}

static void
expect_env(const char *name, const char *want)
{
    const char *got = getenv(name);

    if (want == NULL) {
        cr_expect(got == NULL, "%s=%s, expected unset", name, got);
    } else {
        cr_expect(got != NULL && strcmp(got, want) == 0, "%s=%s, expected %s", name,
                  got != NULL ? got : "(unset)", want);
    }
}

/* Opening UCX sets its TCP and shared-memory transports for bulk transfer (transports/ucx.c),
 * where UCX_TLS lets each in, and never over the user's own setting. */
Test(transport_tls, sets_ucx_for_bulk_where_the_user_did_not)
{
    struct tp_worker *w;

    unsetenv("UCX_TLS");
    unsetenv("UCX_MM_FIFO_SIZE");
    unsetenv("UCX_TCP_TX_SEG_SIZE");
    setenv("UCX_MM_SEG_SIZE", "32k", 1);
    cr_assert_eq(tp_worker_create(&w), ncclSuccess, "%s", shim_error_last(NULL));
    tp_worker_destroy(w);
    expect_env("UCX_MM_FIFO_SIZE", "16");
    expect_env("UCX_MM_SEG_SIZE", "32k");
    expect_env("UCX_TCP_TX_SEG_SIZE", "64k");

    /* The last worker took the context with it; the next one reads the variables again. */
    unsetenv("UCX_MM_FIFO_SIZE");
    unsetenv("UCX_TCP_TX_SEG_SIZE");
    setenv("UCX_TLS", "tcp", 1);
    cr_assert_eq(tp_worker_create(&w), ncclSuccess, "%s", shim_error_last(NULL));
    tp_worker_destroy(w);
    expect_env("UCX_MM_FIFO_SIZE", NULL);
    expect_env("UCX_TCP_TX_SEG_SIZE", "64k");
}

/* Mistakes of the caller are errors with a message, not crashes. */
Test(transport, misuse_is_an_error)
{
    struct rig rig;
    struct tp_request req = {0};
    struct tp_request busy = {0};
    char byte = 0;

    rig_up(&rig, 2);
    cr_assert_eq(tp_send_post(rig.w[0], 2, &byte, 1, 1, &req), ncclInternalError, "rank 2");
    cr_assert_eq(tp_send_post(rig.w[0], -1, &byte, 1, 1, &req), ncclInternalError, "rank -1");
    cr_assert(!req.active, "a failed post left the request active");
    cr_assert_eq(tp_recv_post(rig.w[1], 0, &byte, 1, 9, &busy), ncclSuccess);
    cr_assert_eq(tp_recv_post(rig.w[1], 0, &byte, 1, 10, &busy), ncclInternalError,
                 "posting on a request in use");
    cr_assert_eq(tp_worker_connect(rig.w[0], 2, 0, NULL, NULL), ncclInternalError,
                 "connecting twice");
    tp_request_cancel(rig.w[1], &busy);
    rig_down(&rig);
}

/* Teardown with a receive nobody sends, a rendezvous send nobody receives and an eager send
 * nobody receives: every destroy returns, promptly. */
static void
run_destroy_outstanding(void)
{
    struct rig rig;
    size_t big = 16 * MIB;
    unsigned char *sbuf = calloc(1, big);
    unsigned char rbuf[64];
    struct tp_request reqs[4] = {{0}};

    cr_assert(sbuf != NULL);
    rig_up(&rig, 2);
    cr_assert_eq(tp_recv_post(rig.w[0], 1, rbuf, sizeof(rbuf), 11, &reqs[0]), ncclSuccess);
    cr_assert_eq(tp_send_post(rig.w[1], 0, sbuf, big, 12, &reqs[1]), ncclSuccess);
    cr_assert_eq(tp_send_post(rig.w[1], 0, sbuf, 64, 13, &reqs[2]), ncclSuccess);
    cr_assert_eq(tp_recv_post(rig.w[1], 0, rbuf, sizeof(rbuf), 14, &reqs[3]), ncclSuccess);
    for (int i = 0; i < 200; i++) {
        rig_progress(&rig);
    }
    int64_t start = shim_clock_ms();
    rig_down(&rig); /* the requests are stale now, and not touched again */
    int64_t elapsed = shim_clock_ms() - start;
    cr_assert_lt(elapsed, 10000, "destroying two workers took %" PRId64 " ms", elapsed);
    free(sbuf);
}

Test(transport, destroy_with_outstanding_requests, .timeout = 30)
{
    run_destroy_outstanding();
}

Test(transport_tcp, destroy_with_outstanding_requests, .init = use_tcp, .timeout = 30)
{
    run_destroy_outstanding();
}

/* The context is shared by the live workers and made again after the last one is gone. */
Test(transport, context_outlives_first_worker)
{
    struct rig rig = {.n = 2};
    struct tp_worker *first;
    struct msg m;
    const void *addrs[2];
    size_t lens[2];

    rng_init();
    rig.fds_before = open_fds();
    cr_assert_eq(tp_worker_create(&first), ncclSuccess);
    cr_assert_eq(tp_worker_create(&rig.w[0]), ncclSuccess);
    tp_worker_destroy(first);
    cr_assert_eq(tp_worker_create(&rig.w[1]), ncclSuccess);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(tp_worker_address(rig.w[r], &addrs[r], &lens[r]), ncclSuccess);
    }
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(tp_worker_connect(rig.w[r], 2, r, addrs, lens), ncclSuccess);
    }
    msg_init(&m, 1, 0, 100000, msg_tag(1, 0, 0));
    msg_post_send(&rig, &m);
    msg_post_recv(&rig, &m);
    msgs_finish(&rig, &m, 1);
    msg_free(&m);
    rig_down(&rig);
    cr_assert_eq(tp_worker_create(&first), ncclSuccess);
    tp_worker_destroy(first);
    cr_assert_eq(open_fds(), rig.fds_before, "file descriptors left open");
}

/* A peer that goes away (over TCP its socket closes) fails the survivor's pending receive
 * from it and later sends to it, with ncclRemoteError instead of a hang. */
Test(transport_tcp, dead_peer_is_an_error, .init = use_tcp, .timeout = 60)
{
    struct rig rig;
    struct tp_request req = {0};
    unsigned char buf[64] = {0};
    ncclResult_t res = ncclSuccess;
    bool done = false;

    rng_init();
    rig_up(&rig, 2);
    warm_up(&rig); /* so that the connection exists before the peer leaves */

    cr_assert_eq(tp_recv_post(rig.w[0], 1, buf, sizeof(buf), msg_tag(1, 0, 1), &req),
                 ncclSuccess);
    tp_worker_destroy(rig.w[1]);
    rig.n = 1;
    int64_t deadline = shim_clock_ms() + DEADLINE_MS;
    while (!done && res == ncclSuccess) {
        cr_assert(shim_clock_ms() < deadline, "the peer's death was not noticed");
        if (!tp_worker_progress(rig.w[0])) {
            tp_worker_wait(&rig.w[0], 1, 100);
        }
        res = tp_request_test(rig.w[0], &req, &done);
    }
    cr_assert_eq(res, ncclRemoteError, "receive from a dead peer ended with %d", res);
    cr_assert_eq(tp_worker_failed_peer(rig.w[0]), 1);
    cr_assert(strstr(shim_error_last(NULL), "peer 1") != NULL, "%s", shim_error_last(NULL));
    cr_assert(!req.active && req.handle == NULL, "the failed receive is not idle");
    cr_assert_eq(tp_send_post(rig.w[0], 1, buf, sizeof(buf), msg_tag(0, 1, 1), &req),
                 ncclRemoteError);
    rig_down(&rig);
}

/* --- failure notices ---------------------------------------------------------------------- */

/* Progresses every worker of rig until `to` has rank `from`'s notice; fails the test if it
 * never comes. */
static void
notice_await(struct rig *rig, int to, int from)
{
    int64_t deadline = shim_clock_ms() + DEADLINE_MS;

    while (!tp_worker_noticed(rig->w[to], from)) {
        cr_assert(shim_clock_ms() < deadline, "rank %d's notice did not reach rank %d", from,
                  to);
        if (!rig_progress(rig)) {
            tp_worker_wait(rig->w, rig->n, 10);
        }
    }
}

/* A rank's notice reaches every peer, over connections not yet used (the first message
 * wires them up), with its text cut to 255 bytes; only once. With `teardown` (over TCP, where
 * a closed connection shows at once), a peer that tears down in order sends none, though its
 * endpoint fails as a dead one's would. */
static void
notices(bool teardown)
{
    struct rig rig;
    char why[400];
    const char *got;

    rig_up(&rig, 3);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(tp_worker_notice_first(rig.w[r], &got), -1);
        cr_assert_str_eq(got, "");
    }
    memset(why, 'x', sizeof(why) - 1);
    why[sizeof(why) - 1] = '\0';
    memcpy(why, "rank 0: peer 9 failed", 21);
    tp_worker_notice_send(rig.w[0], why);
    tp_worker_notice_send(rig.w[0], "a second one, which goes nowhere");
    for (int r = 1; r < 3; r++) {
        notice_await(&rig, r, 0);
        cr_assert_eq(tp_worker_notice_first(rig.w[r], &got), 0);
        cr_assert_eq(strlen(got), 255, "a notice of %zu bytes", strlen(got));
        cr_assert(strncmp(got, why, 255) == 0, "notice text \"%s\"", got);
        cr_assert(!tp_worker_noticed(rig.w[r], 3 - r), "rank %d sent no notice", 3 - r);
    }
    cr_assert(!tp_worker_noticed(rig.w[0], 0), "a rank does not notice itself");
    if (!teardown) {
        rig_down(&rig);
        return;
    }

    /* Rank 2 goes in order: rank 1 sees its endpoint fail (once they talked), no notice. */
    struct msg m[2];
    msg_init(&m[0], 1, 2, 1, msg_tag(1, 2, 100));
    msg_init(&m[1], 2, 1, 1, msg_tag(2, 1, 100));
    for (int i = 0; i < 2; i++) {
        msg_post_recv(&rig, &m[i]);
        msg_post_send(&rig, &m[i]);
    }
    msgs_finish(&rig, m, 2);
    msg_free(&m[0]);
    msg_free(&m[1]);
    tp_worker_destroy(rig.w[2]);
    rig.n = 2;
    int64_t deadline = shim_clock_ms() + DEADLINE_MS;
    while (tp_worker_failed_peer(rig.w[1]) != 2) {
        cr_assert(shim_clock_ms() < deadline, "rank 2's teardown was not seen");
        if (!rig_progress(&rig)) {
            tp_worker_wait(rig.w, rig.n, 10);
        }
    }
    cr_assert(!tp_worker_noticed(rig.w[1], 2), "an orderly teardown sent a notice");
    cr_assert_eq(tp_worker_notice_first(rig.w[1], &got), 0);
    rig_down(&rig);
}

Test(transport, notices, .timeout = 60)
{
    notices(false);
}

Test(transport_tcp, notices, .init = use_tcp, .timeout = 60)
{
    notices(true);
}
