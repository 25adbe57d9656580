/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/fatbin_table.c: a fatbin's table of cubins and PTX read from its headers, which GPUs
 * it serves, and bytes that are not a fatbin (or lie about sizes) read safely. Also the
 * library's own embedded fatbin: CUDA 13's architectures from sm_75, none for sm_70.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "kernels/fatbin_table.h"

/* The embedded fatbin (kernels/fatbin.S). */
extern const unsigned char kr_fatbin_start[];
extern const unsigned char kr_fatbin_end[];

/* A fatbin with one entry per arch (negative: PTX of -arch), each with a 64-byte header and
 * 16 bytes of payload; returns its size. */
static size_t
make_fatbin(uint8_t *buf, const int *archs, int n)
{
    size_t off = 16;

    memset(buf, 0, 16 + (size_t)n * 80);
    for (int i = 0; i < n; i++) {
        uint8_t *e = buf + off;
        uint16_t kind = archs[i] < 0 ? 1 : 2;
        uint32_t head = 64, arch = (uint32_t)(archs[i] < 0 ? -archs[i] : archs[i]);
        uint64_t payload = 16;
        memcpy(e, &kind, 2);
        memcpy(e + 4, &head, 4);
        memcpy(e + 8, &payload, 8);
        memcpy(e + 28, &arch, 4);
        off += 80;
    }
    uint32_t magic = 0xba55ed50u;
    uint16_t version = 1, header = 16;
    uint64_t entries = off - 16;
    memcpy(buf, &magic, 4);
    memcpy(buf + 4, &version, 2);
    memcpy(buf + 6, &header, 2);
    memcpy(buf + 8, &entries, 8);
    return off;
}

Test(fatbin_table, cubins_by_major_ptx_by_order)
{
    const int archs[] = {80, 90, -90};
    uint8_t buf[512];
    struct kr_fatbin_info info;
    char text[128];

    cr_assert(kr_fatbin_read(buf, make_fatbin(buf, archs, 3), &info));
    cr_assert_eq(info.ncubins, 2);
    cr_assert_eq(info.nptx, 1);
    cr_assert(kr_fatbin_serves(&info, 80));
    cr_assert(kr_fatbin_serves(&info, 86), "sm_80 code runs on 8.6");
    cr_assert(kr_fatbin_serves(&info, 90));
    cr_assert(kr_fatbin_serves(&info, 120), "PTX of 9.0 compiles for 12.0");
    cr_assert_not(kr_fatbin_serves(&info, 75), "nothing for 7.5");
    cr_assert_not(kr_fatbin_serves(&info, 70));
    kr_fatbin_describe(&info, text, sizeof(text));
    cr_assert_str_eq(text, "sm_80 sm_90, PTX compute_90");
}

Test(fatbin_table, cubin_only_serves_its_major)
{
    const int archs[] = {90};
    uint8_t buf[128];
    struct kr_fatbin_info info;

    cr_assert(kr_fatbin_read(buf, make_fatbin(buf, archs, 1), &info));
    cr_assert(kr_fatbin_serves(&info, 90));
    cr_assert_not(kr_fatbin_serves(&info, 100), "sm_90 code does not run on 10.0");
    cr_assert_not(kr_fatbin_serves(&info, 89));
}

Test(fatbin_table, bad_bytes_are_read_safely)
{
    const int archs[] = {80, 90};
    uint8_t buf[256];
    struct kr_fatbin_info info;
    size_t size = make_fatbin(buf, archs, 2);

    cr_assert_not(kr_fatbin_read(buf, 8, &info), "shorter than a header");
    buf[0] ^= 1;
    cr_assert_not(kr_fatbin_read(buf, size, &info), "not the magic");
    buf[0] ^= 1;
    /* The table claims more than there is: refused. */
    cr_assert_not(kr_fatbin_read(buf, size - 1, &info));
    /* The second entry's payload runs past the end: the walk stops before it. */
    uint64_t huge = 1u << 20;
    memcpy(buf + 16 + 80 + 8, &huge, 8);
    cr_assert(kr_fatbin_read(buf, size, &info));
    cr_assert_eq(info.ncubins, 1);
    /* An entry header shorter than its fields: nothing read from it. */
    uint32_t tiny = 8;
    memcpy(buf + 16 + 4, &tiny, 4);
    cr_assert(kr_fatbin_read(buf, size, &info));
    cr_assert_eq(info.ncubins + info.nptx, 0);
}

Test(fatbin_table, the_library_s_own)
{
    struct kr_fatbin_info info;
    size_t bytes = (size_t)(kr_fatbin_end - kr_fatbin_start);

    if (bytes == 0) {
        cr_skip_test("built without nvcc");
    }
    cr_assert(kr_fatbin_read(kr_fatbin_start, bytes, &info));
    cr_assert_geq(info.ncubins, 10, "CUDA 13 builds a dozen architectures, found %d",
                  info.ncubins);
    cr_assert_eq(info.nptx, 1);
    for (int cc = 75; cc <= 121; cc++) {
        if (cc % 10 <= 9 && (cc / 10 != 7 || cc == 75)) {
            cr_assert(kr_fatbin_serves(&info, cc), "compute capability %d.%d", cc / 10,
                      cc % 10);
        }
    }
    cr_assert_not(kr_fatbin_serves(&info, 70), "CUDA 13 has no sm_70");
}
