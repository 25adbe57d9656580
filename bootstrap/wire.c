/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Encoders and parsers for the bootstrap's unique id, hello and reply (layouts in
 * wire.h). Pure functions over byte buffers: they never read past `len`, never
 * allocate and never log, so a fuzzer can call them on anything. bootstrap.c calls them and
 * turns a refusal into a WARN.
 */
#include "wire.h"

#include <stdio.h>
#include <string.h>

/* Byte offsets in the unique id. */
enum {
    SHIM_ID_MAGIC = 0,
    SHIM_ID_VERSION = 4,
    SHIM_ID_FLAGS = 6,
    SHIM_ID_SECRET = 8,
    SHIM_ID_FAMILY = 16,
    SHIM_ID_PORT = 18,
    SHIM_ID_SCOPE = 20,
    SHIM_ID_ADDR = 24,
    SHIM_ID_CHECK = 40,
    SHIM_ID_END = 48,
};

static uint16_t
shim_wire_get_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static void
shim_wire_put_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static uint64_t
shim_wire_get_u64(const uint8_t *p)
{
    return (uint64_t)shim_wire_get_u32(p) << 32 | shim_wire_get_u32(p + 4);
}

static void
shim_wire_put_u64(uint8_t *p, uint64_t v)
{
    shim_wire_put_u32(p, (uint32_t)(v >> 32));
    shim_wire_put_u32(p + 4, (uint32_t)v);
}

