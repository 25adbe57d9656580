/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Segments and teams: each rank creates one POSIX shared-memory object, peers map it by name,
 * and the names are removed as soon as everyone has mapped them, so nothing is left in
 * /dev/shm when a process dies. Space is reserved up front (posix_fallocate): a sparse object
 * on a full /dev/shm would raise SIGBUS at first touch instead of an error at init.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/debug.h"
#include "base/random.h"
#include "region.h"

size_t
shm_segment_bytes(size_t slot_bytes)
{
    /* the small ring, then two parities of data and result, then the layer above's */
    return SHM_HEADER_BYTES + SHM_SMALL_AREA + 4 * slot_bytes + SHM_AUX_BYTES;
}

ncclResult_t
shm_segment_create(const char *tag, size_t slot_bytes, struct shm_segment *seg)
{
    size_t bytes = shm_segment_bytes(slot_bytes);
    int fd, err;

    memset(seg, 0, sizeof(*seg));
    snprintf(seg->name, sizeof(seg->name), "/ncclshim-%s-%d", tag, (int)getpid());
    fd = shm_open(seg->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        WARN("shm_open(%s) failed: %s", seg->name, strerror(errno));
        return ncclSystemError;
    }
    err = posix_fallocate(fd, 0, (off_t)bytes);
    if (err != 0) {
        WARN("cannot reserve %zu bytes in /dev/shm for %s: %s", bytes, seg->name,
             strerror(err));
        goto err_close;
    }
    seg->base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (seg->base == MAP_FAILED) {
        seg->base = NULL;
        WARN("mmap of %s (%zu bytes) failed: %s", seg->name, bytes, strerror(errno));
        goto err_close;
    }
    close(fd);
    seg->bytes = bytes;
    struct shm_region *region = seg->base;
    region->pid = getpid();
    region->process = shm_process_token();
    region->cpu = -1; /* not noted yet */
    region->slot_bytes = slot_bytes;
    return ncclSuccess;

err_close:
    close(fd);
    shm_unlink(seg->name);
    seg->name[0] = '\0';
    return ncclSystemError;
}

void
shm_segment_destroy(struct shm_segment *seg)
{
    if (seg->name[0] != '\0') {
        shm_unlink(seg->name);
        seg->name[0] = '\0';
    }
    if (seg->base != NULL) {
        munmap(seg->base, seg->bytes);
        seg->base = NULL;
    }
}

static ncclResult_t
shm_team_map(const char *name, size_t bytes, size_t slot_bytes, struct shm_region **region_out)
{
    struct stat st;
    int fd = shm_open(name, O_RDWR, 0);

    if (fd < 0) {
        WARN("cannot open a peer's shared memory %s: %s", name, strerror(errno));
        return ncclSystemError;
    }
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < bytes) {
        WARN("a peer's shared memory %s is smaller than expected (%zu bytes)", name, bytes);
        close(fd);
        return ncclSystemError;
    }
    /* populated now, so no collective pays the page faults of its first use of a slot */
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        WARN("mmap of a peer's shared memory %s failed: %s", name, strerror(errno));
        return ncclSystemError;
    }
    struct shm_region *region = base;
    if (region->slot_bytes != slot_bytes) {
        WARN("a peer's shared memory %s has %llu-byte slots, ours %zu (NCCLSHIM_SHM_SLOT_BYTES "
             "must be equal on every rank)", name, (unsigned long long)region->slot_bytes,
             slot_bytes);
        munmap(base, bytes);
        return ncclInvalidUsage;
    }
    *region_out = region;
    return ncclSuccess;
}

/* Reads a byte of every page of every rank's small ring. Each small call touches a page of
 * its own, and the first walk of each page's translation is cold (nested paging here): the
 * first SHM_SMALL_SLOTS small calls of a team took about 0.1-0.2 us more each (2 ranks, 8 B
 * all-reduce, 10 warm-up calls: 0.58-0.72 us against 0.42-0.56 at the next sizes). */
static void
shm_team_touch_small(const struct shm_team *team)
{
    for (int r = 0; r < team->nranks; r++) {
        const volatile uint8_t *small = (const uint8_t *)team->regions[r] + SHM_HEADER_BYTES;
        for (size_t b = 0; b < SHM_SMALL_AREA; b += 4096) {
            (void)small[b];
        }
    }
}

ncclResult_t
shm_team_create(struct shm_segment *seg, int rank, int nranks,
                const char (*names)[SHM_NAME_MAX], size_t slot_bytes,
                struct shm_team **team_out)
{
    struct shm_team *team;
    ncclResult_t res = ncclSuccess;

