/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shared-memory collectives (shm/) with threads as ranks: one team per rank count, made
 * of real POSIX shared-memory segments, runs every collective x count x root x in/out of
 * place x reduction kind against test/sim's reference (exact int32 data, guard bytes,
 * poisoned outputs, inputs unchanged). Slots are made small so most cases take many chunks,
 * and one team runs case after case, so chunk sequence numbers and slot reuse carry across
 * collectives as they do in a program. Threads wait as the library does: poll, then sleep on
 * the flag (run_op).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm/region.h"
#include "shm/shm.h"
#include "sim/reference.h"

#define MAX_RANKS 8

struct team_set {
    int n;
    struct shm_team *teams[MAX_RANKS];
};

/* Forms a team of n ranks in this process, as engine/connect.c does across processes. */
static void
team_set_create(struct team_set *set, int n, size_t slot_bytes, size_t direct_bytes)
{
    struct shm_segment segs[MAX_RANKS];
    char names[MAX_RANKS][SHM_NAME_MAX];

    set->n = n;
    for (int r = 0; r < n; r++) {
        char tag[32];
        snprintf(tag, sizeof(tag), "unit-n%d-r%d", n, r);
        cr_assert_eq(shm_segment_create(tag, slot_bytes, &segs[r]), ncclSuccess);
        memcpy(names[r], segs[r].name, SHM_NAME_MAX);
    }
    for (int r = 0; r < n; r++) {
        cr_assert_eq(shm_team_create(&segs[r], r, n, (const char(*)[SHM_NAME_MAX])names,
                                     slot_bytes, &set->teams[r]),
                     ncclSuccess);
        set->teams[r]->direct_bytes = direct_bytes;
        set->teams[r]->oversubscribed = true;
    }
    for (int r = 0; r < n; r++) {
        shm_segment_destroy(&segs[r]);
    }
}

static void
team_set_destroy(struct team_set *set)
{
    for (int r = 0; r < set->n; r++) {
        shm_team_destroy(set->teams[r]);
    }
}

struct rank_job {
    struct shm_team *team;
    struct shm_coll_args args;
    int nops;          /* the same op again and again: each must start clean */
    unsigned lag_us;   /* sleep before every 7th op */
};

/* Runs one collective to completion as the library waits: poll, then sleep on the flag. */
static void
run_op(struct shm_team *team, const struct shm_coll_args *args)
{
    struct shm_op op;
    struct shm_wait wait;
    enum shm_status status;

    shm_op_init(&op, team, args);
    while ((status = shm_op_progress(&op, team, &wait)) != SHM_DONE) {
        if (status == SHM_BLOCKED) {
            shm_wait_sleep(&wait, 100);
        }
    }
}

static void *
rank_main(void *arg)
{
    struct rank_job *job = arg;
    for (int k = 0; k < job->nops; k++) {
        if (job->lag_us != 0 && k % 7 == 0) {
            usleep(job->lag_us); /* a slow reader: the others run ahead through the ring */
        }
        run_op(job->team, &job->args);
    }
    return NULL;
}

