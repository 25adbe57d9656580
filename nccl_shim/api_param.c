/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NCCL 2.30's parameter API (ncclParamBind, ncclParamGet*, ...) over ncclshim's own table of
 * environment variables (base/env.c): the parameters are the variables ncclshim reads, named
 * as in the environment (NCCL_DEBUG, NCCLSHIM_TIMEOUT; the NCCL_ prefix may be left out, as
 * in NCCL's keys), each with its value, or its default when unset. A parameter with neither
 * reads as the empty string, and as no number.
 *
 * Strings handed out belong to the table or to the calling thread (until its next call of
 * the same function), as nccl.h says.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "base/check.h"
#include "base/env.h"

/* A handle is the address of its variable's slot; the type stays opaque to the user. */
struct ncclParamHandle {
    int id;
};

static struct ncclParamHandle shim_param_handles[SHIM_ENV_COUNT];
static const char *shim_param_keys[SHIM_ENV_COUNT];
static pthread_once_t shim_param_once = PTHREAD_ONCE_INIT;

static void
shim_param_init(void)
{
    for (int id = 0; id < SHIM_ENV_COUNT; id++) {
        shim_param_handles[id].id = id;
        shim_param_keys[id] = shim_env_name((enum shim_env_id)id);
    }
}

/* The variable key names, with or without the NCCL_ prefix; -1 with a WARN if none. */
static int
shim_param_find(const char *key, const char *api)
{
    char name[128];
    int id = -1;

    if (key == NULL) {
        WARN("%s: key is NULL", api);
        return -1;
    }
    id = shim_env_find(key);
    if (id < 0 && strncmp(key, "NCCL", 4) != 0 &&
        snprintf(name, sizeof(name), "NCCL_%s", key) < (int)sizeof(name)) {
        id = shim_env_find(name);
    }
    if (id < 0) {
        WARN("%s: \"%s\" is not a parameter ncclshim has (ncclParamGetAllParameterKeys lists "
             "them)", api, key);
    }
    return id;
}

static ncclResult_t
shim_param_handle_check(ncclParamHandle_t h, const void *out, const char *api)
{
    shim_error_clear();
    pthread_once(&shim_param_once, shim_param_init);
    if (h < shim_param_handles || h >= shim_param_handles + SHIM_ENV_COUNT) {
        WARN("%s: not a handle ncclParamBind gave out", api);
        return ncclInvalidArgument;
    }
    if (out == NULL) {
        WARN("%s: out is NULL", api);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* The handle's value as text: "" when it has neither value nor default. */
static const char *
shim_param_text(ncclParamHandle_t h)
{
    const char *text = shim_env_str((enum shim_env_id)h->id);
    return text != NULL ? text : "";
}

/* The value as an integer in [lo, hi] (unsigned types pass hi as their maximum). */
static ncclResult_t
shim_param_integer(ncclParamHandle_t h, long double lo, long double hi, const char *api,
                   intmax_t *signed_out, uintmax_t *unsigned_out)
{
    const char *text = shim_param_text(h);
    const char *name = shim_env_name((enum shim_env_id)h->id);
    char *end;

    errno = 0;
    if (lo < 0) {
        intmax_t v = strtoimax(text, &end, 0);
        if (errno == 0 && end != text && *end == '\0' && (long double)v >= lo &&
            (long double)v <= hi) {
            *signed_out = v;
            return ncclSuccess;
        }
    } else if (text[0] != '-') {
        uintmax_t v = strtoumax(text, &end, 0);
        if (errno == 0 && end != text && *end == '\0' && (long double)v <= hi) {
            *unsigned_out = v;
            return ncclSuccess;
        }
    }
    WARN("%s: %s is \"%s\", not an integer in [%.0Lf, %.0Lf]", api, name, text, lo, hi);
    return ncclInvalidArgument;
}

#define SHIM_PARAM_GET_SIGNED(suffix, type, lo, hi)                                           \
    SHIM_API ncclResult_t ncclParamGet##suffix(ncclParamHandle_t h, type *out)                 \
    {                                                                                         \
        intmax_t v;                                                                           \
        SHIM_CHECK(shim_param_handle_check(h, out, "ncclParamGet" #suffix));                  \
        SHIM_CHECK(shim_param_integer(h, (long double)(lo), (long double)(hi),                \
                                      "ncclParamGet" #suffix, &v, NULL));                     \
        *out = (type)v;                                                                       \
        return ncclSuccess;                                                                   \
    }                                                                                         \
    SHIM_ALIAS(ncclParamGet##suffix)

#define SHIM_PARAM_GET_UNSIGNED(suffix, type, hi)                                             \
    SHIM_API ncclResult_t ncclParamGet##suffix(ncclParamHandle_t h, type *out)                 \
    {                                                                                         \
        uintmax_t v;                                                                          \
        SHIM_CHECK(shim_param_handle_check(h, out, "ncclParamGet" #suffix));                  \
        SHIM_CHECK(shim_param_integer(h, 0, (long double)(hi), "ncclParamGet" #suffix, NULL,  \
                                      &v));                                                   \
        *out = (type)v;                                                                       \
        return ncclSuccess;                                                                   \
    }                                                                                         \
    SHIM_ALIAS(ncclParamGet##suffix)

SHIM_API ncclResult_t
ncclParamBind(ncclParamHandle_t *out, const char *key)
{
    shim_error_clear();
    pthread_once(&shim_param_once, shim_param_init);
    if (out == NULL) {
        WARN("ncclParamBind: out is NULL");
        return ncclInvalidArgument;
    }
    int id = shim_param_find(key, "ncclParamBind");
    if (id < 0) {
        return ncclInvalidArgument;
    }
    *out = &shim_param_handles[id];
    return ncclSuccess;
}
SHIM_ALIAS(ncclParamBind)

SHIM_PARAM_GET_SIGNED(I8, int8_t, INT8_MIN, INT8_MAX)
SHIM_PARAM_GET_SIGNED(I16, int16_t, INT16_MIN, INT16_MAX)
SHIM_PARAM_GET_SIGNED(I32, int32_t, INT32_MIN, INT32_MAX)
SHIM_PARAM_GET_SIGNED(I64, int64_t, INT64_MIN, INT64_MAX)
SHIM_PARAM_GET_UNSIGNED(U8, uint8_t, UINT8_MAX)
SHIM_PARAM_GET_UNSIGNED(U16, uint16_t, UINT16_MAX)
SHIM_PARAM_GET_UNSIGNED(U32, uint32_t, UINT32_MAX)
SHIM_PARAM_GET_UNSIGNED(U64, uint64_t, UINT64_MAX)

SHIM_API ncclResult_t
ncclParamGetStr(ncclParamHandle_t h, const char **out)
{
    SHIM_CHECK(shim_param_handle_check(h, out, "ncclParamGetStr"));
    *out = shim_param_text(h); /* the environment's or the table's: it outlives the call */
    return ncclSuccess;
}
SHIM_ALIAS(ncclParamGetStr)

SHIM_API ncclResult_t
ncclParamGet(ncclParamHandle_t h, void *out, int maxLen, int *len)
{
    SHIM_CHECK(shim_param_handle_check(h, out, "ncclParamGet"));
    const char *text = shim_param_text(h);
    size_t bytes = strlen(text) + 1; /* the text and its terminating zero */
    if (maxLen < 0 || (size_t)maxLen < bytes) {
        WARN("ncclParamGet: %s needs %zu bytes, the buffer has %d",
             shim_env_name((enum shim_env_id)h->id), bytes, maxLen);
        return ncclInvalidArgument;
    }
    memcpy(out, text, bytes);
    if (len != NULL) {
        *len = (int)bytes;
    }
    return ncclSuccess;
}
SHIM_ALIAS(ncclParamGet)

SHIM_API ncclResult_t
ncclParamGetParameter(const char *key, const char **value, int *valueLen)
{
    shim_error_clear();
    pthread_once(&shim_param_once, shim_param_init);
    if (value == NULL) {
        WARN("ncclParamGetParameter: value is NULL");
        return ncclInvalidArgument;
    }
    int id = shim_param_find(key, "ncclParamGetParameter");
    if (id < 0) {
        return ncclInvalidArgument;
    }
    *value = shim_param_text(&shim_param_handles[id]);
    if (valueLen != NULL) {
        *valueLen = (int)strlen(*value);
    }
    return ncclSuccess;
}
SHIM_ALIAS(ncclParamGetParameter)

SHIM_API ncclResult_t
ncclParamGetAllParameterKeys(const char ***table, int *tableLen)
{
    shim_error_clear();
    pthread_once(&shim_param_once, shim_param_init);
    if (table == NULL || tableLen == NULL) {
        WARN("ncclParamGetAllParameterKeys: table or tableLen is NULL");
        return ncclInvalidArgument;
    }
    *table = shim_param_keys;
    *tableLen = SHIM_ENV_COUNT;
    return ncclSuccess;
}
SHIM_ALIAS(ncclParamGetAllParameterKeys)

SHIM_API void
ncclParamDumpAll(void)
{
    pthread_once(&shim_param_once, shim_param_init);
    for (int id = 0; id < SHIM_ENV_COUNT; id++) {
        const char *value = shim_env_str((enum shim_env_id)id);
        INFO(SHIM_ENV, "param %s=%s (%s)", shim_env_name((enum shim_env_id)id),
             value != NULL ? value : "", shim_env_meaning((enum shim_env_id)id));
    }
}
SHIM_ALIAS(ncclParamDumpAll)
