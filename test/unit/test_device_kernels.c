/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/reduce_device.cu: kr_dev_reduce_<type> and kr_dev_copy launched through the driver
 * (the embedded fatbin, cuModuleLoadData, cuLaunchKernel) on grids of our choosing, their
 * results compared bit for bit with kr_reduce_host's. Under make test-unit the driver is the
 * test double, which runs the kernels' own code on the CPU over an emulated grid
 * (test/doubles/fake_cuda/kernels_cpu.cpp); on a GPU machine the same test checks the GPU.
 *
 * Every datatype x operation, each batch of several tasks (one per blockIdx.y), each task one
 * count of {0, 1, 3, 4, 5, 17, 1000, 4099} (nothing, shorter than a vector, vectors and tails)
 * in one placement: 16-byte aligned (the vector path of 4- and 8-byte types), every pointer one
 * element off (the element path), one operand off, in place on the first or the last operand,
 * aligned or not; one to five operands, one to three destinations, PreMulSum's scalar on some
 * operands, from the batch or from device memory. The grids run from one thread striding over
 * everything to the kernels' bound of 512 threads. Inputs and results share one arena, which
 * is compared whole: a stray write anywhere fails as a wrong result does.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "gpu/driver.h"
#include "kernels/device_abi.h"
#include "kernels/kernels.h"

/* kernels/fatbin.S: the kernels as nvcc built them; empty without nvcc. */
extern const unsigned char kr_fatbin_start[];
extern const unsigned char kr_fatbin_end[];

static const struct {
    ncclDataType_t type;
    const char *kernel;
} types[] = {
#define TYPE_ROW(type, suffix) {type, "kr_dev_reduce_" #suffix},
    KR_DEV_TYPE_NAMES(TYPE_ROW)
#undef TYPE_ROW
};
#define NTYPES (sizeof(types) / sizeof(types[0]))

static const size_t counts[] = {0, 1, 3, 4, 5, 17, 1000, 4099};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

enum placement {
    ALIGNED,          /* every pointer 16-byte aligned */
    SHIFTED,          /* every pointer one element past that */
    ONE_SHIFTED,      /* the last operand alone */
    IN_PLACE,         /* the first destination is the first operand */
    IN_PLACE_LAST,    /* ... the last operand */
    IN_PLACE_SHIFTED, /* the first, every pointer shifted */
    PLACEMENTS
};

/* Grids: blocks in x, threads per block. One thread does a whole task; 512 is the bound. */
static const unsigned int shapes[][2] = {{1, 1}, {3, 32}, {2, 512}, {5, 96}};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

#define ARENA_BYTES ((size_t)8 << 20)

/* One launch's memory: the device arena and three host images of it. */
struct arena {
    CUdeviceptr dev;
    uint8_t *init; /* the bytes before the launch */
    uint8_t *want; /* what they must be after */
    uint8_t *got;
    size_t used;
};

/* The expected result of one task, applied to want once the batch is built. */
struct task_check {
    int nsrc, ndst;
    size_t count;
    size_t src_off[KR_DEV_MAX_SRCS], dst_off[3];
    uint8_t scalar[KR_DEV_MAX_SRCS][8];
    bool pre[KR_DEV_MAX_SRCS];
};

/* A batch being built, and how it is launched and checked. */
struct launch {
    struct kr_dev_batch batch;
    struct task_check checks[KR_DEV_MAX_TASKS];
    int nsrcs, ndsts;
    CUfunction f;
    bool copy;           /* kr_dev_copy: counts in bytes */
    ncclDataType_t type; /* the reductions' */
    size_t size;         /* bytes of an element (1 for copies) */
    unsigned int grid[3], block[3]; /* grid[1], blocks in y, is the batch's tasks */
    const char *what;
    CUfunction from;     /* kr_dev_from: run the batch from device memory instead; NULL */
    bool post;           /* the tasks get the post-operation */
};

static const struct gpu_device *device;
static CUmodule module;
static CUstream stream;
static struct arena arena;
static CUdeviceptr batch_dev; /* where a kr_dev_from launch reads its batch */
static uint64_t rng_state;

/* splitmix64: reproducible data, seeded per case so a failure names what to rerun. */
static uint64_t
rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static bool
kernels_built(void)
{
    return (uintptr_t)kr_fatbin_end > (uintptr_t)kr_fatbin_start;
}

