/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Logging with NCCL's switches and NCCL's line format. NCCL_DEBUG picks the level (VERSION,
 * WARN, INFO, TRACE), NCCL_DEBUG_SUBSYS the subsystems (comma list, '^' excludes) and
 * NCCL_DEBUG_FILE the destination (%h host, %p pid). Every WARN is also kept as the text that
 * ncclGetLastError returns, whether or not it is printed. The level is tested before anything
 * is formatted, so a disabled INFO costs one load and one branch.
 */
#ifndef SHIM_DEBUG_H
#define SHIM_DEBUG_H

#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

enum shim_log_level {
    SHIM_LOG_NONE = 0,
    SHIM_LOG_VERSION = 1,
    SHIM_LOG_WARN = 2,
    SHIM_LOG_INFO = 3,
    SHIM_LOG_TRACE = 5,
};

/* NCCL's subsystem bits, so NCCL_DEBUG_SUBSYS lists mean the same thing. */
enum shim_subsys {
    SHIM_INIT = 0x1,
    SHIM_COLL = 0x2,
    SHIM_P2P = 0x4,
    SHIM_SHM = 0x8,
    SHIM_NET = 0x10,
    SHIM_GRAPH = 0x20,
    SHIM_TUNING = 0x40,
    SHIM_ENV = 0x80,
    SHIM_ALLOC = 0x100,
    SHIM_CALL = 0x200,
    SHIM_PROXY = 0x400,
    SHIM_NVLS = 0x800,
    SHIM_BOOTSTRAP = 0x1000,
    SHIM_REG = 0x2000,
    SHIM_PROFILE = 0x4000,
    SHIM_RAS = 0x8000,
    SHIM_ALL = ~0u,
};

/* Parsed once from the environment; -1 until then. Read directly by the macros below. */
extern int shim_log_level;
extern uint32_t shim_log_subsys;

void shim_log_init(void);
/* Forgets the parsed settings so the next log call reads NCCL_DEBUG* again. */
void shim_log_reset(void);
void shim_log(int level, uint32_t subsys, const char *file, int line, const char *func,
              const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static inline bool
shim_log_enabled(int level, uint32_t subsys)
{
    /* Acquire pairs with shim_log_init's release store: the subsystem mask is set first. */
    int current = __atomic_load_n(&shim_log_level, __ATOMIC_ACQUIRE);
    if (__builtin_expect(current < 0, 0)) {
        shim_log_init();
        current = __atomic_load_n(&shim_log_level, __ATOMIC_ACQUIRE);
    }
    return level <= current && (subsys & shim_log_subsys);
}

/* WARN always runs: it records the last-error text even when NCCL_DEBUG hides the line. */
#define WARN(...) shim_log(SHIM_LOG_WARN, SHIM_ALL, __FILE__, __LINE__, __func__, __VA_ARGS__)
#define INFO(subsys, ...)                                                                    \
    do {                                                                                     \
        if (shim_log_enabled(SHIM_LOG_INFO, (subsys)))                                       \
            shim_log(SHIM_LOG_INFO, (subsys), __FILE__, __LINE__, __func__, __VA_ARGS__);    \
    } while (0)
#define TRACE(subsys, ...)                                                                   \
    do {                                                                                     \
        if (shim_log_enabled(SHIM_LOG_TRACE, (subsys)))                                      \
            shim_log(SHIM_LOG_TRACE, (subsys), __FILE__, __LINE__, __func__, __VA_ARGS__);   \
    } while (0)

/* The last-error text. WARN writes it for the calling thread and, while a scope is bound to
 * the thread, into that scope too. A scope is what a thread logs for: each communicator owns
 * one (non-blocking init runs on its own thread, and ncclGetLastError(comm) reads the
 * communicator's text), and its device is the [dev] of the thread's log lines. Keeping the
 * scope here, not a communicator, is what lets every layer log without knowing the layer
 * that owns communicators. */
#define SHIM_ERROR_LEN 1024
struct shim_log_scope {
    int dev;              /* the CUDA device log lines name; -1 for none */
    pthread_mutex_t lock; /* guards last_error: WARNs from any thread may write it */
    char last_error[SHIM_ERROR_LEN];
};

void shim_log_scope_init(struct shim_log_scope *scope, int dev);
void shim_log_scope_destroy(struct shim_log_scope *scope);
/* Makes scope the calling thread's: its WARNs also go to scope's text, its lines show scope's
 * device. NULL unbinds. The scope must outlive the binding. */
void shim_log_bind(struct shim_log_scope *scope);
void shim_error_clear(void);
/* scope's last error if it has one, else the calling thread's; scope may be NULL. */
const char *shim_error_last(const struct shim_log_scope *scope);
/* What a result code means, in NCCL's words (ncclGetErrorString's text, for any layer's
 * messages). */
const char *shim_result_text(ncclResult_t result);

/* Prints the one banner line naming ncclshim, once per process, at NCCL_DEBUG=VERSION or more. */
void shim_log_banner(void);

#endif
