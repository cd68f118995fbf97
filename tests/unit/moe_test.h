/*
 * moe_test.h: what every cmocka test program of moeplan includes.
 *
 * cmocka needs these system headers before its own; keeping the order in one place avoids
 * a copy in every test file.
 */
#ifndef MOE_TEST_H
#define MOE_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A path under the source tree, for shipped and test files. */
static inline const char *moe_test_src(char *buf, size_t cap, const char *rel)
{
    snprintf(buf, cap, "%s/%s", MOEPLAN_SOURCE_DIR, rel);
    return buf;
}

#endif
