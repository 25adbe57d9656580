/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap's bytes: the unique id, the hello a rank sends the root and the root's reply.
 * Encoders and parsers only, no I/O and no logging, so fuzzers and unit tests can feed them
 * anything. bootstrap.c is their caller: the root parses hellos, the ranks parse replies.
 * Every integer is big-endian, so ranks on hosts of either byte order agree.
 *
 * Unique id (NCCL_UNIQUE_ID_BYTES = 128):
 *   0  u32  magic "NCSI"          16  u8   family: 4 or 6    24  16 B  address (IPv4: 4 B)
 *   4  u16  version (1)           17  u8   0                 40  u64   check: hash of bytes 0..39
 *   6  u16  flags (FROM_ENV)      18  u16  port              48  80 B  zero
 *   8  u64  secret                20  u32  IPv6 scope id
 *
 * Hello, rank -> root (32 bytes, then the blob):
 *   0 u32 magic "NCSH", 4 u16 version, 6 u16 0, 8 u64 secret, 16 u32 nranks, 20 u32 rank,
 *   24 u32 blob length, 28 u32 0
 *
 * Reply, root -> rank (40 bytes, then for status OK nranks u32 lengths and the blobs):
 *   0 u32 magic "NCSR", 4 u16 version, 6 u16 status, 8 u32 nranks, 12 u32 arg[3],
 *   24 u64 session, 32 u64 total blob bytes
 */
#ifndef SHIM_WIRE_H
#define SHIM_WIRE_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "socket.h"

#define SHIM_WIRE_VERSION 1
#define SHIM_WIRE_ID_MAGIC 0x4e435349u    /* "NCSI" */
#define SHIM_WIRE_HELLO_MAGIC 0x4e435348u /* "NCSH" */
#define SHIM_WIRE_REPLY_MAGIC 0x4e435352u /* "NCSR" */
#define SHIM_WIRE_HELLO_BYTES 32
#define SHIM_WIRE_REPLY_BYTES 40

/* Id flag: computed from NCCL_COMM_ID by every rank; no root runs until rank 0 joins. */
#define SHIM_WIRE_ID_FROM_ENV 0x1

/* Limits a hello or reply must respect. A blob is a UCX worker address: hundreds of bytes to
 * a few KB. The table limit keeps a forged length from making a rank allocate gigabytes. */
#define SHIM_WIRE_MAX_BLOB (64u * 1024)
#define SHIM_WIRE_MAX_NRANKS (1u << 20)
#define SHIM_WIRE_MAX_TABLE (1ull << 30)

/* Length of the `why` buffers the parsers fill. */
#define SHIM_WIRE_WHY_LEN 160

enum shim_wire_parse {
    SHIM_WIRE_BAD = -1, /* malformed; why says how */
    SHIM_WIRE_OK = 0,   /* complete and valid */
    SHIM_WIRE_SHORT = 1 /* valid so far; *need_out bytes in all are needed */
};

/* The reply's status: why the root refused the rendezvous, with the numbers in arg[]. */
enum shim_wire_status {
    SHIM_WIRE_STATUS_OK = 0,
    SHIM_WIRE_STATUS_DUP_RANK = 1, /* arg[0] joined twice */
    SHIM_WIRE_STATUS_NRANKS = 2,   /* rank arg[0] said nranks arg[1]; the first said arg[2] */
    SHIM_WIRE_STATUS_TOO_BIG = 3,  /* the blobs add up to more than SHIM_WIRE_MAX_TABLE */
};

struct shim_wire_id {
    uint16_t flags;
    uint64_t secret;
    union shim_sockaddr root; /* IPv4 or IPv6, with the port */
};

struct shim_wire_hello {
    uint64_t secret;
    uint32_t nranks;
    uint32_t rank;
    uint32_t blob_len;
    const uint8_t *blob; /* into the parsed buffer; set only on SHIM_WIRE_OK */
};

struct shim_wire_reply {
    uint16_t status;
    uint32_t nranks;
    uint32_t arg[3];
    uint64_t session; /* the root's random number, equal on every rank of the rendezvous */
    uint64_t data_len;
    const uint8_t *lens; /* nranks big-endian u32: read with shim_wire_get_u32(lens + 4 * i) */
    const uint8_t *data; /* the blobs, back to back; set only on SHIM_WIRE_OK */
};

static inline uint32_t
shim_wire_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline void
shim_wire_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* 64-bit FNV-1a with a final avalanche; seed 0 for the wire's own uses. */
uint64_t shim_wire_hash(const void *data, size_t len, uint64_t seed);

/* Writes all 128 bytes, zeroing the reserved ones. The root must be IPv4 or IPv6. */
void shim_wire_id_encode(const struct shim_wire_id *wid, ncclUniqueId *id_out);
/* False, with why filled, unless id carries our magic, version, a known family, a port and a
 * matching check. */
bool shim_wire_id_decode(const ncclUniqueId *id, struct shim_wire_id *wid_out, char *why,
                         size_t why_len);
/* Hash of the whole id; for a FROM_ENV id the address bytes are left out, since each host
 * resolves the NCCL_COMM_ID name itself and may get a different address for it. */
uint64_t shim_wire_id_hash(const ncclUniqueId *id);

void shim_wire_hello_encode(const struct shim_wire_hello *hello,
                            uint8_t out[SHIM_WIRE_HELLO_BYTES]);
/* Parses buf[0..len) as one hello, header then blob. Once the header is in (len >= 32) the
 * header fields of *hello_out are set, even on SHIM_WIRE_SHORT, so the root can check the
 * secret before the blob arrives. More than one message's bytes is SHIM_WIRE_BAD. */
enum shim_wire_parse shim_wire_hello_parse(const uint8_t *buf, size_t len,
                                           struct shim_wire_hello *hello_out, size_t *need_out,
                                           char *why, size_t why_len);

void shim_wire_reply_encode(const struct shim_wire_reply *reply,
                            uint8_t out[SHIM_WIRE_REPLY_BYTES]);
/* Parses buf[0..len) as the reply to a rank of `nranks`: an OK reply must list exactly nranks
 * blobs whose lengths add up to data_len; a refusal carries no table. */
enum shim_wire_parse shim_wire_reply_parse(const uint8_t *buf, size_t len, uint32_t nranks,
                                           struct shim_wire_reply *reply_out, size_t *need_out,
                                           char *why, size_t why_len);
/* A refusal in words: "rank 1 joined twice". */
void shim_wire_status_str(const struct shim_wire_reply *reply, char *buf, size_t len);

#endif
