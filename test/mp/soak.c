/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Soak: a long mixed stream of collectives on two communicators at once, through the real
 * libnccl.so.2 on N ranks started by tools/launcher. Each process makes the world
 * communicator and a second one over the same ranks (ncclCommSplit, one color), and drives
 * each from a thread of its own. A thread draws its sequence from a seeded generator that is
 * the same on every rank (nothing drawn depends on the rank), so the ranks of a communicator
 * issue the same calls in the same order.
 *
 * The mix: all-reduce, reduce and reduce-scatter (sum, prod, max, min, avg and PreMulSum
 * with a scalar per rank, on all twelve types), broadcast, all-gather, all-to-all, gather,
 * scatter, a send/recv shift (1 to 3 messages per pair, in-order matching, shift 0 is
 * send-to-self) in a group; one draw in ten is a group of 2 to 4 of these (each collective in
 * a group counts as one op). Each thread starts with every collective at the largest count,
 * out of place and in place, so the library's cached scratch reaches its high-water mark
 * during the warm-up. Counts run from 0 to 256K elements per block, skewed small (55% up to
 * 32, 30% up to 1K, 12% up to 16K, 3% up to 256K; 16K in group members); in and out of place
 * as nccl.h defines them (see collectives.c), NULL where NCCL allows it every other case.
 * Every output element is checked: reductions use small integers, so every sum, product,
 * maximum, minimum and average is exact in every type and every order; data movement puts
 * in a hash of (source rank, byte offset), so a block from the wrong rank or offset shows.
 *
 * Memory: buffers are allocated and touched once at the start. The main thread reads the
 * resident set (/proc/self/statm) at every tenth of the ops; from the first tenth (warm-up)
 * to the end the RSS may grow by at most -r MiB (default 16). Under AddressSanitizer the
 * bound holds only with ASAN_OPTIONS quarantine_size_mb=0: the quarantine keeps freed blocks
 * (256 MiB by default, about 3 MiB more RSS per thousand ops here until it is full), so
 * otherwise the figures are printed and not enforced.
 *
 * Device mode (-D): the buffers are host memory registered with the CUDA driver (found as
 * device.h finds it: the driver's test double in CI), which a kernel reaches, so every call is
 * stream ordered: each thread issues on a stream of its own and synchronises it before it
 * checks, as a PyTorch program does; the two warm-ups, which make the library's staging
 * memory (an allocation synchronizes the device), run one after the other, as NCCL asks of
 * operations on different communicators. That soaks the device paths (the team on one host, or
 * with NCCL_SHM_DISABLE=1 the network path's staging) and bounds their memory as well.
 *
 * Usage: soak [-n OPS] [-s SEED] [-r MIB] [-D]. -n: ops in all, split between the two threads
 * (default 100000). Rank 0 prints the RSS checkpoints and one summary line:
 *   soak: N ops on 2 communicators x 2 threads, M wrong, RSS a -> b MiB (peak c), t s
 * where M is the number of wrong ops summed over all ranks. Exit status 1 on a wrong result
 * or RSS growth past the bound on this rank.
 */
#include "common.h"
#include "device.h"

#include <pthread.h>
#include <stdatomic.h>

#define SO_BIG_CAP (256 * 1024)   /* elements per block, slot 0 */
#define SO_SMALL_CAP (16 * 1024)  /* elements per block, slots 1..3 (group members) */
#define SO_SLOTS 4
#define SO_MAX_GROUP 4
#define SO_MAX_MSGS 3
#define SO_SHOW 10                /* wrong ops described per thread */
#define SO_POISON 0xcd
#define SO_ENC_MAX 256            /* expected values lie in [-256, 256] */

#if defined(__SANITIZE_ADDRESS__)
#define SO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SO_ASAN 1
#endif
#endif
#ifndef SO_ASAN
#define SO_ASAN 0
#endif

enum so_coll {
    SO_ALLREDUCE,
    SO_REDUCE,
    SO_REDUCESCATTER,
    SO_BROADCAST,
    SO_ALLGATHER,
    SO_ALLTOALL,
    SO_GATHER,
    SO_SCATTER,
    SO_SENDRECV,
    SO_NCOLLS
};

static const char *const so_names[SO_NCOLLS] = {
    "allreduce", "reduce", "reducescatter", "broadcast", "allgather", "alltoall", "gather",
    "scatter", "sendrecv",
};

/* Index SO_PREMULSUM is made per call by ncclRedOpCreatePreMulSum. */
static const ncclRedOp_t so_ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, ncclSum};
static const char *const so_op_names[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
#define SO_NOPS 6
#define SO_PREMULSUM 5

/* Each type's encoding of the integers -SO_ENC_MAX..SO_ENC_MAX, made once by main. */
static uint8_t so_enc[MP_NTYPES][2 * SO_ENC_MAX + 1][8];

struct so_slot {
    uint8_t *send;
    uint8_t *recv;
    size_t cap; /* elements per block; each buffer holds nranks blocks of 8-byte elements */
};

/* One collective call: what the generator drew, and the pointers the call got. */
struct so_item {
    enum so_coll coll;
    int tix;            /* index in mp_all_types */
    ncclDataType_t type;
    size_t size;
    int opix;           /* index in so_ops, reductions only */
    size_t count;
    int root;           /* rooted collectives; the shift for sendrecv */
    int nmsg;           /* sendrecv: messages per peer pair */
    bool in_place;
    bool null_ok;
    uint64_t salt;
    struct so_slot *slot;
    uint8_t *sendp;
    uint8_t *recvp;
    ncclRedOp_t op;     /* the op the call got; a PreMulSum is destroyed after the check */
};

struct so_thread {
    pthread_t tid;
    int index;          /* 0: world, 1: the split */
    ncclComm_t comm;
    int rank;
    int nranks;
    long ops;           /* this thread's share */
    uint64_t rng;
    struct so_slot slots[SO_SLOTS];
    uint8_t *scratch;   /* one big block of expected bytes */
    long wrong;
    long shown;
    long groups;
    long per_coll[SO_NCOLLS];
    CUstream stream;    /* -D: the thread's stream; NULL on host memory */
};

static bool so_device;     /* -D */
/* -D: whose warm-up runs (0, 1), then 2: both done, the threads go on together. */
static atomic_int so_warm_turn;
static struct mp_cuda so_cu;

static atomic_long so_done;

/* --- generator and data -------------------------------------------------------------------- */

static inline uint64_t
so_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return mp_hash(*state);
}

static inline uint64_t
so_below(uint64_t *state, uint64_t n)
{
    return n == 0 ? 0 : so_next(state) % n;
}

/* A cheap well-mixed function of (salt, rank, index) for the element loops. */
static inline uint64_t
so_mix(uint64_t salt, int rank, uint64_t i)
{
    uint64_t h = salt ^ ((uint64_t)(rank + 1) * 0x9e3779b97f4a7c15ull) ^
                 (i * 0xd1b54a32d192ed03ull);

    h ^= h >> 32;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 32);
}

