/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a fatbin holds, read from its headers: which GPU architectures it has machine code
 * (cubins) for, and which it has PTX for, that a driver can compile for newer ones. The
 * library asks this of its embedded fatbin before a device call, so that a GPU the kernels
 * cannot run on is a clear error at the call instead of a failed launch later.
 *
 * Layout (nvcc's, as cuobjdump reads it): a 16-byte header (magic 0xba55ed50, version, header
 * size, size of the entries) followed by entries, each a header (kind: 1 PTX, 2 cubin; its
 * own header size; payload size; at byte 28 the architecture, 90 for sm_90) and its payload.
 * Nothing here trusts the bytes: a size that runs past the end stops the walk.
 */
#ifndef KR_FATBIN_TABLE_H
#define KR_FATBIN_TABLE_H

#include <stdbool.h>
#include <stddef.h>

#define KR_FATBIN_MAX_ARCHS 32

struct kr_fatbin_info {
    int ncubins;
    int cubins[KR_FATBIN_MAX_ARCHS]; /* architectures as major * 10 + minor, in file order */
    int nptx;
    int ptx[KR_FATBIN_MAX_ARCHS];
};

/* Reads the entries of the fatbin at image (bytes long); false if it is not one. */
bool kr_fatbin_read(const void *image, size_t bytes, struct kr_fatbin_info *info_out);

/* Whether a GPU of compute capability cc (major * 10 + minor) can run it: a cubin of the
 * same major and a minor not above its own (sm_80 code runs on 8.6), or PTX of an
 * architecture not above it, which the driver compiles. */
bool kr_fatbin_serves(const struct kr_fatbin_info *info, int cc);

/* "sm_75 sm_80 ... sm_121, PTX compute_121" into buf. */
void kr_fatbin_describe(const struct kr_fatbin_info *info, char *buf, size_t size);

#endif
