/* SPDX-License-Identifier: Apache-2.0 */
/*
 * from_check: kr_dev_from and kr_dev_signal (kernels/device_abi.h) on whatever driver is there,
 * the way a device team's leader rank alone on its GPU runs them (cudaipc/ownstream.c): a batch
 * built by kr_dev_begin_collect and kr_dev_add, copied into device memory, run by a launch
 * enqueued through kr_dev_launch_from for more tasks and bigger ones than the batch holds, and
 * for one level of it (a decoy task at another level must not run); then
 * kr_dev_signal writing words into page-locked host memory, the first of its list last (the
 * host, watching, must see the rest once it sees that one). Every result is compared bit for
 * bit with the host reductions. A GPU machine has no Criterion, where test_device_kernels
 * checks the same in CI, so tools/gpu-check runs this instead; make test runs it through the
 * driver's double too.
 *
 * Prints one line per failure and `from-check: N passed, M failed`; exits 1 on a failure, 2
 * when it cannot run (no driver, no device, built without kernels).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/driver.h"
#include "kernels/device.h"
#include "kernels/kernels.h"

#define FROM_COUNT 4099 /* vectors and a tail */
#define FROM_SRCS 3

static int passed, failed;

static void
from_expect(bool ok, const char *what)
{
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("from-check: FAILED: %s\n", what);
    }
}

/* Random bytes that are finite, small numbers for every type: each byte's low bits only. */
static void
from_fill(uint8_t *p, size_t bytes, unsigned seed)
{
    for (size_t i = 0; i < bytes; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (uint8_t)((seed >> 16) & 0x1f);
    }
}

static bool
from_cu(CUresult cu, const char *what)
{
    if (cu != CUDA_SUCCESS) {
        printf("from-check: %s failed: CUDA error %d\n", what, (int)cu);
    }
    return cu == CUDA_SUCCESS;
}

/* One reduction of FROM_SRCS operands of type into one destination (in place on the first
 * operand when in_place), or a copy (op NULL) of odd length and alignment. */
static void
from_case(const struct gpu_device *dev, CUstream stream, CUdeviceptr batch_dev,
          const struct kr_redop *op, bool in_place, const char *what)
{
    const size_t es = op != NULL ? kr_type_size(op->type) : 1;
    const size_t count = op != NULL ? FROM_COUNT : FROM_COUNT * 4 + 3;
    const size_t bytes = count * es, shift = op != NULL ? 0 : 1;
    const int nsrc = op != NULL ? FROM_SRCS : 1;
    uint8_t *host = malloc((size_t)(nsrc + 1) * bytes), *got = malloc(bytes);
    uint8_t *want = malloc(bytes);
    CUdeviceptr mem = 0;
    struct kr_dev_launch l;
    struct kr_dev_src srcs[FROM_SRCS];
    char line[160];

    if (host == NULL || got == NULL || want == NULL ||
        !from_cu(gpu_cu.cuMemAlloc(&mem, (size_t)(nsrc + 1) * (bytes + 256)), "cuMemAlloc")) {
        from_expect(false, what);
        goto out;
    }
    for (int k = 0; k <= nsrc; k++) {
        from_fill(host + (size_t)k * bytes, bytes, 7u * (unsigned)k + (unsigned)bytes);
        CUdeviceptr at = mem + (CUdeviceptr)k * (bytes + 256) + shift;
        from_cu(gpu_cu.cuMemcpyAsync(at, (CUdeviceptr)(uintptr_t)(host + (size_t)k * bytes),
                                     bytes, stream), "cuMemcpyAsync in");
        if (k < nsrc) {
            srcs[k] = (struct kr_dev_src){.ptr = at};
        }
    }
    /* The host's result, in operand order. */
    memcpy(want, host, bytes);
    for (int k = 1; op != NULL && k < nsrc; k++) {
        kr_reduce_host(want, want, host + (size_t)k * bytes, count, op, 0);
    }
    uint64_t dst = in_place ? srcs[0].ptr : mem + (CUdeviceptr)nsrc * (bytes + 256) + shift;
    kr_dev_begin_collect(&l, dev, op);
    /* A decoy at level 0, which the launch of level 1 must leave alone. */
    bool ok = kr_dev_add(&l, &srcs[nsrc - 1], 1, &dst, 1, count) == ncclSuccess;
    kr_dev_set_level(&l, 1);
    ok = ok && kr_dev_add(&l, srcs, nsrc, &dst, 1, count) == ncclSuccess;
    ok = ok && from_cu(gpu_cu.cuMemcpyAsync(batch_dev, (CUdeviceptr)(uintptr_t)&l.batch,
                                            sizeof(l.batch), stream), "the batch");
    /* Sized for three tasks of twice the bytes: the rest of the grid must do nothing. */
    ok = ok && kr_dev_launch_from(stream, dev, 2 * bytes, 3, batch_dev, 1) == ncclSuccess;
    ok = ok && from_cu(gpu_cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)got, dst, bytes, stream),
                       "cuMemcpyAsync out");
    ok = ok && from_cu(gpu_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
    snprintf(line, sizeof(line), "%s: %s", what, ok ? "a result differs" : "did not run");
    from_expect(ok && memcmp(got, want, bytes) == 0, line);
out:
    if (mem != 0) {
        gpu_cu.cuMemFree(mem);
    }
    free(host);
    free(got);
    free(want);
}

