/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer harness for every parser in bootstrap/wire.h: the unique id decoder,
 * the hello a rank sends the root and the root's reply (header, refusal or table). Built by
 * `make fuzz` with clang -fsanitize=fuzzer,address,undefined against bootstrap/wire.c alone.
 *
 * The first input byte picks a mode, the rest is the payload:
 *   0 id, raw: the payload is the 128-byte id (zero-padded or cut).
 *   1 id, sealed: the same with our magic, version and a correct check written in, so the
 *     fuzzer explores family, port and flags instead of fighting the hash. Here decode must
 *     succeed exactly when the family is 4 or 6 and the port is not 0.
 *   2 hello, raw: the payload as bytes from the wire.
 *   3 reply, raw: a big-endian u32 nranks, then the bytes from the wire.
 *   4 hello, encoded: the payload gives the fields and the blob; encode, then parse.
 *   5 reply, encoded: the payload gives nranks (0..16), the blob lengths and a session; a
 *     table is laid out as the root does, then parsed, and every prefix of it too.
 * Invariants checked (abort on violation, which libFuzzer reports as a crash): a parse that
 * succeeds yields in-range ranks and lengths that account for every byte; pointers it returns
 * lie inside the buffer; re-encoding a parsed header gives back the canonical bytes; a prefix
 * of a valid message is SHORT, never BAD, and asks for the whole length; a refusal always says
 * why, NUL-terminated, inside the why buffer.
 */
#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap/wire.h"

#include "fuzz_check.h"

#define FUZZ_WHY_POISON 0xa5

static uint64_t
fuzz_get_u64(const uint8_t *p)
{
    return (uint64_t)shim_wire_get_u32(p) << 32 | shim_wire_get_u32(p + 4);
}

static void
fuzz_put_u64(uint8_t *p, uint64_t v)
{
    shim_wire_put_u32(p, (uint32_t)(v >> 32));
    shim_wire_put_u32(p + 4, (uint32_t)v);
}

static void
fuzz_why_reset(char *why)
{
    memset(why, FUZZ_WHY_POISON, SHIM_WIRE_WHY_LEN);
}

/* A refusal wrote a non-empty, terminated message inside the buffer. */
static void
fuzz_why_check(const char *why)
{
    const char *end = memchr(why, '\0', SHIM_WIRE_WHY_LEN);
    FUZZ_CHECK(end != NULL);
    FUZZ_CHECK(end > why);
}

/* ---- the unique id ------------------------------------------------------------------- */

