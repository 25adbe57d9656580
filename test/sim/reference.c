/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The reference described in reference.h: layouts per collective, input data, and the
 * expected result of every element, computed straight from the collective's definition.
 */
#include "reference.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF_GUARD 0xcd
#define REF_POISON 0x7badbeefu

const char *
ref_coll_name(enum alg_coll coll)
{
    static const char *names[ALG_COLL_COUNT] = {
        "allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall",
        "gather",    "scatter",   "send",   "recv",      "barrier"};
    return coll < ALG_COLL_COUNT ? names[coll] : "?";
}

const char *
ref_kind_name(enum kr_op_kind kind)
{
    static const char *names[] = {"sum", "prod", "max", "min", "premulsum", "sumpostdiv"};
    return (unsigned)kind < 6 ? names[kind] : "?";
}

bool
ref_coll_reduces(enum alg_coll coll)
{
    return coll == ALG_COLL_ALLREDUCE || coll == ALG_COLL_REDUCE ||
           coll == ALG_COLL_REDUCESCATTER;
}

bool
ref_coll_rooted(enum alg_coll coll)
{
    return coll == ALG_COLL_BROADCAST || coll == ALG_COLL_REDUCE || coll == ALG_COLL_GATHER ||
           coll == ALG_COLL_SCATTER;
}

bool
ref_coll_has_in_place(enum alg_coll coll)
{
    return coll == ALG_COLL_ALLREDUCE || coll == ALG_COLL_BROADCAST || coll == ALG_COLL_REDUCE ||
           coll == ALG_COLL_ALLGATHER || coll == ALG_COLL_REDUCESCATTER ||
           coll == ALG_COLL_GATHER || coll == ALG_COLL_SCATTER;
}

/* Elements of rank r's SEND and RECV buffers; -1 where the rank has none (NULL). */
static void
ref_sizes(const struct ref_case *c, int r, long *send_out, long *recv_out)
{
    const long count = (long)c->count, all = count * c->nranks;
    const bool root = r == c->root;
    long send = -1, recv = -1;

    switch (c->coll) {
    case ALG_COLL_ALLREDUCE: send = count, recv = count; break;
    case ALG_COLL_BROADCAST: send = root ? count : -1, recv = count; break;
    case ALG_COLL_REDUCE: send = count, recv = root ? count : -1; break;
    case ALG_COLL_ALLGATHER: send = count, recv = all; break;
    case ALG_COLL_REDUCESCATTER: send = all, recv = count; break;
    case ALG_COLL_ALLTOALL: send = all, recv = all; break;
    case ALG_COLL_GATHER: send = count, recv = root ? all : -1; break;
    case ALG_COLL_SCATTER: send = root ? all : -1, recv = count; break;
    case ALG_COLL_SEND:
    case ALG_COLL_RECV: send = count, recv = count; break; /* the ring exchange */
    default: break;
    }
    *send_out = send;
    *recv_out = recv;
}

/* In place at rank r: where SEND and RECV sit in the one allocation, in elements. */
static bool
ref_in_place_at(const struct ref_case *c, int r, long *send_off, long *recv_off)
{
    *send_off = *recv_off = 0;
    if (!c->in_place || !ref_coll_has_in_place(c->coll) ||
        (ref_coll_rooted(c->coll) && r != c->root)) {
        return false;
    }
    if (c->coll == ALG_COLL_ALLGATHER) {
        *send_off = (long)c->count * r;
    } else if (c->coll == ALG_COLL_GATHER) {
        *send_off = (long)c->count * c->root;
    } else if (c->coll == ALG_COLL_REDUCESCATTER) {
        *recv_off = (long)c->count * r;
    } else if (c->coll == ALG_COLL_SCATTER) {
        *recv_off = (long)c->count * c->root;
    }
    return true;
}

/* Rank r's input element i. Reductions get small values (odd ones for PROD); everything else
 * gets a value that names (rank, index), so a misplaced block shows. */
static int32_t
ref_input(const struct ref_case *c, int r, size_t i)
{
    if (!ref_coll_reduces(c->coll)) {
        return (int32_t)(((uint32_t)r + 1) << 22 | (uint32_t)(i & 0x3fffff));
    }
    if (c->kind == KR_PROD) {
        static const int32_t odd[] = {1, -1, 3, 1, -3, 1, 5, -1};
        return odd[(i * 3 + (size_t)r * 5) % 8];
    }
    return (int32_t)((i * 7 + (size_t)r * 13) % 101) - 50;
}