static void
setup(void)
{
    cr_assert(gpu_driver_present(), "no driver: run with LD_LIBRARY_PATH=build/test/doubles");
    cr_assert_eq(gpu_device_get(0, &device), ncclSuccess);
    cr_assert_eq(gpu_ctx_push(device->ctx), ncclSuccess);
    cr_assert_eq(gpu_cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAlloc(&arena.dev, ARENA_BYTES), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAlloc(&batch_dev, sizeof(struct kr_dev_batch)), CUDA_SUCCESS);
    arena.init = malloc(ARENA_BYTES);
    arena.want = malloc(ARENA_BYTES);
    arena.got = malloc(ARENA_BYTES);
    cr_assert(arena.init != NULL && arena.want != NULL && arena.got != NULL);
    if (kernels_built()) {
        cr_assert_eq(gpu_cu.cuModuleLoadData(&module, kr_fatbin_start), CUDA_SUCCESS);
    }
}

static void
teardown(void)
{
    if (module != NULL) {
        gpu_cu.cuModuleUnload(module);
    }
    gpu_cu.cuMemFree(arena.dev);
    gpu_cu.cuMemFree(batch_dev);
    gpu_cu.cuStreamDestroy(stream);
    free(arena.init);
    free(arena.want);
    free(arena.got);
    gpu_ctx_pop();
}

/* bytes of the arena at an offset aligned to 256, plus `shift`: no buffer touches another. */
static size_t
arena_take(size_t bytes, size_t shift)
{
    size_t off = (arena.used + 255) & ~(size_t)255;
    arena.used = off + shift + bytes + 64;
    cr_assert_leq(arena.used, ARENA_BYTES);
    return off + shift;
}

/* A random element of type, kept finite for float and double (products of five operands
 * included), whose NaN payloads the host and a GPU need not agree on; zeros of both signs
 * now and then for max and min. The narrow types round any NaN to one canonical code. */
static void
random_element(ncclDataType_t type, uint8_t *out)
{
    uint64_t r = rng_next();
    int exponent = (int)(r % 9) - 4;
    double sign = (r >> 8) & 1 ? -1.0 : 1.0;
    double value = sign * ldexp(1.0 + (double)(r >> 11) / 9007199254740992.0, exponent);
    uint8_t elem[8];

    if (r % 53 == 0) {
        value = sign * 0.0;
    }
    switch (type) {
    case ncclFloat32: {
        float f = (float)value;
        memcpy(out, &f, sizeof(f));
        return;
    }
    case ncclFloat64:
        memcpy(out, &value, sizeof(value));
        return;
    case ncclFloat16:
    case ncclBfloat16:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        kr_scalar_from_double(type, value, elem);
        memcpy(out, elem, kr_type_size(type));
        return;
    default:
        memcpy(out, &r, kr_type_size(type)); /* integers wrap: any bits */
        return;
    }
}

static void
fill_random(ncclDataType_t type, size_t off, size_t count)
{
    size_t size = kr_type_size(type);
    for (size_t i = 0; i < count; i++) {
        random_element(type, arena.init + off + i * size);
    }
}

/* An empty batch: no tasks, nothing of the arena used. */
static void
launch_reset(struct launch *l)
{
    memset(&l->batch.tasks, 0, sizeof(l->batch.tasks));
    l->batch.ntasks = 0;
    l->nsrcs = l->ndsts = 0;
    arena.used = 0;
}

/* want = init with every task's destinations holding what the task must write there. For a
 * reduction, the host reductions' result: pre0(src0), then acc OP pre_k(src_k) operand by
 * operand, post on the last, as device_abi.h says. */
static void
launch_expect(const struct launch *l, uint8_t *acc)
{
    memcpy(arena.want, arena.init, arena.used);
    for (uint32_t i = 0; i < l->batch.ntasks; i++) {
        const struct task_check *c = &l->checks[i];
        struct kr_redop op = {.kind = (enum kr_op_kind)l->batch.kind, .type = l->type,
                              .divisor = l->batch.divisor};
        unsigned post = l->batch.tasks[i].post ? KR_POST : 0;

        if (l->copy) {
            memcpy(acc, arena.init + c->src_off[0], c->count);
        } else {
            memcpy(op.scalar, c->scalar[0], sizeof(op.scalar));
            kr_reduce_host(acc, arena.init + c->src_off[0], NULL, c->count, &op,
                           (c->pre[0] ? KR_PRE_A : 0) | (c->nsrc == 1 ? post : 0));
        }
        for (int k = 1; k < c->nsrc; k++) {
            memcpy(op.scalar, c->scalar[k], sizeof(op.scalar));
            kr_reduce_host(acc, acc, arena.init + c->src_off[k], c->count, &op,
                           (c->pre[k] ? KR_PRE_B : 0) | (k == c->nsrc - 1 ? post : 0));
        }
        for (int d = 0; d < c->ndst; d++) {
            memcpy(arena.want + c->dst_off[d], acc, c->count * l->size);
        }
    }
}

