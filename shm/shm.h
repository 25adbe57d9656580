/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Collectives through shared memory, for a communicator whose ranks all run on one host.
 *
 * Every rank owns one segment that every other rank maps. Its slots hold a chunk of what the
 * rank contributes, so a peer reduces or copies straight out of it into its own buffers: one
 * copy into shared memory, one read out of it, and nothing through the kernel. The slots stay
 * in cache (a chunk is a few hundred KiB), so memory sees each user buffer once.
 *
 * A collective is a loop over chunks; each chunk takes the team's next sequence number s, the
 * same on every rank (collectives are issued in the same order everywhere), and goes:
 *
 *   fill      write my contribution into my slot s % 2          -> ready    = s
 *   phase 1   reduce or copy out of the slots of ranks that are ready with s
 *             (two-phase reductions: into my result slot)       -> reduced  = s
 *   phase 2   copy the reduced shares out of the result slots of ranks reduced with s
 *                                                               -> consumed = s
 *
 * Every rank posts ready and consumed for every chunk, and reduced for every chunk of a
 * two-phase reduction (the only chunks that wait for it), whether or not it had work in a
 * phase, so "rank j posted s" always means j is past that point of chunk s. Before I fill slot
 * s % 2 again, every rank must have consumed s - 2: two chunks in flight hide one rank's lag
 * behind another, and a rank fills chunk s + 1 while it waits for its peers' flags of chunk
 * s. A message that fits SHM_SMALL_BYTES whole goes through a ring of SHM_SMALL_SLOTS small
 * slots instead, refilled once everyone consumed s - SHM_SMALL_SLOTS: a root, or a rank that
 * got the CPU first, runs that many small collectives ahead, as an eager MPI send would.
 * Flags are monotonic 32-bit counters compared modulo 2^32.
 *
 * Nothing here blocks: shm_op_progress does what it can and says what it waits for, and the
 * caller (engine/exec.c) spins, yields, or sleeps on the flag with shm_wait_sleep.
 */
#ifndef SHM_SHM_H
#define SHM_SHM_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "algorithms/alg.h"
#include "kernels/kernels.h"

#define SHM_NAME_MAX 64
#define SHM_STAGE_BYTES 32768 /* fits L1 and L2 with room to spare */
/* The small ring is deep so that, with ranks sharing CPUs, each works through many calls per
 * turn on its CPU instead of handing it over every few (4 ranks on 2 CPUs, 8-512 B
 * broadcast, alternating runs: 1.0-1.8 us a call with 16 slots, 0.6-1.0 with 64). */
#define SHM_SMALL_SLOTS 64          /* one-chunk messages of up to SHM_SMALL_BYTES (all pieces) */
#define SHM_SMALL_BYTES 8192        /* take a ring this deep (see region.h) */
#define SHM_MIN_CHUNKS 4            /* a message is cut in at least this many chunks ... */
#define SHM_MIN_CHUNK_BYTES 16384   /* ... unless they would be smaller than this */

struct shm_region;

/* Each rank's segment also holds SHM_AUX_BYTES, page aligned, that the collectives here never
 * touch: the device layer (cudaipc/) keeps its control blocks there, so they share the
 * segments' life (mapped by every rank, nothing left in /dev/shm). */
#define SHM_AUX_BYTES ((size_t)256 * 1024)

/* A flag between ranks: a counter its owner raises and others poll, with a futex for those
 * that sleep on it (flag.c). The owner wakes only when the count of sleepers says someone
 * sleeps, so a rank that never sleeps never pays a system call. Counters compare modulo
 * 2^32. Used for the chunk protocol here, and by the layers above for flags of their own. */
struct shm_flag {
    _Alignas(64) uint32_t value; /* last number posted */
    uint32_t waiters;            /* peers sleeping in futex on value */
};

/* This rank's own segment, before the team is formed. */
struct shm_segment {
    char name[SHM_NAME_MAX]; /* the POSIX shm name peers open */
    void *base;
    size_t bytes;
};