/* The reduction over all ranks of input element i, as the op defines it. */
static int32_t
ref_reduce(const struct ref_case *c, size_t i)
{
    uint32_t acc = 0;
    int32_t best = 0;

    for (int r = 0; r < c->nranks; r++) {
        int32_t x = ref_input(c, r, i);
        switch (c->kind) {
        case KR_PROD: acc = r ? acc * (uint32_t)x : (uint32_t)x; break;
        case KR_MAX: best = r == 0 || x > best ? x : best; break;
        case KR_MIN: best = r == 0 || x < best ? x : best; break;
        case KR_PREMULSUM: acc += (uint32_t)x * (uint32_t)(r + 2); break;
        default: acc += (uint32_t)x; break;
        }
    }
    if (c->kind == KR_MAX || c->kind == KR_MIN) {
        return best;
    }
    if (c->kind == KR_SUMPOSTDIV) {
        return (int32_t)acc / c->nranks;
    }
    return (int32_t)acc;
}

/* Rank r's output element i. */
static int32_t
ref_output(const struct ref_case *c, int r, size_t i)
{
    const size_t count = c->count;
    const int n = c->nranks;

    switch (c->coll) {
    case ALG_COLL_ALLREDUCE:
    case ALG_COLL_REDUCE: return ref_reduce(c, i);
    case ALG_COLL_REDUCESCATTER: return ref_reduce(c, (size_t)r * count + i);
    case ALG_COLL_BROADCAST: return ref_input(c, c->root, i);
    case ALG_COLL_ALLGATHER:
    case ALG_COLL_GATHER: return ref_input(c, (int)(i / count), i % count);
    case ALG_COLL_ALLTOALL: return ref_input(c, (int)(i / count), (size_t)r * count + i % count);
    case ALG_COLL_SCATTER: return ref_input(c, c->root, (size_t)r * count + i);
    case ALG_COLL_SEND:
    case ALG_COLL_RECV: return ref_input(c, alg_mod(r - 1, n), i);
    default: return 0;
    }
}

static bool
ref_alloc_make(struct ref_alloc *a, size_t bytes, const char *what)
{
    a->raw = malloc(bytes + 2 * REF_GUARD_BYTES);
    a->expect = malloc(bytes + 1);
    if (a->raw == NULL || a->expect == NULL) {
        free(a->raw);
        free(a->expect);
        return false;
    }
    a->base = a->raw + REF_GUARD_BYTES;
    a->bytes = bytes;
    a->what = what;
    memset(a->raw, REF_GUARD, bytes + 2 * REF_GUARD_BYTES);
    const uint32_t poison = REF_POISON;
    for (size_t off = 0; off + 4 <= bytes; off += 4) {
        memcpy(a->base + off, &poison, 4);
    }
    return true;
}

static void
ref_put(uint8_t *base, size_t elem, int32_t v)
{
    memcpy(base + elem * 4, &v, 4);
}