static void
fuzz_id_check(const ncclUniqueId *id, bool sealed)
{
    const uint8_t *p = (const uint8_t *)id->internal;
    struct shim_wire_id wid;
    char why[SHIM_WIRE_WHY_LEN];

    fuzz_why_reset(why);
    memset(&wid, 0x5a, sizeof(wid));
    bool ok = shim_wire_id_decode(id, &wid, why, sizeof(why));
    uint16_t port = (uint16_t)(p[18] << 8 | p[19]);
    if (sealed) {
        FUZZ_CHECK(ok == ((p[16] == 4 || p[16] == 6) && port != 0));
    }
    /* The hash reads the id whatever it holds, and is a function of it. */
    FUZZ_CHECK(shim_wire_id_hash(id) == shim_wire_id_hash(id));
    if (!ok) {
        fuzz_why_check(why);
        return;
    }

    FUZZ_CHECK(shim_wire_get_u32(p) == SHIM_WIRE_ID_MAGIC);
    FUZZ_CHECK(wid.secret == fuzz_get_u64(p + 8));
    FUZZ_CHECK(wid.flags == (uint16_t)(p[6] << 8 | p[7]));
    if (p[16] == 4) {
        FUZZ_CHECK(wid.root.sa.sa_family == AF_INET);
        FUZZ_CHECK(ntohs(wid.root.in4.sin_port) == port && port != 0);
        FUZZ_CHECK(memcmp(&wid.root.in4.sin_addr, p + 24, 4) == 0);
    } else {
        FUZZ_CHECK(p[16] == 6);
        FUZZ_CHECK(wid.root.sa.sa_family == AF_INET6);
        FUZZ_CHECK(ntohs(wid.root.in6.sin6_port) == port && port != 0);
        FUZZ_CHECK(wid.root.in6.sin6_scope_id == shim_wire_get_u32(p + 20));
        FUZZ_CHECK(memcmp(&wid.root.in6.sin6_addr, p + 24, 16) == 0);
    }

    /* encode(decode(id)) decodes to the same fields, and is the id itself once the bytes
     * the encoder zeroes (byte 17, an IPv4 id's scope and address tail, 48..127) are. */
    ncclUniqueId again;
    struct shim_wire_id wid2;
    shim_wire_id_encode(&wid, &again);
    FUZZ_CHECK(shim_wire_id_decode(&again, &wid2, why, sizeof(why)));
    FUZZ_CHECK(wid2.flags == wid.flags && wid2.secret == wid.secret);
    FUZZ_CHECK(wid2.root.sa.sa_family == wid.root.sa.sa_family);
    const uint8_t *q = (const uint8_t *)again.internal;
    uint8_t canon[sizeof(id->internal)];
    memcpy(canon, p, sizeof(canon));
    canon[17] = 0;
    if (p[16] == 4) {
        memset(canon + 20, 0, 4);
        memset(canon + 28, 0, 12);
    }
    memset(canon + 48, 0, sizeof(canon) - 48);
    fuzz_put_u64(canon + 40, shim_wire_hash(canon, 40, 0));
    FUZZ_CHECK(memcmp(q, canon, sizeof(canon)) == 0);

    /* A FROM_ENV id's hash leaves the address out: each host resolves the name itself. */
    if (wid.flags & SHIM_WIRE_ID_FROM_ENV) {
        ncclUniqueId moved = *id;
        uint8_t *m = (uint8_t *)moved.internal;
        for (int i = 16; i < 48; i++) {
            m[i] ^= 0xff;
        }
        FUZZ_CHECK(shim_wire_id_hash(&moved) == shim_wire_id_hash(id));
    }
}

static void
fuzz_id(const uint8_t *data, size_t size, bool sealed)
{
    ncclUniqueId id;
    uint8_t *p = (uint8_t *)id.internal;

    memset(&id, 0, sizeof(id));
    memcpy(p, data, size < sizeof(id) ? size : sizeof(id));
    if (sealed) {
        shim_wire_put_u32(p, SHIM_WIRE_ID_MAGIC);
        p[4] = 0;
        p[5] = SHIM_WIRE_VERSION;
        fuzz_put_u64(p + 40, shim_wire_hash(p, 40, 0));
    }
    fuzz_id_check(&id, sealed);
}

/* ---- the hello ----------------------------------------------------------------------- */