static void
run_case_n(struct team_set *set, const struct ref_case *c, int nops, int laggard)
{
    struct ref_data d;
    struct rank_job jobs[MAX_RANKS];
    pthread_t threads[MAX_RANKS];
    char err[512];

    cr_assert(ref_setup(c, &d));
    for (int r = 0; r < c->nranks; r++) {
        jobs[r] = (struct rank_job){
            .team = set->teams[r],
            .args = {.coll = c->coll, .send = d.send[r], .recv = d.recv[r], .count = c->count,
                     .elem_size = 4, .root = c->root, .redop = d.redops[r],
                     .prescale = d.redops[r].kind == KR_PREMULSUM, .in_place = d.in_place[r]},
            .nops = nops,
            .lag_us = r == laggard ? 300 : 0,
        };
        cr_assert_eq(pthread_create(&threads[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < c->nranks; r++) {
        pthread_join(threads[r], NULL);
    }
    cr_assert(ref_check(&d, err, sizeof(err)), "%s n=%d count=%zu root=%d %s %s: %s",
              ref_coll_name(c->coll), c->nranks, c->count, c->root,
              c->in_place ? "in place" : "out of place", ref_kind_name(c->kind), err);
    ref_free(&d);
}

static void
run_case(struct team_set *set, const struct ref_case *c)
{
    run_case_n(set, c, 1, -1);
}

static const enum alg_coll colls[] = {
    ALG_COLL_ALLREDUCE, ALG_COLL_BROADCAST, ALG_COLL_REDUCE,  ALG_COLL_ALLGATHER,
    ALG_COLL_REDUCESCATTER, ALG_COLL_ALLTOALL, ALG_COLL_GATHER, ALG_COLL_SCATTER,
};

/* Every collective on n ranks with slots of slot_bytes: counts around the chunk and share
 * edges, roots at both ends and the middle, in and out of place, every kind at one count. */
static int
sweep(int n, size_t slot_bytes, size_t direct_bytes)
{
    const size_t counts[] = {0, 1, 7, 16 * (size_t)n + 3, 1000, 4099};
    const enum kr_op_kind kinds[] = {KR_SUM, KR_PROD, KR_MAX, KR_MIN, KR_PREMULSUM,
                                     KR_SUMPOSTDIV};
    struct team_set set;
    int runs = 0;

    team_set_create(&set, n, slot_bytes, direct_bytes);
    for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++) {
        enum alg_coll coll = colls[ci];
        int roots[3] = {0, n - 1, n / 2}, nroots = ref_coll_rooted(coll) ? 3 : 1;
        for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
            for (int ri = 0; ri < nroots; ri++) {
                for (int in_place = 0; in_place < 2; in_place++) {
                    int nkinds = ref_coll_reduces(coll) && counts[k] == 1000 ? 6 : 1;
                    for (int ki = 0; ki < nkinds; ki++) {
                        struct ref_case c = {.coll = coll, .nranks = n, .count = counts[k],
                                             .root = roots[ri], .in_place = in_place,
                                             .kind = kinds[ki]};
                        run_case(&set, &c);
                        runs++;
                    }
                }
            }
        }
    }
    team_set_destroy(&set);
    return runs;
}

Test(shm, every_collective_2_ranks_small_slots)
{
    cr_assert_gt(sweep(2, 4096, 256), 0);
}

Test(shm, every_collective_3_ranks_small_slots)
{
    cr_assert_gt(sweep(3, 4096, 256), 0);
}

Test(shm, every_collective_4_ranks_direct_reductions)
{
    /* Every reduction below 64 KiB takes the direct path: each rank reduces it all. */
    cr_assert_gt(sweep(4, 8192, 65536), 0);
}

Test(shm, every_collective_5_and_8_ranks)
{
    cr_assert_gt(sweep(5, 4096, 0), 0);
    cr_assert_gt(sweep(8, 16384, 512), 0);
}

Test(shm, segments_leave_no_name_behind)
{
    struct team_set set;
    team_set_create(&set, 2, 4096, 0);
    team_set_destroy(&set);
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm/ncclshim-unit-n2-r0-%d", (int)getpid());
    cr_assert_neq(access(path, F_OK), 0, "%s is still there", path);
}

/* Pins the calling thread to one CPU; false if it may not run there. */
static bool
pin_to(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof(set), &set) == 0;
}