/* Runs the batch, a grid of grid[0] x ntasks x grid[2] blocks, and compares the whole arena
 * with what it must hold; then empties the batch. */
static void
launch_run(struct launch *l)
{
    static uint8_t acc[4099 * 8];
    const unsigned int *g = l->grid, *b = l->block;
    void *params[] = {&l->batch};

    if (l->batch.ntasks == 0) {
        return;
    }
    launch_expect(l, acc);
    cr_assert_eq(gpu_cu.cuMemcpyAsync(arena.dev, (CUdeviceptr)(uintptr_t)arena.init,
                                      arena.used, stream), CUDA_SUCCESS);
    if (l->from != NULL) {
        /* The batch in device memory, read when the kernel runs, cut into levels of up to
         * three tasks, a launch each (in reverse: each reads only its own tasks); blocks in y
         * past a level's tasks must do nothing. */
        uint32_t levels = (l->batch.ntasks + 2) / 3;
        for (uint32_t i = 0; i < l->batch.ntasks; i++) {
            l->batch.tasks[i].level = (uint8_t)(i / 3);
        }
        cr_assert_eq(gpu_cu.cuMemcpyAsync(batch_dev, (CUdeviceptr)(uintptr_t)&l->batch,
                                          sizeof(l->batch), stream), CUDA_SUCCESS);
        for (uint32_t level = levels; level-- > 0;) {
            struct kr_dev_from_args args = {.batch = batch_dev, .level = level};
            void *at[] = {&args};
            cr_assert_eq(gpu_cu.cuLaunchKernel(l->from, g[0], 3 + 2, g[2], b[0], b[1], b[2], 0,
                                               stream, at, NULL),
                         CUDA_SUCCESS, "kr_dev_from, %s, level %u", l->what, level);
        }
    } else {
        cr_assert_eq(gpu_cu.cuLaunchKernel(l->f, g[0], l->batch.ntasks, g[2], b[0], b[1], b[2],
                                           0, stream, params, NULL),
                     CUDA_SUCCESS, "%s", l->what);
    }
    cr_assert_eq(gpu_cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)arena.got, arena.dev, arena.used,
                                      stream), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
    if (memcmp(arena.got, arena.want, arena.used) != 0) {
        size_t at = 0;
        while (arena.got[at] == arena.want[at]) {
            at++;
        }
        /* The task whose destination holds the first wrong byte, if one does. */
        int task = -1;
        size_t elem = 0;
        for (uint32_t i = 0; i < l->batch.ntasks; i++) {
            for (int d = 0; d < l->checks[i].ndst; d++) {
                size_t lo = l->checks[i].dst_off[d];
                if (at >= lo && at < lo + l->checks[i].count * l->size) {
                    task = (int)i;
                    elem = (at - lo) / l->size;
                }
            }
        }
        const struct task_check *c = task >= 0 ? &l->checks[task] : NULL;
        cr_assert_fail("%s, grid %u x %u x %u, block %u x %u x %u: byte %zu of the arena is "
                       "0x%02x, not 0x%02x; task %d (count %zu, %d operands, %d destinations), "
                       "element %zu",
                       l->what, g[0], l->batch.ntasks, g[2], b[0], b[1], b[2], at,
                       arena.got[at], arena.want[at], task, c ? c->count : 0, c ? c->nsrc : 0,
                       c ? c->ndst : 0, elem);
    }
    launch_reset(l);
}

/* Starts a task of nsrc operands and ndst destinations, running the batch first if it would
 * not fit (as kernels/device.c does). */
static struct task_check *
launch_task(struct launch *l, size_t count, int nsrc, int ndst)
{
    if (l->batch.ntasks == KR_DEV_MAX_TASKS || l->nsrcs + nsrc > KR_DEV_MAX_SRCS ||
        l->ndsts + ndst > KR_DEV_MAX_DSTS) {
        launch_run(l);
    }
    struct kr_dev_task *t = &l->batch.tasks[l->batch.ntasks];
    struct task_check *c = &l->checks[l->batch.ntasks];
    *t = (struct kr_dev_task){.count = count, .first_src = (uint16_t)l->nsrcs,
                              .nsrc = (uint8_t)nsrc, .first_dst = (uint16_t)l->ndsts,
                              .ndst = (uint8_t)ndst, .post = l->post};
    *c = (struct task_check){.nsrc = nsrc, .ndst = ndst, .count = count};
    l->batch.ntasks++;
    return c;
}

