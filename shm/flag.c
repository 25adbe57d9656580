/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Flags between ranks: a counter the owner raises and peers poll, with futex sleep for peers
 * that ran out of patience. The owner wakes only when its sleeper count says someone sleeps,
 * so a rank that never sleeps never pays a system call. Sequentially consistent store and
 * increment on the two sides make the classic lost wakeup impossible: either the sleeper sees
 * the new value, or the owner sees the sleeper (and the kernel's own compare in FUTEX_WAIT
 * covers the gap between the two). The futexes are shared (not FUTEX_PRIVATE): the memory is
 * mapped by several processes.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "region.h"

static long
shm_futex(uint32_t *addr, int op, uint32_t val, const struct timespec *timeout)
{
    return syscall(SYS_futex, addr, op, val, timeout, NULL, 0);
}

void
shm_flag_post(struct shm_flag *flag, uint32_t seq)
{
    __atomic_store_n(&flag->value, seq, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&flag->waiters, __ATOMIC_SEQ_CST) != 0) {
        shm_futex(&flag->value, FUTEX_WAKE, INT_MAX, NULL);
    }
}

void
shm_flag_bump(struct shm_flag *flag)
{
    __atomic_fetch_add(&flag->value, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&flag->waiters, __ATOMIC_SEQ_CST) != 0) {
        shm_futex(&flag->value, FUTEX_WAKE, INT_MAX, NULL);
    }
}

bool
shm_flag_reached(struct shm_flag *flag, uint32_t seq, int peer, struct shm_wait *wait)
{
    uint32_t value = __atomic_load_n(&flag->value, __ATOMIC_ACQUIRE);
    if ((int32_t)(value - seq) >= 0) {
        return true;
    }
    wait->addr = &flag->value;
    wait->waiters = &flag->waiters;
    wait->seen = value;
    wait->peer = peer;
    return false;
}

void
shm_wait_sleep(const struct shm_wait *wait, int timeout_ms)
{
    struct timespec ts = {.tv_sec = timeout_ms / 1000,
                          .tv_nsec = (long)(timeout_ms % 1000) * 1000000L};

    __atomic_fetch_add(wait->waiters, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(wait->addr, __ATOMIC_SEQ_CST) == wait->seen) {
        /* EAGAIN (the value moved), EINTR and ETIMEDOUT all mean: look again. */
        shm_futex(wait->addr, FUTEX_WAIT, wait->seen, timeout_ms < 0 ? NULL : &ts);
    }
    __atomic_fetch_sub(wait->waiters, 1, __ATOMIC_SEQ_CST);
}
