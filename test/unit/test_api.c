/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nccl_shim/api.c: what the exported functions read of the user's memory.
 *
 * ncclRedOpCreatePreMulSum with ncclScalarHostImmediate reads exactly ncclTypeSize(datatype)
 * bytes of the scalar, as NCCL does (PyTorch 2.11 counts on nothing more: it passes a 4-byte
 * float for a bfloat16 op, pytorch/pytorch#190745, and gets the bfloat16 of its first two
 * bytes from both libraries). Each scalar here ends where an inaccessible page begins, so a
 * byte more is a crash; the value the op carries is read back through a one-rank all-reduce on
 * host memory, whose result is the input times the scalar.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <nccl.h>

#include "kernels/kernels.h"

enum { COUNT = 5 };

static const ncclDataType_t all_types[] = {
    ncclInt8,    ncclUint8,   ncclInt32,      ncclUint32,     ncclInt64,    ncclUint64,
    ncclFloat16, ncclFloat32, ncclFloat64,    ncclBfloat16,   ncclFloat8e4m3, ncclFloat8e5m2,
};

/* Two pages, the second inaccessible: the last `size` bytes of the first. Freed by
 * guarded_free. */
static uint8_t *
guarded_end(size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *pages = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                          -1, 0);
    cr_assert_neq(pages, MAP_FAILED);
    cr_assert_eq(mprotect(pages + page, page, PROT_NONE), 0);
    return pages + page - size;
}

static void
guarded_free(uint8_t *end, size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    cr_assert_eq(munmap(end + size - page, 2 * page), 0);
}

/* The op made of the scalar at `scalar`, applied to COUNT elements of 3 on one rank: each
 * result must be the element `want` encodes. */
static void
check_premulsum(ncclComm_t comm, ncclDataType_t type, const void *scalar, double want,
                const char *what)
{
    size_t size = kr_type_size(type);
    uint8_t three[8], expect[8], send[COUNT * 8], recv[COUNT * 8];
    ncclRedOp_t op;

    kr_scalar_from_double(type, 3.0, three);
    kr_scalar_from_double(type, want, expect);
    for (int i = 0; i < COUNT; i++) {
        memcpy(send + i * size, three, size);
    }
    memset(recv, 0xa5, sizeof(recv));
    cr_assert_eq(ncclRedOpCreatePreMulSum(&op, (void *)scalar, type, ncclScalarHostImmediate,
                                          comm),
                 ncclSuccess, "%s: %s", what, ncclGetLastError(comm));
    cr_assert_eq(ncclAllReduce(send, recv, COUNT, type, op, comm, NULL), ncclSuccess, "%s: %s",
                 what, ncclGetLastError(comm));
    for (int i = 0; i < COUNT; i++) {
        cr_expect_arr_eq(recv + i * size, expect, size, "%s: element %d is %g, want %g", what,
                         i, kr_scalar_to_double(type, recv + i * size), want);
    }
    cr_assert_eq(ncclRedOpDestroy(op, comm), ncclSuccess);
}

static ncclComm_t
one_rank(void)
{
    ncclComm_t comm;
    cr_assert_eq(ncclCommInitAll(&comm, 1, NULL), ncclSuccess, "%s", ncclGetLastError(NULL));
    return comm;
}

Test(api, premulsum_reads_the_types_size_of_the_scalar, .timeout = 60)
{
    ncclComm_t comm = one_rank();

    for (size_t t = 0; t < sizeof(all_types) / sizeof(all_types[0]); t++) {
        ncclDataType_t type = all_types[t];
        size_t size = kr_type_size(type);
        uint8_t two[8];
        char what[64];

        kr_scalar_from_double(type, 2.0, two);
        uint8_t *scalar = guarded_end(size);
        memcpy(scalar, two, size);
        snprintf(what, sizeof(what), "%s, scalar at a page's end", kr_type_name(type));
        check_premulsum(comm, type, scalar, 6.0, what);
        guarded_free(scalar, size);
    }
    cr_assert_eq(ncclCommDestroy(comm), ncclSuccess);
}

/* PyTorch's float for a half-width op: the first two bytes are the scalar, whatever the float
 * says. 0x3f804000 is 1.001953125f, whose low half 0x4000 is 2 in bfloat16 and in float16; the
 * float read whole (and rounded) would give 3, not 6. */
Test(api, premulsum_of_a_float_for_a_half_width_type_takes_its_first_two_bytes, .timeout = 60)
{
    ncclComm_t comm = one_rank();
    const uint32_t bits = 0x3f804000u;
    float f;

    memcpy(&f, &bits, sizeof(f));
    cr_assert_eq(f, 1.001953125f);
    for (int half = 0; half < 2; half++) {
        ncclDataType_t type = half ? ncclFloat16 : ncclBfloat16;
        uint8_t *scalar = guarded_end(sizeof(f));
        memcpy(scalar, &f, sizeof(f));
        check_premulsum(comm, type, scalar, 6.0,
                        half ? "float16 given a float" : "bfloat16 given a float");
        guarded_free(scalar, sizeof(f));
    }
    cr_assert_eq(ncclCommDestroy(comm), ncclSuccess);
}
