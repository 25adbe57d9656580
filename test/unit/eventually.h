/* SPDX-License-Identifier: Apache-2.0 */
/*
 * EVENTUALLY(cond): for tests of work that other threads finish (the driver double's streams):
 * polls cond every millisecond for up to a second, then asserts it.
 */
#ifndef TEST_UNIT_EVENTUALLY_H
#define TEST_UNIT_EVENTUALLY_H

#include <criterion/criterion.h>
#include <unistd.h>

#define EVENTUALLY(cond)                                                                     \
    do {                                                                                     \
        for (int i_ = 0; i_ < 1000 && !(cond); i_++) {                                        \
            usleep(1000);                                                                    \
        }                                                                                    \
        cr_assert(cond, "%s did not happen within a second", #cond);                         \
    } while (0)

#endif