/* kr_dev_signal: FROM_WORDS words, a cache line apart, in page-locked host memory, each
 * launch watched from the host while it runs: once words[0] is seen, every other word of the
 * list must be there (device_abi.h: words[0] goes last, after a fence), and after the stream,
 * every word and nothing past them. */
#define FROM_WORDS 16
#define FROM_SIGNAL_LAUNCHES 8

static void
from_signal(const struct gpu_device *dev, CUstream stream, CUdeviceptr batch_dev)
{
    struct kr_dev_signals signals = {.n = FROM_WORDS};
    uint32_t *words = aligned_alloc(4096, 4096);
    CUdeviceptr words_dev = 0;
    bool ok = words != NULL, ordered = true;

    if (ok) {
        memset(words, 0, 4096);
        ok = from_cu(gpu_cu.cuMemHostRegister(words, 4096, CU_MEMHOSTREGISTER_DEVICEMAP),
                     "cuMemHostRegister") &&
             from_cu(gpu_cu.cuMemHostGetDevicePointer(&words_dev, words, 0),
                     "cuMemHostGetDevicePointer");
    }
    for (uint32_t l = 0; ok && l < FROM_SIGNAL_LAUNCHES; l++) {
        const uint32_t first = 1000 * (l + 1);
        for (uint32_t i = 0; i < signals.n; i++) {
            signals.words[i] = (struct kr_dev_signal_word){.addr = words_dev + 64 * i,
                                                           .value = first + i};
        }
        ok = from_cu(gpu_cu.cuMemcpyAsync(batch_dev, (CUdeviceptr)(uintptr_t)&signals,
                                          sizeof(signals), stream), "the signals") &&
             from_cu(gpu_cu.cuStreamSynchronize(stream), "cuStreamSynchronize") &&
             kr_dev_signal_from(stream, dev, batch_dev) == ncclSuccess;
        while (ok && __atomic_load_n(&words[0], __ATOMIC_ACQUIRE) != first &&
               gpu_cu.cuStreamQuery(stream) == CUDA_ERROR_NOT_READY) {
        }
        for (uint32_t i = 1; ok && i < signals.n; i++) {
            ordered &= __atomic_load_n(&words[0], __ATOMIC_ACQUIRE) != first ||
                       __atomic_load_n(&words[16 * i], __ATOMIC_ACQUIRE) == first + i;
        }
        ok = ok && from_cu(gpu_cu.cuStreamSynchronize(stream), "cuStreamSynchronize");
        for (uint32_t i = 0; ok && i < signals.n; i++) {
            ok = __atomic_load_n(&words[16 * i], __ATOMIC_ACQUIRE) == first + i;
        }
        ok = ok && words[16 * signals.n] == 0;
    }
    from_expect(ok, "kr_dev_signal's words");
    from_expect(ok && ordered, "kr_dev_signal's words[0] seen before the rest of its list");
    if (words_dev != 0) {
        gpu_cu.cuMemHostUnregister(words);
    }
    free(words);
}

int
main(void)
{
    static const ncclDataType_t types[] = {ncclInt8,    ncclUint8,   ncclInt32,  ncclUint32,
                                           ncclInt64,   ncclUint64,  ncclFloat16, ncclFloat32,
                                           ncclFloat64, ncclBfloat16};
    static const enum kr_op_kind kinds[] = {KR_SUM, KR_PROD, KR_MAX, KR_MIN};
    const struct gpu_device *dev;
    CUstream stream;
    CUdeviceptr batch_dev;
    char what[96];

    if (!kr_dev_available() || !gpu_driver_present() || gpu_device_get(0, &dev) != ncclSuccess ||
        kr_dev_check_device("from_check", dev) != ncclSuccess || gpu_ctx_push(dev->ctx) != ncclSuccess ||
        !from_cu(gpu_cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate") ||
        !from_cu(gpu_cu.cuMemAlloc(&batch_dev, sizeof(struct kr_dev_batch)), "cuMemAlloc")) {
        printf("from-check: cannot run here (no kernels, driver or device)\n");
        return 2;
    }
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
            struct kr_redop op = {.kind = kinds[k], .type = types[t], .divisor = 1};
            snprintf(what, sizeof(what), "%s op %d%s", kr_type_name(types[t]), (int)kinds[k],
                     t % 2 ? " in place" : "");
            from_case(dev, stream, batch_dev, &op, t % 2 == 1, what);
        }
    }
    from_case(dev, stream, batch_dev, NULL, false, "a copy one byte off");
    from_signal(dev, stream, batch_dev);
    printf("from-check: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
