/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclshim's kernels as the fake driver runs them: each task of a batch (kernels/device_abi.h)
 * computed on the stream's worker with the host reductions (kernels/reduce_host.c, linked
 * into the double), which define the element semantics the real kernels must match. Operands
 * are pre-scaled one by one (each may carry its own PreMulSum scalar), then combined in
 * operand order, the post-operation on the last combination, exactly as the contract says.
 */
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"
#include "kernels/device_abi.h"
#include "kernels/kernels.h"

struct fake_kernel {
    const char *name;
    ncclDataType_t type;
    bool copy;
};

static const struct fake_kernel fake_kernels[] = {
#define FAKE_REDUCE_KERNEL(type, suffix) {"kr_dev_reduce_" #suffix, type, false},
    KR_DEV_TYPE_NAMES(FAKE_REDUCE_KERNEL)
#undef FAKE_REDUCE_KERNEL
    {"kr_dev_copy", ncclInt8, true},
};

const struct fake_kernel *
fake_kernel_find(const char *name)
{
    for (size_t i = 0; i < sizeof(fake_kernels) / sizeof(fake_kernels[0]); i++) {
        if (strcmp(fake_kernels[i].name, name) == 0) {
            return &fake_kernels[i];
        }
    }
    return NULL;
}

size_t
fake_kernel_params_bytes(const struct fake_kernel *kernel)
{
    (void)kernel;
    return sizeof(struct kr_dev_batch);
}

static void
fake_task_copy(const struct kr_dev_batch *b, const struct kr_dev_task *t)
{
    const void *src = (const void *)(uintptr_t)b->srcs[t->first_src].ptr;
    for (int d = 0; d < t->ndst; d++) {
        memmove((void *)(uintptr_t)b->dsts[t->first_dst + d], src, t->count);
    }
}

static void
fake_task_reduce(const struct kr_dev_batch *b, const struct kr_dev_task *t, ncclDataType_t type)
{
    size_t size = kr_type_size(type), bytes = t->count * size;
    uint8_t *acc = malloc(bytes ? bytes : 1), *scaled = malloc(bytes ? bytes : 1);
    struct kr_redop op = {.kind = (enum kr_op_kind)b->kind, .type = type,
                          .divisor = b->divisor};

    if (acc == NULL || scaled == NULL) {
        abort(); /* a double has no better answer */
    }
    for (int k = 0; k < t->nsrc; k++) {
        const struct kr_dev_src *s = &b->srcs[t->first_src + k];
        const void *operand = (const void *)(uintptr_t)s->ptr;
        if (s->pre) {
            struct kr_redop pre = op;
            const void *scalar = s->scalar_ptr ? (const void *)(uintptr_t)s->scalar_ptr
                                               : (const void *)&s->scalar;
            memcpy(pre.scalar, scalar, size);
            kr_reduce_host(k == 0 ? acc : scaled, operand, NULL, t->count, &pre, KR_PRE_A);
            operand = k == 0 ? acc : scaled;
        }
        unsigned post = b->post && k == t->nsrc - 1 ? KR_POST : 0;
        if (k == 0) {
            if (operand != acc) {
                memcpy(acc, operand, bytes);
            }
            if (t->nsrc == 1 && post) {
                kr_reduce_host(acc, acc, NULL, t->count, &op, KR_POST);
            }
        } else {
            kr_reduce_host(acc, acc, operand, t->count, &op, post);
        }
    }
    for (int d = 0; d < t->ndst; d++) {
        memmove((void *)(uintptr_t)b->dsts[t->first_dst + d], acc, bytes);
    }
    free(acc);
    free(scaled);
}

void
fake_kernel_run(const struct fake_kernel *kernel, const void *params)
{
    const struct kr_dev_batch *b = params;

    for (uint32_t i = 0; i < b->ntasks; i++) {
        if (kernel->copy) {
            fake_task_copy(b, &b->tasks[i]);
        } else {
            fake_task_reduce(b, &b->tasks[i], kernel->type);
        }
    }
}