static inline bool
so_is_fp8(ncclDataType_t t)
{
    return t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

/*
 * Rank `rank`'s input element i of a reduction: an integer whose reduction over n ranks is
 * exact in the type. Sum: 0..2 (0..1 in fp8 and 8-bit integers), so a sum is at most 2n.
 * Avg: n times that, so the sum divides by n. PreMulSum: as sum, times so_scalar. Prod:
 * -1, 1, 2 (1, 2 unsigned; in 8-bit integers -1, 1 signed and 1, 2 unsigned, 1 past 7 ranks),
 * so products are powers of two. Max, min: -100..100 in the integer types (0..200
 * unsigned), -8..8 in the short floating types.
 */
static inline int
so_red_value(const struct so_item *it, int rank, int n, size_t i)
{
    uint64_t h = so_mix(it->salt, rank, i);
    ncclDataType_t t = it->type;
    bool small = so_is_fp8(t) || (it->size == 1);
    bool sign = mp_type_is_signed(t);

    switch (it->opix) {
    case 0: case SO_PREMULSUM: /* sum */
        return (int)(h % (small ? 2 : 3));
    case 4: /* avg */
        return n * (int)(h % (small ? 2 : 3));
    case 1: /* prod */
        if (it->size == 1 && !mp_type_is_float(t)) {
            if (sign) {
                return h & 1 ? 1 : -1;
            }
            return n <= 7 ? 1 + (int)(h & 1) : 1;
        }
        if (sign) {
            static const int v[3] = {-1, 1, 2};
            return v[h % 3];
        }
        return 1 + (int)(h & 1);
    default: /* max, min */
        if (t == ncclFloat16 || t == ncclBfloat16 || so_is_fp8(t)) {
            return (int)(h % 17) - 8;
        }
        return sign ? (int)(h % 201) - 100 : (int)(h % 201);
    }
}

/* PreMulSum: rank r's scalar, 1 or 2 (1 in fp8, where 2n might not be exact). */
static inline int
so_scalar(const struct so_item *it, int rank)
{
    return so_is_fp8(it->type) ? 1 : 1 + (int)(so_mix(it->salt, rank, ~0ull) & 1);
}

static inline int
so_red_expected(const struct so_item *it, int n, size_t i)
{
    bool pre = it->opix == SO_PREMULSUM;
    long acc = so_red_value(it, 0, n, i) * (pre ? so_scalar(it, 0) : 1);

    for (int r = 1; r < n; r++) {
        long v = so_red_value(it, r, n, i);
        switch (it->opix) {
        case 0: case 4: acc += v; break;
        case SO_PREMULSUM: acc += v * so_scalar(it, r); break;
        case 1: acc *= v; break;
        case 2: acc = v > acc ? v : acc; break;
        default: acc = v < acc ? v : acc; break;
        }
    }
    if (it->opix == 4) {
        acc /= n;
    }
    return (int)acc;
}

static inline const uint8_t *
so_enc_of(int tix, int v)
{
    return so_enc[tix][v + SO_ENC_MAX];
}

/* Rank `rank`'s reduction input, elements index0 .. index0 + count - 1. */
static void
so_fill_red(const struct so_item *it, uint8_t *buf, size_t count, int rank, int n,
            size_t index0)
{
    for (size_t k = 0; k < count; k++) {
        memcpy(buf + k * it->size, so_enc_of(it->tix, so_red_value(it, rank, n, index0 + k)),
               it->size);
    }
}

/* Data movement: `nbytes` of rank src's stream from byte `off` on (any bits). */
static void
so_fill_move(uint8_t *dst, size_t nbytes, uint64_t salt, int src, size_t off)
{
    size_t b = 0;

    while (b < nbytes) {
        size_t pos = off + b;
        uint64_t w = so_mix(salt, src, pos >> 3);
        size_t k = pos & 7, take = 8 - k;
        if (take > nbytes - b) {
            take = nbytes - b;
        }
        memcpy(dst + b, (const uint8_t *)&w + k, take);
        b += take;
    }
}

/* --- one item ------------------------------------------------------------------------------ */

static void
so_describe(const struct so_thread *th, const struct so_item *it, char *text, size_t len)
{
    snprintf(text, len, "comm %d %s %zu x %s%s%s root/shift %d msgs %d %s%s", th->index,
             so_names[it->coll], it->count, mp_type_name(it->type),
             it->coll <= SO_REDUCESCATTER ? " " : "",
             it->coll <= SO_REDUCESCATTER ? so_op_names[it->opix] : "", it->root, it->nmsg,
             it->in_place ? "in place" : "out of place", it->null_ok ? " (NULLs)" : "");
}

/* Draws one item (same draws on every rank); `cap` bounds its count. */
static void
so_draw(struct so_thread *th, struct so_item *it, size_t cap)
{
    uint64_t *rng = &th->rng;
    uint64_t u = so_below(rng, 100);
    size_t count;

    /* Mostly cheap collectives; the mix is the list, all-reduce most often. */
    static const enum so_coll table[20] = {
        SO_ALLREDUCE, SO_ALLREDUCE, SO_ALLREDUCE, SO_ALLREDUCE, SO_ALLREDUCE,
        SO_REDUCE, SO_REDUCE, SO_REDUCESCATTER, SO_REDUCESCATTER, SO_BROADCAST,
        SO_BROADCAST, SO_ALLGATHER, SO_ALLGATHER, SO_ALLTOALL, SO_GATHER,
        SO_SCATTER, SO_SENDRECV, SO_SENDRECV, SO_ALLREDUCE, SO_BROADCAST,
    };
    it->coll = table[so_below(rng, 20)];
    it->tix = (int)so_below(rng, MP_NTYPES);
    it->type = mp_all_types[it->tix];
    it->size = mp_type_size(it->type);
    it->opix = (int)so_below(rng, SO_NOPS);
    if (u < 55) {
        count = so_below(rng, 33);
    } else if (u < 85) {
        count = so_below(rng, 1025);
    } else if (u < 97) {
        count = so_below(rng, 16385);
    } else {
        count = so_below(rng, SO_BIG_CAP + 1);
    }
    it->nmsg = 1 + (int)so_below(rng, SO_MAX_MSGS);
    if (it->coll == SO_SENDRECV) {
        it->root = (int)so_below(rng, (uint64_t)th->nranks); /* the shift; 0 is to self */
        cap /= (size_t)it->nmsg;
    } else {
        it->root = (int)so_below(rng, (uint64_t)th->nranks);
        it->nmsg = 1;
    }
    it->count = count > cap ? cap : count;
    it->in_place = so_below(rng, 2) == 1 && it->coll != SO_ALLTOALL && it->coll != SO_SENDRECV;
    it->null_ok = so_below(rng, 2) == 1;
    it->salt = so_next(rng);
}

/* Fills the inputs, poisons the outputs and sets the pointers the call gets. */
static void
so_prepare(struct so_thread *th, struct so_item *it, struct so_slot *slot)
{
    int n = th->nranks, me = th->rank, root = it->root;
    size_t c = it->count, sz = it->size, blk = c * sz;
    size_t nblk = (size_t)(it->nmsg > n ? it->nmsg : n); /* blocks a buffer may use */
    bool is_root = me == root;
    uint8_t *send = slot->send, *recv = slot->recv;

    it->slot = slot;
    it->sendp = send;
    it->recvp = recv;
    /* Outputs poisoned over every block that could be written. */
    memset(recv, SO_POISON, nblk * blk);
    if (it->in_place) {
        it->sendp = recv;
        switch (it->coll) {
        case SO_ALLGATHER: case SO_GATHER: it->sendp = recv + (size_t)me * blk; break;
        case SO_REDUCESCATTER: case SO_SCATTER: it->recvp = recv + (size_t)me * blk; break;
        default: break;
        }
    }
    switch (it->coll) {
    case SO_ALLREDUCE: case SO_REDUCE:
        so_fill_red(it, it->sendp, c, me, n, 0);
        break;
    case SO_REDUCESCATTER:
        so_fill_red(it, it->sendp, (size_t)n * c, me, n, 0);
        break;
    case SO_BROADCAST:
        if (is_root) {
            so_fill_move(it->sendp, blk, it->salt, root, 0);
        }
        break;
    case SO_SCATTER:
        if (is_root) {
            so_fill_move(it->sendp, (size_t)n * blk, it->salt, root, 0);
        }
        break;
    case SO_ALLTOALL: case SO_SENDRECV:
        so_fill_move(it->sendp, nblk * blk, it->salt, me, 0);
        break;
    default: /* allgather, gather */
        so_fill_move(it->sendp, blk, it->salt, me, 0);
        break;
    }
    if (!it->in_place && it->null_ok && !is_root) {
        if (it->coll == SO_REDUCE || it->coll == SO_GATHER) {
            it->recvp = NULL;
        } else if (it->coll == SO_SCATTER) {
            it->sendp = NULL;
        }
    }
}

/* Issues the item's calls (inside the caller's group, if any). */
static void
so_post(struct so_thread *th, struct so_item *it)
{
    it->op = so_ops[it->opix];
    if (it->coll <= SO_REDUCESCATTER && it->opix == SO_PREMULSUM) {
        uint8_t scalar[8];
        memcpy(scalar, so_enc_of(it->tix, so_scalar(it, th->rank)), it->size);
        MP_CHECK_COMM(th->comm, ncclRedOpCreatePreMulSum(&it->op, scalar, it->type,
                                                         ncclScalarHostImmediate, th->comm));
    }
    ncclComm_t comm = th->comm;
    cudaStream_t s = (cudaStream_t)th->stream;
    int n = th->nranks, me = th->rank;
    size_t c = it->count, blk = c * it->size;
    ncclRedOp_t op = it->op;

    switch (it->coll) {
    case SO_ALLREDUCE:
        MP_CHECK_COMM(comm, ncclAllReduce(it->sendp, it->recvp, c, it->type, op, comm, s));
        break;
    case SO_REDUCE:
        MP_CHECK_COMM(comm, ncclReduce(it->sendp, it->recvp, c, it->type, op, it->root, comm, s));
        break;
    case SO_REDUCESCATTER:
        MP_CHECK_COMM(comm, ncclReduceScatter(it->sendp, it->recvp, c, it->type, op, comm, s));
        break;
    case SO_BROADCAST:
        MP_CHECK_COMM(comm, ncclBroadcast(it->sendp, it->recvp, c, it->type, it->root, comm, s));
        break;
    case SO_ALLGATHER:
        MP_CHECK_COMM(comm, ncclAllGather(it->sendp, it->recvp, c, it->type, comm, s));
        break;
    case SO_ALLTOALL:
        MP_CHECK_COMM(comm, ncclAlltoAll(it->sendp, it->recvp, c, it->type, comm, s));
        break;
    case SO_GATHER:
        MP_CHECK_COMM(comm, ncclGather(it->sendp, it->recvp, c, it->type, it->root, comm, s));
        break;
    case SO_SCATTER:
        MP_CHECK_COMM(comm, ncclScatter(it->sendp, it->recvp, c, it->type, it->root, comm, s));
        break;
    case SO_SENDRECV: {
        /* Message m of the pair: block m of the buffers; all with the same count. */
        int to = (me + it->root) % n, from = (me - it->root + n) % n;
        MP_CHECK_COMM(comm, ncclGroupStart());
        for (int m = 0; m < it->nmsg; m++) {
            MP_CHECK_COMM(comm, ncclSend(it->sendp + (size_t)m * blk, c, it->type, to, comm, s));
            MP_CHECK_COMM(comm, ncclRecv(it->recvp + (size_t)m * blk, c, it->type, from, comm, s));
        }
        MP_CHECK_COMM(comm, ncclGroupEnd());
        break;
    }
    default:
        MP_ASSERT(false, "so_post: collective %d", (int)it->coll);
    }
}

/* Counts the wrong elements of one block of data movement. */
static long
so_check_move(struct so_thread *th, const struct so_item *it, const uint8_t *got, int src,
              size_t off, size_t nbytes)
{
    long wrong = 0;

    so_fill_move(th->scratch, nbytes, it->salt, src, off);
    if (memcmp(got, th->scratch, nbytes) != 0) {
        for (size_t k = 0; k < nbytes; k += it->size) {
            wrong += memcmp(got + k, th->scratch + k, it->size) != 0;
        }
    }
    return wrong;
}

static long
so_check_red(const struct so_item *it, const uint8_t *got, int n, size_t index0, size_t count)
{
    long wrong = 0;

    for (size_t k = 0; k < count; k++) {
        int want = so_red_expected(it, n, index0 + k);
        wrong += memcmp(got + k * it->size, so_enc_of(it->tix, want), it->size) != 0;
    }
    return wrong;
}

/* Checks every output element of the item on this rank; returns the wrong ones. */
static long
so_check(struct so_thread *th, const struct so_item *it)
{
    int n = th->nranks, me = th->rank, root = it->root;
    size_t c = it->count, blk = c * it->size;
    long wrong = 0;

    switch (it->coll) {
    case SO_ALLREDUCE:
        return so_check_red(it, it->recvp, n, 0, c);
    case SO_REDUCE:
        return me == root ? so_check_red(it, it->recvp, n, 0, c) : 0;
    case SO_REDUCESCATTER:
        return so_check_red(it, it->recvp, n, (size_t)me * c, c);
    case SO_BROADCAST:
        return so_check_move(th, it, it->recvp, root, 0, blk);
    case SO_SCATTER:
        return so_check_move(th, it, it->recvp, root, (size_t)me * blk, blk);
    case SO_GATHER:
        if (me != root) {
            return 0;
        }
        /* fall through */
    case SO_ALLGATHER:
        for (int r = 0; r < n; r++) {
            wrong += so_check_move(th, it, it->recvp + (size_t)r * blk, r, 0, blk);
        }
        return wrong;
    case SO_ALLTOALL:
        for (int r = 0; r < n; r++) {
            wrong += so_check_move(th, it, it->recvp + (size_t)r * blk, r, (size_t)me * blk,
                                   blk);
        }
        return wrong;
    case SO_SENDRECV: {
        int from = (me - root + n) % n;
        for (int m = 0; m < it->nmsg; m++) {
            wrong += so_check_move(th, it, it->recvp + (size_t)m * blk, from, (size_t)m * blk,
                                   blk);
        }
        return wrong;
    }
    default:
        return 0;
    }
}

static void
so_note(struct so_thread *th, const struct so_item *it, long wrong)
{
    char text[256];

    if (wrong == 0) {
        return;
    }
    th->wrong++;
    if (th->shown++ < SO_SHOW) {
        so_describe(th, it, text, sizeof(text));
        mp_report(__FILE__, __LINE__, "%s: %ld wrong elements (salt 0x%llx)", text, wrong,
                  (unsigned long long)it->salt);
    }
}

/* --- the threads --------------------------------------------------------------------------- */

/* An item at its slot's largest count in 8-byte elements (float64, sum). */
static void
so_force(struct so_thread *th, struct so_item *it, enum so_coll coll, size_t cap,
         bool in_place)
{
    memset(it, 0, sizeof(*it));
    it->coll = coll;
    it->tix = 8;
    it->type = mp_all_types[it->tix];
    it->size = mp_type_size(it->type);
    it->nmsg = coll == SO_SENDRECV ? SO_MAX_MSGS : 1;
    it->root = coll == SO_SENDRECV ? 1 % th->nranks : 0;
    it->count = cap / (size_t)it->nmsg;
    it->in_place = in_place && coll != SO_ALLTOALL && coll != SO_SENDRECV;
    it->salt = so_next(&th->rng);
}

/*
 * The warm-up's first calls: every collective at the largest count, out of place then in
 * place, then a group of all-gathers at every slot's largest count. The library keeps its
 * largest scratch buffer per communicator (a high-water mark, not a leak); these bring it
 * there before the RSS baseline is taken. Returns the number of items, 0 when done.
 */
static int
so_warm_items(struct so_thread *th, int step, struct so_item *items)
{
    if (step < 2 * SO_NCOLLS) {
        so_force(th, &items[0], (enum so_coll)(step % SO_NCOLLS), th->slots[0].cap,
                 step >= SO_NCOLLS);
        so_prepare(th, &items[0], &th->slots[0]);
        return 1;
    }
    if (step == 2 * SO_NCOLLS) {
        for (int j = 0; j < SO_MAX_GROUP; j++) {
            so_force(th, &items[j], SO_ALLGATHER, th->slots[j].cap, false);
            so_prepare(th, &items[j], &th->slots[j]);
        }
        return SO_MAX_GROUP;
    }
    return 0;
}

static void *
so_thread_main(void *arg)
{
    struct so_thread *th = arg;
    long done = 0;
    bool warmed = false;

    if (so_device) {
        MP_CU(&so_cu, ctx_set_current(so_cu.ctx));
    }
    for (int step = 0; done < th->ops; step++) {
        struct so_item items[SO_MAX_GROUP];
        int k = so_warm_items(th, step, items);
        bool group = k > 1;

        if (so_device && (step == 0 || (k == 0 && !warmed))) {
            /* On device memory the warm-ups run one communicator at a time, the same on every
             * rank: their first calls make the library's staging memory, and allocating device
             * (or pinned) memory synchronizes the device, which with the other communicator's
             * operations waiting for peers may deadlock across the ranks. NCCL says as much
             * (operations on different communicators at different epochs, with a lock: any
             * CUDA call may synchronize the device). After both, nothing the library does
             * synchronizes it, and the threads go on together. */
            if (k == 0) {
                warmed = true;
                atomic_fetch_add(&so_warm_turn, 1);
            }
            int turn = k == 0 ? 2 : th->index;
            while (atomic_load(&so_warm_turn) < turn) {
                struct timespec pause = {0, 1000 * 1000};
                nanosleep(&pause, NULL);
            }
        }
        if (k == 0) {
            /* One in ten draws is a group of 2 to 4 items, each in its own slot. */
            group = so_below(&th->rng, 10) == 0;
            k = group ? 2 + (int)so_below(&th->rng, SO_MAX_GROUP - 1) : 1;
            for (int j = 0; j < k; j++) {
                struct so_slot *slot = &th->slots[group ? j : 0];
                so_draw(th, &items[j], slot->cap);
                so_prepare(th, &items[j], slot);
            }
        }
        if (k > th->ops - done) {
            k = (int)(th->ops - done); /* the last call or group, cut to the total */
        }
        if (group) {
            MP_CHECK_COMM(th->comm, ncclGroupStart());
        }
        for (int j = 0; j < k; j++) {
            so_post(th, &items[j]);
        }
        if (group) {
            MP_CHECK_COMM(th->comm, ncclGroupEnd());
        }
        if (so_device) {
            MP_CU(&so_cu, stream_synchronize(th->stream));
        }
        for (int j = 0; j < k; j++) {
            so_note(th, &items[j], so_check(th, &items[j]));
            th->per_coll[items[j].coll]++;
            if (items[j].coll <= SO_REDUCESCATTER && items[j].opix == SO_PREMULSUM) {
                MP_CHECK_COMM(th->comm, ncclRedOpDestroy(items[j].op, th->comm));
            }
        }
        th->groups += group;
        done += k;
        atomic_fetch_add(&so_done, k);
    }
    if (so_device && !warmed) {
        atomic_fetch_add(&so_warm_turn, 1); /* done within its warm-up: the other's turn */
    }
    return NULL;
}

static void
so_slots_create(struct so_thread *th)
{
    for (int s = 0; s < SO_SLOTS; s++) {
        struct so_slot *slot = &th->slots[s];
        slot->cap = s == 0 ? SO_BIG_CAP : SO_SMALL_CAP;
        size_t bytes = (size_t)th->nranks * slot->cap * 8;
        slot->send = so_device ? mp_cuda_alloc(&so_cu, MP_MEM_REGISTERED, bytes) : malloc(bytes);
        slot->recv = so_device ? mp_cuda_alloc(&so_cu, MP_MEM_REGISTERED, bytes) : malloc(bytes);
        MP_ASSERT(slot->send != NULL && slot->recv != NULL, "out of memory (%zu bytes)", bytes);
        /* Touched now, so the RSS counts them from the start (not with 0: GCC turns malloc
         * and memset 0 into calloc, which leaves fresh pages untouched). */
        memset(slot->send, SO_POISON, bytes);
        memset(slot->recv, SO_POISON, bytes);
    }
    th->scratch = malloc((size_t)th->nranks * SO_BIG_CAP * 8);
    MP_ASSERT(th->scratch != NULL, "out of memory");
    memset(th->scratch, SO_POISON, (size_t)th->nranks * SO_BIG_CAP * 8);
}

static void
so_slots_destroy(struct so_thread *th)
{
    for (int s = 0; s < SO_SLOTS; s++) {
        if (so_device) {
            mp_cuda_free(&so_cu, MP_MEM_REGISTERED, th->slots[s].send);
            mp_cuda_free(&so_cu, MP_MEM_REGISTERED, th->slots[s].recv);
        } else {
            free(th->slots[s].send);
            free(th->slots[s].recv);
        }
    }
    free(th->scratch);
}

/* --- main ---------------------------------------------------------------------------------- */

static double
so_rss_mib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;

    MP_ASSERT(f != NULL, "cannot open /proc/self/statm");
    MP_ASSERT(fscanf(f, "%lu %lu", &size, &resident) == 2, "cannot parse /proc/self/statm");
    fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

static void
so_usage(void)
{
    fprintf(stderr, "usage: soak [-n OPS] [-s SEED] [-r MIB] [-D]\n");
    exit(2);
}

int
main(int argc, char **argv)
{
    struct mp_world world;
    struct so_thread th[2];
    long total = 100000;
    uint64_t seed = 1;
    double bound = 16.0, rss_warm = 0.0, rss_peak = 0.0, rss_end, start, took;
    int opt;

    while ((opt = getopt(argc, argv, "n:s:r:D")) != -1) {
        switch (opt) {
        case 'D': so_device = true; break;
        case 'n': total = strtol(optarg, NULL, 10); break;
        case 's': seed = strtoull(optarg, NULL, 0); break;
        case 'r': bound = strtod(optarg, NULL); break;
        default: so_usage();
        }
    }
    MP_ASSERT(total >= 2, "-n %ld: need at least 2 ops", total);
    for (int t = 0; t < MP_NTYPES; t++) {
        for (int v = -SO_ENC_MAX; v <= SO_ENC_MAX; v++) {
            mp_store(mp_all_types[t], so_enc[t][v + SO_ENC_MAX], (double)v);
        }
    }

    if (so_device) {
        mp_cuda_init(&so_cu); /* before the communicators: they take the current device */
    }
    mp_world_init(&world);
    MP_ASSERT(world.nranks <= 8, "soak's exact data needs at most 8 ranks, not %d",
              world.nranks);
    memset(th, 0, sizeof(th));
    for (int i = 0; i < 2; i++) {
        th[i].index = i;
        th[i].rank = world.rank;
        th[i].nranks = world.nranks;
        th[i].ops = i == 0 ? total / 2 : total - total / 2;
        th[i].rng = mp_hash4(seed, (uint64_t)i, 0x736f616b, 0);
        so_slots_create(&th[i]);
        if (so_device) {
            MP_CU(&so_cu, stream_create(&th[i].stream, CU_STREAM_NON_BLOCKING));
        }
    }
    th[0].comm = world.comm;
    MP_CHECK_COMM(world.comm, ncclCommSplit(world.comm, 0, world.rank, &th[1].comm, NULL));
    MP_ASSERT(th[1].comm != NULL, "ncclCommSplit gave a NULL communicator");
    mp_barrier(world.comm, world.nranks);

    start = mp_now();
    for (int i = 0; i < 2; i++) {
        int err = pthread_create(&th[i].tid, NULL, so_thread_main, &th[i]);
        MP_ASSERT(err == 0, "pthread_create: %s", strerror(err));
    }
    /* Checkpoints at every tenth of the ops; the first is the end of the warm-up. */
    for (int k = 1; k <= 10; k++) {
        long mark = total * k / 10;
        while (atomic_load(&so_done) < mark) {
            struct timespec pause = {0, 2 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        double rss = so_rss_mib();
        if (k == 1) {
            rss_warm = rss_peak = rss;
        } else if (rss > rss_peak) {
            rss_peak = rss;
        }
        if (world.rank == 0) {
            printf("soak: %3d%% %7ld ops %7.1f s RSS %.1f MiB\n", k * 10, mark,
                   mp_now() - start, rss);
            fflush(stdout);
        }
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i].tid, NULL);
    }
    took = mp_now() - start;
    rss_end = so_rss_mib();
    rss_peak = rss_end > rss_peak ? rss_end : rss_peak;

    /* Wrong ops summed over ranks, on the world communicator. */
    long long wrong = th[0].wrong + th[1].wrong, wrong_all = wrong;
    MP_CHECK_COMM(world.comm, ncclAllReduce(&wrong_all, &wrong_all, 1, ncclInt64, ncclSum,
                                            world.comm, NULL));
    mp_failures += wrong != 0;
    const char *asan_options = getenv("ASAN_OPTIONS");
    bool enforce = !SO_ASAN || (asan_options != NULL &&
                                strstr(asan_options, "quarantine_size_mb=0") != NULL);
    if (rss_peak - rss_warm > bound) {
        if (!enforce) {
            mp_report(__FILE__, __LINE__, "RSS grew %.1f MiB after warm-up (not enforced under "
                      "AddressSanitizer's quarantine)", rss_peak - rss_warm);
        } else {
            mp_report(__FILE__, __LINE__, "RSS grew %.1f MiB after warm-up (%.1f -> peak %.1f "
                      "MiB), more than %.1f MiB", rss_peak - rss_warm, rss_warm, rss_peak,
                      bound);
            mp_failures++;
        }
    }
    if (world.rank == 0) {
        printf("soak: mix per thread (comm 0 / comm 1):");
        for (int c = 0; c < SO_NCOLLS; c++) {
            printf(" %s %ld/%ld", so_names[c], th[0].per_coll[c], th[1].per_coll[c]);
        }
        printf("; groups of 2-4 %ld/%ld", th[0].groups, th[1].groups);
        printf("\n");
        printf("soak: %ld ops on 2 communicators x 2 threads, %lld wrong, RSS %.1f -> %.1f MiB "
               "(peak %.1f), %.1f s\n", total, wrong_all, rss_warm, rss_end, rss_peak, took);
        fflush(stdout);
    }

    MP_CHECK_COMM(th[1].comm, ncclCommDestroy(th[1].comm));
    MP_CHECK_COMM(world.comm, ncclCommDestroy(world.comm));
    for (int i = 0; i < 2; i++) {
        so_slots_destroy(&th[i]);
        if (th[i].stream != NULL) {
            MP_CU(&so_cu, stream_destroy(th[i].stream));
        }
    }
    return mp_failures == 0 ? 0 : 1;
}