/* This rank's view of every rank's segment. */
struct shm_team {
    int rank;
    int nranks;
    size_t slot_bytes;            /* bytes of each data slot and each result slot */
    size_t direct_bytes;          /* all-reduce up to this size: every rank reduces it all */
    bool oversubscribed;          /* more local ranks than CPUs: waiting must yield at once */
    uint32_t seq;                 /* chunks this team has run, equal on every rank */
    uint32_t consumed_by_all;     /* every rank had consumed this chunk when last looked */
    const void *owner;            /* the op now using the slots; ops take turns */
    struct shm_region **regions;  /* every rank's segment, mapped (ours included) */
    const void **srcs;            /* nranks pointers: a reduction's operands */
    void *stage;                  /* SHM_STAGE_BYTES: a reduction's output on its way out */
    size_t map_bytes;
};

/* What a blocked op waits for: the flag at `addr` to move past `seen`. */
struct shm_wait {
    uint32_t *addr;
    uint32_t *waiters; /* the flag's sleeper count, for the waker */
    uint32_t seen;
    int peer;          /* whose flag it is, for liveness checks and reports */
};

/* Sets the flag to seq, waking its sleepers. */
void shm_flag_post(struct shm_flag *flag, uint32_t seq);
/* Adds one (several posters share the flag), waking its sleepers. */
void shm_flag_bump(struct shm_flag *flag);
static inline uint32_t
shm_flag_load(const struct shm_flag *flag)
{
    return __atomic_load_n(&flag->value, __ATOMIC_ACQUIRE);
}
/* Whether flag has reached seq (modulo 2^32); else fills *wait to sleep on it. */
bool shm_flag_reached(struct shm_flag *flag, uint32_t seq, int peer, struct shm_wait *wait);

/* The bytes one rank's segment needs for slots of slot_bytes. */
size_t shm_segment_bytes(size_t slot_bytes);
/* Creates and maps this rank's segment under a fresh name made from `tag` (unique per
 * communicator). ncclSystemError with a WARN if /dev/shm refuses. */
ncclResult_t shm_segment_create(const char *tag, size_t slot_bytes, struct shm_segment *seg);
/* Removes the name (mappings stay valid) and unmaps the segment unless a team took it over;
 * safe on a zeroed or already destroyed segment. */
void shm_segment_destroy(struct shm_segment *seg);

/* Maps every peer's segment by name (names[rank] is ours, already mapped in seg) and takes
 * seg's mapping over (seg keeps its name, for shm_segment_destroy). On failure seg is
 * untouched. */
ncclResult_t shm_team_create(struct shm_segment *seg, int rank, int nranks,
                             const char (*names)[SHM_NAME_MAX], size_t slot_bytes,
                             struct shm_team **team_out);
void shm_team_destroy(struct shm_team *team);
/* Whether the process that owns rank's segment still exists. */
bool shm_team_peer_alive(const struct shm_team *team, int rank);
/* The process that owns rank's segment (known from the segment's creation on). */
pid_t shm_team_peer_pid(const struct shm_team *team, int rank);
/* Whether rank's segment was made by this very process: a random token of the process's,
 * not the pid (containers may share IPC, so /dev/shm, without sharing PID namespaces: equal
 * pids of different processes). */
bool shm_team_peer_in_this_process(const struct shm_team *team, int rank);
/* This process's random token (made again after fork). */
uint64_t shm_process_token(void);
/* Rank's SHM_AUX_BYTES (see above), as this rank maps it. */
void *shm_team_aux(const struct shm_team *team, int rank);
/* Publishes the CPU this rank is on, for its peers, at the start of every op and whenever it
 * waits (a note only refreshed on waits went stale in a rank that never had to wait, and
 * its peers slept on every call); returns it. */
int shm_team_note_cpu(struct shm_team *team);
/* Whether rank `peer` was last noted on the CPU this rank is on now (noting ours too). */
bool shm_team_peer_shares_cpu(struct shm_team *team, int peer);

