/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A block's threads really running together, for the kernels whose threads wait for one
 * another (__syncthreads, cuda_on_cpu.h): each thread of the block is a coroutine on the
 * stream's worker thread, with a stack of its own. The worker starts them in thread order;
 * each runs until it returns or reaches a barrier, where it gives the worker back, which runs
 * the next; once every thread of the block reached the barrier, they all go on, in the same
 * order. A barrier that not every thread reaches (one returned while others wait) or that
 * threads reach at different places is a divergent barrier, undefined in CUDA (a hang or
 * worse on a GPU): the double says so and aborts.
 *
 * The stacks, one per thread of the largest block the driver allows, are mapped once per
 * worker at its first such block (address space only: a thread touches a page or two) and
 * reused, then unmapped when the worker ends (fake_block_free). Their tops are staggered by a
 * cache line per thread, so that the threads' frames do not all fall into the same cache
 * sets. Each ends in a canary, checked every FAKE_BLOCK_CHECK_EVERY blocks and at the
 * worker's end: a thread that overflowed its stack is named rather than left to corrupt
 * another's.
 *
 * The switch is a few instructions on x86-64 (the callee-saved registers and the stack
 * pointer: every coroutine runs with the worker's floating-point modes, which kernels_cpu.cpp
 * set for the launch); elsewhere (or built with -DFAKE_BLOCK_UCONTEXT) ucontext's, which is
 * slower (a system call per switch).
 * Under AddressSanitizer each switch is announced to it, as its fiber interface asks.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fake_cuda.h"

#if defined(__x86_64__) && !defined(FAKE_BLOCK_UCONTEXT)
#define FAKE_BLOCK_ASM 1
#else
#define FAKE_BLOCK_ASM 0
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define FAKE_BLOCK_ASAN 1
#else
#define FAKE_BLOCK_ASAN 0
#endif

/* The most threads a block may have (the driver's limit, which cuLaunchKernel checks). */
#define FAKE_BLOCK_THREADS 1024
/* Each thread's stack: kernels need little; a complaint's formatting a few KiB. */
#define FAKE_BLOCK_STACK ((size_t)64 << 10)
#define FAKE_BLOCK_CANARY 0x5ca1ab1e0ddba11ull
#define FAKE_BLOCK_CHECK_EVERY 64

enum fake_thread_state {
    FAKE_THREAD_READY,   /* not started, or released from a barrier */
    FAKE_THREAD_WAITING, /* at a barrier */
    FAKE_THREAD_DONE,
};

struct fake_thread {
#if FAKE_BLOCK_ASM
    void *sp;            /* its saved stack pointer (fake_block_switch) */
#else
    ucontext_t context;
#endif
    enum fake_thread_state state;
    bool started;
    const char *file;    /* the barrier it waits at */
    int line;
};

/* One per worker thread that ran a block with barriers. */
struct fake_block {
    char *stacks;        /* FAKE_BLOCK_THREADS of FAKE_BLOCK_STACK bytes */
    struct fake_thread threads[FAKE_BLOCK_THREADS];
#if FAKE_BLOCK_ASM
    void *worker_sp;
#else
    ucontext_t worker;
#endif
    int current;         /* the thread running, -1 while the worker runs */
    unsigned nthreads;   /* of the block being run */
    void (*enter)(void *arg, unsigned thread);
    void (*main)(void *arg);
    void *arg;
    unsigned long blocks;      /* run, for the canaries' checks */
    unsigned used;             /* the stacks any block used */
#if FAKE_BLOCK_ASAN
    const void *worker_bottom; /* the worker's own stack, as AddressSanitizer told it */
    size_t worker_size;
#endif
};

static __thread struct fake_block *fake_block_worker;

#if FAKE_BLOCK_ASM
/* Saves the callee-saved registers on the running stack and its pointer in *save, then loads
 * load (a stack fake_block_switch saved, or one fake_block_start prepared) and returns on it. */
void fake_block_switch(void **save, void *load) __attribute__((visibility("hidden")));
__asm__(".text\n"
        ".p2align 4\n"
        ".globl fake_block_switch\n"
        ".hidden fake_block_switch\n"
        ".type fake_block_switch, @function\n"
        "fake_block_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size fake_block_switch, .-fake_block_switch\n");
#endif

