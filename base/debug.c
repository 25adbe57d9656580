/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NCCL_DEBUG logging and the last-error text. Lines look like NCCL's:
 *   host:pid:tid [dev] NCCL INFO text
 *   host:pid:tid [dev] file.c:123 (func) NCCL WARN text
 * so that grep habits and log parsers written for NCCL keep working.
 */
#include "debug.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "env.h"
#include "version.h"

int shim_log_level = -1;
uint32_t shim_log_subsys = SHIM_INIT | SHIM_ENV;

static pthread_mutex_t shim_log_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *shim_log_file;
static char shim_log_host[64];

/* The last-error text: per thread, and per scope while one is bound. */
static __thread char shim_error_text[SHIM_ERROR_LEN];
static __thread struct shim_log_scope *shim_log_bound;

static const struct {
    const char *name;
    uint32_t bit;
} shim_subsys_names[] = {
    {"INIT", SHIM_INIT},     {"COLL", SHIM_COLL},       {"P2P", SHIM_P2P},
    {"SHM", SHIM_SHM},       {"NET", SHIM_NET},         {"GRAPH", SHIM_GRAPH},
    {"TUNING", SHIM_TUNING}, {"ENV", SHIM_ENV},         {"ALLOC", SHIM_ALLOC},
    {"CALL", SHIM_CALL},     {"PROXY", SHIM_PROXY},     {"NVLS", SHIM_NVLS},
    {"BOOTSTRAP", SHIM_BOOTSTRAP}, {"REG", SHIM_REG},   {"PROFILE", SHIM_PROFILE},
    {"RAS", SHIM_RAS},       {"ALL", SHIM_ALL},
};

static int
shim_log_parse_level(const char *text)
{
    static const struct {
        const char *name;
        int level;
    } levels[] = {{"VERSION", SHIM_LOG_VERSION}, {"WARN", SHIM_LOG_WARN},
                  {"INFO", SHIM_LOG_INFO},       {"ABORT", SHIM_LOG_WARN},
                  {"TRACE", SHIM_LOG_TRACE}};

    if (text == NULL) {
        return SHIM_LOG_NONE;
    }
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++) {
        if (strcasecmp(text, levels[i].name) == 0) {
            return levels[i].level;
        }
    }
    return SHIM_LOG_NONE;
}

/* "INIT,COLL" selects; "^INIT,COLL" selects everything else, as in NCCL. */
static uint32_t
shim_log_parse_subsys(const char *text)
{
    char buf[256];
    bool invert = text[0] == '^';
    uint32_t mask = 0;

    snprintf(buf, sizeof(buf), "%s", invert ? text + 1 : text);
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        for (size_t i = 0; i < sizeof(shim_subsys_names) / sizeof(shim_subsys_names[0]); i++) {
            if (strcasecmp(tok, shim_subsys_names[i].name) == 0) {
                mask |= shim_subsys_names[i].bit;
            }
        }
    }
    return invert ? ~mask : mask;
}

/* NCCL_DEBUG_FILE with %h (host) and %p (pid) expanded; stderr if unset or unopenable. */
static FILE *
shim_log_open_file(const char *pattern)
{
    char path[4096];
    size_t used = 0;

    if (pattern == NULL || pattern[0] == '\0') {
        return stderr;
    }
    for (const char *p = pattern; *p != '\0' && used + 64 < sizeof(path); p++) {
        if (p[0] == '%' && p[1] == 'h') {
            used += (size_t)snprintf(path + used, sizeof(path) - used, "%s", shim_log_host);
            p++;
        } else if (p[0] == '%' && p[1] == 'p') {
            used += (size_t)snprintf(path + used, sizeof(path) - used, "%d", (int)getpid());
            p++;
        } else {
            path[used++] = *p;
        }
    }
    path[used] = '\0';
    FILE *file = fopen(path, "w");
    return file != NULL ? file : stderr;
}