/* An identity shared by exactly the processes that may map each other's segments: the
 * override (NCCL_HOSTID) if not NULL, else host name, boot id and network namespace. A
 * network namespace counts as a host of its own, as it does for every other transport. */
uint64_t shm_host_id(const char *override);
/* The number of CPUs this process may run on. */
int shm_cpus_available(void);

/* One collective on the team. */
struct shm_coll_args {
    enum alg_coll coll;      /* ALLREDUCE .. SCATTER; not SEND, RECV or BARRIER */
    const void *send;
    void *recv;
    size_t count;            /* elements, as the NCCL call counts them */
    size_t elem_size;
    int root;
    struct kr_redop redop;
    bool prescale;           /* PreMulSum: each rank scales its own input as it fills */
    bool in_place;           /* NCCL's in-place layout for coll (see alg.h) */
};

enum shm_phase {
    SHM_PHASE_START,   /* waiting for the team (an earlier op of the group has it) */
    SHM_PHASE_READ,    /* the oldest unconsumed chunk waits for phase 1 */
    SHM_PHASE_GATHER,  /* ... for phase 2 (two-phase reductions) */
    SHM_PHASE_DONE,
};

struct shm_op {
    struct shm_coll_args args;
    enum shm_phase phase;
    bool two_phase;   /* reductions split in shares: reduce, then copy shares out */
    bool stream_out;  /* output copies use non-temporal stores (a large output) */
    bool small;       /* one chunk in the small ring (SHM_SMALL_SLOTS deep) */
    unsigned elem_shift; /* log2(elem_size): bytes to elements without a division */
    size_t block;     /* bytes each chunk loop walks (a rank's block, or the whole buffer) */
    size_t chunk;     /* bytes per chunk of that walk */
    uint32_t nchunks;
    uint32_t s0;      /* sequence number of chunk 0 */
    uint32_t filled;  /* chunks filled so far: at most one ahead of read */
    uint32_t read;    /* chunks consumed so far */
};

enum shm_status {
    SHM_DONE,
    SHM_MOVED,   /* did something; call again */
    SHM_BLOCKED, /* nothing to do until *wait changes */
};

/* Whether the team serves this collective (all but SEND, RECV, BARRIER). */
bool shm_serves(enum alg_coll coll);
void shm_op_init(struct shm_op *op, const struct shm_team *team,
                 const struct shm_coll_args *args);
/* Whether op may still need anything from rank: false once rank has consumed op's last
 * chunk, having then posted all its op's flags (its slots stay readable while mapped). A
 * rank that finished and exited is then no failure of op. */
bool shm_op_needs(const struct shm_op *op, struct shm_team *team, int rank);
/* Whether the rank op waits for (wait, as shm_op_progress left it) has posted anything of
 * op yet: then it is at work on op, not late to it. */
bool shm_op_peer_arrived(const struct shm_op *op, const struct shm_wait *wait);
/* Advances op as far as it can without waiting. */
enum shm_status shm_op_progress(struct shm_op *op, struct shm_team *team,
                                struct shm_wait *wait_out);
/* Sleeps until the flag moves past wait->seen, a wakeup, or timeout_ms. */
void shm_wait_sleep(const struct shm_wait *wait, int timeout_ms);

/* Suspension (ncclCommSuspend): gives the pages of this rank's small ring and data slots back
 * to the system once every rank consumed this rank's last chunk (peers may still read it);
 * they come back zero-filled at their next use. false, releasing nothing, if that did not
 * happen within budget_ms (a peer that died, or one still in the last operation). Nothing
 * else of the segment goes: flags, identity and the area above stay. */
bool shm_team_release_slots(struct shm_team *team, int budget_ms);
/* One line on what op is doing, for hang reports. */
int shm_op_describe(const struct shm_op *op, const struct shm_wait *wait, char *buf,
                    size_t len);

#endif