Test(shm, a_rank_sees_when_the_awaited_rank_last_waited_on_its_cpu)
{
    cpu_set_t allowed;
    struct team_set set;
    int cpus[2], found = 0;

    cr_assert_eq(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
    for (int c = 0; c < CPU_SETSIZE && found < 2; c++) {
        if (CPU_ISSET(c, &allowed)) {
            cpus[found++] = c;
        }
    }
    team_set_create(&set, 2, 4096, 0);
    cr_assert(pin_to(cpus[0]));
    cr_assert_not(shm_team_peer_shares_cpu(set.teams[0], 1), "rank 1 never waited");
    /* Rank 1 on rank 0's CPU: rank 0 noted it there on its call above. */
    cr_assert(shm_team_peer_shares_cpu(set.teams[1], 0));
    cr_assert(shm_team_peer_shares_cpu(set.teams[0], 1));
    if (found == 2) {
        cr_assert(pin_to(cpus[1]));
        cr_assert_not(shm_team_peer_shares_cpu(set.teams[1], 0), "rank 0 was last on cpu %d",
                      cpus[0]);
        /* Rank 0 moves to rank 1's new CPU and is seen there once it waits. */
        cr_assert(shm_team_peer_shares_cpu(set.teams[0], 1));
        cr_assert(shm_team_peer_shares_cpu(set.teams[1], 0));
    }
    cr_assert(sched_setaffinity(0, sizeof(allowed), &allowed) == 0);
    team_set_destroy(&set);
}

Test(shm, large_outputs_go_out_with_streaming_stores)
{
    /* Outputs of 1 MiB and more take the non-temporal path (copies and staged reductions). */
    for (int direct = 0; direct < 2; direct++) {
        struct team_set set;
        team_set_create(&set, 3, 65536, direct ? (size_t)1 << 30 : 0);
        for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++) {
            for (int in_place = 0; in_place < 2; in_place++) {
                struct ref_case c = {.coll = colls[ci], .nranks = 3, .count = 300007,
                                     .root = 1, .in_place = in_place,
                                     .kind = in_place ? KR_PREMULSUM : KR_SUM};
                run_case(&set, &c);
            }
        }
        team_set_destroy(&set);
    }
}

#define AHEAD_CALLS (2 * SHM_SMALL_SLOTS + 8) /* calls in a row: twice round the small ring */

Test(shm, ranks_run_ahead_through_the_small_ring_and_back)
{
    /* Twice round the small ring and more, with one slow rank: the others get up to
     * SHM_SMALL_SLOTS calls ahead, then wait; every result stays right, in small and large
     * messages alike. */
    const size_t counts[] = {5, 1000, 4099};
    struct team_set set;
    team_set_create(&set, 4, 16384, 1024);
    for (size_t ci = 0; ci < sizeof(colls) / sizeof(colls[0]); ci++) {
        for (size_t k = 0; k < 3; k++) {
            struct ref_case c = {.coll = colls[ci], .nranks = 4, .count = counts[k],
                                 .root = 2, .in_place = false, .kind = KR_SUM};
            run_case_n(&set, &c, AHEAD_CALLS, (int)(ci + k) % 4);
        }
    }
    team_set_destroy(&set);
}

/* Broadcast of the call's own number, AHEAD_CALLS calls in a row, with a slow receiver: the root runs
 * ahead through the small ring, and every receiver must still see call k's value in call k
 * (a slot reused too early would hand it a later call's). */
struct ahead_job {
    struct shm_team *team;
    int root;
    int32_t got[AHEAD_CALLS];
};

static void *
ahead_main(void *arg)
{
    struct ahead_job *job = arg;
    for (int k = 0; k < AHEAD_CALLS; k++) {
        int32_t send[4] = {k, k, k, k}, recv[4] = {-1, -1, -1, -1};
        struct shm_coll_args args = {.coll = ALG_COLL_BROADCAST, .send = send, .recv = recv,
                                     .count = 4, .elem_size = 4, .root = job->root,
                                     .redop = {.kind = KR_SUM, .type = ncclInt32}};
        if (job->team->rank == 1 && k % 5 == 0) {
            usleep(2000);
        }
        run_op(job->team, &args);
        job->got[k] = recv[3];
    }
    return NULL;
}