/* Adds a reduction task: its operands (filled), destinations and expected result's recipe. */
static void
add_reduce_task(struct launch *l, size_t count, enum placement place, int nsrc, int ndst)
{
    struct task_check *c = launch_task(l, count, nsrc, ndst);
    struct kr_dev_batch *b = &l->batch;
    size_t size = l->size;
    size_t shift = place == SHIFTED || place == IN_PLACE_SHIFTED ? size : 0;

    for (int k = 0; k < nsrc; k++) {
        size_t off = arena_take(count * size,
                                place == ONE_SHIFTED && k == nsrc - 1 ? size : shift);
        struct kr_dev_src *s = &b->srcs[l->nsrcs++];
        fill_random(l->type, off, count);
        c->src_off[k] = off;
        *s = (struct kr_dev_src){.ptr = arena.dev + off};
        if (b->kind == KR_PREMULSUM && rng_next() % 3 != 0) {
            s->pre = 1;
            c->pre[k] = true;
            random_element(l->type, c->scalar[k]);
            if (k % 2 == 1) {
                /* ncclScalarDevice: the scalar in device memory, one element. */
                size_t at = arena_take(size, 0);
                memcpy(arena.init + at, c->scalar[k], size);
                s->scalar_ptr = arena.dev + at;
            } else {
                memcpy(&s->scalar, c->scalar[k], size);
            }
        }
    }
    for (int d = 0; d < ndst; d++) {
        size_t off;
        if (d == 0 && (place == IN_PLACE || place == IN_PLACE_SHIFTED)) {
            off = c->src_off[0];
        } else if (d == 0 && place == IN_PLACE_LAST) {
            off = c->src_off[nsrc - 1];
        } else {
            off = arena_take(count * size, shift);
            fill_random(l->type, off, count); /* to be overwritten */
        }
        c->dst_off[d] = off;
        b->dsts[l->ndsts++] = arena.dev + off;
    }
}

static const char *
kind_name(enum kr_op_kind kind)
{
    static const char *names[] = {"sum", "prod", "max", "min", "premulsum", "sumpostdiv"};
    return names[kind];
}

/* Every datatype x count x placement of one operation, on every grid shape; through
 * kr_dev_from, which reads the batch from device memory, where `from`. */
static void
check_operation(enum kr_op_kind kind, bool from)
{
    static struct launch l;
    char what[64];

    if (!kernels_built()) {
        cr_skip_test("built without nvcc: no kernels to launch");
    }
    l.from = NULL;
    if (from) {
        cr_assert_eq(gpu_cu.cuModuleGetFunction(&l.from, module, "kr_dev_from"), CUDA_SUCCESS);
    }
    for (size_t ty = 0; ty < NTYPES; ty++) {
        l.type = types[ty].type;
        l.size = kr_type_size(l.type);
        snprintf(what, sizeof(what), "%s, %s", types[ty].kernel, kind_name(kind));
        l.what = what;
        cr_assert_eq(gpu_cu.cuModuleGetFunction(&l.f, module, types[ty].kernel), CUDA_SUCCESS);
        for (size_t sh = 0; sh < NSHAPES; sh++) {
            rng_state = (uint64_t)kind << 32 | ty << 16 | sh;
            memset(&l.batch, 0, sizeof(l.batch));
            l.batch.kernel = (uint32_t)ty; /* types[] is in enum kr_dev_kernel_id's order */
            l.batch.kind = (uint32_t)kind;
            l.post = kind == KR_SUMPOSTDIV;
            l.batch.divisor = 3 + sh * 2;
            l.grid[0] = shapes[sh][0], l.grid[2] = 1;
            l.block[0] = shapes[sh][1], l.block[1] = l.block[2] = 1;
            launch_reset(&l);
            /* Each count in each placement, one to five operands, one to three destinations. */
            for (size_t n = 0; n < NCOUNTS * PLACEMENTS; n++) {
                add_reduce_task(&l, counts[n / PLACEMENTS], (enum placement)(n % PLACEMENTS),
                                1 + (int)(n % 5), 1 + (int)(n % 3));
            }
            launch_run(&l);
        }
    }
}

TestSuite(device_kernels, .init = setup, .fini = teardown, .timeout = 120);

Test(device_kernels, sum)
{
    check_operation(KR_SUM, false);
}

Test(device_kernels, prod)
{
    check_operation(KR_PROD, false);
}

Test(device_kernels, max)
{
    check_operation(KR_MAX, false);
}

Test(device_kernels, min)
{
    check_operation(KR_MIN, false);
}

