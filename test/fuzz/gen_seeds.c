/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Writes the seed corpora of the bootstrap harnesses, one directory per harness under DIR:
 * fuzz_bootstrap_wire/ holds valid messages made by the library's own encoders, each prefixed
 * with the harness's mode byte; fuzz_bootstrap_root/ holds whole rendezvous as that harness's
 * records (2 and 1 ranks with strangers between them, a duplicate rank, a disagreement on
 * nranks, a rank that leaves). The fuzzer starts from inputs that parse and mutates them into
 * near misses. `make fuzz` runs it; the corpus is generated, not committed.
 *
 * Usage: gen_seeds DIR
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bootstrap/wire.h"

enum { MODE_ID = 0, MODE_ID_SEALED, MODE_HELLO, MODE_REPLY, MODE_HELLO_ENC, MODE_REPLY_ENC };

static char seed_dir[4096];
static int seed_count;

static void
seed_dir_set(const char *top, const char *harness)
{
    snprintf(seed_dir, sizeof(seed_dir), "%s/%s", top, harness);
    if (mkdir(seed_dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "gen_seeds: %s: %s\n", seed_dir, strerror(errno));
        exit(1);
    }
}

static void
seed_write(const char *name, int mode, const void *a, size_t alen, const void *b, size_t blen)
{
    char path[sizeof(seed_dir) + 64];
    snprintf(path, sizeof(path), "%s/%.63s", seed_dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, "gen_seeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    if (mode >= 0) { /* the wire harness's mode byte; the root harness has none */
        unsigned char m = (unsigned char)mode;
        fwrite(&m, 1, 1, f);
    }
    if (alen > 0) {
        fwrite(a, 1, alen, f);
    }
    if (blen > 0) {
        fwrite(b, 1, blen, f);
    }
    if (fclose(f) != 0) {
        fprintf(stderr, "gen_seeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    seed_count++;
}

static void
seed_ids(void)
{
    struct shim_wire_id wid;
    ncclUniqueId id;

    memset(&wid, 0, sizeof(wid));
    wid.secret = 0x0123456789abcdefULL;
    wid.root.in4.sin_family = AF_INET;
    wid.root.in4.sin_port = htons(29500);
    wid.root.in4.sin_addr.s_addr = htonl(0x7f000001);
    shim_wire_id_encode(&wid, &id);
    seed_write("id_v4", MODE_ID, &id, sizeof(id), NULL, 0);
    seed_write("id_v4_sealed", MODE_ID_SEALED, &id, 48, NULL, 0);

    wid.flags = SHIM_WIRE_ID_FROM_ENV;
    shim_wire_id_encode(&wid, &id);
    seed_write("id_v4_env", MODE_ID, &id, sizeof(id), NULL, 0);

    memset(&wid, 0, sizeof(wid));
    wid.secret = 42;
    wid.root.in6.sin6_family = AF_INET6;
    wid.root.in6.sin6_port = htons(1);
    wid.root.in6.sin6_scope_id = 3;
    inet_pton(AF_INET6, "fe80::1", &wid.root.in6.sin6_addr);
    shim_wire_id_encode(&wid, &id);
    seed_write("id_v6", MODE_ID, &id, sizeof(id), NULL, 0);
    seed_write("id_v6_sealed", MODE_ID_SEALED, &id, 48, NULL, 0);
}

static void
seed_hellos(void)
{
    uint8_t buf[SHIM_WIRE_HELLO_BYTES + 64];
    struct shim_wire_hello h = {.secret = 9, .nranks = 4, .rank = 3, .blob_len = 64};

    shim_wire_hello_encode(&h, buf);
    for (size_t i = 0; i < 64; i++) {
        buf[SHIM_WIRE_HELLO_BYTES + i] = (uint8_t)i;
    }
    seed_write("hello_blob", MODE_HELLO, buf, sizeof(buf), NULL, 0);
    seed_write("hello_header_only", MODE_HELLO, buf, SHIM_WIRE_HELLO_BYTES, NULL, 0);
    h = (struct shim_wire_hello){.secret = 1, .nranks = 1, .rank = 0, .blob_len = 0};
    shim_wire_hello_encode(&h, buf);
    seed_write("hello_empty", MODE_HELLO, buf, SHIM_WIRE_HELLO_BYTES, NULL, 0);

    /* Mode 4's payload: secret, nranks, rank, length (odd first byte: taken as given), blob. */
    uint8_t fields[20] = {0};
    fields[11] = 8;                             /* nranks 8 */
    fields[15] = 7;                             /* rank 7 */
    shim_wire_put_u32(fields + 16, 0x01000010); /* odd top byte: explicit length */
    seed_write("hello_enc", MODE_HELLO_ENC, fields, sizeof(fields), buf, 16);
}

static void
seed_replies(void)
{
    /* Three ranks, blobs of 5, 0 and 7 bytes: the nranks prefix, header, lengths, blobs. */
    uint32_t lens[3] = {5, 0, 7};
    uint8_t msg[4 + SHIM_WIRE_REPLY_BYTES + 12 + 12];
    struct shim_wire_reply r = {.status = SHIM_WIRE_STATUS_OK, .nranks = 3, .session = 77,
                                .data_len = 12};

    shim_wire_put_u32(msg, 3);
    shim_wire_reply_encode(&r, msg + 4);
    for (int i = 0; i < 3; i++) {
        shim_wire_put_u32(msg + 4 + SHIM_WIRE_REPLY_BYTES + 4 * i, lens[i]);
    }
    memset(msg + 4 + SHIM_WIRE_REPLY_BYTES + 12, 0xee, 12);
    seed_write("reply_table", MODE_REPLY, msg, sizeof(msg), NULL, 0);

    r = (struct shim_wire_reply){.status = SHIM_WIRE_STATUS_NRANKS, .nranks = 3,
                                 .arg = {2, 4, 3}, .session = 77};
    shim_wire_reply_encode(&r, msg + 4);
    seed_write("reply_refusal", MODE_REPLY, msg, 4 + SHIM_WIRE_REPLY_BYTES, NULL, 0);

    uint8_t fields[10 + 5] = {5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 0, 200, 9};
    seed_write("reply_enc_table", MODE_REPLY_ENC, fields, sizeof(fields), NULL, 0);
    fields[1] = 3;
    seed_write("reply_enc_refusal", MODE_REPLY_ENC, fields, 10, NULL, 0);
}

/* ---- fuzz_bootstrap_root: records {op, len, bytes}; op's low 3 bits name the connection,
 * 0x18 has the harness write the secret, magic and version in, 0x40 closes the client. */

#define ROOT_SEAL 0x18
#define ROOT_CLOSE 0x40

struct root_seed {
    uint8_t bytes[1024];
    size_t len;
};

static void
root_record(struct root_seed *s, int op, const void *bytes, size_t len)
{
    s->bytes[s->len++] = (uint8_t)op;
    s->bytes[s->len++] = (uint8_t)len;
    memcpy(s->bytes + s->len, bytes, len);
    s->len += len;
}

/* A hello with a blob of blob_len bytes, in two records: header, then blob. */
static void
root_hello(struct root_seed *s, int conn, uint32_t nranks, uint32_t rank, uint32_t blob_len)
{
    uint8_t head[SHIM_WIRE_HELLO_BYTES], blob[64];
    struct shim_wire_hello h = {.nranks = nranks, .rank = rank, .blob_len = blob_len};

    shim_wire_hello_encode(&h, head);
    memset(blob, 'a' + (int)rank, sizeof(blob));
    root_record(s, conn | ROOT_SEAL, head, sizeof(head));
    root_record(s, conn, blob, blob_len);
}

static void
seed_root(void)
{
    static const char junk[] = "GET / HTTP/1.1\r\n\r\n";
    struct root_seed s;

    s.len = 0;
    root_hello(&s, 0, 2, 0, 10);
    root_record(&s, 1, junk, sizeof(junk) - 1);
    root_record(&s, 3, "NCSH", 4);
    root_hello(&s, 2, 2, 1, 7);
    seed_write("two_ranks", -1, s.bytes, s.len, NULL, 0);

    s.len = 0;
    root_hello(&s, 0, 1, 0, 0);
    seed_write("one_rank", -1, s.bytes, s.len, NULL, 0);

    s.len = 0;
    root_hello(&s, 0, 3, 1, 5);
    root_hello(&s, 1, 3, 1, 5);
    seed_write("dup_rank", -1, s.bytes, s.len, NULL, 0);

    s.len = 0;
    root_hello(&s, 0, 3, 0, 5);
    root_hello(&s, 1, 4, 1, 5);
    seed_write("nranks_disagree", -1, s.bytes, s.len, NULL, 0);

    s.len = 0;
    root_hello(&s, 0, 3, 0, 5);
    root_record(&s, 0 | ROOT_CLOSE, "", 0);
    root_hello(&s, 1, 3, 1, 5);
    root_hello(&s, 2, 3, 2, 50);
    seed_write("rank_leaves", -1, s.bytes, s.len, NULL, 0);
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    if (mkdir(argv[1], 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "gen_seeds: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    seed_dir_set(argv[1], "fuzz_bootstrap_wire");
    seed_ids();
    seed_hellos();
    seed_replies();
    seed_dir_set(argv[1], "fuzz_bootstrap_root");
    seed_root();
    printf("gen_seeds: %d seeds in %s\n", seed_count, argv[1]);
    return 0;
}
