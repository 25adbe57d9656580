/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The parameters of ncclshim's CUDA kernels (reduce_device.cu), shared by the host code that
 * launches them (device.c), the kernels, and the driver test double that emulates them. Plain
 * C: nvcc and gcc must lay it out alike.
 *
 * One launch runs a batch of tasks, one per blockIdx.y. A task reduces nsrc operands
 * element-wise, in operand order, and writes the result to ndst destinations:
 *
 *     acc = pre0(src0[i]); acc = acc OP pre1(src1[i]); ...; acc = post(acc)
 *     dst0[i] = dst1[i] = ... = acc
 *
 * pre is PreMulSum's multiply by the operand's own scalar (applied where the operand's `pre`
 * is set), post SumPostDiv's divide (where the task's `post` is set); OP is the kind's
 * combining operation (sum for both of those kinds). This is the host path's order and
 * rounding (kernels.h), so device and host results are bit-identical. kr_dev_copy runs the
 * same batch with count in bytes and one operand, copied to every destination.
 *
 * The whole batch travels as the kernel's one by-value parameter; its size stays under the
 * 4 KiB that every CUDA 12 driver takes. An operation with more tasks or operands than fit is
 * cut into several launches by the caller.
 *
 * kr_dev_from runs any of them: its one parameter is the device address of a batch in device
 * memory, read when the kernel runs, whose `kernel` says which (a reduction of a type, or the
 * copy). Its launch is enqueued before the batch is known (a device team's leader rank
 * enqueues its GPU's share at its call; the leader's thread builds the batch later, once every
 * rank posted, and may give the launch any operation of the group). One batch may hold the
 * tasks of several launches in sequence (a schedule's levels, cudaipc/levels.h): the launch
 * names its level, and block y runs the y-th task of that level; blocks past them do nothing.
 * kr_dev_signal then writes a list of 32-bit words,
 * also read when it runs, after everything before it on its stream: the done words of the
 * ranks whose operations the batch completed, and last, after a fence, the first word of the
 * list (struct kr_dev_signals).
 */
#ifndef KR_DEVICE_ABI_H
#define KR_DEVICE_ABI_H

#include <stdint.h>

#define KR_DEV_MAX_TASKS 64
#define KR_DEV_MAX_SRCS 64
#define KR_DEV_MAX_DSTS 64

struct kr_dev_src {
    uint64_t ptr;        /* the operand's device address */
    uint64_t scalar_ptr; /* PreMulSum with ncclScalarDevice: the scalar's device address */
    uint64_t scalar;     /* PreMulSum otherwise: the scalar, one element of the type */
    uint32_t pre;        /* apply the pre-operation to this operand */
    uint32_t pad;
};

struct kr_dev_task {
    uint64_t count;      /* elements (bytes for kr_dev_copy) */
    uint16_t first_src;  /* operands srcs[first_src .. first_src + nsrc) */
    uint16_t first_dst;  /* destinations dsts[first_dst .. first_dst + ndst) */
    uint8_t nsrc;
    uint8_t ndst;
    uint8_t post;        /* apply the post-operation to this task's results */
    uint8_t level;       /* kr_dev_from: the launch that runs it (the batch's tasks ascend) */
};

struct kr_dev_batch {
    uint32_t kind;       /* enum kr_op_kind (kernels.h); unused by kr_dev_copy */
    uint32_t ntasks;
    uint32_t pad;
    uint32_t kernel;     /* enum kr_dev_kernel_id: what kr_dev_from runs */
    uint64_t divisor;    /* SumPostDiv */
    struct kr_dev_task tasks[KR_DEV_MAX_TASKS];
    struct kr_dev_src srcs[KR_DEV_MAX_SRCS];
    uint64_t dsts[KR_DEV_MAX_DSTS];
};

/* kr_dev_from's one parameter. */
struct kr_dev_from_args {
    uint64_t batch;      /* device address of a struct kr_dev_batch */
    uint32_t level;      /* the tasks it runs: those of this level */
    uint32_t pad;
};

/* A word per rank of a device team, and one more. */
#define KR_DEV_MAX_SIGNALS 65

/* kr_dev_signal's list. Its contract: once everything before it on its stream is done, it
 * writes words[1 .. n) in no promised order, then, after a fence (__threadfence_system),
 * words[0]. So a reader that sees words[0]'s value (with acquire order) also sees every other
 * word of the list written, and may then write a newer value into one of them: no store of
 * this list lands after it. A reader of any other word learns nothing of the rest. */

struct kr_dev_signal_word {
    uint64_t addr;       /* device address of a 32-bit word in page-locked host memory */
    uint32_t value;
    uint32_t pad;
};

struct kr_dev_signals {
    uint32_t n;
    uint32_t pad;
    struct kr_dev_signal_word words[KR_DEV_MAX_SIGNALS];
};

#ifdef __cplusplus
static_assert(sizeof(struct kr_dev_batch) <= 4000, "kernel parameters above 4 KiB");
#else
_Static_assert(sizeof(struct kr_dev_batch) <= 4000, "kernel parameters above 4 KiB");
#endif

/* Kernel names: "kr_dev_reduce_" followed by one of these, "kr_dev_copy", "kr_dev_from" and
 * "kr_dev_signal". */
#define KR_DEV_TYPE_NAMES(X)                                                                 \
    X(ncclInt8, i8) X(ncclUint8, u8) X(ncclInt32, i32) X(ncclUint32, u32) X(ncclInt64, i64)   \
    X(ncclUint64, u64) X(ncclFloat16, f16) X(ncclFloat32, f32) X(ncclFloat64, f64)           \
    X(ncclBfloat16, bf16) X(ncclFloat8e4m3, e4m3) X(ncclFloat8e5m2, e5m2)

/* The by-value kernels in that order, then the copy: a batch's `kernel`. */
enum kr_dev_kernel_id {
#define KR_DEV_KERNEL_ID(type, suffix) KR_DEV_ID_##suffix,
    KR_DEV_TYPE_NAMES(KR_DEV_KERNEL_ID)
#undef KR_DEV_KERNEL_ID
    KR_DEV_ID_COPY,
    KR_DEV_IDS
};

#endif