bool
ref_setup(const struct ref_case *c, struct ref_data *d)
{
    const int n = c->nranks;

    memset(d, 0, sizeof(*d));
    d->c = *c;
    for (int r = 0; r < n; r++) {
        int32_t scalar = r + 2;
        d->redops[r] = (struct kr_redop){.kind = ref_coll_reduces(c->coll) ? c->kind : KR_SUM,
                                         .type = ncclInt32, .divisor = (uint64_t)n};
        memcpy(d->redops[r].scalar, &scalar, sizeof(scalar));
        if (c->coll == ALG_COLL_BARRIER) {
            continue;
        }
        struct ref_rank *rk = &d->ranks[r];
        long send, recv, send_off, recv_off;
        ref_sizes(c, r, &send, &recv);
        uint8_t *send_base = NULL, *send_expect = NULL, *recv_base = NULL, *recv_expect = NULL;
        d->in_place[r] = ref_in_place_at(c, r, &send_off, &recv_off);
        if (d->in_place[r]) {
            long elems = send + send_off > recv + recv_off ? send + send_off : recv + recv_off;
            struct ref_alloc *a = &rk->alloc[rk->nalloc];
            if (!ref_alloc_make(a, (size_t)elems * 4, "in-place SEND/RECV")) {
                goto fail;
            }
            rk->nalloc++;
            a->send_off = (size_t)send_off * 4;
            a->recv_off = (size_t)recv_off * 4;
            send_base = a->base + a->send_off, send_expect = a->expect + a->send_off;
            recv_base = a->base + a->recv_off, recv_expect = a->expect + a->recv_off;
        } else {
            if (send >= 0) {
                struct ref_alloc *a = &rk->alloc[rk->nalloc];
                if (!ref_alloc_make(a, (size_t)send * 4, "SEND")) {
                    goto fail;
                }
                rk->nalloc++;
                send_base = a->base, send_expect = a->expect;
            }
            if (recv >= 0) {
                struct ref_alloc *a = &rk->alloc[rk->nalloc];
                if (!ref_alloc_make(a, (size_t)recv * 4, "RECV")) {
                    goto fail;
                }
                rk->nalloc++;
                recv_base = a->base, recv_expect = a->expect;
            }
        }
        /* Inputs first; what the allocations must hold is the inputs with RECV overwritten. */
        for (long i = 0; i < send; i++) {
            ref_put(send_base, (size_t)i, ref_input(c, r, (size_t)i));
        }
        for (int k = 0; k < rk->nalloc; k++) {
            memcpy(rk->alloc[k].expect, rk->alloc[k].base, rk->alloc[k].bytes);
        }
        for (long i = 0; i < recv; i++) {
            ref_put(recv_expect, (size_t)i, ref_output(c, r, (size_t)i));
        }
        (void)send_expect;
        d->send[r] = send_base;
        d->recv[r] = recv_base;
        d->send_bytes[r] = send >= 0 ? (size_t)send * 4 : 0;
        d->recv_bytes[r] = recv >= 0 ? (size_t)recv * 4 : 0;
    }
    return true;
fail:
    ref_free(d);
    return false;
}

static int32_t
ref_get(const uint8_t *p, size_t elem)
{
    int32_t v;
    memcpy(&v, p + elem * 4, 4);
    return v;
}

/* Which part of an allocation byte `off` belongs to, for messages. */
static const char *
ref_region(const struct ref_alloc *a, const struct ref_data *d, int r, size_t off)
{
    if (strcmp(a->what, "in-place SEND/RECV") != 0) {
        return a->what[0] == 'S' ? "input, must be unchanged" : "output";
    }
    if (off >= a->recv_off && off < a->recv_off + d->recv_bytes[r]) {
        return "output (RECV part)";
    }
    return "input outside RECV, must be unchanged";
}

bool
ref_check(const struct ref_data *d, char *err, size_t errlen)
{
    for (int r = 0; r < d->c.nranks; r++) {
        const struct ref_rank *rk = &d->ranks[r];
        for (int k = 0; k < rk->nalloc; k++) {
            const struct ref_alloc *a = &rk->alloc[k];
            for (size_t g = 0; g < REF_GUARD_BYTES; g++) {
                bool before = a->raw[g] != REF_GUARD;
                if (before || a->base[a->bytes + g] != REF_GUARD) {
                    snprintf(err, errlen, "rank %d %s buffer: guard byte %zu %s the %zu bytes "
                             "overwritten (0x%02x)", r, a->what,
                             before ? REF_GUARD_BYTES - g : g + 1, before ? "before" : "after",
                             a->bytes,
                             before ? a->raw[g] : a->base[a->bytes + g]);
                    return false;
                }
            }
            if (memcmp(a->base, a->expect, a->bytes) == 0) {
                continue;
            }
            size_t first = SIZE_MAX, wrong = 0;
            for (size_t e = 0; e < a->bytes / 4; e++) {
                if (ref_get(a->base, e) != ref_get(a->expect, e)) {
                    first = first == SIZE_MAX ? e : first;
                    wrong++;
                }
            }
            int32_t got = ref_get(a->base, first), want = ref_get(a->expect, first);
            snprintf(err, errlen, "rank %d %s buffer element %zu (%s): got %d (0x%08x%s), want %d "
                     "(0x%08x); %zu of %zu elements wrong", r, a->what, first,
                     ref_region(a, d, r, first * 4), got, (uint32_t)got,
                     (uint32_t)got == REF_POISON ? ", never written" : "", want, (uint32_t)want,
                     wrong, a->bytes / 4);
            return false;
        }
    }
    return true;
}

void
ref_free(struct ref_data *d)
{
    for (int r = 0; r < SIM_MAX_RANKS; r++) {
        for (int k = 0; k < d->ranks[r].nalloc; k++) {
            free(d->ranks[r].alloc[k].raw);
            free(d->ranks[r].alloc[k].expect);
        }
        d->ranks[r].nalloc = 0;
    }
}
