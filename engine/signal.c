/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every kind of window shares (signal.h).
 */
#include "signal.h"

#include <stdbool.h>

#include "base/check.h"
#include "gpu/driver.h"
#include "gpu/stream.h"

ncclResult_t
shim_signal_check_stream(const struct gpu_device *gpu, cudaStream_t stream, const char *api)
{
    CUcontext ctx;
    bool capturing = false;

    SHIM_CHECK(gpu_stream_ctx(stream, gpu->ordinal, &ctx));
    if (ctx != gpu->ctx) {
        WARN("%s: stream %p is not a stream of the communicator's device %d", api,
             (void *)stream, gpu->ordinal);
        return ncclInvalidArgument;
    }
    SHIM_CHECK(gpu_stream_capturing(stream, ctx, &capturing));
    if (capturing) {
        WARN("%s: stream %p is being captured into a CUDA graph: ncclshim numbers signals when "
             "they are called, and a graph would replay the numbers; run it outside the "
             "capture", api, (void *)stream);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

void
shim_signal_release_waits(volatile uint32_t *words, const uint32_t *counted, size_t nwords)
{
    for (size_t w = 0; words != NULL && w < nwords; w++) {
        if ((int32_t)(counted[w] - words[w]) > 0) {
            __atomic_store_n(&words[w], counted[w], __ATOMIC_RELEASE);
        }
    }
}