Test(device_kernels, premulsum_with_host_and_device_scalars)
{
    check_operation(KR_PREMULSUM, false);
}

Test(device_kernels, sumpostdiv)
{
    check_operation(KR_SUMPOSTDIV, false);
}

/* kr_dev_from runs the kernel its batch names over the tasks of its level of the batch it
 * reads from device memory: one launch per level gives the same results, blocks past a level's
 * tasks doing nothing. */
Test(device_kernels, from_device_memory_sum_and_premulsum)
{
    check_operation(KR_SUM, true);
    check_operation(KR_PREMULSUM, true);
}

/* kr_dev_signal writes each word of the list it reads from device memory, into page-locked
 * host memory (where a device team's done words are), after the work before it. */
Test(device_kernels, signal_writes_its_words)
{
    enum { WORDS = 3 };
    struct kr_dev_signals signals = {.n = WORDS};
    uint32_t *words = aligned_alloc(4096, 4096);
    CUdeviceptr words_dev = 0, signals_dev = 0;
    CUfunction f;

    if (!kernels_built()) {
        cr_skip_test("built without nvcc: no kernels to launch");
    }
    cr_assert(words != NULL);
    memset(words, 0, 4096);
    cr_assert_eq(gpu_cu.cuMemHostRegister(words, 4096, CU_MEMHOSTREGISTER_DEVICEMAP),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemHostGetDevicePointer(&words_dev, words, 0), CUDA_SUCCESS);
    for (int i = 0; i < WORDS; i++) {
        /* A word per cache line, as the control block's. */
        signals.words[i] = (struct kr_dev_signal_word){.addr = words_dev + 64 * (unsigned)i,
                                                       .value = 1000u + (unsigned)i};
    }
    cr_assert_eq(gpu_cu.cuMemAlloc(&signals_dev, sizeof(signals)), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemcpyAsync(signals_dev, (CUdeviceptr)(uintptr_t)&signals,
                                      sizeof(signals), stream), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuModuleGetFunction(&f, module, "kr_dev_signal"), CUDA_SUCCESS);
    void *params[] = {&signals_dev};
    cr_assert_eq(gpu_cu.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
    for (int i = 0; i < WORDS; i++) {
        cr_expect_eq(__atomic_load_n(&words[16 * i], __ATOMIC_ACQUIRE), 1000u + (unsigned)i,
                     "word %d", i);
    }
    cr_expect_eq(words[16 * WORDS], 0u, "a word past the list was written");
    gpu_cu.cuMemFree(signals_dev);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

/* The stores the driver's double applied, in its order (fake_cuda_set_store_hook). */
#define ORDER_MAX 256
struct store_order {
    pthread_mutex_t lock;
    const uint32_t *base; /* words[16 i]: word i */
    int n;
    int word[ORDER_MAX];
};

static void
store_order_hook(void *arg, const uint32_t *word, uint32_t value)
{
    struct store_order *o = arg;

    (void)value;
    pthread_mutex_lock(&o->lock);
    if (o->n < ORDER_MAX) {
        o->word[o->n++] = (int)((word - o->base) / 16);
    }
    pthread_mutex_unlock(&o->lock);
}

/* kr_dev_signal's contract (device_abi.h): words[0] after every other word of its list, a
 * fence between, so whoever sees words[0] sees the rest. Checked on any driver by watching
 * words[0] from the host while the kernel runs. The driver's double holds a kernel's stores
 * and applies those no fence orders in a random order (stores.c); it tells this test each
 * store it applies, so the order is checked, not guessed from timing: words[0] last in every
 * launch, and the other words, which no fence orders, not in the list's order every time
 * (the double does reorder unfenced stores). */
Test(device_kernels, signal_writes_the_first_word_last)
{
    enum { WORDS = 16, LAUNCHES = 24 };
    struct kr_dev_signals signals = {.n = WORDS};
    static struct store_order order = {.lock = PTHREAD_MUTEX_INITIALIZER};
    uint32_t *words = aligned_alloc(4096, 4096);
    CUdeviceptr words_dev = 0, signals_dev = 0;
    CUfunction f;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void (*set_hook)(void (*)(void *, const uint32_t *, uint32_t), void *) =
        lib != NULL ? (void (*)(void (*)(void *, const uint32_t *, uint32_t), void *))dlsym(
                          lib, "fake_cuda_set_store_hook")
                    : NULL;
    int reordered = 0;

    if (!kernels_built()) {
        cr_skip_test("built without nvcc: no kernels to launch");
    }
    cr_assert(words != NULL);
    cr_assert_eq(gpu_cu.cuMemHostRegister(words, 4096, CU_MEMHOSTREGISTER_DEVICEMAP),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemHostGetDevicePointer(&words_dev, words, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAlloc(&signals_dev, sizeof(signals)), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuModuleGetFunction(&f, module, "kr_dev_signal"), CUDA_SUCCESS);
    order.base = words;
    if (set_hook != NULL) {
        set_hook(store_order_hook, &order);
    }
    for (uint32_t l = 0; l < LAUNCHES; l++) {
        memset(words, 0, 4096);
        for (uint32_t i = 0; i < WORDS; i++) {
            signals.words[i] = (struct kr_dev_signal_word){.addr = words_dev + 64 * i,
                                                           .value = 1000 * (l + 1) + i};
        }
        cr_assert_eq(gpu_cu.cuMemcpyAsync(signals_dev, (CUdeviceptr)(uintptr_t)&signals,
                                          sizeof(signals), stream), CUDA_SUCCESS);
        cr_assert_eq(gpu_cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
        order.n = 0;
        void *params[] = {&signals_dev};
        cr_assert_eq(gpu_cu.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL),
                     CUDA_SUCCESS);
        /* Until words[0] is seen (the stream done without it is a failure too) ... */
        while (__atomic_load_n(&words[0], __ATOMIC_ACQUIRE) != 1000 * (l + 1)) {
            if (gpu_cu.cuStreamQuery(stream) == CUDA_SUCCESS) {
                cr_assert_eq(__atomic_load_n(&words[0], __ATOMIC_ACQUIRE), 1000 * (l + 1),
                             "launch %u: words[0] not written", l);
            }
        }
        /* ... then every other word is there. */
        for (uint32_t i = 1; i < WORDS; i++) {
            cr_assert_eq(__atomic_load_n(&words[16 * i], __ATOMIC_ACQUIRE), 1000 * (l + 1) + i,
                         "launch %u: words[0] seen before word %u", l, i);
        }
        cr_assert_eq(gpu_cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
        if (set_hook == NULL) {
            continue;
        }
        cr_assert_eq(order.n, WORDS, "launch %u: %d stores applied", l, order.n);
        cr_assert_eq(order.word[WORDS - 1], 0, "launch %u: word %d applied last, not words[0]",
                     l, order.word[WORDS - 1]);
        for (int i = 1; i < WORDS - 1; i++) {
            if (order.word[i] < order.word[i - 1]) {
                reordered++;
                break;
            }
        }
    }
    if (set_hook != NULL) {
        set_hook(NULL, NULL);
        cr_expect_gt(reordered, 0, "in %d launches the double applied %d unfenced stores in "
                                   "their order every time: it does not reorder them",
                     LAUNCHES, WORDS - 1);
    }
    gpu_cu.cuMemFree(signals_dev);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

/* Copies choose the widest word all of a task's pointers are aligned to (16, 8, 4 bytes, or
 * bytes): each of those placements, at every count, with one to three destinations, in
 * place too (a copy onto itself), on grids with blocks and threads in y and z as well. */
Test(device_kernels, copies_at_every_alignment)
{
    static const size_t shifts[] = {0, 8, 4, 2, 1};
    static const unsigned int grids[][6] = {
        {1, 1, 1, 1, 1, 1}, {3, 1, 1, 32, 1, 1}, {2, 1, 1, 512, 1, 1}, {2, 1, 2, 64, 2, 2},
    };
    static struct launch l = {.copy = true, .type = ncclUint8, .size = 1,
                              .what = "kr_dev_copy"};

    if (!kernels_built()) {
        cr_skip_test("built without nvcc: no kernels to launch");
    }
    cr_assert_eq(gpu_cu.cuModuleGetFunction(&l.f, module, "kr_dev_copy"), CUDA_SUCCESS);
    for (size_t g = 0; g < 2 * sizeof(grids) / sizeof(grids[0]); g++) {
        /* Each grid twice: by value, then through kr_dev_from. */
        size_t grid = g % (sizeof(grids) / sizeof(grids[0]));
        bool from = g >= sizeof(grids) / sizeof(grids[0]);
        l.from = NULL;
        if (from) {
            cr_assert_eq(gpu_cu.cuModuleGetFunction(&l.from, module, "kr_dev_from"),
                         CUDA_SUCCESS);
        }
        rng_state = 0xc0b1 + grid;
        memset(&l.batch, 0, sizeof(l.batch));
        l.batch.kernel = KR_DEV_ID_COPY;
        memcpy(l.grid, grids[grid], sizeof(l.grid));
        memcpy(l.block, grids[grid] + 3, sizeof(l.block));
        launch_reset(&l);
        for (size_t s = 0; s < sizeof(shifts) / sizeof(shifts[0]); s++) {
            for (size_t n = 0; n < NCOUNTS; n++) {
                /* Bytes: the counts in words of 4 bytes, odd ones plus a byte of tail. */
                size_t bytes = counts[n] * 4 + (n % 2);
                int ndst = 1 + (int)((s + n) % 3);
                struct task_check *c = launch_task(&l, bytes, 1, ndst);
                size_t src = arena_take(bytes, shifts[s]);
                fill_random(ncclUint8, src, bytes);
                c->src_off[0] = src;
                l.batch.srcs[l.nsrcs++] = (struct kr_dev_src){.ptr = arena.dev + src};
                for (int d = 0; d < ndst; d++) {
                    size_t dst = src;
                    if (d > 0 || n % 4 != 3) {
                        dst = arena_take(bytes, shifts[s]);
                        fill_random(ncclUint8, dst, bytes);
                    }
                    c->dst_off[d] = dst;
                    l.batch.dsts[l.ndsts++] = arena.dev + dst;
                }
            }
        }
        launch_run(&l);
    }
}

#if defined(__x86_64__)
/* A GPU keeps subnormals (nvcc's default -ftz=false), whatever mode the host thread that made
 * the stream computes in: sums of subnormals on a stream made while flushing them to zero. */
Test(device_kernels, subnormals_kept_whatever_the_callers_mode)
{
    enum { COUNT = 100 };
    static struct launch l = {.type = ncclFloat32, .size = 4, .grid = {2, 1, 1},
                              .block = {32, 1, 1}, .what = "kr_dev_reduce_f32, subnormals"};
    unsigned int mxcsr = _mm_getcsr();
    CUstream plain = stream;

    if (!kernels_built()) {
        cr_skip_test("built without nvcc: no kernels to launch");
    }
    _mm_setcsr(mxcsr | 0x8040); /* flush to zero, denormals are zero */
    cr_assert_eq(gpu_cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    _mm_setcsr(mxcsr);
    cr_assert_eq(gpu_cu.cuModuleGetFunction(&l.f, module, "kr_dev_reduce_f32"), CUDA_SUCCESS);
    memset(&l.batch, 0, sizeof(l.batch));
    l.batch.kind = KR_SUM;
    launch_reset(&l);
    struct task_check *c = launch_task(&l, COUNT, 2, 1);
    for (int k = 0; k < 2; k++) {
        c->src_off[k] = arena_take(COUNT * 4, 0);
        for (uint32_t i = 0; i < COUNT; i++) {
            uint32_t bits = 1 + i * 7919 + (uint32_t)k * 100000; /* below 2^23: subnormal */
            memcpy(arena.init + c->src_off[k] + i * 4, &bits, 4);
        }
        l.batch.srcs[l.nsrcs++] = (struct kr_dev_src){.ptr = arena.dev + c->src_off[k]};
    }
    c->dst_off[0] = arena_take(COUNT * 4, 0);
    l.batch.dsts[l.ndsts++] = arena.dev + c->dst_off[0];
    launch_run(&l);
    gpu_cu.cuStreamDestroy(stream);
    stream = plain;
}
#endif

/* kr_dev_from over a batch its builder got wrong in a way a GPU would run wrongly, at its
 * level 1, on a grid of blocks_y blocks in y: the driver's double says so and ends the process
 * (SIGABRT), as an illegal address ends the context on a GPU. A valid batch before spoil: two
 * tasks of one element, at levels 0 and 1. Only on the double (a GPU runs it, wrongly). */
static void
from_refused(void (*spoil)(struct kr_dev_batch *b), unsigned int blocks_y)
{
    static struct kr_dev_batch batch;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUfunction f;

    if (!kernels_built() || lib == NULL || dlsym(lib, "fake_cuda_get_stats") == NULL) {
        cr_skip_test("the driver's double's refusals: not this driver");
    }
    memset(&batch, 0, sizeof(batch));
    batch.kernel = KR_DEV_ID_f32;
    batch.kind = KR_SUM;
    batch.ntasks = 2;
    for (uint32_t t = 0; t < 2; t++) {
        batch.tasks[t] = (struct kr_dev_task){.count = 1, .first_src = (uint16_t)t,
                                              .first_dst = (uint16_t)t, .nsrc = 1, .ndst = 1,
                                              .level = (uint8_t)t};
        batch.srcs[t] = (struct kr_dev_src){.ptr = arena.dev + 64 * t};
        batch.dsts[t] = arena.dev + 256 + 64 * t;
    }
    spoil(&batch);
    cr_assert_eq(gpu_cu.cuModuleGetFunction(&f, module, "kr_dev_from"), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemcpyAsync(batch_dev, (CUdeviceptr)(uintptr_t)&batch, sizeof(batch),
                                      stream), CUDA_SUCCESS);
    struct kr_dev_from_args args = {.batch = batch_dev, .level = 1};
    void *params[] = {&args};
    cr_assert_eq(gpu_cu.cuLaunchKernel(f, 1, blocks_y, 1, 32, 1, 1, 0, stream, params, NULL),
                 CUDA_SUCCESS);
    gpu_cu.cuStreamSynchronize(stream);
    cr_assert_fail("the double ran kr_dev_from over a batch a GPU would run wrongly");
}

static void
spoil_levels_descend(struct kr_dev_batch *b)
{
    b->tasks[0].level = 1;
    b->tasks[1].level = 0;
}

static void
spoil_too_many_tasks(struct kr_dev_batch *b)
{
    b->ntasks = KR_DEV_MAX_TASKS + 1;
}

static void
spoil_unknown_kernel(struct kr_dev_batch *b)
{
    b->kernel = KR_DEV_IDS;
}

static void
spoil_both_at_level_1(struct kr_dev_batch *b)
{
    b->tasks[0].level = 1;
}

static void
spoil_operands_past_the_batch(struct kr_dev_batch *b)
{
    b->tasks[1].first_src = KR_DEV_MAX_SRCS - 1;
    b->tasks[1].nsrc = 2;
}

/* Levels that do not ascend: the kernel's scan for its level's first task assumes they do. */
Test(device_kernels, from_refuses_levels_that_descend, .signal = SIGABRT)
{
    from_refused(spoil_levels_descend, 2);
}

/* More tasks than a batch holds: the scan would read past them. */
Test(device_kernels, from_refuses_more_tasks_than_a_batch_holds, .signal = SIGABRT)
{
    from_refused(spoil_too_many_tasks, 2);
}

/* A kernel no id names: the kernel would run nothing, and its ranks would wait for results. */
Test(device_kernels, from_refuses_an_unknown_kernel, .signal = SIGABRT)
{
    from_refused(spoil_unknown_kernel, 2);
}

/* A level with more tasks than the launch has blocks in y: the rest would never run. */
Test(device_kernels, from_refuses_a_level_wider_than_its_grid, .signal = SIGABRT)
{
    from_refused(spoil_both_at_level_1, 1);
}

/* A task whose operands lie past the batch's arrays: the kernel would read garbage. */
Test(device_kernels, from_refuses_operands_past_the_batch, .signal = SIGABRT)
{
    from_refused(spoil_operands_past_the_batch, 2);
}

/* The driver's answers to launches no device runs, and to more threads than the kernels'
 * __launch_bounds__(512): CUDA_ERROR_INVALID_VALUE. */
Test(device_kernels, launches_beyond_the_limits_are_refused)
{
    static const unsigned int bad[][6] = {
        {1, 1, 1, 513, 1, 1},    {1, 1, 1, 1024, 1, 1}, {1, 1, 1, 256, 4, 1},
        {1, 1, 1, 0, 1, 1},      {0, 1, 1, 32, 1, 1},   {1, 65536, 1, 32, 1, 1},
        {1, 1, 65536, 32, 1, 1}, {1, 1, 1, 1, 1, 65},   {1, 1, 1, 65536, 65536, 1},
    };
    struct kr_dev_batch batch = {.ntasks = 1};
    void *params[] = {&batch};
    CUfunction f;

    if (!kernels_built()) {
        cr_skip_test("built without nvcc: no kernels to launch");
    }
    cr_assert_eq(gpu_cu.cuModuleGetFunction(&f, module, "kr_dev_reduce_f32"), CUDA_SUCCESS);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const unsigned int *d = bad[i];
        cr_assert_eq(gpu_cu.cuLaunchKernel(f, d[0], d[1], d[2], d[3], d[4], d[5], 0, stream,
                                           params, NULL),
                     CUDA_ERROR_INVALID_VALUE, "grid %u x %u x %u, block %u x %u x %u", d[0],
                     d[1], d[2], d[3], d[4], d[5]);
    }
    /* At the bound it runs (a task of nothing). */
    cr_assert_eq(gpu_cu.cuLaunchKernel(f, 1, 1, 1, 512, 1, 1, 0, stream, params, NULL),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
}
