/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What tests may ask of the fake driver, by dlsym on the library the process loaded as
 * libcuda.so.1 (absent from a real driver, so a test knows which one it runs on):
 *   fake_cuda_get_stats   how many streams, events, registrations, IPC mappings and modules
 *                         are alive, and how many kernels were launched;
 *   fake_cuda_set_capturing  puts a stream in (or out of) the graph-capturing state;
 *   fake_cuda_set_store_hook  calls a function after each kernel store of a word that others
 *                         read is applied (stores.c), in the order they are applied, so a test
 *                         checks the order without guessing it from timing (NULL: no more).
 */
#include "fake_cuda.h"

struct fake_cuda_stats fake_stats;
pthread_mutex_t fake_stats_lock = PTHREAD_MUTEX_INITIALIZER;

void fake_stream_set_capturing(CUstream handle, bool capturing);

FAKE_API void
fake_cuda_get_stats(struct fake_cuda_stats *out)
{
    pthread_mutex_lock(&fake_stats_lock);
    *out = fake_stats;
    pthread_mutex_unlock(&fake_stats_lock);
}

FAKE_API void
fake_cuda_set_capturing(CUstream stream, int capturing)
{
    fake_stream_set_capturing(stream, capturing != 0);
}

FAKE_API void
fake_cuda_set_store_hook(void (*hook)(void *arg, const uint32_t *word, uint32_t value),
                         void *arg)
{
    fake_store_set_hook(hook, arg);
}
