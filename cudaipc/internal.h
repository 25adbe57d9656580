/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Inside the device team (private to cudaipc/): the control block every rank keeps in its
 * shared-memory segment, the team as one rank holds it, and what its files offer each other.
 *
 * The team has a leader per GPU: the lowest rank on each device (told apart by UUID), indexed
 * 0 .. nleaders-1 in rank order. A rank's control block (in shm_team_aux, registered with the
 * driver by the rank and by every leader so that streams of all of them may touch its flags):
 *
 *   arrive       written by the rank's streams when they reach an operation (its number)
 *   done[k]      written by leader k's stream (or, for a leader alone on its GPU, by its
 *                rank's stream, or its thread: ownstream.c): its share of the rank's
 *                operations done, up to this number (the rank's operations are done when
 *                every leader's word is)
 *   posted       the rank's host: descriptors posted up to this number (a whole group at once)
 *   consumed[k]  leader k's host: this rank's descriptors taken, up to this number
 *   forgets_closed[k]  leader k closed what this rank's first forgets_closed[k] forgets named
 *   left         the rank destroyed or aborted its side: a rank still needed will not come
 *   unmapped     a leader that left closed every mapping it held (exports.c waits for it)
 *   ring         CIPC_RING descriptors: operation n is in slot n % CIPC_RING
 * and, in a leader's block: doorbell (a rank posted; the leader sleeps on it), leader_done
 * (its stream's operations done, for its mapping cache and deferred done words), level (the
 * levels of ring and tree schedules its stream ran: ownstream.c), channel (its
 * socket's name) and
 * forgets (bumped by a rank that sent it a forget on the channel, which it then reads). Rank
 * 0's block holds the team's verdict, `error` (a leader failed it: an ncclResult_t every
 * rank's thread adopts).
 */
#ifndef CIPC_INTERNAL_H
#define CIPC_INTERNAL_H

#include <pthread.h>
#include <sys/types.h>

#include "channel.h"
#include "cudaipc.h"
#include "levels.h"
#include "runner.h"
#include "gpu/driver.h"
#include "gpu/stream.h"
#include "shm/shm.h"

#define CIPC_RING 256
/* The most GPUs a device team spans: a leader each. */
#define CIPC_MAX_LEADERS 16
/* The rank whose control block holds the team's verdict. */
#define CIPC_VERDICT 0

/* How the leaders reach one buffer of a rank's operation. */
enum cipc_buf_how {
    CIPC_BUF_NONE,   /* not used by this rank */
    CIPC_BUF_LOCAL,  /* every leader is in the rank's process: ptr as it is */
    CIPC_BUF_LEGACY, /* a legacy IPC handle of the allocation (a leader in the rank's
                        process: ptr as it is) */
    CIPC_BUF_CUMEM,  /* a cuMem allocation, its file descriptor sent on the channel (a leader
                        in the rank's process: ptr as it is, a device staging area's there) */
    CIPC_BUF_STAGED, /* copied through the owner's staging segment, sent on the channel */
};

struct cipc_buf {
    uint32_t how;
    uint32_t region;       /* STAGED, while posting: 1 + its staging region (post.c); 0 after */
    uint64_t ptr;          /* the address in its owner's process (where a leader there reaches
                              it: the user's buffer, or its device staging copy) */
    uint64_t key;          /* LEGACY, CUMEM: the allocation's id; STAGED: the segment's
                              generation */
    uint64_t offset;       /* from the allocation's (segment's) first byte */
    uint64_t size;         /* of the allocation (segment) */
    CUipcMemHandle handle; /* LEGACY */
};

struct cipc_desc {
    uint32_t seq;
    uint32_t group_last;   /* the last operation of the group this one was posted in */
    uint32_t match;        /* cipc_op.match */
    uint8_t coll;          /* enum alg_coll */
    uint8_t kind;          /* enum kr_op_kind */
    uint8_t pre;           /* this rank's input takes its PreMulSum scalar */
    uint8_t by_event;      /* a leader rank's call: its stream's arrive is also the event
                              cipc_team.arrived, which its own leader's stream waits on
                              (other GPUs' leaders wait on arrive) */
    uint8_t own_part;      /* staged for other GPUs' leaders: what its own GPU's leader alone
                              touches is neither copied in nor out, and that leader, in this
                              rank's process, uses the user's buffers as they are (post.c) */
    uint8_t algo;          /* enum cipc_algo: the schedule between GPUs this rank's call chose
                              (cipc_team_algo), and enqueued the levels of */
    int32_t datatype;
    int32_t root;
    int32_t area;          /* a leader rank alone on its GPU: the work area its stream runs
                              this operation's share from (ownstream.c); -1 otherwise */
    uint64_t count;
    uint64_t divisor;
    uint64_t scalar;       /* PreMulSum's scalar, one element, unless scalar_buf is used */
    struct cipc_buf send, recv, scalar_buf;
};

/* A word a stream writes, alone on its cache line (leaders on several GPUs write a rank's). */
struct cipc_word {
    _Alignas(64) uint32_t value;
};

struct cipc_ctrl {
    _Alignas(64) uint32_t arrive;
    struct cipc_word done[CIPC_MAX_LEADERS];
    _Alignas(64) uint32_t leader_done;
    _Alignas(64) uint32_t level; /* a leader alone on its GPU, its thread: the levels of a ring
                                    or tree schedule its stream ran (ownstream.c) */
    struct shm_flag posted;
    struct shm_flag consumed[CIPC_MAX_LEADERS];
    struct shm_flag doorbell;
    _Alignas(64) int32_t error;
    int32_t left;
    int32_t unmapped;  /* a leader that left: every mapping of other ranks' memory is closed */
    uint32_t forgets;
    uint32_t forgets_closed[CIPC_MAX_LEADERS]; /* exports.c */
    char channel[CIPC_CHANNEL_NAME_MAX];
    _Alignas(64) struct cipc_desc ring[CIPC_RING];
};

_Static_assert(sizeof(struct cipc_ctrl) <= SHM_AUX_BYTES, "the control block outgrew its area");

/* A staged buffer's copy out, enqueued after done (post.c). */
struct cipc_copy {
    CUdeviceptr dst, src;
    size_t bytes;
};

/* A release word a host-posted group's stream waits for, opened when done reaches last. */
struct cipc_release {
    int slot;
    uint32_t last;
};

struct cipc_stage;
struct cipc_exports;
struct cipc_leader;
struct cipc_runner;
struct cipc_work;

struct cipc_team {
    struct shm_team *shm;
    int rank;
    int nranks;
    int device;
    uint64_t id;
    struct shim_log_scope *log;  /* cipc_team_args.log */
    uint8_t *reach;              /* nranks * nranks, cipc_team_args.reach */
    int *device_here;            /* per rank: its device as this process numbers it; -1 */
    struct cipc_ctrl **ctrls;    /* every rank's control block as mapped here */
    int nleaders;
    int leaders[CIPC_MAX_LEADERS]; /* the rank that leads each GPU */
    int8_t *leader_of;           /* per rank: the index of its GPU's leader; -1: no device */
    int lead;                    /* the index this rank leads; -1 */
    struct alg_policy policy;    /* NCCL_ALGO and NCCLSHIM_ALGO: the schedules between GPUs */
    bool levels_ok;              /* every rank alone on its GPU, every GPU reaching every other:
                                    ring and tree schedules may run between them (levels.h) */

    /* Registration of control blocks with the driver, by whichever thread needs it first. */
    pthread_mutex_t reg_lock;
    bool *registered;

    /* The posting side: the thread that makes this rank's calls. */
    const struct gpu_device *gpu;  /* this rank's device, once it posted */
    struct gpu_flag arrive;        /* its own flags, as its streams see them */
    struct gpu_flag done[CIPC_MAX_LEADERS];
    uint32_t seq;                  /* atomic: the last operation posted */
    uint32_t pending_wait;         /* operations arrived, not yet waited for (cipc_post_wait) */
    struct cipc_desc *launch_descs; /* the group arrived last, whose share on this rank's
                                      stream cipc_post_launch enqueues: CIPC_RING / 2 */
    int launch_n;                  /* its operations; 0: none to launch */
    int launch_from;               /* enum cipc_post_from */
    CUstream last_stream;          /* the stream the last operations were gated on */
    struct gpu_stream_marks gates; /* every stream with a gate that may not have run yet: the
                                      control block must outlive every gate that reads it */
    struct cipc_copy *copies;      /* the staged outputs of those */
    int ncopies, copies_cap;
    struct cipc_stage *stage;      /* through pinned host memory */
    struct cipc_stage *dev_stage;  /* through device memory (stage.c) */
    struct cipc_exports *exports;
    uint32_t forgets_sent;         /* forgets sent on the channel, to every leader */
    int channel_fds[CIPC_MAX_LEADERS]; /* to each leader, once needed; -1 */
    uint32_t coll_match;           /* the last numbers posted: collectives, and per peer; */
    uint32_t sent_match[CIPC_MAX_RANKS];     /* stream posting goes on from them */
    uint32_t received_match[CIPC_MAX_RANKS];

    /* Stream posting (hostpost.c), for good once a stream of this rank was captured. */
    bool stream_posting;
    int eager_slot;                /* the release word opened once the calls' last operation
                                      is done, which every host-posted group's stream waits
                                      for (hostpost.c); -1 */
    bool posted_by_host;           /* the last arrive was a host function's: its wait is for
                                      its release word (cipc_hostpost_wait) */
    int wait_slot;                 /* ... that one */
    pthread_mutex_t post_lock;     /* host functions post one at a time */
    int hostposts_queued;          /* atomic: made by calls, not posted yet */
    int hostposts_running;         /* under cipc_hostpost_lock */
    struct cipc_hostpost *hostposts; /* under cipc_hostpost_lock: every one naming this team */
    uint32_t graphs_gone;          /* atomic: captured records whose graph went, counted */
    uint32_t graphs_reaped;        /* ... as the posting thread last reaped them */
    bool prepared;                 /* cipc_hostpost_prepare'd, to unprepare */
    CUstream probe;                /* ours, idle, of the device's context: the team thread asks
                                      it for a sticky error (made with the team's memory) */
    pthread_mutex_t release_lock;  /* guards releases: words the thread opens at done >= last */
    struct cipc_release *releases;
    int nreleases, releases_cap;

    /* The thread. */
    pthread_t thread;
    bool thread_started;
    int stop;                      /* atomic */
    int released;                  /* atomic: revoked (cipc_team_release): calls stop waiting */
    int32_t error;                 /* atomic: ncclResult_t */
    int failing;                   /* atomic: the first cipc_team_set_error is under way */
    char cause[256];               /* what this process logged when error was set (or "") */
    struct cipc_leader *leader;    /* a leader's side; NULL on every other rank */
    const struct cipc_runner *runner; /* who runs this rank's GPU's share (runner.h) */
    void *share;                   /* the runner's state: only its own file reads it */
};

/* Made ready when the team is made, where the program chose the device and it exists, so
 * that nothing registers page-locked memory or creates a stream later, between a queued
 * stream wait and its release (registration synchronizes the device's context: review B6);
 * else at the first device call, before it enqueues anything (which fails with a message
 * where the device does not exist). post.c: this rank's device, the process's release words,
 * its control block registered, its flags' stream addresses, and, on a leader, the leader
 * activated. leader.c (the leader only): its device and stream, every rank's control block
 * registered; by its thread only where its rank made no device call yet. */
ncclResult_t cipc_post_ready(struct cipc_team *team);
ncclResult_t cipc_leader_activate(struct cipc_team *team);

/* leaders.c: the team's leaders, one per GPU, and what a rank does with each of them. */
/* From first_on_device (per rank: the lowest rank on its device, -1 without one): the leaders,
 * each rank's, and this rank's index if it leads. An error past CIPC_MAX_LEADERS GPUs. */
ncclResult_t cipc_leaders_form(struct cipc_team *team, const int *first_on_device);
/* Whether ring and tree schedules may run between the team's GPUs (levels_ok). */
bool cipc_levels_possible(const struct cipc_team *team);
/* The schedule between GPUs for an operation (cipc_algo_choose, where levels_ok; else
 * DIRECT): what its descriptor says. */
enum cipc_algo cipc_team_algo(const struct cipc_team *team, enum alg_coll coll, size_t count,
                              ncclDataType_t type);
/* Whether leader k runs in this process. */
bool cipc_leader_here(const struct cipc_team *team, int k);
/* Whether every leader's done word of rank r reached seq: r's operations up to seq are done. */
bool cipc_done_reached(const struct cipc_team *team, int r, uint32_t seq);
/* The sum of rank r's done words, which moves whenever one does (the thread's watch). */
uint32_t cipc_done_sum(const struct cipc_team *team, int r);
/* The least of rank r's done words, for reports. */
uint32_t cipc_done_least(const struct cipc_team *team, int r);
/* Enqueues on stream a wait for every leader's share of this rank's operations up to seq: its
 * own GPU's as its runner has it (which may first wait on the host), unless `flags_only` (the
 * team failed: only abort, destroy or revoke open the words now). */
ncclResult_t cipc_done_wait(struct cipc_team *team, CUstream stream, uint32_t seq,
                            bool flags_only);
/* A leader that left (destroyed or aborted its side) takes no more operations, and its done
 * words of this rank stop. This rank's groups that need nothing of its GPU (messages between
 * ranks of other GPUs, which NCCL lets go on) need nothing of it either: this rank writes its
 * done and consumed words for them, up to the first group that needs its GPU (for which the
 * watch fails the team). The team's thread calls it every turn. */
void cipc_done_stand_in(struct cipc_team *team);
/* Writes every done word of this rank up to seq from the host: every gate opens. */
void cipc_done_release(struct cipc_team *team, uint32_t seq);
/* The connection to leader k's socket, opened on first need. */
ncclResult_t cipc_channel_open(struct cipc_team *team, int k);
/* Sends msg (and fd, unless -1) to every leader that has not left; remote_only: to those in
 * other processes. */
ncclResult_t cipc_channel_send_all(struct cipc_team *team, const struct cipc_channel_msg *msg,
                                   int fd, bool remote_only);
/* Whether leader k holds no mapping of this rank's memory any more: it left and closed them
 * (or its process died with them). */
bool cipc_leader_unmapped(const struct cipc_team *team, int k);
/* Rings every leader's doorbell. */
void cipc_leaders_ring(struct cipc_team *team);
/* Posts the descriptors of this rank's ring up to last (a whole group) and rings the leaders. */
void cipc_leaders_publish(struct cipc_team *team, uint32_t last);
/* Sleeps until leader k (-1: every leader) took this rank's descriptors up to seq; an error
 * if the team fails, is revoked or goes first. */
ncclResult_t cipc_consumed_wait(struct cipc_team *team, int k, uint32_t seq);

/* describe.c: a rank's operation as a descriptor. */
/* Where a buffer some leader cannot map is copied through (stage.c). */
enum cipc_stage_via {
    CIPC_STAGE_NONE,
    CIPC_STAGE_HOST,    /* pinned shared host memory */
    CIPC_STAGE_DEVICE,  /* a cuMem allocation of the rank's device */
};

/* Fills d for op (numbered seq, in a group ending at group_last) and describes its buffers;
 * via_out: whether its send, receive and scalar buffers only a staging copy reaches, and
 * through what (enum cipc_stage_via). kept: the caller pins the exports for as long as the
 * buffers may be used (a capture), so cudaMalloc memory may be mapped. */
ncclResult_t cipc_desc_make(struct cipc_team *team, const struct cipc_op *op, uint32_t seq,
                            uint32_t group_last, bool kept, struct cipc_desc *d,
                            uint8_t via_out[3]);
/* Fills buf for bytes at ptr, used by operation seq, for the leaders in `touchers` (a mask);
 * *via_out: through which staging area a copy reaches it, if only a copy can. kept: the
 * caller pins what this exports for as long as the memory may be used. */
ncclResult_t cipc_describe(struct cipc_team *team, const void *ptr,
                           const struct gpu_mem_info *mem, size_t bytes, uint32_t seq,
                           bool kept, uint32_t touchers, struct cipc_buf *buf,
                           uint8_t *via_out);
/* Whether the kernels of leader k, which runs in this process, may touch mem at ptr as it is. */
bool cipc_leader_touches_local(struct cipc_team *team, int k, const void *ptr,
                               const struct gpu_mem_info *mem);
/* Bytes of op's send and receive buffers on this rank (alg.h's layouts). */
void cipc_op_bytes(const struct cipc_op *op, int nranks, size_t *send_out, size_t *recv_out);

/* stage.c: what only a copy reaches. */
/* The team's two kinds of area, empty (made as groups need them). */
ncclResult_t cipc_stage_create(struct cipc_team *team);
/* Stages what only a copy reaches of a group's nops operations (descs[i] describes ops[i],
 * via[i] as cipc_desc_make said): lays the buffers out per staging area, enqueues the copies
 * in on stream, keeps the copies out, and points the descriptors at the areas. last_seq: the
 * group's last number (posting from streams: not known yet, the areas wait for everything). */
ncclResult_t cipc_stage_descs(struct cipc_team *team, const struct cipc_op *ops,
                              struct cipc_desc *const *descs, const uint8_t (*via)[3], int nops,
                              uint32_t last_seq, CUstream stream);
/* Enqueues on stream, which is past done, the kept copies out; the areas are free after. */
ncclResult_t cipc_stage_copy_out(struct cipc_team *team, CUstream stream);
/* Teardown: waits for the streams to pass the last copies, then frees the areas. */
void cipc_stage_quiesce(struct cipc_team *team);
void cipc_stage_free(struct cipc_team *team);

/* hostpost.c: operations posted by a host function on their stream (cudaipc.h). */
ncclResult_t cipc_hostpost_arrive(struct cipc_team *team, const struct cipc_op *ops, int nops,
                                  CUstream stream, bool capturing);
/* The wait of the group cipc_hostpost_arrive posted last (after its launch): its release
 * word, then the copies out. The device's context is current. */
ncclResult_t cipc_hostpost_wait(struct cipc_team *team, CUstream stream);
/* Unpins the buffers of captured groups whose graph and every launch of it went, and frees
 * their records; a call does it first (the posting thread owns the exports). */
ncclResult_t cipc_hostpost_reap(struct cipc_team *team);
/* At teardown, after the thread stopped: no host function touches the team any more, and
 * every release word it held is open. */
void cipc_hostpost_detach(struct cipc_team *team);
/* The process's release words, made (registered in gpu's context) with its first team, and
 * let go with the last one that prepared them, unless a group was ever captured. */
ncclResult_t cipc_hostpost_prepare(const struct gpu_device *gpu);
void cipc_hostpost_unprepare(void);
/* Opens the release words of groups done (all: every one); whether some are still held. The
 * team's thread calls it every turn. */
bool cipc_hostpost_release(struct cipc_team *team, bool all);

/* exports.c: this rank's allocations the leaders map. Each export names operation seq, the
 * one that uses it (the entry is forgotten only once that is done). */
ncclResult_t cipc_exports_create(struct cipc_team *team);
void cipc_exports_free(struct cipc_team *team);
/* A legacy IPC handle of mem's allocation, made once per allocation (it costs about 18 us). */
ncclResult_t cipc_export_legacy(struct cipc_team *team, const struct gpu_mem_info *mem,
                                uint32_t seq, CUipcMemHandle *handle_out);
/* Sends the leaders of other processes the file descriptor of the cuMem allocation (id,
 * mapped at base) that ptr lies in, once. */
ncclResult_t cipc_export_cumem(struct cipc_team *team, const void *ptr, uint64_t id,
                               uintptr_t base, size_t size, uint32_t seq);
/* Whether exporting the cuMem mapping (id, base) would give the leaders an id they know for
 * another mapping of this rank (still in the table): they key mappings by id alone, and
 * cuda.h does not say that BUFFER_ID tells apart mappings of one reservation. */
bool cipc_export_clash(struct cipc_team *team, uint64_t id, uintptr_t base);
/* Whether export (id, base) is pinned by a registration: its owner promised to keep it. */
bool cipc_export_pinned(struct cipc_team *team, uint64_t id, uintptr_t base);
/* Adds delta (+1 or -1) to the registrations pinning export (id, base). Unpinned, a cudaMalloc
 * allocation's export waits for the operations using it and is forgotten, and the call returns
 * once every leader closed its mapping (its owner may free it then); a cuMem one is forgotten at
 * once if no operation in flight uses it. Nothing if it is not exported. */
ncclResult_t cipc_export_pin(struct cipc_team *team, uint64_t id, uintptr_t base, int delta);
/* Forgets export (id, base), which no operation in flight uses, pinned or not. */
ncclResult_t cipc_export_release(struct cipc_team *team, uint64_t id, uintptr_t base);
/* Pins the export buf (as cipc_desc_make described it) names, if it names one; pin says which. */
ncclResult_t cipc_export_pin_buf(struct cipc_team *team, const struct cipc_buf *buf,
                                 struct cipc_pin *pin);
/* Forgets the exports whose allocation is gone, a share at a time, at most every 10 ms. */
ncclResult_t cipc_exports_sweep(struct cipc_team *team);
/* Tells every leader that no operation of this rank will name (how, key) again. */
ncclResult_t cipc_forget(struct cipc_team *team, enum cipc_buf_how how, uint64_t key);

/* ctrl.c: the control blocks. */
/* Registers rank r's control block with the driver (once per process mapping) and fills the
 * flags of it that streams touch. The caller has a context of the device current. */
ncclResult_t cipc_ctrl_register(struct cipc_team *team, int r);
/* Every control block this process registered, unregistered in the device's context. */
void cipc_ctrl_unregister_all(struct cipc_team *team);
struct gpu_flag cipc_flag(struct cipc_team *team, int r, uint32_t *host);
/* Fails the team (the first error stays): this rank, and, if it leads, through the verdict
 * in rank CIPC_VERDICT's block every rank, sees it. */
void cipc_team_set_error(struct cipc_team *team, ncclResult_t res);
/* Why, as this process logged it when the team failed ("" where another process failed it):
 * for the WARNs of later calls, which would otherwise hide it from ncclGetLastError. */
const char *cipc_team_cause(const struct cipc_team *team);

/* post.c */
/* Keeps a group just posted (descs, which may go now) for cipc_post_launch. Inline: both a
 * call's post (post.c) and a host-posted one (hostpost.c) keep theirs. */
static inline void
cipc_post_launch_keep(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
                      enum cipc_post_from from)
{
    for (int i = 0; i < nops; i++) {
        team->launch_descs[i] = *descs[i];
    }
    team->launch_n = nops;
    team->launch_from = (int)from;
}
/* Waits until every stream this rank gated has run past its gates (released, or done) and
 * past the staged copies: then nothing of this rank's reads the control block or staging. */
void cipc_post_quiesce(struct cipc_team *team);
void cipc_post_free(struct cipc_team *team);

/* leader.c: a GPU's leader's side, driven by the team's thread. */
ncclResult_t cipc_leader_create(struct cipc_team *team);
void cipc_leader_destroy(struct cipc_team *team, bool abort);
/* Enqueues every operation whose descriptors are all posted; *progressed_out if any. */
ncclResult_t cipc_leader_step(struct cipc_team *team, bool *progressed_out);
/* Whether any rank has operations posted and not done. */
bool cipc_leader_busy(const struct cipc_team *team);
/* Whether rank r is gone: its process died, or it destroyed or aborted its side. */
bool cipc_rank_gone(const struct cipc_team *team, int r);
/* After nothing moved for NCCLSHIM_WAIT_MS: an error if a rank the leader waits for died. */
ncclResult_t cipc_leader_check_peers(struct cipc_team *team);
int cipc_leader_describe(const struct cipc_team *team, char *buf, size_t len);

#endif
