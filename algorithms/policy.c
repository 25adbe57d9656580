/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NCCL_ALGO and NCCLSHIM_ALGO, parsed into the set of table rows allowed per collective.
 *
 * The syntax is NCCL's: sections separated by ';', each "list" or "collective:list"; a list is
 * comma-separated names, all of them allowed, or with a leading '^' all of them excluded. A
 * section without a collective applies to every collective. NCCL_ALGO names families (our
 * rows answer to "ring" or "tree"); NCCLSHIM_ALGO names our rows ("dbtree", "bruck", ...).
 * Both filters apply, NCCL_ALGO first. A filter that would leave a collective with no row is
 * dropped for that collective, so a name that only serves all-gather does not stop anything
 * else from running.
 */
#include "alg.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/check.h"

static const char *const alg_coll_names[ALG_COLL_COUNT] = {
    [ALG_COLL_ALLREDUCE] = "allreduce",   [ALG_COLL_BROADCAST] = "broadcast",
    [ALG_COLL_REDUCE] = "reduce",         [ALG_COLL_ALLGATHER] = "allgather",
    [ALG_COLL_REDUCESCATTER] = "reducescatter", [ALG_COLL_ALLTOALL] = "alltoall",
    [ALG_COLL_GATHER] = "gather",         [ALG_COLL_SCATTER] = "scatter",
    [ALG_COLL_SEND] = "send",             [ALG_COLL_RECV] = "recv",
    [ALG_COLL_BARRIER] = "barrier",
};

/* NCCL's algorithm names: our two families, and those with no counterpart here (accepted and
 * ignored). */
static const char *const alg_nccl_names[] = {"ring", "tree", "collnetdirect", "collnetchain",
                                             "nvls", "nvlstree", "pat"};

/* The rows named `name`: by family (NCCL_ALGO) or by row name (NCCLSHIM_ALGO). Sets
 * *known_out when the name means something, even if no row matches it. */
static uint64_t
alg_policy_rows(const char *name, bool by_family, bool *known_out)
{
    int count;
    const struct alg_algorithm *table = alg_table(&count);
    uint64_t rows = 0;

    *known_out = false;
    for (int i = 0; i < count; i++) {
        if (strcasecmp(name, by_family ? table[i].nccl : table[i].name) == 0) {
            rows |= 1ull << i;
            *known_out = true;
        }
    }
    for (size_t i = 0; by_family && i < sizeof(alg_nccl_names) / sizeof(*alg_nccl_names); i++) {
        *known_out |= strcasecmp(name, alg_nccl_names[i]) == 0;
    }
    return rows;
}

/* Applies one "[collective:][^]name,name" section to allowed[]. */
static ncclResult_t
alg_policy_section(char *section, bool by_family, const char *var, uint64_t *allowed)
{
    int first = 0, last = ALG_COLL_COUNT - 1;
    char *list = section, *colon = strchr(section, ':');

    if (colon != NULL) {
        *colon = '\0';
        list = colon + 1;
        for (first = 0; first < ALG_COLL_COUNT; first++) {
            if (strcasecmp(section, alg_coll_names[first]) == 0) {
                break;
            }
        }
        if (first == ALG_COLL_COUNT) {
            WARN("%s: unknown collective \"%s\"", var, section);
            return ncclInvalidArgument;
        }
        last = first;
    }
    bool exclude = list[0] == '^';
    uint64_t rows = 0;
    for (char *save, *name = strtok_r(list + exclude, ",", &save); name != NULL;
         name = strtok_r(NULL, ",", &save)) {
        bool known;
        rows |= alg_policy_rows(name, by_family, &known);
        if (!known) {
            WARN("%s: unknown algorithm \"%s\"", var, name);
            return ncclInvalidArgument;
        }
    }
    for (int c = first; c <= last; c++) {
        allowed[c] = exclude ? allowed[c] & ~rows : allowed[c] & rows;
    }
    return ncclSuccess;
}

/* Applies a whole variable; a collective it would leave without rows keeps what it had. */
static ncclResult_t
alg_policy_apply(const char *value, bool by_family, const char *var, struct alg_policy *policy)
{
    char text[512];
    uint64_t allowed[ALG_COLL_COUNT];

    if (value == NULL || value[0] == '\0') {
        return ncclSuccess;
    }
    if (strlen(value) >= sizeof(text)) {
        WARN("%s is longer than %zu characters", var, sizeof(text) - 1);
        return ncclInvalidArgument;
    }
    snprintf(text, sizeof(text), "%s", value);
    memcpy(allowed, policy->allowed, sizeof(allowed));
    for (char *save, *section = strtok_r(text, ";", &save); section != NULL;
         section = strtok_r(NULL, ";", &save)) {
        SHIM_CHECK(alg_policy_section(section, by_family, var, allowed));
    }
    for (int c = 0; c < ALG_COLL_COUNT; c++) {
        if (allowed[c] & policy->allowed[c]) {
            policy->allowed[c] = allowed[c];
        }
    }
    return ncclSuccess;
}

ncclResult_t
alg_policy_parse(const char *nccl_algo, const char *shim_algo, struct alg_policy *policy_out)
{
    struct alg_policy policy;
    int count;
    const struct alg_algorithm *table = alg_table(&count);

    memset(&policy, 0, sizeof(policy));
    for (int i = 0; i < count; i++) {
        policy.allowed[table[i].coll] |= 1ull << i;
    }
    SHIM_CHECK(alg_policy_apply(nccl_algo, true, "NCCL_ALGO", &policy));
    SHIM_CHECK(alg_policy_apply(shim_algo, false, "NCCLSHIM_ALGO", &policy));
    *policy_out = policy;
    return ncclSuccess;
}

bool
alg_policy_allows_family(const struct alg_policy *policy, enum alg_coll coll, const char *family)
{
    int count;
    const struct alg_algorithm *table = alg_table(&count);

    for (int i = 0; i < count; i++) {
        if (table[i].coll == coll && (policy->allowed[coll] & (1ull << i)) &&
            strcmp(table[i].nccl, family) == 0) {
            return true;
        }
    }
    return false;
}

bool
alg_policy_unfiltered(const struct alg_policy *policy, enum alg_coll coll)
{
    int count;
    const struct alg_algorithm *table = alg_table(&count);

    for (int i = 0; i < count; i++) {
        if (table[i].coll == coll && !(policy->allowed[coll] & (1ull << i))) {
            return false;
        }
    }
    return true;
}