    SHIM_CHECK(shim_calloc(&team, 1));
    SHIM_CHECK_GOTO(shim_calloc(&team->regions, (size_t)nranks), res, err_free);
    SHIM_CHECK_GOTO(shim_calloc(&team->srcs, (size_t)nranks), res, err_unmap);
    team->stage = aligned_alloc(64, SHM_STAGE_BYTES);
    if (team->stage == NULL) {
        WARN("out of memory for a %d-byte staging buffer", SHM_STAGE_BYTES);
        res = ncclSystemError;
        goto err_unmap;
    }
    memset(team->stage, 0, SHM_STAGE_BYTES); /* faulted in now, as the mappings */
    team->rank = rank;
    team->nranks = nranks;
    team->slot_bytes = slot_bytes;
    team->map_bytes = seg->bytes;
    for (int r = 0; r < nranks; r++) {
        if (r == rank) {
            team->regions[r] = seg->base;
            continue;
        }
        SHIM_CHECK_GOTO(shm_team_map(names[r], seg->bytes, slot_bytes, &team->regions[r]),
                        res, err_unmap);
    }
    shm_team_touch_small(team);
    seg->base = NULL; /* the team's now */
    *team_out = team;
    return ncclSuccess;

err_unmap:
    for (int r = 0; r < nranks; r++) {
        if (r != rank && team->regions[r] != NULL) {
            munmap(team->regions[r], team->map_bytes);
        }
    }
    free(team->regions);
    free(team->srcs);
    free(team->stage);
err_free:
    free(team);
    return res;
}

void
shm_team_destroy(struct shm_team *team)
{
    if (team == NULL) {
        return;
    }
    for (int r = 0; r < team->nranks; r++) {
        munmap(team->regions[r], team->map_bytes);
    }
    free(team->regions);
    free(team->srcs);
    free(team->stage);
    free(team);
}

/* Random per process, made on first use and again in a child after fork (the child handler
 * forgets the parent's). Read on every device call's buffers: an atomic load, no lock and no
 * system call once made. */
static uint64_t shm_token;
static pthread_once_t shm_token_once = PTHREAD_ONCE_INIT;

static void
shm_token_forget(void)
{
    __atomic_store_n(&shm_token, 0, __ATOMIC_RELAXED);
}

static void
shm_token_watch_forks(void)
{
    pthread_atfork(NULL, NULL, shm_token_forget);
}

uint64_t
shm_process_token(void)
{
    uint64_t token = __atomic_load_n(&shm_token, __ATOMIC_ACQUIRE);

    if (token != 0) {
        return token;
    }
    pthread_once(&shm_token_once, shm_token_watch_forks);
    if (shim_random_u64("a process token", &token) != ncclSuccess || token == 0) {
        /* Without the kernel's randomness: the pid and a clock, unique enough here. */
        token = ((uint64_t)getpid() << 32) ^ (uint64_t)shim_clock_ns() ^ 1;
    }
    uint64_t none = 0;
    /* Two threads making it at once agree on the first one stored. */
    if (!__atomic_compare_exchange_n(&shm_token, &none, token, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        token = none;
    }
    return token;
}

bool
shm_team_peer_in_this_process(const struct shm_team *team, int rank)
{
    /* The token alone: equal pids of other PID namespaces differ in it. */
    return team->regions[rank]->process == shm_process_token();
}

pid_t
shm_team_peer_pid(const struct shm_team *team, int rank)
{
    return team->regions[rank]->pid;
}

bool
shm_team_peer_alive(const struct shm_team *team, int rank)
{
    pid_t pid = team->regions[rank]->pid;
    return kill(pid, 0) == 0 || errno != ESRCH;
}

void *
shm_team_aux(const struct shm_team *team, int rank)
{
    return shm_region_aux(team->regions[rank], team->slot_bytes);
}

int
shm_team_note_cpu(struct shm_team *team)
{
    int cpu = sched_getcpu(); /* glibc reads it from the rseq area: no system call */
    struct shm_region *own = team->regions[team->rank];

    /* Written only when it changed: peers read this line. */
    if (__atomic_load_n(&own->cpu, __ATOMIC_RELAXED) != cpu) {
        __atomic_store_n(&own->cpu, cpu, __ATOMIC_RELAXED);
    }
    return cpu;
}

bool
shm_team_peer_shares_cpu(struct shm_team *team, int peer)
{
    int cpu = shm_team_note_cpu(team);
    return cpu >= 0 && __atomic_load_n(&team->regions[peer]->cpu, __ATOMIC_RELAXED) == cpu;
}

/* FNV-1a, enough to tell hosts apart. */
static uint64_t
shm_hash(uint64_t h, const void *data, size_t len)
{
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

uint64_t
shm_host_id(const char *override)
{
    uint64_t h = 0xcbf29ce484222325ull;
    char buf[256] = {0};
    struct stat st;

    if (override != NULL && override[0] != '\0') {
        return shm_hash(h, override, strlen(override));
    }
    gethostname(buf, sizeof(buf) - 1);
    h = shm_hash(h, buf, strlen(buf));
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f != NULL) {
        memset(buf, 0, sizeof(buf));
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        h = shm_hash(h, buf, n);
    }
    if (stat("/proc/self/ns/net", &st) == 0) {
        h = shm_hash(h, &st.st_ino, sizeof(st.st_ino));
    }
    return h;
}

int
shm_cpus_available(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 1;
    }
    return CPU_COUNT(&set);
}