Test(shm, a_root_ahead_never_overwrites_what_a_slow_rank_still_reads)
{
    struct team_set set;
    struct ahead_job jobs[3];
    pthread_t threads[3];

    team_set_create(&set, 3, 16384, 1024);
    for (int r = 0; r < 3; r++) {
        jobs[r] = (struct ahead_job){.team = set.teams[r], .root = 0};
        cr_assert_eq(pthread_create(&threads[r], NULL, ahead_main, &jobs[r]), 0);
    }
    for (int r = 0; r < 3; r++) {
        pthread_join(threads[r], NULL);
    }
    for (int r = 0; r < 3; r++) {
        for (int k = 0; k < AHEAD_CALLS; k++) {
            cr_assert_eq(jobs[r].got[k], k, "rank %d call %d got %d", r, k, jobs[r].got[k]);
        }
    }
    team_set_destroy(&set);
}

/* Two ranks in one process are told apart from a rank of another process that has our pid
 * (containers sharing /dev/shm but not a PID namespace), and a forked child is another
 * process though it inherits the token's memory. */
Test(shm, the_same_process_takes_more_than_the_same_pid)
{
    struct team_set set;

    team_set_create(&set, 2, 16384, 0);
    cr_assert(shm_team_peer_in_this_process(set.teams[0], 1));
    struct shm_region *region = set.teams[0]->regions[1];
    region->process ^= 1;
    cr_assert_eq(shm_team_peer_pid(set.teams[0], 1), getpid());
    cr_assert_not(shm_team_peer_in_this_process(set.teams[0], 1),
                  "an equal pid with another process's token is another process");
    region->process ^= 1;
    uint64_t mine = shm_process_token();
    pid_t child = fork();
    if (child == 0) {
        _exit(shm_process_token() != mine && !shm_team_peer_in_this_process(set.teams[0], 1)
                  ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "a forked child took itself for its parent");
    team_set_destroy(&set);
}

/* Pages of [p, p + bytes) resident in memory. */
static size_t
resident_pages(const void *p, size_t bytes)
{
    size_t pages = bytes / 4096, resident = 0;
    unsigned char *vec = malloc(pages);

    cr_assert_not_null(vec);
    cr_assert_eq(mincore((void *)p, bytes, vec), 0);
    for (size_t i = 0; i < pages; i++) {
        resident += vec[i] & 1;
    }
    free(vec);
    return resident;
}

Test(shm, suspension_gives_the_slots_back_and_they_serve_again)
{
    struct team_set set;
    const size_t slot_bytes = 16384;
    const size_t slots = SHM_SMALL_AREA + 4 * slot_bytes;
    struct ref_case big = {.coll = ALG_COLL_ALLREDUCE, .nranks = 3, .count = 40000,
                           .kind = KR_SUM};
    struct ref_case small = {.coll = ALG_COLL_ALLGATHER, .nranks = 3, .count = 7,
                             .kind = KR_SUM};

    team_set_create(&set, 3, slot_bytes, 0);
    run_case(&set, &big);
    run_case(&set, &small);
    for (int r = 0; r < 3; r++) {
        const uint8_t *first = shm_region_small(set.teams[r]->regions[r], 0);
        cr_assert_gt(resident_pages(first, slots), 0);
        cr_assert(shm_team_release_slots(set.teams[r], 1000));
        cr_assert_eq(resident_pages(first, slots), 0, "rank %d's slots still resident", r);
    }
    /* Zero-filled again, they carry the next operations as before. */
    run_case(&set, &big);
    run_case(&set, &small);
    team_set_destroy(&set);
}

Test(shm, suspension_keeps_the_slots_while_a_peer_has_not_read_them)
{
    struct team_set set;
    struct shm_op op;
    struct shm_wait wait;
    float send[64] = {1}, recv[3 * 64];
    struct shm_coll_args args = {.coll = ALG_COLL_ALLGATHER, .send = send, .recv = recv,
                                 .count = 64, .elem_size = 4};

    team_set_create(&set, 3, 4096, 0);
    /* Rank 0 posts its part of an all-gather nobody else joins: its chunk stays unread. */
    shm_op_init(&op, set.teams[0], &args);
    cr_assert_neq(shm_op_progress(&op, set.teams[0], &wait), SHM_DONE);
    cr_assert_not(shm_team_release_slots(set.teams[0], 50));
    team_set_destroy(&set);
}