void
shim_log_init(void)
{
    pthread_mutex_lock(&shim_log_lock);
    if (shim_log_level < 0) {
        gethostname(shim_log_host, sizeof(shim_log_host) - 1);
        char *dot = strchr(shim_log_host, '.');
        if (dot != NULL) {
            *dot = '\0';
        }
        /* Read straight from the environment so ncclResetDebugInit sees new values. */
        const char *subsys = getenv(shim_env_name(SHIM_ENV_NCCL_DEBUG_SUBSYS));
        shim_log_subsys = shim_log_parse_subsys(subsys != NULL ? subsys : "INIT,ENV");
        if (shim_log_file == NULL) {
            shim_log_file = shim_log_open_file(getenv(shim_env_name(SHIM_ENV_NCCL_DEBUG_FILE)));
        }
        __atomic_store_n(&shim_log_level,
                         shim_log_parse_level(getenv(shim_env_name(SHIM_ENV_NCCL_DEBUG))),
                         __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&shim_log_lock);
}

void
shim_log_reset(void)
{
    pthread_mutex_lock(&shim_log_lock);
    __atomic_store_n(&shim_log_level, -1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&shim_log_lock);
}

static void
shim_error_record(const char *text)
{
    struct shim_log_scope *scope = shim_log_bound;

    snprintf(shim_error_text, sizeof(shim_error_text), "%s", text);
    if (scope != NULL) {
        pthread_mutex_lock(&scope->lock);
        snprintf(scope->last_error, sizeof(scope->last_error), "%s", text);
        pthread_mutex_unlock(&scope->lock);
    }
}

/* The device a log line names: the bound scope's. */
static int
shim_log_dev(void)
{
    return shim_log_bound != NULL ? shim_log_bound->dev : -1;
}

void
shim_log(int level, uint32_t subsys, const char *file, int line, const char *func,
         const char *fmt, ...)
{
    char text[SHIM_ERROR_LEN];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (level == SHIM_LOG_WARN) {
        shim_error_record(text);
    }
    if (!shim_log_enabled(level, subsys)) {
        return;
    }

    const char *base = strrchr(file, '/');
    base = base != NULL ? base + 1 : file;
    long tid = syscall(SYS_gettid);
    pthread_mutex_lock(&shim_log_lock);
    if (level == SHIM_LOG_WARN) {
        fprintf(shim_log_file, "%s:%d:%ld [%d] %s:%d (%s) NCCL WARN %s\n", shim_log_host,
                (int)getpid(), tid, shim_log_dev(), base, line, func, text);
    } else {
        fprintf(shim_log_file, "%s:%d:%ld [%d] NCCL %s %s\n", shim_log_host, (int)getpid(),
                tid, shim_log_dev(), level == SHIM_LOG_TRACE ? "TRACE" : "INFO", text);
    }
    fflush(shim_log_file);
    pthread_mutex_unlock(&shim_log_lock);
}

void
shim_log_banner(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    void shim_log_banner_print(void);

    if (shim_log_enabled(SHIM_LOG_VERSION, SHIM_ALL)) {
        pthread_once(&once, shim_log_banner_print);
    }
}

void
shim_log_banner_print(void)
{
    pthread_mutex_lock(&shim_log_lock);
    fprintf(shim_log_file,
            "%s:%d:%ld [%d] NCCL INFO ncclshim %s, serving the NCCL %d.%d.%d ABI "
            "(host memory over UCX, device memory through CUDA IPC on one host; not NVIDIA "
            "NCCL)\n",
            shim_log_host, (int)getpid(), (long)syscall(SYS_gettid), shim_log_dev(),
            SHIM_VERSION_STRING, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
    fflush(shim_log_file);
    pthread_mutex_unlock(&shim_log_lock);
}

void
shim_error_clear(void)
{
    shim_error_text[0] = '\0';
}

void
shim_log_scope_init(struct shim_log_scope *scope, int dev)
{
    scope->dev = dev;
    pthread_mutex_init(&scope->lock, NULL);
    scope->last_error[0] = '\0';
}

void
shim_log_scope_destroy(struct shim_log_scope *scope)
{
    pthread_mutex_destroy(&scope->lock);
}

void
shim_log_bind(struct shim_log_scope *scope)
{
    shim_log_bound = scope;
}

const char *
shim_error_last(const struct shim_log_scope *scope)
{
    const char *text = scope != NULL ? scope->last_error : NULL;
    return text != NULL && text[0] != '\0' ? text : shim_error_text;
}

const char *
shim_result_text(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the ncclshim developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    case ncclTimeout:
        return "timeout";
    default:
        return "unknown result code";
    }
}