uint64_t
shim_wire_hash(const void *data, size_t len, uint64_t seed)
{
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ULL ^ seed;

    for (size_t i = 0; i < len; i++) {
        h = (h ^ p[i]) * 0x100000001b3ULL;
    }
    /* FNV alone mixes the last bytes poorly; murmur3's finalizer spreads them over all bits. */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

void
shim_wire_id_encode(const struct shim_wire_id *wid, ncclUniqueId *id_out)
{
    uint8_t *p = (uint8_t *)id_out->internal;

    memset(p, 0, sizeof(id_out->internal));
    shim_wire_put_u32(p + SHIM_ID_MAGIC, SHIM_WIRE_ID_MAGIC);
    shim_wire_put_u16(p + SHIM_ID_VERSION, SHIM_WIRE_VERSION);
    shim_wire_put_u16(p + SHIM_ID_FLAGS, wid->flags);
    shim_wire_put_u64(p + SHIM_ID_SECRET, wid->secret);
    if (wid->root.sa.sa_family == AF_INET6) {
        p[SHIM_ID_FAMILY] = 6;
        memcpy(p + SHIM_ID_PORT, &wid->root.in6.sin6_port, 2); /* already big-endian */
        shim_wire_put_u32(p + SHIM_ID_SCOPE, wid->root.in6.sin6_scope_id);
        memcpy(p + SHIM_ID_ADDR, &wid->root.in6.sin6_addr, 16);
    } else {
        p[SHIM_ID_FAMILY] = 4;
        memcpy(p + SHIM_ID_PORT, &wid->root.in4.sin_port, 2);
        memcpy(p + SHIM_ID_ADDR, &wid->root.in4.sin_addr, 4);
    }
    shim_wire_put_u64(p + SHIM_ID_CHECK, shim_wire_hash(p, SHIM_ID_CHECK, 0));
}

bool
shim_wire_id_decode(const ncclUniqueId *id, struct shim_wire_id *wid_out, char *why,
                    size_t why_len)
{
    const uint8_t *p = (const uint8_t *)id->internal;
    uint32_t magic = shim_wire_get_u32(p + SHIM_ID_MAGIC);
    uint16_t version = shim_wire_get_u16(p + SHIM_ID_VERSION);
    struct shim_wire_id wid;

    if (magic != SHIM_WIRE_ID_MAGIC) {
        snprintf(why, why_len, "magic 0x%08x, expected 0x%08x: not an id from this library's "
                 "ncclGetUniqueId", magic, SHIM_WIRE_ID_MAGIC);
        return false;
    }
    if (version != SHIM_WIRE_VERSION) {
        snprintf(why, why_len, "format version %u; this library reads version %u",
                 (unsigned)version, SHIM_WIRE_VERSION);
        return false;
    }
    uint64_t check = shim_wire_get_u64(p + SHIM_ID_CHECK);
    if (check != shim_wire_hash(p, SHIM_ID_CHECK, 0)) {
        snprintf(why, why_len, "check 0x%016llx does not match its contents: the id was "
                 "altered or truncated", (unsigned long long)check);
        return false;
    }
    memset(&wid, 0, sizeof(wid));
    wid.flags = shim_wire_get_u16(p + SHIM_ID_FLAGS);
    wid.secret = shim_wire_get_u64(p + SHIM_ID_SECRET);
    if (p[SHIM_ID_FAMILY] == 4) {
        wid.root.in4.sin_family = AF_INET;
        memcpy(&wid.root.in4.sin_port, p + SHIM_ID_PORT, 2);
        memcpy(&wid.root.in4.sin_addr, p + SHIM_ID_ADDR, 4);
    } else if (p[SHIM_ID_FAMILY] == 6) {
        wid.root.in6.sin6_family = AF_INET6;
        memcpy(&wid.root.in6.sin6_port, p + SHIM_ID_PORT, 2);
        wid.root.in6.sin6_scope_id = shim_wire_get_u32(p + SHIM_ID_SCOPE);
        memcpy(&wid.root.in6.sin6_addr, p + SHIM_ID_ADDR, 16);
    } else {
        snprintf(why, why_len, "address family %u; expected 4 or 6", (unsigned)p[SHIM_ID_FAMILY]);
        return false;
    }
    if (shim_wire_get_u16(p + SHIM_ID_PORT) == 0) {
        snprintf(why, why_len, "port 0");
        return false;
    }
    *wid_out = wid;
    return true;
}

uint64_t
shim_wire_id_hash(const ncclUniqueId *id)
{
    uint8_t copy[sizeof(id->internal)];

    memcpy(copy, id->internal, sizeof(copy));
    if (shim_wire_get_u16(copy + SHIM_ID_FLAGS) & SHIM_WIRE_ID_FROM_ENV) {
        memset(copy + SHIM_ID_FAMILY, 0, SHIM_ID_END - SHIM_ID_FAMILY);
    }
    return shim_wire_hash(copy, sizeof(copy), 0);
}

void
shim_wire_hello_encode(const struct shim_wire_hello *hello, uint8_t out[SHIM_WIRE_HELLO_BYTES])
{
    memset(out, 0, SHIM_WIRE_HELLO_BYTES);
    shim_wire_put_u32(out, SHIM_WIRE_HELLO_MAGIC);
    shim_wire_put_u16(out + 4, SHIM_WIRE_VERSION);
    shim_wire_put_u64(out + 8, hello->secret);
    shim_wire_put_u32(out + 16, hello->nranks);
    shim_wire_put_u32(out + 20, hello->rank);
    shim_wire_put_u32(out + 24, hello->blob_len);
}

enum shim_wire_parse
shim_wire_hello_parse(const uint8_t *buf, size_t len, struct shim_wire_hello *hello_out,
                      size_t *need_out, char *why, size_t why_len)
{
    struct shim_wire_hello hello;

    if (len < SHIM_WIRE_HELLO_BYTES) {
        *need_out = SHIM_WIRE_HELLO_BYTES;
        return SHIM_WIRE_SHORT;
    }
    uint32_t magic = shim_wire_get_u32(buf);
    uint16_t version = shim_wire_get_u16(buf + 4);
    if (magic != SHIM_WIRE_HELLO_MAGIC || version != SHIM_WIRE_VERSION) {
        snprintf(why, why_len, "not a hello: magic 0x%08x version %u", magic, (unsigned)version);
        return SHIM_WIRE_BAD;
    }
    hello.secret = shim_wire_get_u64(buf + 8);
    hello.nranks = shim_wire_get_u32(buf + 16);
    hello.rank = shim_wire_get_u32(buf + 20);
    hello.blob_len = shim_wire_get_u32(buf + 24);
    hello.blob = NULL;
    if (hello.nranks == 0 || hello.nranks > SHIM_WIRE_MAX_NRANKS || hello.rank >= hello.nranks) {
        snprintf(why, why_len, "rank %u of %u is out of range (at most %u ranks)", hello.rank,
                 hello.nranks, SHIM_WIRE_MAX_NRANKS);
        return SHIM_WIRE_BAD;
    }
    if (hello.blob_len > SHIM_WIRE_MAX_BLOB) {
        snprintf(why, why_len, "blob of %u bytes is over the limit of %u", hello.blob_len,
                 SHIM_WIRE_MAX_BLOB);
        return SHIM_WIRE_BAD;
    }
    size_t need = SHIM_WIRE_HELLO_BYTES + (size_t)hello.blob_len;
    *need_out = need;
    if (len > need) {
        snprintf(why, why_len, "%zu bytes follow the hello", len - need);
        return SHIM_WIRE_BAD;
    }
    if (len == need) {
        hello.blob = buf + SHIM_WIRE_HELLO_BYTES;
    }
    *hello_out = hello;
    return len == need ? SHIM_WIRE_OK : SHIM_WIRE_SHORT;
}

void
shim_wire_reply_encode(const struct shim_wire_reply *reply, uint8_t out[SHIM_WIRE_REPLY_BYTES])
{
    memset(out, 0, SHIM_WIRE_REPLY_BYTES);
    shim_wire_put_u32(out, SHIM_WIRE_REPLY_MAGIC);
    shim_wire_put_u16(out + 4, SHIM_WIRE_VERSION);
    shim_wire_put_u16(out + 6, reply->status);
    shim_wire_put_u32(out + 8, reply->nranks);
    for (int i = 0; i < 3; i++) {
        shim_wire_put_u32(out + 12 + 4 * i, reply->arg[i]);
    }
    shim_wire_put_u64(out + 24, reply->session);
    shim_wire_put_u64(out + 32, reply->data_len);
}

enum shim_wire_parse
shim_wire_reply_parse(const uint8_t *buf, size_t len, uint32_t nranks,
                      struct shim_wire_reply *reply_out, size_t *need_out, char *why,
                      size_t why_len)
{
    struct shim_wire_reply reply;
    size_t need;

    if (len < SHIM_WIRE_REPLY_BYTES) {
        *need_out = SHIM_WIRE_REPLY_BYTES;
        return SHIM_WIRE_SHORT;
    }
    uint32_t magic = shim_wire_get_u32(buf);
    uint16_t version = shim_wire_get_u16(buf + 4);
    if (magic != SHIM_WIRE_REPLY_MAGIC || version != SHIM_WIRE_VERSION) {
        snprintf(why, why_len, "not a reply: magic 0x%08x version %u", magic, (unsigned)version);
        return SHIM_WIRE_BAD;
    }
    memset(&reply, 0, sizeof(reply));
    reply.status = shim_wire_get_u16(buf + 6);
    reply.nranks = shim_wire_get_u32(buf + 8);
    for (int i = 0; i < 3; i++) {
        reply.arg[i] = shim_wire_get_u32(buf + 12 + 4 * i);
    }
    reply.session = shim_wire_get_u64(buf + 24);
    reply.data_len = shim_wire_get_u64(buf + 32);

    switch (reply.status) {
    case SHIM_WIRE_STATUS_OK:
        if (reply.nranks != nranks) {
            snprintf(why, why_len, "a table of %u ranks, expected %u", reply.nranks, nranks);
            return SHIM_WIRE_BAD;
        }
        if (reply.data_len > SHIM_WIRE_MAX_TABLE ||
            reply.data_len > (uint64_t)nranks * SHIM_WIRE_MAX_BLOB) {
            snprintf(why, why_len, "a table of %llu bytes, over the limit",
                     (unsigned long long)reply.data_len);
            return SHIM_WIRE_BAD;
        }
        need = SHIM_WIRE_REPLY_BYTES + 4 * (size_t)nranks + (size_t)reply.data_len;
        break;
    case SHIM_WIRE_STATUS_DUP_RANK:
    case SHIM_WIRE_STATUS_NRANKS:
    case SHIM_WIRE_STATUS_TOO_BIG:
        if (reply.data_len != 0) {
            snprintf(why, why_len, "a refusal (status %u) with %llu bytes of table",
                     (unsigned)reply.status, (unsigned long long)reply.data_len);
            return SHIM_WIRE_BAD;
        }
        need = SHIM_WIRE_REPLY_BYTES;
        break;
    default:
        snprintf(why, why_len, "unknown status %u", (unsigned)reply.status);
        return SHIM_WIRE_BAD;
    }
    *need_out = need;
    if (len > need) {
        snprintf(why, why_len, "%zu bytes follow the reply", len - need);
        return SHIM_WIRE_BAD;
    }
    if (len < need) {
        *reply_out = reply;
        return SHIM_WIRE_SHORT;
    }
    if (reply.status == SHIM_WIRE_STATUS_OK) {
        uint64_t sum = 0;
        reply.lens = buf + SHIM_WIRE_REPLY_BYTES;
        reply.data = reply.lens + 4 * (size_t)nranks;
        for (uint32_t i = 0; i < nranks; i++) {
            uint32_t blob_len = shim_wire_get_u32(reply.lens + 4 * (size_t)i);
            if (blob_len > SHIM_WIRE_MAX_BLOB) {
                snprintf(why, why_len, "blob %u of %u bytes is over the limit", i, blob_len);
                return SHIM_WIRE_BAD;
            }
            sum += blob_len;
        }
        if (sum != reply.data_len) {
            snprintf(why, why_len, "blob lengths add up to %llu, the header says %llu",
                     (unsigned long long)sum, (unsigned long long)reply.data_len);
            return SHIM_WIRE_BAD;
        }
    }
    *reply_out = reply;
    return SHIM_WIRE_OK;
}

void
shim_wire_status_str(const struct shim_wire_reply *reply, char *buf, size_t len)
{
    switch (reply->status) {
    case SHIM_WIRE_STATUS_OK:
        snprintf(buf, len, "no error");
        break;
    case SHIM_WIRE_STATUS_DUP_RANK:
        snprintf(buf, len, "rank %u joined twice (two processes were given the same rank)",
                 reply->arg[0]);
        break;
    case SHIM_WIRE_STATUS_NRANKS:
        snprintf(buf, len, "rank %u says there are %u ranks, the first rank to join said %u",
                 reply->arg[0], reply->arg[1], reply->arg[2]);
        break;
    case SHIM_WIRE_STATUS_TOO_BIG:
        snprintf(buf, len, "the ranks' blobs add up to more than %llu bytes",
                 (unsigned long long)SHIM_WIRE_MAX_TABLE);
        break;
    default:
        snprintf(buf, len, "unknown status %u", (unsigned)reply->status);
        break;
    }
}
