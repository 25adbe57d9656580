/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Kernel stores to words that another agent reads (kr_dev_store_word in
 * kernels/reduce_device.cu: the done words in page-locked host memory), ordered no more than
 * CUDA orders them. A GPU thread's stores to system memory reach the host in no promised order
 * and after a while; __threadfence_system() orders the thread's stores before it against those
 * after it, and a kernel's end orders all of them before the stream's later work. So the double
 * holds each such store; the thread's fence applies that thread's held stores, the kernel's
 * end what is left, each time in a random order with a random delay between two stores
 * (uniform up to twice FAKE_CUDA_STORE_DELAY_US, default 20 us; 0: none; the worker's timer
 * slack is 1 us meanwhile, so that a sleep lasts about what it asks), on the stream's worker
 * while the kernel runs. Host code that reads one word and takes another, unfenced one of the
 * same kernel as written sees the truth: it may not be yet.
 *
 * The order comes from a generator per worker, seeded from the process's seed
 * (FAKE_CUDA_STORE_SEED, else the pid and the time), which the complaints here print; the
 * delays, and so what a reader sees, depend on timing as well.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

struct fake_held {
    uint32_t *word;  /* the double's address of it */
    uint32_t value;
    uint64_t thread; /* the kernel's thread that stored it */
};

/* One per worker thread: its launch's held stores, and its generator. */
struct fake_stores {
    struct fake_held *held;
    size_t n, cap;
    uint64_t rng;
};

static __thread struct fake_stores fake_stores;
/* A test's witness of every store applied (test.c), or NULL. */
static void (*fake_store_hook)(void *arg, const uint32_t *word, uint32_t value);
static void *fake_store_hook_arg;
static uint64_t fake_stores_seed;
static pthread_once_t fake_stores_once = PTHREAD_ONCE_INIT;
static uint64_t fake_stores_workers; /* atomic: generators seeded */

static void
fake_stores_setup(void)
{
    const char *text = getenv("FAKE_CUDA_STORE_SEED");
    struct timespec now;

    if (text != NULL && text[0] != '\0') {
        fake_stores_seed = strtoull(text, NULL, 0);
        return;
    }
    clock_gettime(CLOCK_REALTIME, &now);
    fake_stores_seed = (uint64_t)getpid() << 32 ^ (uint64_t)now.tv_sec * 1000000000u ^
                       (uint64_t)now.tv_nsec;
}

/* splitmix64 over the worker's state. */
static uint64_t
fake_stores_next(struct fake_stores *s)
{
    uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static struct fake_stores *
fake_stores_worker(void)
{
    struct fake_stores *s = &fake_stores;

    if (s->rng == 0) {
        pthread_once(&fake_stores_once, fake_stores_setup);
        uint64_t worker = __atomic_add_fetch(&fake_stores_workers, 1, __ATOMIC_RELAXED);
        s->rng = (fake_stores_seed ^ worker * 0xd1b54a32d192ed03ull) | 1;
    }
    return s;
}

void
fake_store_word(uint64_t addr, uint32_t value, uint64_t thread)
{
    struct fake_stores *s = fake_stores_worker();
    uintptr_t word = fake_mem_op_target(addr);

    if (word == 0) {
        fake_complain("kernel thread %llu stores a word at 0x%llx, which is not device memory "
                      "or registered host memory (store order seed %llu)",
                      (unsigned long long)thread, (unsigned long long)addr,
                      (unsigned long long)fake_stores_seed);
        abort();
    }
    /* A thread's stores to one word are seen in its order (coherence): the later replaces
     * the held one. */
    for (size_t i = 0; i < s->n; i++) {
        if (s->held[i].word == (uint32_t *)word && s->held[i].thread == thread) {
            s->held[i].value = value;
            return;
        }
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct fake_held *held = realloc(s->held, cap * sizeof(*held));
        if (held == NULL) {
            fake_complain("no memory to hold a kernel's stores");
            abort();
        }
        s->held = held;
        s->cap = cap;
    }
    s->held[s->n++] = (struct fake_held){.word = (uint32_t *)word, .value = value,
                                         .thread = thread};
}

/* Applies the held stores of `thread` (all: every one), in a random order, a random delay
 * between two. */
static void
fake_stores_apply(bool all, uint64_t thread)
{
    struct fake_stores *s = fake_stores_worker();
    int delay_us = fake_config()->store_delay_us;
    size_t n = 0;

    /* The ones to apply to the front. */
    for (size_t i = 0; i < s->n; i++) {
        if (all || s->held[i].thread == thread) {
            struct fake_held h = s->held[i];
            s->held[i] = s->held[n];
            s->held[n++] = h;
        }
    }
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(fake_stores_next(s) % i);
        struct fake_held h = s->held[i - 1];
        s->held[i - 1] = s->held[j];
        s->held[j] = h;
    }
    /* Short sleeps that last what they ask, for this while only: the worker's other sleeps
     * (polling a stream wait) keep the default slack, which spares wakeups. */
    int slack = n > 1 && delay_us > 0 ? prctl(PR_GET_TIMERSLACK, 0UL, 0UL, 0UL, 0UL) : -1;
    if (slack >= 0) {
        prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    }
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && delay_us > 0) {
            uint64_t ns = fake_stores_next(s) % (2000u * (uint64_t)delay_us + 1);
            struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
            nanosleep(&ts, NULL);
        }
        __atomic_store_n(s->held[i].word, s->held[i].value, __ATOMIC_RELEASE);
        void (*hook)(void *, const uint32_t *, uint32_t) =
            __atomic_load_n(&fake_store_hook, __ATOMIC_ACQUIRE);
        if (hook != NULL) {
            hook(fake_store_hook_arg, s->held[i].word, s->held[i].value);
        }
    }
    if (slack >= 0) {
        prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0UL, 0UL, 0UL);
    }
    memmove(s->held, s->held + n, (s->n - n) * sizeof(*s->held));
    s->n -= n;
}

void
fake_store_fence(uint64_t thread)
{
    fake_stores_apply(false, thread);
}

void
fake_store_kernel_end(void)
{
    if (fake_stores.n > 0) {
        fake_stores_apply(true, 0);
    }
}

void
fake_store_set_hook(void (*hook)(void *arg, const uint32_t *word, uint32_t value), void *arg)
{
    __atomic_store_n(&fake_store_hook, NULL, __ATOMIC_RELEASE);
    fake_store_hook_arg = arg;
    __atomic_store_n(&fake_store_hook, hook, __ATOMIC_RELEASE);
}

void
fake_store_free(void)
{
    free(fake_stores.held);
    fake_stores = (struct fake_stores){0};
}
