/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The last-error text and log scopes (base/debug.c): a WARN is kept for the calling thread
 * and, while a scope is bound, in that scope too; each scope keeps its own text; a thread's
 * text never reaches a scope it did not bind; log lines name the bound scope's device.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/debug.h"

Test(debug, warn_is_kept_for_the_thread_and_the_bound_scope)
{
    struct shim_log_scope a, b;

    shim_log_scope_init(&a, 0);
    shim_log_scope_init(&b, 1);
    shim_error_clear();
    cr_assert_str_empty(shim_error_last(NULL));
    cr_assert_str_empty(shim_error_last(&a), "a fresh scope falls back to the thread's text");

    shim_log_bind(&a);
    WARN("first failure %d", 1);
    shim_log_bind(&b);
    WARN("second failure %d", 2);
    shim_log_bind(NULL);
    WARN("unbound failure");

    cr_assert_str_eq(shim_error_last(&a), "first failure 1");
    cr_assert_str_eq(shim_error_last(&b), "second failure 2");
    cr_assert_str_eq(shim_error_last(NULL), "unbound failure");
    shim_error_clear();
    cr_assert_str_eq(shim_error_last(&a), "first failure 1", "clearing is per thread");
    shim_log_scope_destroy(&a);
    shim_log_scope_destroy(&b);
}

static void *
warn_bound(void *arg)
{
    shim_log_bind(arg);
    WARN("from another thread");
    shim_log_bind(NULL);
    return NULL;
}

/* Non-blocking init WARNs on its own thread; the caller reads the scope. */
Test(debug, a_scope_collects_warns_from_the_thread_it_is_bound_to)
{
    struct shim_log_scope scope;
    pthread_t thread;

    shim_log_scope_init(&scope, 3);
    shim_error_clear();
    cr_assert_eq(pthread_create(&thread, NULL, warn_bound, &scope), 0);
    pthread_join(thread, NULL);
    cr_assert_str_eq(shim_error_last(&scope), "from another thread");
    cr_assert_str_empty(shim_error_last(NULL), "another thread's WARN is not ours");
    shim_log_scope_destroy(&scope);
}

/* NCCL's line format with the bound scope's device: "host:pid:tid [dev] NCCL INFO text". */
Test(debug, log_lines_name_the_bound_scopes_device)
{
    char path[] = "/tmp/ncclshim-test-debug-XXXXXX";
    char line[512] = "";
    struct shim_log_scope scope;

    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "INIT", 1);
    setenv("NCCL_DEBUG_FILE", path, 1);
    shim_log_reset();
    shim_log_scope_init(&scope, 5);
    shim_log_bind(&scope);
    INFO(SHIM_INIT, "hello from device five");
    INFO(SHIM_COLL, "a subsystem not selected");
    shim_log_bind(NULL);
    INFO(SHIM_INIT, "hello from no device");
    shim_log_scope_destroy(&scope);

    FILE *file = fopen(path, "r");
    cr_assert_not_null(file);
    cr_assert_not_null(fgets(line, sizeof(line), file));
    cr_assert_not_null(strstr(line, " [5] NCCL INFO hello from device five"), "%s", line);
    cr_assert_not_null(fgets(line, sizeof(line), file));
    cr_assert_not_null(strstr(line, " [-1] NCCL INFO hello from no device"), "%s", line);
    cr_assert_null(fgets(line, sizeof(line), file), "unexpected line: %s", line);
    fclose(file);
    unlink(path);
}
