/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading a fatbin's table of entries (fatbin_table.h).
 */
#include "fatbin_table.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KR_FATBIN_MAGIC 0xba55ed50u
#define KR_FATBIN_KIND_PTX 1
#define KR_FATBIN_KIND_CUBIN 2
#define KR_FATBIN_ENTRY_MIN 32 /* an entry header reaches at least its architecture field */

static uint64_t
kr_fatbin_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) {
        v = v << 8 | p[i];
    }
    return v;
}

bool
kr_fatbin_read(const void *image, size_t bytes, struct kr_fatbin_info *info_out)
{
    const uint8_t *p = image;
    struct kr_fatbin_info info = {0};

    if (bytes < 16 || kr_fatbin_le(p, 4) != KR_FATBIN_MAGIC) {
        return false;
    }
    uint64_t header = kr_fatbin_le(p + 6, 2), entries = kr_fatbin_le(p + 8, 8);
    if (header < 16 || header > bytes || entries > bytes - header) {
        return false;
    }
    uint64_t end = header + entries;
    for (uint64_t off = header; end - off >= KR_FATBIN_ENTRY_MIN;) {
        const uint8_t *e = p + off;
        uint64_t kind = kr_fatbin_le(e, 2), ehead = kr_fatbin_le(e + 4, 4);
        uint64_t payload = kr_fatbin_le(e + 8, 8);
        int arch = (int)kr_fatbin_le(e + 28, 4);
        if (ehead < KR_FATBIN_ENTRY_MIN || ehead > end - off || payload > end - off - ehead) {
            break;
        }
        if (kind == KR_FATBIN_KIND_CUBIN && info.ncubins < KR_FATBIN_MAX_ARCHS) {
            info.cubins[info.ncubins++] = arch;
        } else if (kind == KR_FATBIN_KIND_PTX && info.nptx < KR_FATBIN_MAX_ARCHS) {
            info.ptx[info.nptx++] = arch;
        }
        off += ehead + payload;
    }
    *info_out = info;
    return true;
}

bool
kr_fatbin_serves(const struct kr_fatbin_info *info, int cc)
{
    for (int i = 0; i < info->ncubins; i++) {
        if (info->cubins[i] / 10 == cc / 10 && info->cubins[i] % 10 <= cc % 10) {
            return true;
        }
    }
    for (int i = 0; i < info->nptx; i++) {
        if (info->ptx[i] <= cc) {
            return true;
        }
    }
    return false;
}

void
kr_fatbin_describe(const struct kr_fatbin_info *info, char *buf, size_t size)
{
    size_t used = 0;

    buf[0] = '\0';
    for (int i = 0; i < info->ncubins + info->nptx && used < size; i++) {
        bool ptx = i >= info->ncubins;
        int arch = ptx ? info->ptx[i - info->ncubins] : info->cubins[i];
        int n = snprintf(buf + used, size - used, "%s%s%d", used ? (ptx ? ", " : " ") : "",
                         ptx ? "PTX compute_" : "sm_", arch);
        used += n > 0 ? (size_t)n : 0;
    }
    if (used == 0) {
        snprintf(buf, size, "no kernels");
    }
}