/* Parses buf[0..len) and checks what the parser claims; returns its answer. */
static enum shim_wire_parse
fuzz_hello_check(const uint8_t *buf, size_t len, struct shim_wire_hello *out, size_t *need_out)
{
    struct shim_wire_hello hello;
    char why[SHIM_WIRE_WHY_LEN];
    size_t need = (size_t)-1;

    fuzz_why_reset(why);
    memset(&hello, 0x5a, sizeof(hello));
    enum shim_wire_parse res = shim_wire_hello_parse(buf, len, &hello, &need, why, sizeof(why));
    switch (res) {
    case SHIM_WIRE_BAD:
        fuzz_why_check(why);
        FUZZ_CHECK(len >= SHIM_WIRE_HELLO_BYTES); /* the header decides; nothing less can */
        break;
    case SHIM_WIRE_SHORT:
        FUZZ_CHECK(need > len && need >= SHIM_WIRE_HELLO_BYTES);
        FUZZ_CHECK(need <= SHIM_WIRE_HELLO_BYTES + (size_t)SHIM_WIRE_MAX_BLOB);
        if (len >= SHIM_WIRE_HELLO_BYTES) {
            /* The header is in: the root can check the secret now. */
            FUZZ_CHECK(hello.nranks >= 1 && hello.nranks <= SHIM_WIRE_MAX_NRANKS);
            FUZZ_CHECK(hello.rank < hello.nranks);
            FUZZ_CHECK(hello.blob_len <= SHIM_WIRE_MAX_BLOB);
            FUZZ_CHECK(need == SHIM_WIRE_HELLO_BYTES + (size_t)hello.blob_len);
            FUZZ_CHECK(hello.blob == NULL);
            FUZZ_CHECK(hello.secret == fuzz_get_u64(buf + 8));
        } else {
            FUZZ_CHECK(need == SHIM_WIRE_HELLO_BYTES);
        }
        break;
    case SHIM_WIRE_OK:
        FUZZ_CHECK(hello.nranks >= 1 && hello.nranks <= SHIM_WIRE_MAX_NRANKS);
        FUZZ_CHECK(hello.rank < hello.nranks);
        FUZZ_CHECK(hello.blob_len <= SHIM_WIRE_MAX_BLOB);
        FUZZ_CHECK(len == SHIM_WIRE_HELLO_BYTES + (size_t)hello.blob_len && need == len);
        FUZZ_CHECK(hello.blob == buf + SHIM_WIRE_HELLO_BYTES);
        FUZZ_CHECK(hello.secret == fuzz_get_u64(buf + 8));
        break;
    default:
        FUZZ_CHECK(!"unknown parse result");
    }
    if (out != NULL) {
        *out = hello;
    }
    if (need_out != NULL) {
        *need_out = need;
    }
    return res;
}

static void
fuzz_hello_raw(const uint8_t *data, size_t size)
{
    struct shim_wire_hello hello;
    size_t need;

    if (fuzz_hello_check(data, size, &hello, &need) != SHIM_WIRE_OK) {
        return;
    }
    /* Re-encoding gives the header back with its reserved words zeroed. */
    uint8_t head[SHIM_WIRE_HELLO_BYTES], canon[SHIM_WIRE_HELLO_BYTES];
    shim_wire_hello_encode(&hello, head);
    memcpy(canon, data, sizeof(canon));
    memset(canon + 6, 0, 2);
    memset(canon + 28, 0, 4);
    FUZZ_CHECK(memcmp(head, canon, sizeof(head)) == 0);
    /* Every prefix, as the root sees it arrive, is SHORT and asks for the whole. */
    size_t cuts[] = {0, 1, SHIM_WIRE_HELLO_BYTES - 1, SHIM_WIRE_HELLO_BYTES, size / 2,
                     size - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        if (cuts[i] >= size) {
            continue;
        }
        size_t part_need;
        FUZZ_CHECK(fuzz_hello_check(data, cuts[i], NULL, &part_need) == SHIM_WIRE_SHORT);
        FUZZ_CHECK(part_need == (cuts[i] < SHIM_WIRE_HELLO_BYTES ? SHIM_WIRE_HELLO_BYTES
                                                                 : size));
    }
}