static char *
fake_block_stack(const struct fake_block *blk, unsigned t)
{
    return blk->stacks + (size_t)t * FAKE_BLOCK_STACK;
}

/* Into thread t's coroutine (from the worker), or back to the worker (t < 0, from thread
 * `from`, for good where it is done). */
static void
fake_block_go(struct fake_block *blk, int t, int from)
{
#if FAKE_BLOCK_ASAN
    void *fake_stack = NULL;
    bool leaving = from >= 0 && blk->threads[from].state == FAKE_THREAD_DONE;
    if (t >= 0) {
        __sanitizer_start_switch_fiber(&fake_stack, fake_block_stack(blk, (unsigned)t),
                                       FAKE_BLOCK_STACK);
    } else {
        __sanitizer_start_switch_fiber(leaving ? NULL : &fake_stack, blk->worker_bottom,
                                       blk->worker_size);
    }
#endif
#if FAKE_BLOCK_ASM
    if (t >= 0) {
        fake_block_switch(&blk->worker_sp, blk->threads[t].sp);
    } else {
        fake_block_switch(&blk->threads[from].sp, blk->worker_sp);
    }
#else
    if (t >= 0) {
        swapcontext(&blk->worker, &blk->threads[t].context);
    } else {
        swapcontext(&blk->threads[from].context, &blk->worker);
    }
#endif
#if FAKE_BLOCK_ASAN
    if (t >= 0) {
        __sanitizer_finish_switch_fiber(fake_stack, NULL, NULL);
    } else {
        __sanitizer_finish_switch_fiber(fake_stack, &blk->worker_bottom, &blk->worker_size);
    }
#endif
}

/* Where every coroutine starts, on its own stack: the thread's kernel, then back to the
 * worker for good. */
static void
fake_block_thread_main(void)
{
    struct fake_block *blk = fake_block_worker;
    int t = blk->current;

#if FAKE_BLOCK_ASAN
    __sanitizer_finish_switch_fiber(NULL, &blk->worker_bottom, &blk->worker_size);
#endif
    blk->main(blk->arg);
    blk->threads[t].state = FAKE_THREAD_DONE;
    fake_block_go(blk, -1, t);
    fake_complain("a finished thread of a block was resumed");
    abort();
}

/* Prepares thread t's coroutine to start at fake_block_thread_main on its stack. */
static void
fake_block_start(struct fake_block *blk, unsigned t)
{
    char *stack = fake_block_stack(blk, t);
#if FAKE_BLOCK_ASM
    /* What fake_block_switch pops: six registers, then the address it returns to, on a stack
     * where that function finds itself as if called (the stack pointer 8 past 16-aligned). */
    uintptr_t top = (uintptr_t)stack + FAKE_BLOCK_STACK - (t % 64) * 64;
    void **sp = (void **)top;
    *--sp = NULL; /* the return address of fake_block_thread_main, which never returns */
    *--sp = (void *)(uintptr_t)fake_block_thread_main;
    for (int r = 0; r < 6; r++) {
        *--sp = NULL;
    }
    blk->threads[t].sp = sp;
#else
    ucontext_t *c = &blk->threads[t].context;
    getcontext(c);
    c->uc_stack.ss_sp = stack;
    c->uc_stack.ss_size = FAKE_BLOCK_STACK - (t % 64) * 64;
    c->uc_link = NULL;
    makecontext(c, fake_block_thread_main, 0);
#endif
}