static void
fuzz_hello_encoded(const uint8_t *data, size_t size)
{
    uint8_t fields[20] = {0};
    struct shim_wire_hello in, out;

    memcpy(fields, data, size < sizeof(fields) ? size : sizeof(fields));
    data += size < sizeof(fields) ? size : sizeof(fields);
    size -= size < sizeof(fields) ? size : sizeof(fields);
    in.secret = fuzz_get_u64(fields);
    in.nranks = shim_wire_get_u32(fields + 8);
    in.rank = shim_wire_get_u32(fields + 12);
    /* The blob is what the rest of the payload holds; the length field may disagree. */
    in.blob_len = fields[16] & 1 ? shim_wire_get_u32(fields + 16) : (uint32_t)size;
    in.blob = NULL;

    size_t len = SHIM_WIRE_HELLO_BYTES + size;
    uint8_t *buf = malloc(len);
    FUZZ_CHECK(buf != NULL);
    shim_wire_hello_encode(&in, buf);
    memcpy(buf + SHIM_WIRE_HELLO_BYTES, data, size);
    enum shim_wire_parse res = fuzz_hello_check(buf, len, &out, NULL);
    bool valid = in.nranks >= 1 && in.nranks <= SHIM_WIRE_MAX_NRANKS && in.rank < in.nranks &&
                 in.blob_len <= SHIM_WIRE_MAX_BLOB;
    if (!valid) {
        FUZZ_CHECK(res == SHIM_WIRE_BAD);
    } else if (in.blob_len == size) {
        FUZZ_CHECK(res == SHIM_WIRE_OK);
    } else {
        FUZZ_CHECK(res == (in.blob_len > size ? SHIM_WIRE_SHORT : SHIM_WIRE_BAD));
    }
    if (res != SHIM_WIRE_BAD) {
        FUZZ_CHECK(out.secret == in.secret && out.nranks == in.nranks && out.rank == in.rank);
        FUZZ_CHECK(out.blob_len == in.blob_len);
    }
    free(buf);
}

/* ---- the reply ----------------------------------------------------------------------- */

static enum shim_wire_parse
fuzz_reply_check(const uint8_t *buf, size_t len, uint32_t nranks, size_t *need_out)
{
    struct shim_wire_reply reply;
    char why[SHIM_WIRE_WHY_LEN], text[SHIM_WIRE_WHY_LEN];
    size_t need = (size_t)-1;

    fuzz_why_reset(why);
    memset(&reply, 0x5a, sizeof(reply));
    enum shim_wire_parse res = shim_wire_reply_parse(buf, len, nranks, &reply, &need, why,
                                                     sizeof(why));
    if (res == SHIM_WIRE_BAD) {
        fuzz_why_check(why);
        FUZZ_CHECK(len >= SHIM_WIRE_REPLY_BYTES);
        return res;
    }
    FUZZ_CHECK(res == SHIM_WIRE_OK || res == SHIM_WIRE_SHORT);
    if (need_out != NULL) {
        *need_out = need;
    }
    if (res == SHIM_WIRE_SHORT && len < SHIM_WIRE_REPLY_BYTES) {
        FUZZ_CHECK(need == SHIM_WIRE_REPLY_BYTES);
        return res;
    }
    /* The header is in: it is known, and says how much follows. */
    FUZZ_CHECK(reply.status <= SHIM_WIRE_STATUS_TOO_BIG);
    if (reply.status == SHIM_WIRE_STATUS_OK) {
        FUZZ_CHECK(reply.nranks == nranks);
        FUZZ_CHECK(reply.data_len <= SHIM_WIRE_MAX_TABLE);
        FUZZ_CHECK(reply.data_len <= (uint64_t)nranks * SHIM_WIRE_MAX_BLOB);
        FUZZ_CHECK(need == SHIM_WIRE_REPLY_BYTES + 4 * (size_t)nranks + reply.data_len);
    } else {
        FUZZ_CHECK(reply.data_len == 0 && need == SHIM_WIRE_REPLY_BYTES);
    }
    shim_wire_status_str(&reply, text, sizeof(text));
    FUZZ_CHECK(memchr(text, '\0', sizeof(text)) != NULL);

    uint8_t head[SHIM_WIRE_REPLY_BYTES];
    shim_wire_reply_encode(&reply, head);
    FUZZ_CHECK(memcmp(head, buf, sizeof(head)) == 0); /* no reserved bytes in a reply */
    if (res == SHIM_WIRE_SHORT) {
        FUZZ_CHECK(need > len);
        return res;
    }

    FUZZ_CHECK(need == len);
    if (reply.status == SHIM_WIRE_STATUS_OK) {
        /* The lengths and the blobs lie inside the buffer and account for all of it. */
        FUZZ_CHECK(reply.lens == buf + SHIM_WIRE_REPLY_BYTES);
        FUZZ_CHECK(reply.data == reply.lens + 4 * (size_t)nranks);
        uint64_t sum = 0;
        for (uint32_t r = 0; r < nranks; r++) {
            uint32_t blob_len = shim_wire_get_u32(reply.lens + 4 * (size_t)r);
            FUZZ_CHECK(blob_len <= SHIM_WIRE_MAX_BLOB);
            sum += blob_len;
        }
        FUZZ_CHECK(sum == reply.data_len);
        FUZZ_CHECK(reply.data + reply.data_len == buf + len);
    }
    return res;
}

static void
fuzz_reply_raw(const uint8_t *data, size_t size)
{
    if (size < 4) {
        return;
    }
    uint32_t nranks = shim_wire_get_u32(data);
    fuzz_reply_check(data + 4, size - 4, nranks, NULL);
}

static void
fuzz_reply_encoded(const uint8_t *data, size_t size)
{
    uint8_t fields[2 + 8] = {0};

    memcpy(fields, data, size < sizeof(fields) ? size : sizeof(fields));
    data += size < sizeof(fields) ? size : sizeof(fields);
    size -= size < sizeof(fields) ? size : sizeof(fields);
    uint32_t nranks = fields[0] % 17;
    bool refusal = fields[1] & 1;

    /* Rank r's blob length is a byte of the payload times 3 (0..765), or 0 past its end. */
    uint32_t lens[16];
    uint64_t total = 0;
    for (uint32_t r = 0; r < nranks; r++) {
        lens[r] = r < size ? 3u * data[r] : 0;
        total += lens[r];
    }
    struct shim_wire_reply reply = {.status = SHIM_WIRE_STATUS_OK, .nranks = nranks,
                                    .session = fuzz_get_u64(fields + 2), .data_len = total};
    size_t len = SHIM_WIRE_REPLY_BYTES + 4 * (size_t)nranks + total;
    if (refusal) {
        reply = (struct shim_wire_reply){.status = 1 + fields[1] / 2 % 3, .nranks = nranks,
                                         .arg = {fields[2], fields[3], fields[4]},
                                         .session = fuzz_get_u64(fields + 2)};
        len = SHIM_WIRE_REPLY_BYTES;
    }
    uint8_t *buf = malloc(len);
    FUZZ_CHECK(buf != NULL);
    shim_wire_reply_encode(&reply, buf);
    if (!refusal) {
        uint8_t *p = buf + SHIM_WIRE_REPLY_BYTES + 4 * (size_t)nranks;
        for (uint32_t r = 0; r < nranks; r++) {
            shim_wire_put_u32(buf + SHIM_WIRE_REPLY_BYTES + 4 * (size_t)r, lens[r]);
            memset(p, (int)r, lens[r]);
            p += lens[r];
        }
    }
    FUZZ_CHECK(fuzz_reply_check(buf, len, nranks, NULL) == SHIM_WIRE_OK);
    /* Every prefix is SHORT and asks for the whole (the header's for a partial header). */
    for (size_t cut = 0; cut < len; cut += 1 + len / 64) {
        size_t need;
        FUZZ_CHECK(fuzz_reply_check(buf, cut, nranks, &need) == SHIM_WIRE_SHORT);
        FUZZ_CHECK(need == (cut < SHIM_WIRE_REPLY_BYTES ? SHIM_WIRE_REPLY_BYTES : len));
    }
    /* A rank that expects another rank count refuses an OK table. */
    if (!refusal) {
        FUZZ_CHECK(fuzz_reply_check(buf, len, nranks + 1, NULL) == SHIM_WIRE_BAD);
    }
    free(buf);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) {
        return 0;
    }
    uint8_t mode = data[0];
    data++;
    size--;
    switch (mode % 6) {
    case 0:
        fuzz_id(data, size, false);
        break;
    case 1:
        fuzz_id(data, size, true);
        break;
    case 2:
        fuzz_hello_raw(data, size);
        break;
    case 3:
        fuzz_reply_raw(data, size);
        break;
    case 4:
        fuzz_hello_encoded(data, size);
        break;
    case 5:
        fuzz_reply_encoded(data, size);
        break;
    }
    return 0;
}