static struct fake_block *
fake_block_get(void)
{
    struct fake_block *blk = fake_block_worker;

    if (blk != NULL) {
        return blk;
    }
    blk = calloc(1, sizeof(*blk));
    void *stacks = mmap(NULL, FAKE_BLOCK_THREADS * FAKE_BLOCK_STACK, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (blk == NULL || stacks == MAP_FAILED) {
        fake_complain("no memory for the stacks of a block's threads");
        abort();
    }
    blk->stacks = stacks;
    for (unsigned t = 0; t < FAKE_BLOCK_THREADS; t++) {
        memcpy(fake_block_stack(blk, t), &(uint64_t){FAKE_BLOCK_CANARY}, sizeof(uint64_t));
    }
    blk->current = -1;
    fake_block_worker = blk;
    return blk;
}

/* Every stack a block used still ends in its canary. */
static void
fake_block_check(const struct fake_block *blk)
{
    for (unsigned t = 0; t < blk->used; t++) {
        uint64_t canary;
        memcpy(&canary, fake_block_stack(blk, t), sizeof(canary));
        if (canary != FAKE_BLOCK_CANARY) {
            fake_complain("thread %u of a block overflowed its stack of %zu KiB", t,
                          FAKE_BLOCK_STACK >> 10);
            abort();
        }
    }
}

void
fake_block_free(void)
{
    struct fake_block *blk = fake_block_worker;

    if (blk != NULL) {
        fake_block_check(blk);
        munmap(blk->stacks, FAKE_BLOCK_THREADS * FAKE_BLOCK_STACK);
        free(blk);
        fake_block_worker = NULL;
    }
}

static void
fake_block_divergent(const struct fake_block *blk, unsigned waiting, unsigned other)
{
    const struct fake_thread *w = &blk->threads[waiting], *o = &blk->threads[other];

    if (o->state == FAKE_THREAD_DONE) {
        fake_complain("a divergent barrier (undefined in CUDA): thread %u of the block "
                      "returned while thread %u waits at the __syncthreads at %s:%d", other,
                      waiting, w->file, w->line);
    } else {
        fake_complain("a divergent barrier (undefined in CUDA): thread %u of the block waits "
                      "at the __syncthreads at %s:%d, thread %u at the one at %s:%d", waiting,
                      w->file, w->line, other, o->file, o->line);
    }
    abort();
}

void
fake_block_run(unsigned nthreads, void (*enter)(void *arg, unsigned thread),
               void (*main)(void *arg), void *arg)
{
    struct fake_block *blk = fake_block_get();

    if (nthreads > FAKE_BLOCK_THREADS) {
        fake_complain("a block of %u threads (at most %d)", nthreads, FAKE_BLOCK_THREADS);
        abort();
    }
    blk->nthreads = nthreads;
    blk->enter = enter;
    blk->main = main;
    blk->arg = arg;
    for (unsigned t = 0; t < nthreads; t++) {
        blk->threads[t].state = FAKE_THREAD_READY;
        blk->threads[t].started = false;
    }
    for (;;) {
        /* One round: every thread not done runs to its end or to the barrier. */
        int first_waiting = -1, first_done = -1;
        for (unsigned t = 0; t < nthreads; t++) {
            struct fake_thread *th = &blk->threads[t];
            if (th->state == FAKE_THREAD_DONE) {
                first_done = first_done < 0 ? (int)t : first_done;
                continue;
            }
            if (!th->started) {
                fake_block_start(blk, t);
                th->started = true;
            }
            enter(arg, t);
            blk->current = (int)t;
            fake_block_go(blk, (int)t, -1);
            blk->current = -1;
            if (th->state == FAKE_THREAD_DONE) {
                first_done = first_done < 0 ? (int)t : first_done;
            } else if (first_waiting < 0) {
                first_waiting = (int)t;
            } else {
                const struct fake_thread *w = &blk->threads[first_waiting];
                if (th->line != w->line ||
                    (th->file != w->file && strcmp(th->file, w->file) != 0)) {
                    fake_block_divergent(blk, (unsigned)first_waiting, t);
                }
            }
        }
        if (first_waiting < 0) {
            break; /* every thread returned */
        }
        if (first_done >= 0) {
            fake_block_divergent(blk, (unsigned)first_waiting, (unsigned)first_done);
        }
        for (unsigned t = 0; t < nthreads; t++) {
            blk->threads[t].state = FAKE_THREAD_READY; /* every one waited: all go on */
        }
    }
    blk->used = nthreads > blk->used ? nthreads : blk->used;
    if (++blk->blocks % FAKE_BLOCK_CHECK_EVERY == 0) {
        fake_block_check(blk);
    }
}

void
fake_block_sync(const char *file, int line)
{
    struct fake_block *blk = fake_block_worker;

    if (blk == NULL || blk->current < 0) {
        fake_complain("__syncthreads at %s:%d in a kernel the double runs a thread at a time "
                      "(kernels_cpu.cpp: its table must say it has barriers)", file, line);
        abort();
    }
    int t = blk->current;
    blk->threads[t].state = FAKE_THREAD_WAITING;
    blk->threads[t].file = file;
    blk->threads[t].line = line;
    fake_block_go(blk, -1, t);
}
